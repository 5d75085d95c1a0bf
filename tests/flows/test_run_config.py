"""One run configuration: a file plus --set overrides reaches every stage program, the resolved
configuration is recorded before the first stage, and a rerun from the record resolves the same; a secret
setting (alerts.webhook) is in no record, parameter or line."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from components.common.files import read_json, read_result
from components.common.spans import Spans
from components.contracts.layout import Root
from components.contracts.results import GateResult, TrainMetrics
from components.contracts.run_config import RunConfig
from components.contracts.stages import STAGES
from components.contracts.summaries import DataCheckSummary, PushSummary
from flows.run_options import add_config_arguments, config_from
from tests.credentials import TOKEN, shows

BIN = os.path.dirname(sys.executable)


def test_the_file_and_the_overrides_reach_every_stage_program(pushed_run):
    run = Root(pushed_run["root"]).run("first")
    assert not os.path.exists(os.path.join(run.uri, "config"))  # every program read config.json, the one record
    assert read_json(run.config)["preflight"]["sample_mb"] == 4
    (manifest,) = Spans(pushed_run["root"]).manifests()
    assert manifest.settings["shard_mb"] == 8.0  # what ingest recorded it used
    datacheck = read_result(run.result("datacheck"), DataCheckSummary)
    assert not [a for c in datacheck.spans for a in c.anomalies if a.kind == "rare_class"]  # min_class_examples 1, not 5
    metrics = read_result(run.metrics, TrainMetrics)
    assert (metrics.network, metrics.image_size, metrics.batch_size) == ("small_cnn", 32, 8)  # preset demo, file
    assert metrics.steps_per_epoch == 3  # --set won over the file's 4
    gate = read_result(run.gate, GateResult)
    assert gate.thresholds.min_accuracy == 0.0 and gate.metrics.top_k == 3
    push = read_result(run.result("push"), PushSummary)
    assert push.image.built is False and "push.build_image" in push.image.reason
    assert read_json(run.config)["push"]["keep"] == 2


def test_the_resolved_configuration_is_recorded_before_the_first_stage(pushed_run):
    run = Root(pushed_run["root"]).run("first")
    recorded = RunConfig.model_validate(read_json(run.config))
    assert recorded.preset == "demo" and recorded.train.network == "small_cnn" and recorded.train.epochs == 1
    assert recorded.gate.min_accuracy == 0.0 and recorded.train.steps_per_epoch == 3
    for stage in STAGES:  # each program read it: written before the first result
        assert os.path.getmtime(run.config) <= os.path.getmtime(run.result(stage.name)), stage.name


def test_a_rerun_from_the_record_resolves_to_the_same_settings_elsewhere(pushed_run, tmp_path):
    run = Root(pushed_run["root"]).run("first")
    recorded = read_json(run.config)
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    other = str(tmp_path / "other-root")
    again = config_from(parser.parse_args([pushed_run["source"], "--root", other, "--config", run.config])).resolved()
    assert again.model_dump(mode="json") == {**recorded, "root": other}


def test_config_show_prints_a_file_that_config_takes_back(pushed_run, tmp_path):
    shown = subprocess.run([os.path.join(BIN, "stoke"), "config", "show", "--config", pushed_run["config_file"],
                            "--set", "train.epochs=5"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "# passes over the training split" in shown.stdout  # every setting under its help
    saved = tmp_path / "shown.yaml"
    saved.write_text(shown.stdout)
    again = subprocess.run([os.path.join(BIN, "stoke"), "config", "show", "--config", str(saved), "--json"],
                           capture_output=True, text=True, timeout=60)
    resolved = json.loads(again.stdout.strip().splitlines()[-1])
    assert resolved["train"]["epochs"] == 5 and resolved["train"]["network"] == "small_cnn"
    assert resolved["gate"]["top_k"] == 3 and resolved["source"] == "SOURCE"


@pytest.mark.parametrize("argv, line", [
    (["--set", "train.epoch=3"], "train.epoch: no such setting; did you mean train.epochs?"),
    (["--set", "trian.epochs=3"], "trian.epochs: no such setting; did you mean train?"),
    (["--set", "train.epochs=-1"], "train.epochs: Input should be greater than 0 (got -1)"),
    (["--set", "train.epochs=many"], "train.epochs: Input should be a valid integer, unable to parse string as an "
                                     "integer (got 'many')"),
    (["--set", "train.epochs.x=1"], "train.epochs.x: train.epochs is a single setting, not a group"),
    (["--set", "epochs"], "--set 'epochs': GROUP.FIELD=VALUE is needed, e.g. train.epochs=3"),
    (["--set", "gate.min_accuracy=1.5"], "gate.min_accuracy: Input should be less than or equal to 1 (got 1.5)"),
    (["--set", "model_name=../x"], "model_name: bad model name '../x': letters, digits, '_' and '-' "
                                   "only (1 to 64) (got '../x')"),
    (["--set", "beam_args=[\"--runner=DirectRunner\"]"], "beam_args: '--runner' is not an option a run"),
    (["--set", "runs.keep=5", "--set", "runs.keep_records=2"], "runs: keep_records (2) must be at least keep (5)"),
])
def test_a_bad_key_or_value_is_one_line_naming_its_path(argv, line, tmp_path):
    (tmp_path / "images").mkdir()
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", str(tmp_path / "images"), "--root",
                           str(tmp_path / "root"), *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    (shown,) = done.stderr.strip().splitlines()
    assert shown.startswith(f"stoke run: error: {line}"), shown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


@pytest.mark.parametrize("text, line", [
    ("train: [1, 2\n", "is not a YAML or JSON file of settings"),
    ("- 1\n- 2\n", "holds a list, not settings"),
    ("train:\n  epochs: 0\n", "train.epochs: Input should be greater than 0 (got 0)"),
    ("train:\n  wings: 2\n", "train.wings: no such setting"),
])
def test_a_bad_config_file_is_one_line(text, line, tmp_path):
    (tmp_path / "bad.yaml").write_text(text)
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", str(tmp_path), "--root", str(tmp_path / "root"),
                           "--config", str(tmp_path / "bad.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and line in done.stderr, done.stderr


def test_a_missing_config_file_is_one_line(tmp_path):
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", str(tmp_path), "--root", str(tmp_path / "root"),
                           "--config", str(tmp_path / "nowhere.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == f"stoke run: error: {tmp_path / 'nowhere.yaml'}: no such file"


def test_run_help_stays_short_and_says_where_every_setting_is():
    shown = subprocess.run([os.path.join(BIN, "stoke"), "run", "--help"], capture_output=True, text=True, timeout=60)
    options = [line for line in shown.stdout.splitlines() if line.lstrip().startswith("-")]
    assert len(options) <= 25 and "stoke config show" in shown.stdout


@pytest.mark.parametrize("stage", [s.name for s in STAGES])
def test_a_stage_answers_help_before_loading_tensorflow_or_beam(stage):
    code = (f"import sys; sys.argv = ['x', '--help']; import runpy\n"
            f"try:\n    runpy.run_module('{dict((s.name, s.program) for s in STAGES)[stage]}', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "heavy = [m for m in ('tensorflow', 'apache_beam', 'tensorflow_model_analysis') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in done.stdout, done.stdout[-500:] + done.stderr[-500:]
    assert "--config FILE" in done.stdout


def test_the_record_leaves_credentials_out():
    from flows.pipeline import recorded

    record = recorded(RunConfig(source="https://alice:s3cret@host.example/photos/in?pw=hunter2",
                                root="gs://my-bucket/root").resolved())
    assert "s3cret" not in json.dumps(record) and "hunter2" not in json.dumps(record)
    assert record["source"].startswith("https://alice:***@host.example/photos/in")
    assert record["train"]["network"] == "efficientnet_b0"
    # Keys in a bucket URI are no bucket name: refused as a setting, without the secret in the refusal.
    for source, root in [("s3://AKIAEXAMPLE:s3cret@photos/in", "/r"), ("/photos", "gs://user:s3cret@my-bucket/root")]:
        with pytest.raises(ValidationError) as refused:
            RunConfig(source=source, root=root)
        (error,) = refused.value.errors()
        assert "s3cret" not in error["msg"] and " bucket name: " in error["msg"]


@pytest.mark.parametrize("setting, given", [("root", {"root": "ROOT;token=abc"}),
                                             ("shard_cache", {"shard_cache": {"dir": "/tmp/cache;sig=1"}})])
def test_a_setting_the_record_would_hide_is_refused_before_anything_runs(tmp_path, setting, given):
    # The stages read config.json, which holds no credential: a setting it would hide sends them elsewhere.
    from flows.pipeline import ConfigurationError, configure

    defaults = {name: field.default for name, field in RunConfig.model_fields.items() if not field.is_required()}
    given = {**defaults, "source": str(tmp_path), "root": str(tmp_path / "root"), **given}
    given["root"] = given["root"].replace("ROOT", str(tmp_path / "root"))
    with pytest.raises(ConfigurationError, match=f"^{setting}: holds what reads as a credential") as refused:
        configure(**given)
    assert "abc" not in str(refused.value) and "sig=1" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_run_without_source_is_refused_though_a_stage_by_hand_may_go_without(tmp_path, capsys):
    from flows import cli

    assert cli.main(["run", "--root", str(tmp_path / "root"), "--json"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "stoke run: error: source: Field required"
    assert not (tmp_path / "root").exists()


def recorded_config(tmp_path, preset: str = "production") -> str:
    """A run's config.json: the resolved configuration, as the flow records it."""
    from flows.pipeline import recorded

    path = tmp_path / "config.json"
    path.write_text(json.dumps(recorded(RunConfig(source=str(tmp_path), root=str(tmp_path / "root"), preset=preset)
                                        .resolved())))
    return str(path)


