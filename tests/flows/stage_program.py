"""A stand-in stage program for tests of flows/programs.py: prints, forks, hangs or fails on request.

    python -m tests.flows.stage_program ok|fail|hang PIDFILE
"""
import json
import subprocess
import sys
import time

mode, pidfile = sys.argv[1], sys.argv[2]
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
print(json.dumps({"done": True, "mode": mode}), flush=True)
print(json.dumps({**PROGRESS, "done": 2}), flush=True)  # an event after the summary is still no summary
