"""The runner a Beam job of Stoke's runs on: a local job (DirectRunner, however it is spelt) on Beam's FnApiRunner,
given the job's options as DirectRunner gives them, and never on the PrismRunner, whose binary DirectRunner would
download from github.com as the job starts; a runner asked for by name otherwise, as Beam makes it."""
from __future__ import annotations

import pytest

from components.common.beam_runner import runner_for
from tests.prism import prism_tried

DIRECT = ["DirectRunner", "direct", "DIRECT", "directrunner", "SwitchingDirectRunner",
          "apache_beam.runners.direct.DirectRunner", "apache_beam.runners.direct.direct_runner.DirectRunner"]
# Runners named for what they are, each made as Beam makes it: the PrismRunner too, asked for by name.
NAMED = {"PrismRunner": "PrismRunner", "prism": "PrismRunner", "FnApiRunner": "FnApiRunner",
         "BundleBasedDirectRunner": "BundleBasedDirectRunner", "PortableRunner": "PortableRunner",
         "FlinkRunner": "FlinkRunner", "SparkRunner": "SparkRunner", "DataflowRunner": "DataflowRunner"}


def options_given_to_workers(runner) -> dict:
    """The options the runner's provision service hands the workers it starts (a multi_processing worker
    reads them there), by name."""
    from apache_beam.runners.job import utils as job_utils

    given = job_utils.struct_to_dict(runner._provision_info.provision_info.pipeline_options)
    return {key.removeprefix("beam:option:").removesuffix(":v1"): value for key, value in given.items()}


@pytest.mark.parametrize("args", [[], *([f"--runner={name}"] for name in DIRECT), ["--runner", "direct"],
                                  ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
                                  ["--runner=DirectRunner", "--direct_running_mode=in_memory"]])
def test_a_local_job_runs_on_beams_fnapi_runner_with_its_options(args):
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
    from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

    options = PipelineOptions([*args, "--job_name=stoke-ingest"])
    runner = runner_for(options)
    assert type(runner) is FnApiRunner
    given = options_given_to_workers(runner)
    direct = options.view_as(DirectOptions)
    assert given["job_name"] == "stoke-ingest"
    assert (given["direct_running_mode"], given["direct_num_workers"]) == (direct.direct_running_mode,
                                                                           str(direct.direct_num_workers))


@pytest.mark.parametrize("name", sorted(NAMED))
def test_a_runner_asked_for_by_name_is_the_one_beam_makes(name):
    from apache_beam.options.pipeline_options import PipelineOptions

    assert type(runner_for(PipelineOptions([f"--runner={name}"]))).__name__ == NAMED[name]


def test_beams_own_direct_runner_tries_prism_first_and_a_local_job_never_does(monkeypatch):
    """Why a local job is handed to the FnApiRunner itself (components/common/beam_runner.py), and that
    `prism_tried` sees a job that tries Prism: when a Beam upgrade stops DirectRunner trying it first, this
    fails and says so."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    def job(runner):
        with beam.Pipeline(runner=runner, options=PipelineOptions([])) as pipeline:
            assert_that(pipeline | beam.Create([-1, 2]) | beam.Map(abs), equal_to([1, 2]))

    tried = prism_tried(monkeypatch)
    job("DirectRunner")
    assert len(tried) == 1, "Beam's DirectRunner no longer tries the PrismRunner first: a local job may use it"
    job(runner_for(PipelineOptions([])))
    assert len(tried) == 1