HYBRID = "which holds the production preset's values already"


@pytest.mark.parametrize("argv", [["--preset", "cpu"], ["--set", "preset=demo"]])
def test_a_preset_over_a_recorded_configuration_is_refused(argv, tmp_path, capsys):
    """A recorded configuration is resolved: a preset laid over it would fill only what the recorded preset left
    unset, and put its own name on a run of the other's network, size and epochs."""
    from components.common import program
    from flows import cli

    path = recorded_config(tmp_path)
    for command in (["run", str(tmp_path), "--root", str(tmp_path / "root")], ["config", "show"]):
        assert cli.main([*command, "--config", path, *argv]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert HYBRID in line and "drop the preset" in line, line
    with pytest.raises(program.config_files.ConfigError, match=HYBRID):  # a stage program by hand
        program.stage_config("train", program.stage_arguments("train", ["--config", path, "--preset", "cpu"]))
    assert not (tmp_path / "root").exists()


def test_a_preset_over_a_deployment_of_a_recorded_configuration_is_refused(tmp_path, prefect_api, monkeypatch):
    """`stoke up --config runs/<id>/config.json` registers it; `prefect deployment run -p preset=cpu` then asks for
    the same hybrid."""
    from components.common.config_files import read_file
    from flows.pipeline import ConfigurationError, configure, pipeline
    from flows.run_options import given_fields

    registered = given_fields(RunConfig.model_validate(read_file(recorded_config(tmp_path))))
    deployment_id = pipeline.to_deployment(name="recorded", parameters=registered).apply()
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", str(deployment_id))  # as in a run of that deployment
    given = {**{name: field.default for name, field in RunConfig.model_fields.items() if not field.is_required()},
             "source": registered["source"], "root": registered["root"]}  # what Prefect hands the flow
    try:
        assert configure(**given).train.network == "efficientnet_b0"  # as registered
        with pytest.raises(ConfigurationError, match=HYBRID):
            configure(**{**given, "preset": "cpu"})
    finally:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)


