"""`python -m components.gate.serving_check MODEL_DIR --warmup FILE`: the serving contract, checked the
way TF Serving meets the model: a fresh process that knows nothing of the training code loads the
SavedModel's `serve` tag, replays the warm-up requests through `serving_default` and checks names,
dtypes, shapes, finite probabilities summing to 1, and latency at batch 1 and 32.

When `tensorflow_model_server` is on the PATH, or a Docker engine answers, the real server is also
started on a loopback port and queried over REST; otherwise the report says it was skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from components.common import processes
from components.common.serving import PredictError, docker_engine, rest_predict
from components.contracts.schema import SERVING_INPUT, SERVING_OUTPUTS, SERVING_SIGNATURE
from components.gate import warmup

LATENCY_BATCHES = (1, 32)
LATENCY_REPEATS = 10


def check(model_dir: str, warmup_uri: str, model_name: str, serving_image: str | None = None) -> dict:
    import tensorflow as tf

    problems: list[str] = []
    report: dict = {"model_dir": model_dir, "problems": problems}
    loaded = tf.saved_model.load(model_dir, tags=["serve"])
    signature = loaded.signatures.get(SERVING_SIGNATURE)
    problems.extend(_contract_problems(signature, report))
    if problems:
        return _finish(report)

    logs = warmup.read_prediction_logs(warmup_uri)
    if not logs:
        problems.append(f"{warmup_uri} holds no warm-up request")
        return _finish(report)
    images, first_outputs = _replay(signature, logs, problems)
    report["classes"] = int(first_outputs[1]["probabilities"].shape[1]) if first_outputs else None
    report["warmup_requests"] = len(logs)
    report["latency_ms"] = _latency(signature, images)
    report["real_server"] = real_server_check(model_dir, model_name, first_outputs, serving_image)
    if report["real_server"]["status"] == "failed":
        problems.append(f"real TF Serving: {report['real_server']['reason']}")
    return _finish(report)


def _contract_problems(signature, report: dict) -> list[str]:
    """How the signature's names, dtypes and ranks break the serving contract; records its outputs."""
    import tensorflow as tf

    if signature is None:
        return [f"the SavedModel has no {SERVING_SIGNATURE} signature"]
    inputs = signature.structured_input_signature[1]
    spec = inputs.get(SERVING_INPUT)
    if spec is None or spec.dtype != tf.string or spec.shape.rank != 1 or len(inputs) != 1:
        return [f"{SERVING_SIGNATURE} must take one input {SERVING_INPUT!r} (string [N]), "
                f"takes {dict((k, (v.dtype.name, v.shape.as_list())) for k, v in inputs.items())}"]
    outputs = signature.structured_outputs
    report["signature"] = {name: {"dtype": t.dtype.name, "shape": t.shape.as_list()} for name, t in outputs.items()}
    problems = []
    for name, (dtype, rank) in SERVING_OUTPUTS.items():
        if name not in outputs:
            problems.append(f"{SERVING_SIGNATURE} has no output {name!r}")
        elif outputs[name].dtype.name != dtype or outputs[name].shape.rank != rank:
            problems.append(f"output {name!r} is {outputs[name].dtype.name} of rank {outputs[name].shape.rank}, "
                            f"expected {dtype} of rank {rank}")
    return problems


def _replay(signature, logs: list, problems: list[str]) -> tuple[list[bytes], tuple | None]:
    """Every warm-up request through the signature: all their images, and the first batch with its outputs."""
    import tensorflow as tf

    images: list[bytes] = []
    first_outputs = None
    for index, log in enumerate(logs):
        batch = warmup.request_images(log)
        images.extend(batch)
        out = {k: v.numpy() for k, v in signature(**{SERVING_INPUT: tf.constant(batch)}).items()}
        first_outputs = first_outputs or (batch, out)
        problems.extend(_answer_problems(out, len(batch), f"warm-up request {index + 1} (batch {len(batch)})"))
    return images, first_outputs


