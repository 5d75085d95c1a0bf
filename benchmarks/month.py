"""A month of nights in about an hour: the real `train` flow, night after night, on arrivals made here.

    python -m benchmarks.month [--nights 30] [--first 300] [--per-night 40] [--keep DIR]
    stoke bench month ...

The data are scikit-learn's 1,797 handwritten digits (nothing is downloaded), written as PNG files
the way `stoke demo` writes them. A fixed held-out set (`--held-out` per class) never reaches the
bucket: after every night the served model answers it, so the accuracy of what is served is measured
on the same images all month. The rest arrive in a local folder that stands for the bucket: `--first`
on night 1, then `--per-night` a night, and each night runs `stoke run SOURCE --root ROOT --preset demo
--skip-unchanged` against one Prefect server, as the nightly deployment does. Some nights are not
ordinary (`NIGHTS` below): arrivals skewed to a few classes, a few broken files, a class relabelled
(every "three" filed under "eight"), a run killed while it trains (SIGKILL, as a preempted machine
dies), and two runs started at once (a nightly run and a data-triggered one that meet).

Per night it prints one JSON line and, at the end, a table (docs/benchmarks.md keeps one): images new
that night, records trained on and images seen, training seconds, full or warm, the served version,
and the served model's held-out accuracy overall and per class. At the end: spans stranded (published
and never trained on nor held back), processes the runs left behind, disk used under ROOT/runs,
ROOT/models and the caches, and the served model against one trained from scratch on all the data,
paired on the held-out set (McNemar's exact test, components/gate/evidence.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
# Nights that are not ordinary, by number; every other night brings --per-night digits of every class.
NIGHTS = {5: "skewed", 8: "broken", 11: "killed", 14: "skewed", 17: "relabelled", 20: "overlap", 23: "skewed",
          27: "skewed"}
SKEWED_CLASSES = 3  # a skewed night's arrivals come from this many classes only
BROKEN_FILES = 3
RELABELLED = ("three", "eight")  # that night, every "three" is filed under "eight"
SERVER_START_SECONDS = 180
NIGHT_TIMEOUT_SECONDS = 1800


@dataclasses.dataclass
class Digit:
    index: int
    label: str
    png: bytes


def digits(size: int = 32) -> list[Digit]:
    """Every digit as `stoke demo` writes it: 8-bit grey, enlarged to `size`, RGB PNG."""
    from sklearn.datasets import load_digits

    data = load_digits()
    scans = zip(data.images, data.target)
    return [Digit(index, NAMES[label], png(pixels, size)) for index, (pixels, label) in enumerate(scans)]


def png(pixels: np.ndarray, size: int = 32) -> bytes:
    """One 8x8 scan (values 0-16) as `stoke demo` writes it: 8-bit grey, enlarged to `size`, RGB PNG."""
    grey = np.clip(pixels * (255 / 16), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(grey, "L").resize((size, size), Image.BILINEAR).convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def split(all_digits: list[Digit], held_out_per_class: int, seed: int) -> tuple[list[Digit], list[Digit]]:
    """(held-out, the rest in arrival order): the held-out set takes the same number of every class."""
    rng = np.random.default_rng(seed)
    order = [all_digits[i] for i in rng.permutation(len(all_digits))]
    held, rest, taken = [], [], dict.fromkeys(NAMES, 0)
    for digit in order:
        if taken[digit.label] < held_out_per_class:
            held.append(digit)
            taken[digit.label] += 1
        else:
            rest.append(digit)
    return held, rest


def plan(pool: list[Digit], nights: int, first: int, per_night: int, seed: int) -> list[tuple[str, list[Digit]]]:
    """Each night's kind and arrivals, drawn from `pool` without putting any digit back."""
    rng = np.random.default_rng(seed + 1)
    pool = list(pool)
    planned = []
    for night in range(1, nights + 1):
        kind = NIGHTS.get(night, "ordinary")
        want = first if night == 1 else per_night
        if kind == "skewed":
            few = set(rng.choice(NAMES, SKEWED_CLASSES, replace=False))
            chosen = [d for d in pool if d.label in few][:want]
        else:
            chosen = pool[:want]
        taken = {d.index for d in chosen}
        pool = [d for d in pool if d.index not in taken]
        planned.append((kind, chosen))
    return planned


