"""A stand-in stage program for tests of flows/programs.py: prints, forks, hangs or fails on request.

    python -m tests.flows.stage_program ok|fail|own-error|transient|crash|killed|hang|tensorflow PIDFILE

Each run appends a line to PIDFILE.runs, for tests that count retries.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

mode, pidfile = sys.argv[1], sys.argv[2]
tempfile.mkdtemp(prefix="stage-")  # as a library's temporary files: left for whoever cleans up after the program
with open(f"{pidfile}.runs", "a") as runs:
    runs.write(f"{mode}\n")
print("starting", flush=True)
print("Epoch 1/2", flush=True)
print("a line on stderr", file=sys.stderr, flush=True)
print(json.dumps({"not": "the summary"}), flush=True)
PROGRESS = {"event": "progress", "stage": "fake", "done": 1, "total": 2, "unit": "epochs", "seconds": 0.5}
print(json.dumps(PROGRESS), flush=True)
if mode == "hang":
    # A grandchild, as Beam's worker processes are: a timeout must take it down too.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(pidfile, "w") as f:
        f.write(str(child.pid))
    time.sleep(600)
if mode == "fail":
    print(json.dumps({"error": "the source is empty"}), flush=True)
    sys.exit(3)
if mode == "own-error":  # as components/common/program.py fails: its own line on stderr, and the JSON line
    print("stoke fake: checked 2 shards", file=sys.stderr, flush=True)
    print("Epoch 2/2", flush=True)
    print("stoke fake: error: the source is empty", file=sys.stderr, flush=True)
    print("cleaning up", flush=True)  # stdout after the error line: read on another thread, it may come first or last
    print(json.dumps({"error": "the source is empty"}), flush=True)
    sys.exit(1)
if mode == "tensorflow":  # TensorFlow's runtime looks for GPUs and says what it found
    import tensorflow as tf

    tf.config.list_physical_devices("GPU")
    print(json.dumps({"legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS")}), flush=True)
    sys.exit(0)
if mode == "transient":  # components/common/program.py TRANSIENT
    print(json.dumps({"error": "cannot reach S3 for bucket b (Connection reset by peer)"}), flush=True)
    sys.exit(75)
if mode == "killed":  # as the OOM killer ends a process
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "crash":
    raise RuntimeError("a bug's traceback: its last line is the reason")
print(json.dumps({"done": True, "mode": mode}), flush=True)
print(json.dumps({**PROGRESS, "done": 2}), flush=True)  # an event after the summary is still no summary