def _answer_problems(out: dict, n: int, where: str) -> list[str]:
    """What is wrong with one answer of n rows: shapes first, then finite probabilities, their sum and argmax."""
    import numpy as np

    probabilities = out["probabilities"]
    if probabilities.shape[0] != n or out["class_ids"].shape != (n,) or out["labels"].shape != (n,):
        return [f"{where}: output shapes {probabilities.shape}, {out['class_ids'].shape}, "
                f"{out['labels'].shape} do not match the batch"]
    if not np.all(np.isfinite(probabilities)):
        return [f"{where}: probabilities are not all finite"]
    problems = []
    sums = probabilities.sum(axis=1)
    if not np.allclose(sums, 1.0, atol=1e-3):
        problems.append(f"{where}: probabilities sum to {sums.min():.4f}..{sums.max():.4f}, not 1")
    if not np.array_equal(out["class_ids"], probabilities.argmax(axis=1)):
        problems.append(f"{where}: class_ids are not the most probable classes")
    return problems


def _latency(signature, images: list[bytes]) -> dict:
    """Median and worst milliseconds per call at each of LATENCY_BATCHES, cycling through `images`."""
    import tensorflow as tf

    latency = {}
    for size in LATENCY_BATCHES:
        batch = tf.constant([images[i % len(images)] for i in range(size)])
        signature(**{SERVING_INPUT: batch})  # the first call of a new batch size may trace
        times = []
        for _ in range(LATENCY_REPEATS):
            start = time.perf_counter()
            signature(**{SERVING_INPUT: batch})["probabilities"].numpy()
            times.append((time.perf_counter() - start) * 1000)
        latency[f"batch_{size}"] = {"median_ms": statistics.median(times), "max_ms": max(times)}
    return latency


def _finish(report: dict) -> dict:
    report["ok"] = not report["problems"]
    report.setdefault("real_server", {"status": "skipped", "reason": "the in-process check failed first"})
    return report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_server_check(model_dir: str, model_name: str, expected, serving_image: str | None) -> dict:
    """Serves the model with the real TF Serving on a loopback port and compares its REST answers."""
    binary = shutil.which("tensorflow_model_server")
    engine = not binary and serving_image and docker_engine()
    if not binary and not engine:
        return {"status": "skipped",
                "reason": "neither tensorflow_model_server nor a Docker engine is available on this machine"}
    port = _free_port()
    with tempfile.TemporaryDirectory() as base:
        os.symlink(os.path.abspath(model_dir), os.path.join(base, "1"))
        if binary:
            command = [binary, f"--rest_api_port={port}", "--port=0", f"--model_name={model_name}",
                       f"--model_base_path={base}"]
            how = "tensorflow_model_server"
        else:
            # A symlink does not survive a bind mount: mount the model itself as version 1.
            command = ["docker", "run", "--rm", "-p", f"127.0.0.1:{port}:8501",
                       "-v", f"{os.path.abspath(model_dir)}:/models/{model_name}/1:ro",
                       "-e", f"MODEL_NAME={model_name}", serving_image]
            how = serving_image
        server = processes.start(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}/v1/models/{model_name}"
        try:
            if not _wait_available(url, server, timeout=180):
                if server.poll() is not None and not binary:
                    return {"status": "skipped", "reason": f"could not start {how}: "
                            + server.stderr.read().decode(errors="replace")[-300:]}
                return {"status": "failed", "reason": f"{how} did not make the model available"}
            batch, outputs = expected
            predictions = rest_predict(url, batch)
            served = [p["probabilities"] for p in predictions]
            import numpy as np

            if not np.allclose(np.array(served), outputs["probabilities"], atol=1e-4):
                return {"status": "failed", "reason": f"{how} answered different probabilities than the SavedModel"}
            return {"status": "passed", "server": how, "url": url}
        except PredictError as exc:
            return {"status": "failed", "reason": str(exc)}
        finally:
            processes.stop(server, grace=30)


def _wait_available(url: str, server: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                states = [v.get("state") for v in json.loads(response.read()).get("model_version_status", [])]
                if "AVAILABLE" in states:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(1)
    return False


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serving_check", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", help="local SavedModel folder")
    parser.add_argument("--warmup", required=True, help="warm-up requests file (TFRecord of PredictionLog)")
    parser.add_argument("--model-name", default="stoke")
    parser.add_argument("--serving-image", default=None, help="tensorflow/serving image for the Docker check")
    args = parser.parse_args(argv)
    report = check(args.model_dir, args.warmup, args.model_name, args.serving_image)
    print(json.dumps(report, sort_keys=True, default=float), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
