"""Beam's runner options belong to the deployment; a run may only size the runner it is given."""
import os
import shlex

import pytest

from components.contracts.beam_options import BEAM_ARGS_ENV, check_beam_args
from components.contracts.run_config import RunConfig
from flows.parameters import read_beam_args
from flows.pipeline import beam_options, pipeline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHELL = ["--environment_type=beam:env:harness_subprocess_python:v1", "--environment_config=touch {marker}"]


@pytest.mark.parametrize("arg", ["--environment_config=touch /tmp/x", "--runner=PortableRunner", "--num_workers",
                                 "10", "--experiments=use_runner_v2", "--temp_location=gs://other/tmp"])
def test_a_run_may_not_set_runner_environment_or_locations(arg):
    with pytest.raises(ValueError, match="not an option a run may set"):
        check_beam_args([arg])


def test_a_run_may_size_its_runner():
    assert check_beam_args(["--direct_num_workers=2", "--max_num_workers=8"]) == ["--direct_num_workers=2",
                                                                                    "--max_num_workers=8"]


def test_the_flow_refuses_a_command_in_its_parameters_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    state = pipeline(source=str(tmp_path / "images"), root=str(tmp_path / "root"), preflight=None, run_id="r1",
                     beam_args=[a.format(marker=marker) for a in SHELL], return_state=True)
    assert state.is_failed() and "not an option a run may set" in str(state.result(raise_on_failure=False))
    assert not marker.exists() and not (tmp_path / "root").exists()


def test_the_deployment_options_come_first_and_the_run_may_add_sizes(monkeypatch):
    options = read_beam_args(os.path.join(REPO, "infra", "beam", "dataflow.args"))
    monkeypatch.setenv(BEAM_ARGS_ENV, options)
    argv = beam_options(RunConfig(source="gs://bkt/in", root="gs://bkt/root", beam_args=["--max_num_workers=4"]))
    assert "--runner=DataflowRunner" in argv and argv[-1] == "--max_num_workers=4"
    assert argv[argv.index("--runner=DataflowRunner"):-1] == shlex.split(options)
    assert all(not a.startswith("#") for a in argv)


def test_a_run_may_not_ask_for_more_direct_workers_than_the_machine_has_cores():
    cores = os.cpu_count() or 1
    assert check_beam_args([f"--direct_num_workers={cores}"]) == [f"--direct_num_workers={cores}"]
    with pytest.raises(ValueError, match=f"direct_num_workers.*at most {cores}.*cores"):
        check_beam_args([f"--direct_num_workers={cores + 1}"])


@pytest.mark.parametrize("arg", [
    "--direct_num_workers=16000", "--direct_num_workers=0", "--direct_num_workers=-1", "--direct_num_workers=1e3",
    "--direct_num_workers=0x10", "--direct_num_workers= 2", "--direct_num_workers=", "--direct_num_workers=2.5",
    "--num_workers=100000", "--max_num_workers=100000", "--number_of_worker_harness_threads=100000",
    "--disk_size_gb=1000000", "--parallelism=100000", "--direct_running_mode=subprocess; sh",
    "--autoscaling_algorithm=ANY", "--machine_type=n1-standard-4 --environment_config=sh",
    "--worker_machine_type=$(sh)",
])
def test_run_sizes_are_bounded_and_well_formed(arg):
    with pytest.raises(ValueError, match="a run may set"):
        check_beam_args([arg])


def test_the_last_of_repeated_sizes_is_checked_too():
    with pytest.raises(ValueError, match="direct_num_workers"):
        check_beam_args(["--direct_num_workers=1", "--direct_num_workers=100000"])


def test_the_flow_refuses_an_oversized_run_before_anything_runs(tmp_path):
    state = pipeline(source=str(tmp_path / "images"), root=str(tmp_path / "root"), preflight=None, run_id="r1",
                     beam_args=["--direct_num_workers=100000"], return_state=True)
    assert state.is_failed() and "direct_num_workers" in str(state.result(raise_on_failure=False))
    assert not (tmp_path / "root").exists()
