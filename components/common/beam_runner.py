"""The runner a Beam job of Stoke's runs on: a local job (DirectRunner, Beam's default) on Beam's FnApiRunner,
the runner the tests run it on; any other runner as Beam makes it from its name.

Beam 2.77's DirectRunner (apache_beam/runners/direct/direct_runner.py, SwitchingDirectRunner.run_pipeline) first
hands a batch job to its PrismRunner, whose binary it downloads from github.com as the job starts
(apache_beam/runners/portability/prism_runner.py, with no timeout), and runs it on the FnApiRunner only when that
fails. Offline the download fails at once; on a network that drops github.com's packets it waits without end;
with internet the job runs on Prism, which none of the ingest job's tuning of the FnApiRunner reaches (its data
plane flushed by size, its worker threads, progress counted on this process's threads: beam_jobs/job.py).
So a local job runs on the FnApiRunner, made as DirectRunner makes it (Stoke's jobs are batch jobs,
which DirectRunner hands the FnApiRunner: it keeps its older runner for streaming ones). Not `--runner FnApiRunner`:
that one reads `direct_num_workers` and `direct_running_mode` the same way, but Beam makes it without the job's
options, which DirectRunner puts in the provision info its workers are started with (the options a
multi_processing worker runs with).
"""
from __future__ import annotations


def runner_for(options):
    """The runner for Beam `options`: for DirectRunner, however it is named (`direct`, its module path, none
    at all), the FnApiRunner that DirectRunner falls back to, given `options` as it gives them; any other (the
    PrismRunner too, when asked for by name) as Beam's Pipeline makes it from its name (create_runner)."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle
    from apache_beam.runners.runner import create_runner

    runner = create_runner(options.view_as(StandardOptions).runner or StandardOptions.DEFAULT_RUNNER)
    if type(runner) is not SwitchingDirectRunner:
        return runner
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))
