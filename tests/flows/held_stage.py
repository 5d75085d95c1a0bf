"""A stand-in stage program that holds on until it is stopped: it starts a child as Stoke's stages start
theirs (components/common/processes.py), writes its pid and the child's to $STOKE_TEST_PIDS, and waits.

    python -m tests.flows.held_stage --config FILE --json     (the arguments a stage gets; ignored)
"""
import os
import sys
import time

from components.common import processes

child = processes.start([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["STOKE_TEST_PIDS"] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}\n")
os.replace(os.environ["STOKE_TEST_PIDS"] + ".tmp", os.environ["STOKE_TEST_PIDS"])
time.sleep(600)