def test_the_same_preset_or_a_file_of_ones_own_takes_the_preset(tmp_path):
    from components.common import program
    from components.contracts.config import TrainConfig

    path = recorded_config(tmp_path, preset="demo")
    same, _ = program.stage_config("train", program.stage_arguments("train", ["--config", path, "--preset", "demo"]))
    assert same.train == RunConfig(root="r", preset="demo").resolved().train
    (tmp_path / "mine.yaml").write_text("preset: production\ntrain:\n  network: resnet50\n  epochs: 3\n")
    mine, _ = program.stage_config("train", program.stage_arguments(
        "train", ["--config", str(tmp_path / "mine.yaml"), "--root", "r", "--preset", "cpu"]))
    assert mine.preset == "cpu"
    assert mine.train == RunConfig(root="r", preset="cpu", train=TrainConfig(network="resnet50", epochs=3)).resolved().train


def test_the_webhook_is_in_no_record_parameter_or_shown_configuration(tmp_path, capsys):
    from flows import cli
    from flows.deployments import build_deployments
    from flows.pipeline import recorded

    url = f"https://hooks.example/services/T0/B0/{TOKEN}"
    config = RunConfig(source=str(tmp_path), root=str(tmp_path / "root"), alerts={"webhook": url, "after": 4})
    assert config.alerts.webhook.get_secret_value() == url and not shows(repr(config))
    nightly, poll = build_deployments(config)
    assert nightly.parameters["alerts"] == {"after": 4}  # the deployment's, which Prefect keeps and shows
    assert not shows(json.dumps([nightly.parameters, poll.parameters, recorded(config.resolved())]))

    for json_or_yaml in (["--json"], []):
        assert cli.main(["config", "show", str(tmp_path), "--root", str(tmp_path / "root"), "--set",
                         f"alerts.webhook={url}", *json_or_yaml]) == 0
        out = capsys.readouterr().out
        assert "after" in out and not shows(out)


@pytest.mark.parametrize("value", [f"ftp://hooks.example/{TOKEN}", f"file:///tmp/{TOKEN}", f"hooks.example/{TOKEN}", f"https:///{TOKEN}",
                                   f"https://hooks.example/{TOKEN} x"])
def test_a_webhook_that_is_no_url_is_one_line_that_does_not_repeat_it(value, tmp_path, capsys, monkeypatch):
    from flows import cli, work_pools

    monkeypatch.setenv("STOKE_WORK_POOL", "process")
    given = [str(tmp_path), "--root", str(tmp_path / "root"), "--set", f"alerts.webhook={value}"]
    for command, argv in (("stoke config", ["config", "show", *given]), ("stoke run", ["run", *given]),
                          ("stoke up", ["up", "--source", *given]), ("stoke deploy", ["deploy", "--source", *given])):
        code = work_pools.main(argv[1:]) if command == "stoke deploy" else cli.main(argv)
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and line == (f"{command}: error: alerts.webhook: an http:// or https:// URL is needed, such "
                                      "as a chat's incoming webhook"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_row_counted_must_fit_in_the_records_kept():
    from components.common.config_files import ConfigError, build

    with pytest.raises(ConfigError, match=r"^alerts: after \(20\) must be at most runs.keep_records \(10\)"):
        build(RunConfig, {"root": "/r", "alerts": {"after": 20}, "runs": {"keep_records": 10}})
