"""`stoke <command>`: the command line of the pipeline.

Stages that are plain programs (the Beam job, training) run as their own processes, exactly as a
flow, Dataflow or a Kubernetes Job would start them; the CLI passes their arguments through. Every
command takes `--json` and then prints one JSON object as the last line of stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from components.contracts import stages

# Commands that are whole programs of their own: `stoke ingest ...` is `python -m beam_jobs.ingest ...`.
# Every stage of the registry is one, under its name; these are the others.
TOOLS = {
    "rollback": ("components.push.rollback", "take the newest served version out of the repository"),
    "lineage": ("components.push.lineage", "where a served version came from"),
    "predict": ("components.push.predict", "labels and probabilities from a model folder or TF Serving"),
    "spans": ("components.datacheck.spans", "published spans and their status; `spans release N` lets a "
              "quarantined one in"),
    "deploy": ("flows.work_pools", "register the deployments to a process, Docker or Kubernetes work pool"),
    "data-service": ("components.train.data_service", "a tf.data service dispatcher or worker, for "
                     "`stoke train --data-service`"),
}


def programs() -> dict[str, tuple[str, str]]:
    """Command name -> (module, one-line help): the registry's stages, then the tools."""
    return {**{s.name: (s.program, s.summary) for s in stages.STAGES}, **TOOLS}


# `stoke bench <what> ...` is the benchmark program `python -m <module> ...`.
BENCHES = {
    "input": "benchmarks.input_pipeline",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in programs() and any(argv[0] in s.aliases for s in stages.STAGES):
        renamed = stages.stage(argv[0]).name
        print(f"stoke: `stoke {argv[0]}` is now `stoke {renamed}`; the old name goes in the next release",
              file=sys.stderr, flush=True)
        argv[0] = renamed
    if argv and argv[0] in programs():
        return run_program(programs()[argv[0]][0], argv[1:])
    if len(argv) > 1 and argv[0] == "bench" and argv[1] in BENCHES:
        return run_program(BENCHES[argv[1]], argv[2:])
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return args.handler(args)


def run_program(module: str, argv: list[str]) -> int:
    """Runs `python -m module argv...` in its own process and returns its exit code."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return subprocess.call([sys.executable, "-m", module, *argv], env=env)
    except KeyboardInterrupt:
        return 130


def emit(summary: dict, as_json: bool, text: str) -> None:
    """Prints a human line, or the summary as one JSON object on the last line of stdout."""
    print(json.dumps(summary, sort_keys=True) if as_json else text, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoke", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, (_, summary) in programs().items():
        commands.add_parser(name, help=summary)
    bench = commands.add_parser("bench", help="measure a part of the pipeline: " + ", ".join(BENCHES))
    bench.add_argument("what", choices=sorted(BENCHES), help="see `stoke bench <what> --help`")

    from flows import commands as flow_commands

    run = commands.add_parser("run", help="the train flow once, here: " + ", ".join(s.name for s in stages.STAGES))
    flow_commands.add_run_arguments(run)
    run.set_defaults(handler=flow_commands.run)
    up = commands.add_parser("up", help="a local Prefect server serving train/nightly and watch-bucket/poll until Ctrl-C")
    flow_commands.add_up_arguments(up)
    up.set_defaults(handler=flow_commands.up)

    demo = commands.add_parser("demo", help="write the demo digits as PNG files in class folders")
    demo.add_argument("target", help="folder or URI to write into")
    demo.add_argument("--limit", type=int, default=None, help="write at most this many images")
    demo.add_argument("--json", action="store_true", help="print a JSON summary last")
    demo.set_defaults(handler=_demo)

    return parser


def _demo(args) -> int:
    from flows.demo import write_digits

    count = write_digits(args.target, limit=args.limit)
    emit({"target": args.target, "images": count}, args.json, f"wrote {count} digit images to {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
