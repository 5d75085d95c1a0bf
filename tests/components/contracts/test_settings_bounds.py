"""Settings that cannot work are refused as settings, before any work: non-finite numbers, absurd
sizes and model names that could leave ROOT/models."""
from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from beam_jobs import ingest
from components.contracts.config import GateConfig, IngestConfig, PushConfig, TrainConfig
from flows import cli
from flows.parameters import SETTINGS, Timeouts

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
    for model in (IngestConfig, TrainConfig, GateConfig, PushConfig, *SETTINGS.values(), Timeouts):
        floats = [name for name, field in model.model_fields.items() if "float" in str(field.annotation)]
        for name in floats:
            base = {"root": "r", "source": "s", "run_id": "x"}
            base = {k: v for k, v in base.items() if k in model.model_fields}
            for value in (math.inf, math.nan):
                with pytest.raises(ValidationError):
                    model(**base, **{name: value})


@pytest.mark.parametrize("argv, words", [
    (["--shard-mb", "inf"], "--shard-mb: "),
    (["--max-megapixels", "nan"], "--max-megapixels: "),
    (["--learning-rate", "inf"], "--learning-rate: "),
    (["--model-name", "../../evil"], "--model-name: "),
    (["--model-name", "a/b"], "--model-name: "),
    (["--model-name", ""], "--model-name: "),
])
def test_stoke_run_refuses_bad_settings_before_anything_runs(tmp_path, capsys, argv, words):
    (tmp_path / "images").mkdir()
    code = cli.main(["run", str(tmp_path / "images"), "--root", str(tmp_path / "root"), *argv, "--json"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith(f"stoke run: error: {words}") and "Traceback" not in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_the_flow_refuses_a_model_name_that_leaves_models(tmp_path, prefect_api):
    from flows.train import train

    state = train(source=str(tmp_path), root=str(tmp_path / "root"), model_name="../../evil", preflight=None,
                  return_state=True)
    assert state.is_failed() and "bad model name '../../evil'" in str(state.result(raise_on_failure=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == []
