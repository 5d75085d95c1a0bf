"""The train flow with a skewed arrival and a broken one: the skewed one trains with its warning, the
broken one (a label no span had) is held back, the run goes on with the other spans and its report says
what was held back; with no other span, the run ends skipped."""
from __future__ import annotations

import json
import shutil

from beam_jobs.ingest import run as ingest
from components.common.files import read_json
from components.common.spans import Spans
from components.contracts.config import GateConfig, PushConfig, TrainConfig
from components.contracts.layout import Root
from flows.demo import write_digits
from flows.pipeline import pipeline
from tests.beam_jobs import images
from tests.flows.conftest import TINY_BEAM, TINY_MODEL


def test_a_skewed_arrival_trains_a_broken_one_is_held_back_and_the_run_trains_on_the_rest(tmp_path):
    pool, source, root = tmp_path / "pool", tmp_path / "source", str(tmp_path / "root")
    write_digits(str(pool), limit=80)
    shutil.copytree(pool, source, ignore=lambda folder, names: [n for n in names if n.endswith(".png")
                                                                  and int(n[6:10]) >= 40])
    assert ingest([str(source), "--root", root, *TINY_BEAM]) == 0  # span 1: 40 digits, every class
    for name in ("zero", "one", "two", "three"):  # span 2, published by hand: four classes of ten
        for path in sorted((pool / name).glob("*.png")):
            shutil.copy(path, source / name / path.name)
    assert ingest([str(source), "--root", root, *TINY_BEAM]) == 0
    (source / "ten").mkdir()
    for path in sorted((pool / "eight").glob("*.png"))[4:]:  # the run's arrival: eights, in a folder "ten"
        shutil.copy(path, source / "ten" / path.name)

    state = pipeline(source=str(source), root=root, preflight=None, preset="demo", train=TrainConfig(**TINY_MODEL),
                     gate=GateConfig(min_accuracy=0.0), push=PushConfig(build_image=False),
                     beam_args=TINY_BEAM, run_id="held", return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["status"] == "pushed" and "Span 3 was held back" in summary["message"]
    run = Root(root).run("held")
    assert read_json(run.metrics)["spans"] == [1, 2]  # the skewed night trains
    report = read_json(run.report_json)
    first, skewed, broken = report["datacheck"]["spans"]  # spans 1 and 2 were ingested by hand: the run checked them
    assert (first["span"], first["status"] in ("ok", "warning")) == (1, True)
    assert (skewed["span"], skewed["status"]) == (2, "warning")
    (drift,) = [a for a in skewed["anomalies"] if a["kind"] == "label_drift"]
    assert drift["severity"] == "warning" and "; fewer 'five' (0 where " in drift["message"]
    assert (broken["span"], broken["status"]) == (3, "quarantined")
    assert [a["kind"] for a in broken["anomalies"] if a["severity"] == "error"] == ["new_label"]
    markdown = open(run.report_md).read()
    assert "## Data check" in markdown and "**Held back**" in markdown and drift["message"] in markdown
    assert "Span 2, against the spans the check let in (1): **warning**" in markdown
    assert "Let in with its warnings: span 2 is trained on" in markdown
    assert f"stoke spans release 3 --root {root}" in markdown and "![label mix](labels.png)" in markdown
    assert open(report["plots"]["labels"], "rb").read(4) == b"\x89PNG"


def test_a_first_span_quarantined_leaves_nothing_to_train_and_the_run_is_skipped(tmp_path):
    source, root = tmp_path / "source", str(tmp_path / "root")
    for label in ("cat", "dog"):
        (source / label).mkdir(parents=True)
        for seed in range(6):  # other bytes, one picture: the same dHash
            (source / label / f"{seed}.png").write_bytes(images.rgb_png(seed=seed + (10 if label == "dog" else 0)))
    state = pipeline(source=str(source), root=root, preflight=None, beam_args=TINY_BEAM, run_id="flood",
                     return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["status"] == "skipped", json.dumps(summary)
    assert "no span the data check let in to train on" in summary["message"]
    assert "span 1 is quarantined" in summary["message"]
    assert Spans(root).check_record(1).record.status == "quarantined"
    (check,) = read_json(Root(root).run("flood").report_json)["datacheck"]["spans"]
    assert [a["kind"] for a in check["anomalies"] if a["severity"] == "error"] == ["same_image_flood"]
