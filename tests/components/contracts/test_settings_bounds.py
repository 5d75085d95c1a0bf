"""Settings that cannot work are refused as settings, before any work: non-finite numbers, absurd
sizes and model names that could leave ROOT/models."""
from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from beam_jobs import ingest
from components.contracts.config import GateConfig, IngestConfig, PushConfig, ShardCacheConfig, TrainConfig
from components.contracts.run_config import RunConfig, Timeouts, program_model
from components.contracts.stages import STAGES
from flows import cli

NON_FINITE = ["inf", "-inf", "nan", "Infinity", "1e308", "1e999"]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("flag", ["--shard-mb", "--max-megapixels", "--max-file-mb", "--blank-std"])
def test_ingest_refuses_non_finite_and_absurd_numbers_as_settings(tmp_path, capsys, flag, value):
    (tmp_path / "images").mkdir()
    code = ingest.run([str(tmp_path / "images"), "--root", str(tmp_path / "root"), f"{flag}={value}", "--json"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err.startswith(f"stoke ingest: error: {flag}: ") and "Traceback" not in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["published"] is False
    assert not (tmp_path / "root").exists()


def test_every_settings_model_refuses_nan_and_infinity():
    programs = [program_model(s) for s in STAGES]
    for model in (IngestConfig, TrainConfig, GateConfig, PushConfig, ShardCacheConfig, *programs, Timeouts, RunConfig):
        floats = [name for name, field in model.model_fields.items() if "float" in str(field.annotation)]
        for name in floats:
            base = {"root": "r", "source": "s", "run_id": "x"} if model is not Timeouts else {}
            base = {k: v for k, v in base.items() if k in model.model_fields}
            for value in (math.inf, math.nan):
                with pytest.raises(ValidationError):
                    model(**base, **{name: value})


@pytest.mark.parametrize("argv, words", [
    (["--set", "ingest.shard_mb=inf"], "ingest.shard_mb: "),
    (["--set", "ingest.max_megapixels=NaN"], "ingest.max_megapixels: "),
    (["--set", "train.learning_rate=Infinity"], "train.learning_rate: "),
    (["--set", "timeouts.train=1e999"], "timeouts.train: "),
    (["--model-name", "../../evil"], "model_name: "),
    (["--model-name", "a/b"], "model_name: "),
    (["--model-name", ""], "model_name: "),
])
def test_stoke_run_refuses_bad_settings_before_anything_runs(tmp_path, capsys, argv, words):
    (tmp_path / "images").mkdir()
    code = cli.main(["run", str(tmp_path / "images"), "--root", str(tmp_path / "root"), *argv, "--json"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith(f"stoke run: error: {words}") and "Traceback" not in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_the_flow_refuses_a_model_name_that_leaves_models(tmp_path, prefect_api):
    from flows.pipeline import pipeline

    state = pipeline(source=str(tmp_path), root=str(tmp_path / "root"), model_name="../../evil", preflight=None,
                     return_state=True)
    assert state.is_failed() and "bad model name '../../evil'" in str(state.result(raise_on_failure=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == []
