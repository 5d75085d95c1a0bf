"""What a flow run may and may not be given: Beam options, job variables and the networks of code a run may
train belong to the deployment, and a run's parameters are laid over the deployment's (flows/pipeline.py
configure)."""
from __future__ import annotations

import os
import shlex

from components.common.config_files import read_option_file
from components.contracts.beam_options import BEAM_ARGS_ENV
from components.contracts.config import network_parts

# The demo's data and artifact ROOT, relative to where `make run` runs.
DEMO_SOURCE = ".stoke/demo/digits"
DEMO_ROOT = ".stoke/root"


def read_beam_args(path: str) -> str:
    """A Beam options file such as infra/beam/dataflow.args (one option a line, # comments)."""
    text = read_option_file(path, "--beam-args-file")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return " ".join(shlex.quote(line) for line in lines)


# The job variables a flow run may set (work pools): names and labels of what the worker creates,
# its output, how long it waits, and the GPUs a Kubernetes job asks for (bounded by the pool).
# Everything else (command, env, working_dir, image, volumes, networks, service account, the job
# manifest...) belongs to the deployment: `stoke deploy` fixes it in the pool's base job template
# (flows/work_pools.py lock_template), and the flow refuses a run that tries to set it.
OPEN_VARIABLES = frozenset({"name", "labels", "stream_output", "gpus", "finished_job_ttl",
                            "job_watch_timeout_seconds", "pod_watch_timeout_seconds", "auto_remove"})


def check_job_variables(variables: dict) -> None:
    """Refuses a flow run created with job variables outside OPEN_VARIABLES."""
    locked = sorted(set(variables or {}) - OPEN_VARIABLES)
    if locked:
        raise ValueError(f"this run sets the job variables {', '.join(locked)}, which belong to the deployment "
                         "(command, env, image, mounts and accounts are fixed by `stoke deploy`); a run may set "
                         f"only {', '.join(sorted(OPEN_VARIABLES))}")


# A network reference is code that runs with the worker's rights. It may come from the run configuration file,
# the command line and a deployment's definition, whose authors run code there anyway; a deployment run's
# parameters (`prefect deployment run -p`, the UI), which whoever may start a run sets, choose only among the
# networks of code the deployment lists (its own train.network and `stoke deploy --network`), or a built-in one
# or keras.applications' (Stoke's code and Keras', as any other setting is).
def check_network_choice(network: str | None, networks: list[str]) -> None:
    """Refuses a deployment run whose parameters choose a network of code its deployment does not list, or
    change that list; a run outside a deployment (`stoke run`) may name any."""
    registered = registered_parameters()
    if not registered:
        return
    listed = list(registered.get("networks") or [])
    if list(networks) != listed:
        raise ValueError("networks: the networks a run may choose belong to the deployment (`stoke deploy --network`); "
                         "a run cannot change them")
    own = (registered.get("train") or {}).get("network")
    if network is None or network_parts(network)[0] in ("builtin", "application") or network in (own, *listed):
        return
    choices = ", ".join(n for n in dict.fromkeys((own, *listed)) if n and network_parts(n)[0] in ("module", "file"))
    raise ValueError(f"train.network {network}: a run of this deployment may choose a built-in network, a "
                     "keras.applications one" + (f" or one of the networks it lists ({choices})" if choices else "")
                     + "; list more with `stoke deploy --network` (or `stoke up --network`)")


def refuse_webhook(webhook) -> None:
    """Refuses a deployment run whose parameters name an alerts webhook, after taking it out of the run's record: a
    webhook is the deployment's, kept as a secret in the notification block `stoke deploy` and `stoke up` register
    (flows/alerts.py), while Prefect keeps a run's parameters as they were given, in the clear; and alerts are sent
    by the deployment's automations, so one run's webhook would send nothing. (`stoke run` hands the flow its
    configuration's webhook, which Prefect records without it: the field is excluded from its JSON.)"""
    from prefect import get_client
    from prefect.runtime import deployment, flow_run

    if webhook is None or not deployment.id:
        return
    with get_client(sync_client=True) as client:
        given = client.read_flow_run(flow_run.id).parameters
        alerts = {key: value for key, value in (given.get("alerts") or {}).items() if key != "webhook"}
        client.update_flow_run(flow_run.id, parameters={**given, "alerts": alerts})
    raise ValueError("alerts.webhook: the webhook is the deployment's, given to `stoke deploy` or `stoke up` "
                     "(`--set alerts.webhook=URL`, or the configuration file), never to a run, whose parameters "
                     "Prefect keeps in the clear; it was taken out of this run's")


def run_job_variables() -> dict:
    """The job variables the running flow run was created with; {} outside a flow run."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return {}
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run.id).job_variables or {}


def deployment_beam_args() -> str:
    """The deployment's Beam options, one shell-quoted line: those `stoke deploy` registered with the
    deployment (its `env` job variable, which a run cannot change and the locked pool does not pass on),
    else those in the environment of the process running the flow (`stoke up`'s, or the worker's)."""
    return _registered_env().get(BEAM_ARGS_ENV) or os.environ.get(BEAM_ARGS_ENV, "")


def registered_parameters() -> dict:
    """The parameters the running flow run's deployment was registered with; {} outside a deployment."""
    registered = _deployment()
    return (registered.parameters or {}) if registered else {}


def _registered_env() -> dict:
    registered = _deployment()
    return ((registered.job_variables or {}).get("env") or {}) if registered else {}


def _deployment():
    from prefect import get_client
    from prefect.runtime import deployment

    if not deployment.id:
        return None
    with get_client(sync_client=True) as client:
        return client.read_deployment(deployment.id)
