"""The gate's log: TensorFlow's notices about its own callers (TFMA reads the results it wrote with
TensorFlow's deprecated record reader) are for STOKE_DEBUG=1, not for the run's log."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# The gate program, then a read of TFMA's kind, in one process: what the program set up holds for it.
PROGRAM = """
import sys
import tensorflow as tf
from components.gate.gate import run
print("gate exit code", run(["--root", sys.argv[1], "--run-id", "none"]), file=sys.stderr)
list(tf.compat.v1.python_io.tf_record_iterator(sys.argv[2]))
"""


@pytest.mark.parametrize("debug", [False, True])
def test_tensorflows_deprecation_notices_are_for_stoke_debug(tmp_path, debug):
    (tmp_path / "root").mkdir()
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    env = {key: value for key, value in os.environ.items() if key != "STOKE_DEBUG"}
    if debug:
        env["STOKE_DEBUG"] = "1"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "root"), str(tmp_path / "empty.tfrecord")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stoke gate: error: " in done.stderr and "gate exit code 1" in done.stderr  # its own line still shows
    assert ("tf_record_iterator (from tensorflow.python.lib.io.tf_record) is deprecated" in done.stderr) == debug, \
        done.stderr[-2000:]
