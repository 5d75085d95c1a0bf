"""`stoke <command>`: the command line of the pipeline.

Stage programs and tools are programs of their own: `stoke ingest ...` is `python -m beam_jobs.ingest
...`, which the command becomes (exec), so signals such as Kubernetes' SIGTERM reach the program
itself. Every command takes `--json` and then prints one JSON object as the last line of stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from components.common.runtime_logs import program_environment
from components.contracts import stages

# Commands that are whole programs of their own: every stage of the registry under its name, and these.
TOOLS = {
    "report": ("components.report", "(re)build a run's report from its folder"),
    "rollback": ("components.push.rollback", "take the newest served version out of the repository"),
    "lineage": ("components.push.show_lineage", "where a served version came from"),
    "predict": ("components.push.predict", "labels and probabilities from a model folder or TF Serving"),
    "runs": ("components.report.runs", "run folders and what the retention rule makes of them; `runs prune` "
             "applies it"),
    "spans": ("components.datacheck.span_status", "published spans and their status; `spans release N` lets a "
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
    "month": "benchmarks.month",
    "year": "benchmarks.year",
}


def main(argv: list[str] | None = None) -> int:
    """The `stoke` command (argv None: this process's arguments, and a program replaces this process);
    from Python, with `argv`, a program runs as a child and its exit code is returned."""
    replace = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in programs():
        return run_program(programs()[argv[0]][0], argv[1:], replace)
    if len(argv) > 1 and argv[0] == "bench" and argv[1] in BENCHES:
        return run_program(BENCHES[argv[1]], argv[2:], replace)
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    args.command = ["stoke", *argv]  # as given: `stoke run` says how to run it again
    return args.handler(args)


def run_program(module: str, argv: list[str], replace: bool = False) -> int:
    """Runs `python -m module argv...`: in place of this process (`replace`), else as a child whose exit code is returned."""
    command = [sys.executable, "-m", module, *argv]
    env = program_environment()
    if replace:
        sys.stdout.flush()
        os.execve(sys.executable, command, env)
    try:
        return subprocess.call(command, env=env)
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
    from flows import config_command

    run = commands.add_parser("run", help="the train flow once, here: " + ", ".join(s.name for s in stages.STAGES))
    flow_commands.add_run_arguments(run)
    run.set_defaults(handler=flow_commands.run)
    up = commands.add_parser("up", help="a local Prefect server serving train/nightly and watch-bucket/poll until Ctrl-C")
    flow_commands.add_up_arguments(up)
    up.set_defaults(handler=flow_commands.up)
    config = commands.add_parser("config", help="`config show`: the run configuration, every setting with its help")
    config_command.add_arguments(config)
    config.set_defaults(handler=config_command.show)

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
