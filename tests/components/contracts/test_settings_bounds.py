"""Settings that cannot work are refused as settings, before any work: non-finite numbers, absurd
sizes and model names that could leave ROOT/models."""
from __future__ import annotations

import json
import math
import os
import re
import typing

import annotated_types
import pytest
from pydantic import ValidationError

from beam_jobs import ingest
from components.common import config_files
from components.common.program import stage_arguments
from components.common.program import stage_config as program_stage_settings
from components.contracts import config
from components.contracts.config import GateConfig, IngestConfig, PushConfig, ShardCacheConfig, TrainConfig
from components.contracts.layout import parse_spans
from components.contracts.run_config import RunConfig, RunFacts, Timeouts
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
    for model in (IngestConfig, TrainConfig, GateConfig, PushConfig, ShardCacheConfig, RunFacts, Timeouts, RunConfig):
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


def numbers(model, prefix=()):
    """(dotted path, field) of every int or float setting of `model`, groups walked into."""
    from components.common.config_files import leaves

    for path, field in leaves(model, prefix):
        kinds = {kind for kind in (field.annotation, *typing.get_args(field.annotation)) if kind in (int, float)}
        if kinds:
            yield ".".join(path), field


def test_every_number_of_every_settings_model_has_an_upper_bound():
    unbounded = [path for model in (RunConfig, RunFacts)
                 for path, field in numbers(model, (model.__name__,))
                 if not any(isinstance(rule, annotated_types.Le | annotated_types.Lt) for rule in field.metadata)]
    assert unbounded == []


ABSURD = [
    ("train.spans=1-999999999999", "train.spans: span 999999999999 in '1-999999999999' is past the "
                                   "highest span number, 999,999,999"),
    ("train.spans=1-999999999", "train.spans: span list '1-999999999' names 999,999,999 spans"),
    ("train.spans=1-100001", "train.spans: span list '1-100001' names 100,001 spans: at most 100,000"),
    ("train.spans=1-60000,60001-120000", "names 120,000 spans"),
    ("train.spans=0", "train.spans: bad span range '0'"),
    ("train.spans=5-3", "train.spans: bad span range '5-3'"),
    ("train.spans=1,,2", "train.spans: bad span list '1,,2'"),
    ("train.spans=" + "9" * 5000, "train.spans: span list of 5000 characters: at most 1000"),
    ("train.spans=" + "9" * 30, "train.spans: bad span list '999999999999999999999999999999'"),
    ("train.spans=" + ",".join(["1"] * 600), "train.spans: span list of 1199 characters"),
    ("train.epochs=100000000000000000000000000", "train.epochs: Input should be less than or equal to 100000"),
    ("train.epochs=1e26", "train.epochs: Unable to parse input string as an integer, exceeded maximum size"),
    ("train.image_size=100000", "train.image_size: Input should be less than or equal to 2048"),
    ("train.batch_size=1000000", "train.batch_size: Input should be less than or equal to 16384"),
    ("train.min_steps=1000000000000", "train.min_steps: Input should be less than or equal to 100000000"),
    ("train.steps_per_epoch=1000000000000", "train.steps_per_epoch: Input should be less than or equal to"),
    ("train.shuffle_buffer=10000000000", "train.shuffle_buffer: Input should be less than or equal to 1000000"),
    ("train.seed=18446744073709551616", "train.seed: Input should be less than or equal to 4294967295"),
    ("train.cpu_devices=100000", "train.cpu_devices: Input should be less than or equal to 256"),
    ("train.learning_rate=1e300", "train.learning_rate: Input should be less than or equal to 10"),
    ("train.trace_steps=20,10", "train.trace_steps: bad trace steps '20,10'"),
    ("train.trace_steps=1,1000000000000", "train.trace_steps: bad trace steps"),
    ("gate.top_k=10000000", "gate.top_k: Input should be less than or equal to 100000"),
    ("push.keep=10000000", "push.keep: Input should be less than or equal to 10000"),
    ("preflight.sample_mb=100000000", "preflight.sample_mb: Input should be less than or equal to 16384"),
    ("datacheck.min_class_examples=1000000000000", "datacheck.min_class_examples: Input should be less than or equal"),
    ("timeouts.train=1e300", "timeouts.train: Input should be less than or equal to 43200"),
]