def write_arrivals(source: Path, night: int, kind: str, arrivals: list[Digit]) -> int:
    """Writes a night's files into SOURCE/<label>/; returns how many."""
    for digit in arrivals:
        label = RELABELLED[1] if kind == "relabelled" and digit.label == RELABELLED[0] else digit.label
        folder = source / label
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"night{night:02d}-{digit.index:04d}.png").write_bytes(digit.png)
    count = len(arrivals)
    if kind == "broken":  # a truncated PNG, a text file named .png, an empty file
        folder = source / arrivals[0].label
        (folder / f"night{night:02d}-truncated.png").write_bytes(arrivals[0].png[: len(arrivals[0].png) // 2])
        (folder / f"night{night:02d}-text.png").write_bytes(b"not an image at all\n")
        (folder / f"night{night:02d}-empty.png").write_bytes(b"")
        count += BROKEN_FILES
    return count


# ---------------------------------------------------------------- the Prefect server and the runs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(home: Path, env: dict) -> tuple[subprocess.Popen, dict]:
    """A Prefect server on a free loopback port, its home in `home`; the environment runs reach it with."""
    from components.common import processes

    port = free_port()
    env = {**env, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    log = open(home / "server.log", "ab")
    server = processes.start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                              "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env,
                             preexec_fn=processes.dies_with_this_process())
    log.close()
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the Prefect server exited with code {server.returncode}; see {home / 'server.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                return server, env
        except OSError:
            time.sleep(0.5)
    processes.stop(server)
    sys.exit(f"the Prefect server did not answer within {SERVER_START_SECONDS} s; see {home / 'server.log'}")


def run_command(source: Path, root: Path, run_id: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "run", str(source), "--root", str(root), "--preset", "demo",
            "--skip-unchanged", "--run-id", run_id, "--json"]


def finished(process: subprocess.Popen, timeout: float = NIGHT_TIMEOUT_SECONDS) -> dict:
    """The summary `stoke run --json` printed last, or what went wrong."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return {"status": "timeout", "message": err[-500:]}
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    if not lines:
        return {"status": "no summary", "exit": process.returncode, "message": err[-500:]}
    return {**json.loads(lines[-1]), "exit": process.returncode}


def start_run(source: Path, root: Path, run_id: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(run_command(source, root, run_id), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)


def killed_while_training(source: Path, root: Path, run_id: str, env: dict) -> dict:
    """Starts a run, SIGKILLs `stoke run` once its training has made a backup (or after a bound), and
    returns what was left running of what it started."""
    import psutil

    process = start_run(source, root, run_id, env)
    backup = root / "runs" / run_id / "backup"
    deadline = time.monotonic() + NIGHT_TIMEOUT_SECONDS
    while time.monotonic() < deadline and process.poll() is None and not any(backup.glob("*")):
        time.sleep(0.5)
    if process.poll() is not None:
        return {**finished(process), "killed": False}
    family = psutil.Process(process.pid).children(recursive=True)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate()
    gone, alive = psutil.wait_procs(family, timeout=30)
    return {"status": "killed", "killed": True, "left_running": [" ".join(p.cmdline()[:4]) for p in alive
                                                                 if p.is_running()]}


# ---------------------------------------------------------------- what the served model knows


class Served:
    """The newest version in ROOT/models/stoke, answering the held-out set (loaded once per version)."""

    def __init__(self, root: Path):
        self.models = root / "models" / "stoke"
        self.version, self.signature = None, None

    def newest(self) -> int | None:
        if not self.models.is_dir():
            return None
        versions = [int(p.name) for p in self.models.iterdir()
                    if p.name.isascii() and p.name.isdigit() and (p / "saved_model.pb").exists()]
        return max(versions, default=None)

    def answers(self, held: list[Digit]) -> list[str] | None:
        version = self.newest()
        if version is None:
            return None
        if version != self.version:
            self.version, self.signature = version, load_signature(self.models / str(version))
        return predict(self.signature, held)


def load_signature(model_dir: Path):
    import tensorflow as tf

    return tf.saved_model.load(str(model_dir)).signatures["serving_default"]


def predict(signature, held: list[Digit], batch: int = 256) -> list[str]:
    import tensorflow as tf

    labels = []
    for start in range(0, len(held), batch):
        out = signature(image_bytes=tf.constant([d.png for d in held[start:start + batch]]))
        labels += [label.decode() for label in out["labels"].numpy()]
    return labels


def accuracy(held: list[Digit], answers: list[str] | None) -> tuple[float | None, dict[str, float]]:
    if answers is None:
        return None, {}
    right = [a == d.label for a, d in zip(answers, held)]
    per_class = {name: float(np.mean([r for r, d in zip(right, held) if d.label == name])) for name in NAMES}
    return float(np.mean(right)), per_class


# ---------------------------------------------------------------- one night


def night_row(night: int, kind: str, new_images: int, summary: dict, root: Path, served: Served,
              held: list[Digit], seconds: float) -> dict:
    run_id = summary.get("run_id")
    metrics = read_json(root / "runs" / str(run_id) / "metrics.json") if run_id else None
    overall, per_class = accuracy(held, served.answers(held))
    row = {"night": night, "kind": kind, "new_images": new_images, "status": summary.get("status"),
           "exit": summary.get("exit"), "run_seconds": round(seconds, 1), "served_version": served.newest(),
           "held_out_accuracy": overall, "per_class": per_class}
    if metrics:
        row.update({
            "records_trained_on": (start["new_records"] + start["replay_records"]) if (start := metrics.get("start"))
            else metrics["steps_per_epoch"] * metrics["global_batch_size"],
            "images_seen": metrics["total_steps"] * metrics["global_batch_size"],
            "train_seconds": metrics.get("train_seconds") or _seconds(metrics),
            "start": (metrics.get("start") or {}).get("kind", "full"),
            "start_reason": (metrics.get("start") or {}).get("reason"),
            "spans_trained": metrics.get("spans"),
        })
    if summary.get("status") in ("failed", "timeout", "no summary"):
        row["message"] = summary.get("message")
    return row


def _seconds(metrics: dict) -> float | None:
    rate = metrics.get("images_per_sec")
    return round(metrics["total_steps"] * metrics["global_batch_size"] / rate, 1) if rate else None


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- the end of the month


def spans_at_the_end(root: Path, served: Served) -> dict:
    """Published spans by fate: in the served model, held back by the data check, or stranded (neither)."""
    spans = root / "data" / "spans"
    published = sorted(int(p.name.split("-")[1]) for p in spans.glob("span-*") if (p / "_MANIFEST.json").exists())
    half = sorted(p.name for p in spans.glob("span-*") if not (p / "_MANIFEST.json").exists())
    version = served.newest()
    lineage = read_json(served.models / str(version) / "assets.extra" / "stoke_lineage.json") if version else None
    learnt = {(s["span"], s["manifest_sha256"]) for s in (lineage or {}).get("spans", [])}  # a number and its manifest
    trained = [n for n in published
               if (n, hashlib.sha256((spans / f"span-{n:05d}" / "_MANIFEST.json").read_bytes()).hexdigest()) in learnt]
    held = []
    for number in published:
        record = read_json(spans / f"span-{number:05d}" / "_DATACHECK.json") or {}
        if record.get("status") == "quarantined":
            held.append(number)
    stranded = [n for n in published if n not in trained and n not in held]
    return {"published": len(published), "in_served_model": trained, "quarantined": held,
            "stranded": stranded, "unpublished_folders": half}


def disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) if path.exists() else 0


def left_running(work: Path, server_pid: int) -> list[str]:
    """Processes other than the Prefect server whose command line names the month's folder (every run
    and stage program names its ROOT or SOURCE)."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["pid"] not in (os.getpid(), server_pid) and str(work) in cmdline:
            found.append(f"{process.info['pid']}: {cmdline[:120]}")
    return found


def against_scratch(root: Path, held: list[Digit], served_answers: list[str] | None, env: dict) -> dict:
    """The served model against one trained from scratch on every span the data check let in, paired on
    the held-out set."""
    from components.gate.evidence import discordant, mcnemar_exact, newcombe_paired

    if served_answers is None:
        return {"error": "no model was served at the end"}
    command = [sys.executable, "-m", "flows.cli", "train", "--root", str(root), "--preset", "demo",
               "--run-id", "from-scratch", "--no-warm-start", "--json"]
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode:
        return {"error": f"stoke train exited {out.returncode}: {out.stderr.strip()[-500:]}"}
    scratch = predict(load_signature(root / "runs" / "from-scratch" / "candidate"), held)
    served_right = [a == d.label for a, d in zip(served_answers, held)]
    scratch_right = [a == d.label for a, d in zip(scratch, held)]
    a, b, c, d = discordant(served_right, scratch_right)
    low, high = newcombe_paired(a, b, c, d)
    return {"served": float(np.mean(served_right)), "from_scratch": float(np.mean(scratch_right)),
            "served_only_right": b, "scratch_only_right": c, "p_value": mcnemar_exact(b, c),
            "difference_95": [round(low, 4), round(high, 4)], "within_noise": low <= 0 <= high}


def table(rows: list[dict]) -> str:
    head = ("| night | kind | new | trained on | seen | train s | start | status | served | held-out | lowest class |\n"
            "| ---: | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |")
    lines = [head]
    for row in rows:
        low = min(row["per_class"].items(), key=lambda item: item[1]) if row.get("per_class") else None
        accuracy = row.get("held_out_accuracy")
        cells = [row["night"], row["kind"], row["new_images"], row.get("records_trained_on", "-"),
                 row.get("images_seen", "-"), row.get("train_seconds", "-"), row.get("start", "-"), row.get("status"),
                 row.get("served_version") or "-", "-" if accuracy is None else f"{accuracy:.3f}",
                 f"{low[0]} {low[1]:.2f}" if low else "-"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stoke bench month", description=__doc__.split("\n")[0])
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--first", type=int, default=300, help="digits on night 1")
    parser.add_argument("--per-night", type=int, default=40, help="digits on every later night")
    parser.add_argument("--held-out", type=int, default=30, help="held-out digits per class, never ingested")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="stoke-month-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    source, root, cache, home = work / "bucket", work / "root", work / "cache", work / "prefect"
    for folder in (source, home):
        folder.mkdir(exist_ok=True)
    held, pool = split(digits(), args.held_out, args.seed)
    nights = plan(pool, args.nights, args.first, args.per_night, args.seed)
    env = {**os.environ, "STOKE_CACHE_DIR": str(cache), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH")]))}
    server, env = start_server(home, env)
    served, rows = Served(root), []
    try:
        for night, (kind, arrivals) in enumerate(nights, start=1):
            new_images = write_arrivals(source, night, kind, arrivals)
            started = time.monotonic()
            run_id = f"night-{night:02d}"
            if kind == "killed":
                outcome = killed_while_training(source, root, run_id, env)
                rows.append({"night": night, "kind": kind, "new_images": new_images, **outcome,
                             "served_version": served.newest()})
                print(json.dumps(rows[-1]), flush=True)
                continue
            if kind == "overlap":  # the nightly run and an arrival's run meet
                first, second = (start_run(source, root, f"{run_id}{x}", env) for x in ("a", "b"))
                summaries = [finished(first), finished(second)]
                for letter, summary in zip("ab", summaries):
                    rows.append(night_row(night, f"overlap-{letter}", new_images if letter == "a" else 0, summary,
                                          root, served, held, time.monotonic() - started))
                    print(json.dumps(rows[-1]), flush=True)
                continue
            summary = finished(start_run(source, root, run_id, env))
            rows.append(night_row(night, kind, new_images, summary, root, served, held, time.monotonic() - started))
            print(json.dumps(rows[-1]), flush=True)
        end = {"spans": spans_at_the_end(root, served), "left_running": left_running(work, server.pid),
               "disk_mb": {name: round(disk(path) / 1e6, 2) for name, path in
                           (("runs", root / "runs"), ("models", root / "models"), ("data", root / "data"),
                            ("caches", cache))},
               "run_folders": len(list((root / "runs").iterdir())) if (root / "runs").exists() else 0}
        end["against_scratch"] = against_scratch(root, held, served.answers(held), env)
    finally:
        from components.common import processes

        processes.stop(server)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rows), flush=True)
    print(json.dumps(end, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
