"""The TensorFlow Profiler's verdict beside Stoke's probe, on two real runs built to differ: large
PNGs (no reduced-scale decode) for a small CNN at 32 px on one CPU, and small images for the same
CNN at 192 px, whose steps cost far more than their input. The Profile tab's input-pipeline analyzer reads each trace, and
both verdicts must agree in each run."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from components.common import processes
from components.common.files import read_result, write_json
from components.contracts.layout import Root
from components.contracts.results import TrainMetrics
from components.report.report import write_report
from components.train import measure as profile
from tests.components.conftest import TRAIN_LABELS, tiny_image, tiny_records, write_span
from tests.waiting import free_port, wait_for

COMMON = ["--epochs", "1", "--steps-per-epoch", "16", "--trace-steps", "8,14", "--input-probe-steps", "4",
          "--precision", "float32", "--no-xla", "--no-flip", "--json"]
RUNS = {
    # 768x776 noise PNGs, decoded whole on one core, for a small CNN at 32 px.
    "input_bound": {"size": 768, "args": ["--network", "small_cnn", "--weights", "none",
                                          "--image-size", "32", "--batch-size", "4"],
                    "cpus": 1},
    # 32 px JPEGs, decoded at a glance, for the same CNN at 192 px: 36 times the compute per image.
    "model_bound": {"size": 32, "args": ["--network", "small_cnn", "--weights", "none",
                                         "--image-size", "192", "--batch-size", "4"],
                    "cpus": None},
}


def train_in_subprocess(root: str, run_id: str, args: list[str], cpus: int | None) -> dict:
    """`python -m components.train`, pinned to `cpus` cores: tf.data sizes its threads to what it may use."""
    pin = (lambda: os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cpus]))) if cpus else None
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "components.train", "--root", root, "--run-id", run_id,
                           *COMMON, *args], capture_output=True, text=True, env=env, timeout=600, preexec_fn=pin)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each kind of run, trained once: its RunDir and the summary `stoke train --json` printed."""
    done = {}
    for kind, spec in RUNS.items():
        root = str(tmp_path_factory.mktemp(kind))
        # Three images, one per label, 64 times over: decoding costs the same, making them would not.
        images = [(tiny_image(label, label, spec["size"], "png"), "png", label) for label in range(3)]
        write_span(root, 1, {"train": [images[i % 3] for i in range(64)], "eval": tiny_records(8, offset=100)},
                   TRAIN_LABELS, {"train": 2, "eval": 1})
        done[kind] = (Root(root).run(kind), train_in_subprocess(root, kind, spec["args"], spec["cpus"]))
    return done


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_the_profilers_verdict_agrees_with_the_probe(kind, runs):
    run, summary = runs[kind]
    metrics = read_result(run.metrics, TrainMetrics)
    probe, profiler = metrics.input, metrics.profiler
    assert profiler is not None, "the trace of steps 8-14 was not read"
    assert profiler.steps >= 4 and profiler.step_time_ms > 0 and os.path.isdir(profiler.trace)
    expected = kind == "input_bound"
    assert probe.input_bound is expected and profiler.input_bound is expected, (probe, profiler)
    if expected:
        assert profiler.classification == "highly" and profiler.input_percent >= 20
        said = re.search(r"([\d.]+)% of the total step time sampled is waiting for input", profiler.conclusion)
        assert said and abs(float(said.group(1)) - profiler.input_percent) <= 0.05 + 1e-9  # rounded once or twice
    else:
        assert profiler.input_percent < 20

    write_json(run.result("train"), summary)  # the train stage's result, which the report reads
    report = write_report(run)
    assert report["summary"]["train"]["profiler"] == profiler.model_dump(mode="json")
    assert f"Profile tab): {profiler.conclusion}" in report["markdown"]


def test_tensorboard_shows_the_same_analysis_in_its_profile_tab(runs, tmp_path):
    """`tensorboard --logdir ROOT/runs/<id>/tensorboard`, as docs/train.md shows it, asked what its Profile
    tab's input-pipeline analyzer page loads."""
    run, _ = runs["input_bound"]
    profiler = read_result(run.metrics, TrainMetrics).profiler
    port = free_port()
    log = open(tmp_path / "tensorboard.log", "wb")
    server = processes.start([os.path.join(os.path.dirname(sys.executable), "tensorboard"), "--logdir", run.tensorboard,
                              "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/data"
    try:
        listing = wait_for(lambda: answer(f"{base}/plugins_listing"), "tensorboard to answer", 180, process=server)
        assert listing["profile"]["enabled"]
        (session,) = get_json(f"{base}/plugin/profile/runs")
        assert session == os.path.basename(profiler.trace)
        assert "input_pipeline_analyzer" in get_json(f"{base}/plugin/profile/run_tools?run={session}")
        (host,) = get_json(f"{base}/plugin/profile/hosts?run={session}&tag=input_pipeline_analyzer")
        page = get(f"{base}/plugin/profile/data?run={session}&tag=input_pipeline_analyzer&host={host['hostname']}")
    finally:
        processes.stop(server)
    assert profile.parse_analysis(page, profiler.trace) == profiler


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
        return gzip.decompress(body) if response.headers.get("Content-Encoding") == "gzip" else body


def get_json(url: str):
    return json.loads(get(url))


def answer(url: str):
    """The JSON at `url`, or None while nothing answers there."""
    try:
        return get_json(url)
    except OSError:
        return None


def test_without_a_trace_there_is_no_verdict(tmp_path):
    assert profile.input_pipeline_verdict(str(tmp_path / "tensorboard")) is None
