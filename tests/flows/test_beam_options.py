"""Beam's runner options belong to the deployment; a run may only size the runner it is given."""
import os
import shlex

import pytest

from components.contracts.beam_options import BEAM_ARGS_ENV, check_beam_args, deployment_options
from flows.parameters import deployment_beam_args, read_beam_args
from flows.pipeline import pipeline
from tests.beam_jobs import images

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


def test_the_deployment_options_are_one_line_of_the_environment(monkeypatch):
    options = read_beam_args(os.path.join(REPO, "infra", "beam", "dataflow.args"))
    monkeypatch.setenv(BEAM_ARGS_ENV, options)
    assert deployment_beam_args() == options  # what the flow hands ingest in its environment
    argv = deployment_options(options)
    assert "--runner=DataflowRunner" in argv and argv == shlex.split(options)
    assert all(not a.startswith("#") for a in argv)


def test_ingest_takes_the_deployment_options_from_its_environment(tmp_path, monkeypatch, capsys):
    """Before its command line's, never on it (where `ps` shows them to every local user); an option given as
    two tokens stays an option with its value, never SOURCE; a line a shell cannot split is a settings error."""
    from beam_jobs.ingest import run

    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "a.png").write_bytes(images.rgb_png())
    argv = [str(tmp_path / "photos"), "--root", str(tmp_path / "root"), "--json"]
    monkeypatch.setenv(BEAM_ARGS_ENV, "--s3_session_token S3CRETTOKEN --runner=NoSuchRunner")
    assert run(argv) == 1  # the deployment's runner, which the run may not name
    printed = capsys.readouterr()
    assert "NoSuchRunner" in printed.err and "S3CRETTOKEN" not in printed.out + printed.err, printed.err
    monkeypatch.setenv(BEAM_ARGS_ENV, "--s3_session_token 'S3CRET")
    assert run(argv) == 2
    printed = capsys.readouterr()
    assert printed.err.startswith(f"stoke ingest: error: {BEAM_ARGS_ENV}: No closing quotation")
    assert printed.err.count("\n") == 1 and "S3CRET" not in printed.err


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
