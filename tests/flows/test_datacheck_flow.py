"""The train flow with a skewed arrival and a broken one: the skewed one trains with its warning, the
broken one (a label no span had) is held back, the run goes on with the other spans and its report says
what was held back; with no other span, the run ends skipped.

That run has SOURCE and ROOT on gs://, against a GCS emulator on 127.0.0.1, and is also the test of a
bucket ROOT on GCS: the same path as s3:// (TensorFlow's own GCS client cannot be pointed at an
emulator, so the shards go through the local cache). One run proves both: a whole flow run costs
about a minute of CPU, and neither behaviour depends on the other."""
from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from beam_jobs.ingest import run as ingest
from components.common.files import read_bytes, read_json
from components.common.repository import Repository
from components.common.spans import Spans
from components.contracts.config import GateConfig, PushConfig, ShardCacheConfig, TrainConfig
from components.contracts.layout import Root
from flows.demo import write_digits
from flows.pipeline import pipeline
from tests.beam_jobs import images
from tests.flows.conftest import TINY_BEAM, TINY_MODEL

SOURCE, ROOT = "gs://stoke-gcs/incoming", "gs://stoke-gcs/stoke"


def _land(files: list[Path], pool: Path, folder: str | None = None) -> None:
    """Uploads `files` of the local `pool` into SOURCE, each under its class folder (or `folder`): only
    those, since an object written again is a new generation, which ingest would read as new."""
    gs = fsspec.filesystem("gs")
    for path in files:
        gs.pipe_file(f"{SOURCE}/{folder or path.parent.name}/{path.name}", path.read_bytes())


@pytest.fixture(scope="module")
def held_run(gcs_endpoint, tmp_path_factory) -> dict:
    """Span 1 (40 digits, every class) and span 2 (four classes of ten: a skewed night), both published
    by hand and never checked; then the run, whose arrival is eights in a folder "ten" (a label no span
    had), with a floor any model passes."""
    pool = tmp_path_factory.mktemp("pool")
    write_digits(str(pool), limit=80)
    pngs = sorted(pool.glob("*/*.png"))
    _land([path for path in pngs if int(path.name[6:10]) < 40], pool)
    assert ingest([SOURCE, "--root", ROOT, *TINY_BEAM]) == 0  # span 1: 40 digits, every class
    _land([path for path in pngs if int(path.name[6:10]) >= 40
           and path.parent.name in ("zero", "one", "two", "three")], pool)  # span 2, published by hand
    assert ingest([SOURCE, "--root", ROOT, *TINY_BEAM]) == 0
    _land(sorted((pool / "eight").glob("*.png"))[4:], pool, folder="ten")  # the run's arrival

    state = pipeline(source=SOURCE, root=ROOT, preflight=None, preset="demo", train=TrainConfig(**TINY_MODEL),
                     gate=GateConfig(min_accuracy=0.0), push=PushConfig(build_image=False), beam_args=TINY_BEAM,
                     shard_cache=ShardCacheConfig(dir=str(tmp_path_factory.mktemp("shard-cache"))), run_id="held",
                     return_state=True)
    assert state.is_completed(), state.message
    return state.result()


def test_a_skewed_arrival_trains_a_broken_one_is_held_back_and_the_run_trains_on_the_rest(held_run):
    summary = held_run
    assert summary["status"] == "pushed" and "Span 3 was held back" in summary["message"]
    run = Root(ROOT).run("held")
    assert read_json(run.metrics)["spans"] == [1, 2]  # the skewed night trains
    report = read_json(run.report_json)
    first, skewed, broken = report["datacheck"]["spans"]  # spans 1 and 2 were ingested by hand: the run checked them
    assert (first["span"], first["status"] in ("ok", "warning")) == (1, True)
    assert (skewed["span"], skewed["status"]) == (2, "warning")
    (drift,) = [a for a in skewed["anomalies"] if a["kind"] == "label_drift"]
    assert drift["severity"] == "warning" and "; fewer 'five' (0 where " in drift["message"]
    assert (broken["span"], broken["status"]) == (3, "quarantined")
    assert [a["kind"] for a in broken["anomalies"] if a["severity"] == "error"] == ["new_label"]
    markdown = read_bytes(run.report_md).decode()
    assert "## Data check" in markdown and "**Held back**" in markdown and drift["message"] in markdown
    assert "Span 2, against the spans the check let in (1): **warning**" in markdown
    assert "Let in with its warnings: span 2 is trained on" in markdown
    assert f"stoke spans release 3 --root {ROOT}" in markdown and "![label mix](labels.png)" in markdown
    assert read_bytes(report["plots"]["labels"])[:4] == b"\x89PNG"


def test_a_gcs_root_is_trained_gated_and_pushed(held_run):
    version = held_run["pushed_version"]
    assert held_run["status"] == "pushed", held_run
    assert Repository(ROOT, "stoke").versions() == [version]
    assert fsspec.filesystem("gs").exists(f"stoke-gcs/stoke/models/stoke/{version}/saved_model.pb")
    run = Root(ROOT).run("held")
    assert read_json(run.metrics)["staging"]["fetched"] > 0  # the cache path, said in the run's summary
    serving = fsspec.filesystem("gs").cat_file("stoke-gcs/stoke/serving/models.bucket.config").decode()
    assert f'base_path: "{ROOT}/models/stoke"' in serving


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