@pytest.mark.parametrize("override, line", ABSURD)
def test_stoke_run_refuses_absurd_numbers_and_span_lists_when_it_reads_them(tmp_path, capsys, override, line):
    (tmp_path / "images").mkdir()
    code = cli.main(["run", str(tmp_path / "images"), "--root", str(tmp_path / "root"), "--set", override, "--json"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    (shown,) = captured.err.strip().splitlines()
    assert shown.startswith(f"stoke run: error: {line}") or line in shown, shown
    assert len(shown) < 600 and "Traceback" not in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


@pytest.mark.parametrize("settings", [{"spans": "1-999999999999"}, {"epochs": 10**26}, {"image_size": 100000},
                                      {"trace_steps": "0,5"}])
def test_the_train_program_refuses_them_from_its_settings_file_and_its_flags(tmp_path, settings):
    (tmp_path / "train.json").write_text(json.dumps({"root": str(tmp_path), "train": settings}))
    args = stage_arguments("train", ["--config", str(tmp_path / "train.json")])
    with pytest.raises(ValidationError, match=next(iter(settings))):
        program_stage_settings("train", args)
    flag, value = next(iter(settings.items()))
    args = stage_arguments("train", ["--root", str(tmp_path), f"--{flag.replace('_', '-')}={value}"])
    with pytest.raises(ValidationError, match=flag):
        program_stage_settings("train", args)


def test_a_span_list_is_bounded_before_any_span_is_counted():
    assert parse_spans("1-3,7, 5") == [1, 2, 3, 5, 7]
    assert parse_spans("all") is None and parse_spans(None) is None
    assert len(parse_spans("1-100000")) == config.MAX_SPANS_NAMED == 100_000
    with pytest.raises(ValueError, match="names 999,999,999 spans"):
        parse_spans("1-999999999")


def test_the_flow_refuses_an_unbounded_span_range_given_as_a_run_parameter(tmp_path, prefect_api):
    from flows.pipeline import pipeline

    state = pipeline(source=str(tmp_path), root=str(tmp_path / "root"), train={"spans": "1-999999999"},
                     preflight=None, return_state=True)
    assert state.is_failed() and "names 999,999,999 spans" in str(state.result(raise_on_failure=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


ROOTS = ["memory://x", "MEMORY://x", "simplecache::s3://bucket/root", "filecache::/tmp/x", "a/b::c",
         "blockcache::s3://bucket/root", "tar://root::file:///tmp/x.tar", "zip://root::file:///tmp/x.zip",
         "http://127.0.0.1:9/root", "https://example.com/root", "github://org/repo", "ftp://host/root",
         "reference://root", "local:///tmp/root", "s3a://bucket/root", "  s3://bucket/root", "",
         # a data: URL has no '//', and fsspec reads it as one all the same (read-only, in memory)
         "data:text/plain,x", "data:,x", "data:text/csv;base64,dXJpLGxhYmVsCg==", "DATA:,x"]


@pytest.mark.parametrize("root", ROOTS)
def test_a_root_no_other_process_can_write_is_refused_when_the_configuration_is_read(root, tmp_path, capsys):
    (tmp_path / "images").mkdir()
    code = cli.main(["run", str(tmp_path / "images"), "--root", root, "--json"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("stoke run: error: root: ") and "Traceback" not in captured.err
    assert line.endswith(f"name a local path, file://, s3:// or gs:// (got {root!r})"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


@pytest.mark.parametrize("source", ["memory://x", "simplecache::file:///tmp/x", "ftp://host/photos", "zip://x::/y.zip",
                                    "data:text/csv;base64,dXJpLGxhYmVsCi9ldGMvcGFzc3dkLHgK", "data:,x"])
def test_a_source_ingest_cannot_read_from_its_own_process_is_refused_alike(source, tmp_path, capsys):
    code = cli.main(["run", source, "--root", str(tmp_path / "root")])
    assert code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("stoke run: error: source: ") and "is not taken for SOURCE" in line
    assert "name a local path, file://, s3://, gs://, http:// or https://" in line and not (tmp_path / "root").exists()


@pytest.mark.parametrize("root, says", [
    ("memory://x", "'memory://x': memory:// is not taken for ROOT"),
    ("data:,x", "'data:,x': a data: URL is not taken for ROOT"),
    ("{tmp}/exp[1]/root", "ROOT {tmp}/exp[1]/root holds '[', which TensorFlow"),
])
def test_the_stage_programs_up_deploy_and_the_flow_refuse_them_alike(root, says, tmp_path, capsys, prefect_api,
                                                                       monkeypatch):
    from flows import work_pools
    from flows.pipeline import pipeline

    root, says = root.format(tmp=tmp_path), says.format(tmp=tmp_path)
    (tmp_path / "images").mkdir()
    assert ingest.run([str(tmp_path / "images"), "--root", root, "--json"]) == 2
    assert f"--root: {says}" in capsys.readouterr().err
    for name in ("preflight", "train", "gate", "push", "datacheck"):
        with pytest.raises(ValidationError, match=re.escape(says)):
            program_stage_settings(name, stage_arguments(name, ["--root", root, "--run-id", "r"]
                                                         if name in ("gate", "push") else ["--root", root]))
    assert cli.main(["up", "--source", str(tmp_path / "images"), "--root", root]) == 2
    monkeypatch.setenv(work_pools.POOL_ENV, "process")
    assert work_pools.main(["--source", str(tmp_path / "images"), "--root", root]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(": error: root: ")[0] for line in lines] == ["stoke up", "stoke deploy"], lines
    assert all(says in line for line in lines), lines
    state = pipeline(source=str(tmp_path / "images"), root=root, preflight=None, return_state=True)
    assert state.is_failed() and says in str(state.result(raise_on_failure=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


# TensorFlow's checkpoint reader, TF Serving's loader, Beam's file reads (the gate's TFMA) and fsspec's glob take
# these in a path for a pattern: `exp[1]` matches only `exp1`, a backslash escapes, `*` and `?` match a neighbour.
PATTERN_ROOTS = ["exp[1]/root", "e[x/root", "exp*/root", "exp?/root", "exp\\1/root"]


@pytest.mark.parametrize("name", PATTERN_ROOTS)
def test_a_root_read_as_a_pattern_is_refused_however_it_is_spelled(name, tmp_path, capsys, monkeypatch):
    (tmp_path / "images").mkdir()
    for root in (str(tmp_path / name), f"file://{tmp_path / name}", f"s3://bucket/{name}", f"gs://bucket/{name}"):
        assert cli.main(["run", str(tmp_path / "images"), "--root", root]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"stoke run: error: root: ROOT {root.removeprefix('file://')} holds "), line
        assert "TensorFlow reads as a pattern" in line and "rename the folder" in line, line
    # A relative ROOT is read below the working folder: TensorFlow is handed the whole path.
    (tmp_path / name).mkdir(parents=True)
    monkeypatch.chdir(tmp_path / name)
    assert cli.main(["run", str(tmp_path / "images"), "--root", "root"]) == 2
    assert f"root: ROOT {tmp_path / name}/root holds " in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / name)) == []


def test_the_refused_characters_are_patterns_to_tensorflow_and_beam(tmp_path):
    """Why a ROOT may not hold them: a checkpoint below `[1]` or a backslash is not found, and a shard below `*`
    or `?` is read together with its neighbour's. Braces and the rest are read as they are."""
    import tensorflow as tf
    from apache_beam.io.filesystems import FileSystems

    def restored(folder: str) -> float | None:
        prefix = tf.train.Checkpoint(v=tf.Variable(1.0)).write(str(tmp_path / folder / "ckpt"))
        into = tf.Variable(0.0)
        try:
            tf.train.Checkpoint(v=into).read(prefix).assert_consumed()
        except (tf.errors.NotFoundError, FileNotFoundError):
            return None
        return float(into.numpy())

    def matched(folder: str, neighbour: str) -> list[str]:
        for name in (folder, neighbour):
            (tmp_path / neighbour / name).mkdir(parents=True)
            (tmp_path / neighbour / name / "train.tfrecord").write_bytes(b"")
        shard = str(tmp_path / neighbour / folder / "train.tfrecord")
        return sorted(m.path for m in FileSystems.match([shard])[0].metadata_list)

    assert restored("exp[1]") is None and restored("exp\\1") is None
    assert len(matched("exp*", "expA")) == 2 and len(matched("exp?", "expB")) == 2
    assert [restored(name) for name in ("exp{1}", "exp]", "e x,~'")] == [1.0, 1.0, 1.0]
    assert matched("exp{1}", "exp1") == [str(tmp_path / "exp1" / "exp{1}" / "train.tfrecord")]
    assert config.check_root(str(tmp_path / "exp{1}" / "e x,~'")) == str(tmp_path / "exp{1}" / "e x,~'")


def test_the_shard_cache_and_the_temporary_folder_are_refused_alike(tmp_path, capsys, monkeypatch):
    """TensorFlow reads a bucket ROOT's shards, and loads its models, from copies in the shard cache and the
    temporary folder: a pattern there fails the same way, from the setting or from the environment."""
    import tempfile

    (tmp_path / "images").mkdir()
    argv = ["run", str(tmp_path / "images"), "--root", "s3://bucket/root"]
    assert cli.main([*argv, "--set", f"shard_cache.dir={tmp_path}/cache[1]"]) == 2
    assert capsys.readouterr().err.startswith(f"stoke run: error: shard_cache.dir: the shard cache {tmp_path}/cache[1] "
                                              "holds '['")
    for variable, folder, what in (("STOKE_CACHE_DIR", "cache?", "the shard cache"),
                                   ("TMPDIR", "tmp*", "the temporary folder")):
        with monkeypatch.context() as patched:
            patched.setenv(variable, str(tmp_path / folder))
            if variable == "TMPDIR":  # taken when it is a folder one can write to
                (tmp_path / folder).mkdir()
                patched.setattr(tempfile, "tempdir", None)
            assert cli.main(argv) == 2
            (line,) = capsys.readouterr().err.strip().splitlines()
            assert line.startswith(f"stoke run: error: {what} {tmp_path / folder} holds "), line
            assert variable in line
            with pytest.raises(config_files.ConfigError, match=f"^{what} .* holds "):
                program_stage_settings("train", stage_arguments("train", ["--root", "s3://bucket/root"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "tmp*"]


def test_the_roots_and_sources_it_takes(tmp_path):
    for root in (str(tmp_path), "relative/root", f"file://{tmp_path}", "s3://bucket/root", "gs://bucket/root",
                 f"{tmp_path}/exp{{1}}/a]b c", "data/root", "./data:x"):
        assert RunConfig(source=str(tmp_path), root=root).root == root
    for source in ("http://127.0.0.1:9/m.csv", "https://example.com/photos/", "s3://photos-bucket/photos", "gs://b_1/m.csv"):
        assert RunConfig(source=source, root=str(tmp_path)).source == source


@pytest.mark.parametrize("argv, says", [
    (["--port", "70000"], "argument --port: 70000 is not from 1 to 65535"),
    (["--port", "-1"], "argument --port: -1 is not from 1 to 65535"),
    (["--port", "http"], "argument --port: 'http' is not a whole number"),
    (["--poll-seconds", "nan"], "argument --poll-seconds: nan is not from 1 to 86400"),
    (["--poll-seconds", "inf"], "argument --poll-seconds: inf is not from 1 to 86400"),
    (["--poll-seconds", "0"], "argument --poll-seconds: 0 is not from 1 to 86400"),
])
def test_stoke_up_and_deploy_refuse_a_port_or_a_poll_out_of_bounds_before_anything_starts(argv, says, tmp_path,
                                                                                          capsys):
    from flows import work_pools

    for main, command in ((cli.main, ["up"]), (work_pools.main, [])):
        if argv[0] == "--port" and main is work_pools.main:
            continue
        with pytest.raises(SystemExit) as exited:
            main([*command, "--source", str(tmp_path), "--root", str(tmp_path / "root"), *argv])
        assert exited.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {says}")


@pytest.mark.parametrize("argv, says", [
    (["--timezone", "Mars/Phobos"], "--cron '0 2 * * *' --timezone 'Mars/Phobos': Invalid timezone"),
    (["--cron", "every night"], "--cron 'every night' --timezone 'UTC': Invalid cron string"),
])
def test_stoke_up_refuses_a_schedule_prefect_cannot_read_before_its_server_starts(argv, says, tmp_path, capsys,
                                                                                 monkeypatch):
    from tests.waiting import free_port

    for name in ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_SERVER_API_HOST", "PREFECT_SERVER_API_PORT"):
        monkeypatch.delenv(name, raising=False)  # set by `stoke up` for its server: undone after the test
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    port = free_port()
    code = cli.main(["up", "--source", str(tmp_path), "--root", str(tmp_path / "root"), "--port", str(port),
                     "--timezone", "UTC", *argv])
    assert code == 2
    assert capsys.readouterr().err.strip().startswith(f"stoke up: error: {says}")
    assert not (tmp_path / "home" / "stoke-server.log").exists()
