"""infra/beam/*.args: the runner options documented for `stoke ingest`, parsed by Beam, passed
through the ingest job's own command line untouched, and naming the worker image the training
Dockerfile builds (or the wheel `pip wheel` builds)."""
from __future__ import annotations

import glob
import os
import tomllib

import dockerfile
import pytest
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    SetupOptions,
    SparkRunnerOptions,
    StandardOptions,
    WorkerOptions,
)

from beam_jobs import ingest, job
from flows.demo import write_digits
from tests.infra.conftest import REPO, infra

RUNNERS = {"dataflow.args": "DataflowRunner", "dataflow-wheel.args": "DataflowRunner",
           "flink.args": "FlinkRunner", "spark.args": "SparkRunner"}
VERSION = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]["version"]


def read_args(name: str) -> list[str]:
    """What `$(grep -v '^#' FILE)` gives the shell: one flag per line, comments dropped."""
    return [line.strip() for line in open(infra("beam", name)) if line.strip() and not line.startswith("#")]


def test_every_runner_is_documented():
    assert {os.path.basename(p) for p in glob.glob(infra("beam", "*.args"))} == set(RUNNERS)


@pytest.mark.parametrize("name", sorted(RUNNERS))
def test_options_parse_with_nothing_left_over(name):
    args = read_args(name)
    assert all(" " not in a for a in args)  # survives the shell's word splitting
    options = PipelineOptions(args)
    known = options.get_all_options(drop_default=True)
    everything = options.get_all_options(drop_default=True, retain_unknown_options=True)
    assert set(everything) == set(known), f"unknown to Beam: {set(everything) - set(known)}"
    assert options.view_as(StandardOptions).runner == RUNNERS[name]


def worker_image_tag() -> str:
    text = open(infra("training", "Dockerfile")).read()
    stages = [c.value[2] for c in dockerfile.parse_string(text) if c.cmd == "FROM" and len(c.value) == 3]
    assert "beam-worker" in stages
    return f"stoke-beam-worker:{VERSION}"


@pytest.mark.parametrize("name", ["dataflow.args", "dataflow-wheel.args"])
def test_dataflow_options_pass_beams_own_checks(name):
    """Beam's validator for Dataflow, minus the part that asks GCS about the bucket (network)."""
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    options = PipelineOptions(read_args(name))
    validator = PipelineOptionsValidator(options, DataflowRunner())
    cloud, worker = options.view_as(GoogleCloudOptions), options.view_as(WorkerOptions)
    assert cloud.region and validator.validate_cloud_options(cloud) == []
    assert validator.validate_gcs_path(cloud, "temp_location") == []
    assert validator.validate_sdk_container_image_options(worker) == []
    assert validator.validate_worker_region_zone(worker) == []
    broken = PipelineOptions([*read_args(name), "--temp_location=/tmp/not-a-bucket", "--project=1234"])
    broken_cloud = broken.view_as(GoogleCloudOptions)
    assert validator.validate_gcs_path(broken_cloud, "temp_location") and validator.validate_cloud_options(broken_cloud)


def test_dataflow_runs_on_the_worker_image():
    options = PipelineOptions(read_args("dataflow.args"))
    assert options.view_as(WorkerOptions).sdk_container_image.endswith("/" + worker_image_tag())


def test_dataflow_wheel_is_the_one_pip_builds():
    options = PipelineOptions(read_args("dataflow-wheel.args"))
    assert options.view_as(SetupOptions).extra_packages == [f"dist/stoke-{VERSION}-py3-none-any.whl"]
    assert "python -m pip wheel --no-deps -w dist ." in open(infra("beam", "dataflow-wheel.args")).read()


@pytest.mark.parametrize("name, view, master", [("flink.args", FlinkRunnerOptions, "flink_master"),
                                                ("spark.args", SparkRunnerOptions, "spark_master_url")])
def test_flink_and_spark_start_the_worker_image(name, view, master):
    options = PipelineOptions(read_args(name))
    assert getattr(options.view_as(view), master)
    portable = options.view_as(PortableOptions)
    assert portable.environment_type == "DOCKER"
    assert portable.environment_config.endswith("/" + worker_image_tag())


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    write_digits(str(folder), limit=6)
    return str(folder)


@pytest.mark.parametrize("name", sorted(RUNNERS))
def test_stoke_ingest_hands_the_options_to_beam_untouched(name, digits, tmp_path, monkeypatch, capsys):
    """The real command line and driver (listing, staging), stopped where the runner would start."""
    seen = {}

    def runner_starts(chunks, staging, config, pipeline_args, *published):
        seen["options"] = job.pipeline_options(pipeline_args)
        seen["args"] = pipeline_args
        raise ingest.IngestError("stopped where the runner would start")

    monkeypatch.setattr(ingest, "run_pipeline", runner_starts)
    args = read_args(name)
    code = ingest.run([digits, "--root", str(tmp_path / "root"), "--shard-mb", "16", *args, "--json"])
    assert code == 1 and "stopped where the runner would start" in capsys.readouterr().err
    assert seen["args"] == args
    assert seen["options"].view_as(StandardOptions).runner == RUNNERS[name]
    assert not os.path.exists(tmp_path / "root" / "data" / "spans" / "span-00001" / "_MANIFEST.json")


def test_without_a_runner_ingest_stays_local():
    assert job.pipeline_options([]).view_as(StandardOptions).runner == "DirectRunner"
