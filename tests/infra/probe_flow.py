"""A flow that records what its process was given: the environment and the command line."""
import json
import os
import sys

from prefect import flow


@flow(name="probe")
def probe(out: str) -> None:
    with open(out, "w") as f:
        json.dump({"env": {k: os.environ.get(k) for k in ("PROBE", "STOKE_BEAM_ARGS", "PYTHONPATH")},
                   "argv": sys.argv}, f)
