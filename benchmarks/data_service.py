"""The demo's input pipeline in-process against the same pipeline on tf.data service, in one run.

    python -m benchmarks.data_service [--batches 200] [--rounds 3]

Writes the demo digits, ingests them (Beam), then reads the training split with the demo's settings
(32 px, batch 32) three ways: in this process, and through a dispatcher with 1 and with 2 workers,
each a process of its own on this machine (`stoke data-service`). For each it reports:
  records_per_pass   one pass over the split (batch 1, so no batch remainder is dropped) and the
                     label counts: equal to in-process means nothing lost or repeated
  images_per_sec     the repeating training stream, after a warm-up, median over alternating rounds
  cpu_ms_per_image   CPU time of this process and the servers, all threads, per image: what going
                     through the service costs whatever else the machine runs
and the overhead per image against in-process, in CPU and wall-clock milliseconds. On a machine of
few cores the workers share the trainer's cores, so no speed-up is expected here: the service pays
off when its workers are other machines' CPUs.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.jpeg_spans import write_span
from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.train import data as pipeline
from flows.demo import write_digits

SERVER = [sys.executable, "-m", "components.train.data_service"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200, help="timed batches per configuration (default: 200)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are kept (default: 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoke-bench-data-service-") as tmp:
        write_digits(os.path.join(tmp, "digits"))
        write_span(os.path.join(tmp, "root"), Path(tmp) / "digits")
        shards = Spans(os.path.join(tmp, "root")).shards("train", None, checked=False)
        servers = []
        try:
            dispatcher = _start(servers, "dispatcher")
            _start(servers, "worker", "--dispatcher", dispatcher)
            result = _measure(shards, {"in_process": (None, []), "one_worker": (dispatcher, list(servers))}, args)
            _start(servers, "worker", "--dispatcher", dispatcher)
            result |= _measure(shards, {"two_workers": (dispatcher, list(servers))}, args)
        finally:
            for server in reversed(servers):  # workers first: they stop at once while the dispatcher answers
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    print(f"warning: {' '.join(server.args[2:5])} did not stop within 30 s of SIGTERM; killed",
                          file=sys.stderr, flush=True)
                    server.kill()
    base = result["in_process"]
    for served in (result["one_worker"], result["two_workers"]):
        served["same_records_as_in_process"] = served.pop("labels") == base["labels"]
        served["overhead_cpu_ms_per_image"] = round(served["cpu_ms_per_image"] - base["cpu_ms_per_image"], 3)
        served["overhead_wall_ms_per_image"] = round(1000 / served["images_per_sec"] - 1000 / base["images_per_sec"], 3)
        served["speed_vs_in_process"] = round(served["images_per_sec"] / base["images_per_sec"], 3)
    base.pop("labels")
    print(json.dumps({"cores": os.cpu_count(), **result}, sort_keys=True))
    return 0


def _start(servers: list, *argv: str) -> str:
    """Starts `stoke data-service ROLE ...` on a free port; returns its address."""
    process = subprocess.Popen([*SERVER, *argv, "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    servers.append(process)
    for line in process.stderr:
        if ": serving at " in line:
            threading.Thread(target=process.stderr.read, daemon=True).start()  # a full pipe would stall it
            return line.split(": serving at ")[1].split()[0]
    raise RuntimeError(f"`stoke data-service {argv[0]}` exited with code {process.wait()}")


def _measure(shards, configs: dict, args) -> dict:
    """Per configuration: the records of one pass, and the stream's rate and CPU per image (medians)."""
    found = {name: {"labels": _one_pass(shards, address), "rates": [], "cpu": []}
             for name, (address, _) in configs.items()}
    for _ in range(args.rounds):
        for name, (address, servers) in configs.items():
            rate, cpu = _timed(shards, address, [psutil.Process(), *map(psutil.Process, (s.pid for s in servers))],
                               args.batches)
            found[name]["rates"].append(rate)
            found[name]["cpu"].append(cpu)
    return {name: {"labels": f["labels"], "records_per_pass": sum(f["labels"].values()),
                   "images_per_sec": round(statistics.median(f["rates"]), 1),
                   "cpu_ms_per_image": round(statistics.median(f["cpu"]), 3)} for name, f in found.items()}


def _dataset(shards, address: str | None, **changes):
    options = pipeline.PipelineOptions(**{"batch_size": 32, "training": True, **changes})
    dataset = pipeline.make_dataset(shards, TrainConfig(image_size=32, flip=False), options)
    return dataset if address is None else pipeline.through_service(dataset, address)


def _one_pass(shards, address: str | None) -> dict:
    labels = collections.Counter()
    for _, batch in _dataset(shards, address, repeat=False, batch_size=1):
        labels.update(batch.numpy().tolist())
    return dict(sorted(labels.items()))


def _timed(shards, address: str | None, processes: list, batches: int) -> tuple[float, float]:
    stream = iter(_dataset(shards, address))
    for _ in range(5):  # warm-up: shuffle buffers fill, autotuning starts, workers take their files
        next(stream)
    cpu, start = _cpu(processes), time.perf_counter()
    for _ in range(batches):
        next(stream)
    seconds, images = time.perf_counter() - start, batches * 32
    return images / seconds, (_cpu(processes) - cpu) * 1000 / images


def _cpu(processes: list) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


if __name__ == "__main__":
    sys.exit(main())
