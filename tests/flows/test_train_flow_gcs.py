"""The `train` flow with SOURCE and ROOT on gs://, against a GCS emulator on 127.0.0.1: the same
path as s3:// (TensorFlow's own GCS client cannot be pointed at an emulator, so the shards go
through the local cache)."""
from __future__ import annotations

import fsspec

from components.common.files import read_json
from components.common.repository import Repository
from components.contracts.config import GateConfig, PushConfig, ShardCacheConfig, TrainConfig
from components.contracts.layout import Root
from flows.demo import write_digits
from flows.pipeline import pipeline
from tests.flows.conftest import TINY_BEAM, TINY_MODEL


def test_a_gcs_root_is_trained_gated_and_pushed(gcs_endpoint, tmp_path):
    write_digits("gs://stoke-gcs/incoming", limit=40)
    root = "gs://stoke-gcs/stoke"
    state = pipeline(source="gs://stoke-gcs/incoming", root=root, preflight=None, preset="demo",
                     train=TrainConfig(**TINY_MODEL), beam_args=TINY_BEAM, gate=GateConfig(min_accuracy=0.0),
                     push=PushConfig(build_image=False), shard_cache=ShardCacheConfig(dir=str(tmp_path)), run_id="gcs",
                     return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["status"] == "pushed", summary
    version = summary["pushed_version"]
    assert Repository(root, "stoke").versions() == [version]
    assert fsspec.filesystem("gs").exists(f"stoke-gcs/stoke/models/stoke/{version}/saved_model.pb")
    run = Root(root).run("gcs")
    assert read_json(run.metrics)["staging"]["fetched"] > 0  # the cache path, said in the run's summary
    serving = fsspec.filesystem("gs").cat_file("stoke-gcs/stoke/serving/models.bucket.config").decode()
    assert f'base_path: "{root}/models/stoke"' in serving
