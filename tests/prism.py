"""What tells a test that a Beam job of its process tried the PrismRunner (components/common/beam_runner.py says
why none may)."""
from __future__ import annotations


def prism_tried(monkeypatch) -> list:
    """Makes the PrismRunner fail wherever a job of this process would run on it (DirectRunner then falls back
    to the FnApiRunner, and the job still succeeds) and returns the list of the pipelines it was handed: empty
    while no job tried it."""
    from apache_beam.runners.portability.prism_runner import PrismRunner

    tried = []

    def refused(_runner, pipeline, _options):
        tried.append(pipeline)
        raise RuntimeError("a local job tried the PrismRunner")

    monkeypatch.setattr(PrismRunner, "run_pipeline", refused)
    return tried
