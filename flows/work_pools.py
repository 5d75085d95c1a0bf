"""Where flow runs execute, chosen by one setting, STOKE_WORK_POOL:

    (unset)      `stoke up` serves the deployments and runs their flow runs in its own process
    process      a `prefect worker start --pool stoke` on a machine with Stoke installed runs them
    docker       a Docker worker starts each flow run in the training image, with the GPUs, a big
                 /dev/shm and unlimited locked memory (`docker run --gpus all --shm-size ...`)
    kubernetes   a Kubernetes worker starts each flow run as a Job in the training image, with a
                 GPU request; create the pool from infra/prefect/kubernetes-job-template.json

    stoke deploy --source S --root R [--config FILE] [--set GROUP.FIELD=VALUE ...] [--network REF ...] [--json]

registers train/nightly and watch-bucket/poll (flows/deployments.py, the same schedules and
trigger) to that pool, creating the pool when the server has none of that name, and the alerts of
train/nightly (flows/alerts.py). Only train/nightly asks for GPUs: a poll that lists a bucket would
otherwise hold one all day.
Also read: STOKE_WORK_POOL_NAME (default `stoke`), STOKE_IMAGE, STOKE_GPUS, STOKE_ROOT_VOLUME,
STOKE_DOCKER_NETWORK. Flow runs inherit the worker's Prefect settings (API URL, auth string).
The pool's base job template is locked (lock_template): command, env, image, volumes, account and
the rest are fixed here, so whoever may start a flow run cannot choose them. A process flow run
inherits the worker's environment (bucket credentials go there); a Docker container or a
Kubernetes Job gets only Prefect's own settings from the worker (credentials: the image, a mounted
file, a workload identity, or envFrom in the template's job manifest).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from components.common import config_files
from components.common.config_files import ConfigError, read_option_file
from components.common.program import BAD_SETTINGS, printable
from components.contracts.beam_options import BEAM_ARGS_ENV
from components.contracts.run_config import RunConfig
from flows.parameters import OPEN_VARIABLES, read_beam_args

POOL_ENV = "STOKE_WORK_POOL"
POOL_TYPES = ("process", "docker", "kubernetes")
# The training image of infra/training/Dockerfile; tagged with the project's version, never `latest`.
TRAINING_IMAGE = "stoke-training:0.1.0"
ROOT_MOUNT = "/stoke/root"  # where containers see ROOT when it is a volume, not a bucket
ROOT_VOLUME = "stoke-root"  # the Docker volume / Kubernetes PersistentVolumeClaim holding it
SHM_SIZE = "8g"  # tf.data and Beam share memory through /dev/shm; Docker's 64 MB starves them
STACK_BYTES = 67108864
# The compose stack's network (project `stoke`): flow-run containers reach prefect-server and minio.
DOCKER_NETWORK = "stoke_default"


class WorkPool(BaseModel):
    """The pool the deployments go to and what their containers get."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["process", "docker", "kubernetes"] = Field(description="worker type of the pool")
    name: str = Field("stoke", min_length=1, description="work pool name")
    image: str = Field(TRAINING_IMAGE, description="image of the flow-run containers (docker, kubernetes)")
    gpus: int = Field(1, ge=0, description="GPUs per training flow run (docker: 0 or all; kubernetes: the request)")
    root_volume: str = Field(ROOT_VOLUME, description=f"volume or claim mounted at {ROOT_MOUNT}")
    network: str = Field(DOCKER_NETWORK, description="Docker network of the flow-run containers (docker)")

    @classmethod
    def from_env(cls, env: dict | None = None) -> WorkPool | None:
        """The pool STOKE_WORK_POOL names, or None: then `stoke up` serves the flows itself."""
        env = os.environ if env is None else env
        kind = (env.get(POOL_ENV) or "").strip()
        if not kind:
            return None
        values = {"type": kind, "name": env.get("STOKE_WORK_POOL_NAME"), "image": env.get("STOKE_IMAGE"),
                  "gpus": env.get("STOKE_GPUS"), "root_volume": env.get("STOKE_ROOT_VOLUME"),
                  "network": env.get("STOKE_DOCKER_NETWORK")}
        return cls(**{k: v for k, v in values.items() if v not in (None, "")})

    def job_variables(self, gpu: bool, env: dict | None = None) -> dict:
        """Job variables of one deployment; `gpu` for the flow that trains, `env` for its processes."""
        return {**self._infrastructure(gpu), **({"env": env} if env else {})}

    def _infrastructure(self, gpu: bool) -> dict:
        if self.type == "process":
            return {}
        if self.type == "docker":
            # The image's entry point is `stoke train`; the worker's command must run as given.
            create = {"entrypoint": ["/usr/bin/env"], "shm_size": SHM_SIZE, "ulimits": [
                {"name": "memlock", "soft": -1, "hard": -1},
                {"name": "stack", "soft": STACK_BYTES, "hard": STACK_BYTES}]}
            if gpu and self.gpus:
                # docker-py's DeviceRequest for `--gpus all`
                create["device_requests"] = [{"count": -1, "capabilities": [["gpu"]]}]
            return {"image": self.image, "volumes": [f"{self.root_volume}:{ROOT_MOUNT}"],
                    "networks": [self.network], "container_create_kwargs": create}
        return {"image": self.image, "gpus": self.gpus if gpu else 0, "root_claim": self.root_volume}


# Prefect substitutes any {{ placeholder }} from whatever job variables a run passes, and merges a
# run's `env` into a dict `env` of job_configuration whatever the schema says. So the lock fixes
# every variable outside OPEN_VARIABLES in job_configuration, removes it from the schema, and
# leaves job_configuration no `env` at all: the flow reads the deployment's Beam options from the
# deployment itself (flows/parameters.py deployment_beam_args).
_PLACEHOLDER = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")
_UNSET = object()  # a variable without value or default: Prefect drops its key from the configuration


def lock_template(template: dict, pool: WorkPool, beam_args: str | None) -> dict:
    """`template` with every variable outside OPEN_VARIABLES fixed to the train deployment's value
    (else its default) in job_configuration and removed from the variables schema."""
    fixed = pool.job_variables(gpu=True, env={BEAM_ARGS_ENV: beam_args} if beam_args else None)
    locked = copy.deepcopy(template)
    properties = locked["variables"].setdefault("properties", {})
    # As Prefect does: a variable without a value, or whose default is null, drops its key.
    values = {name: _UNSET if fixed.get(name, spec.get("default")) is None else fixed.get(name, spec.get("default"))
              for name, spec in properties.items() if name not in OPEN_VARIABLES}
    for name in values:
        del properties[name]
    if "required" in locked["variables"]:
        locked["variables"]["required"] = [n for n in locked["variables"]["required"] if n in properties]
    if "gpus" in properties:
        properties["gpus"] = {**properties["gpus"], "minimum": 0, "maximum": pool.gpus}
    locked["job_configuration"] = _fill(locked["job_configuration"], values)
    locked["job_configuration"].pop("env", None)
    return locked


def _fill(node, values: dict):
    """NODE with the placeholders of VALUES replaced: a whole-value placeholder by the value itself."""
    if isinstance(node, dict):
        filled = {key: _fill(value, values) for key, value in node.items()}
        return {key: value for key, value in filled.items() if value is not _UNSET}
    if isinstance(node, list):
        return [item for item in (_fill(value, values) for value in node) if item is not _UNSET]
    if not isinstance(node, str):
        return node
    whole = _PLACEHOLDER.fullmatch(node.strip())
    if whole and whole.group(1) in values:
        return values[whole.group(1)]

    def text(match: re.Match) -> str:
        value = values.get(match.group(1), match.group(0))
        return "" if value is None or value is _UNSET else str(value)
    return _PLACEHOLDER.sub(text, node)


def deploy(config: RunConfig, pool: WorkPool, base_job_template: dict | None = None,
           beam_args: str | None = None, **options) -> list[str]:
    """Creates the pool if missing, locks its template (lock_template) and registers the deployments
    to it, and their alerts (flows/alerts.py); returns their names. `beam_args`: the Beam runner options of
    the train deployment's ingest."""
    from flows.alerts import register
    from flows.deployments import NIGHTLY, build_deployments

    ensure_pool(pool, base_job_template, beam_args)
    names = []
    for deployment in build_deployments(config, **options):
        training = deployment.flow_name == "train"
        env = {BEAM_ARGS_ENV: beam_args} if training and beam_args else None
        deployment.job_variables = {key: value for key, value in pool.job_variables(gpu=training, env=env).items()
                                    if key in OPEN_VARIABLES or key == "env"}  # env: read by the flow only
        deployment.apply(work_pool_name=pool.name)
        names.append(f"{deployment.flow_name}/{deployment.name}")
    register(config, NIGHTLY)
    return names


def ensure_pool(pool: WorkPool, base_job_template: dict | None = None, beam_args: str | None = None) -> None:
    """Creates the pool with the given template, or the worker type's default, locked; an existing
    pool of the same type gets its template locked again (what an earlier deploy or a person loosened)."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound
    from prefect.utilities.asyncutils import run_coro_as_sync
    from prefect.workers.utilities import get_default_base_job_template_for_infrastructure_type

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_work_pool(pool.name)
        except ObjectNotFound:
            existing = None
        if existing is not None and existing.type != pool.type:
            raise WorkPoolError(f"work pool {pool.name!r} exists with type {existing.type!r}, not {pool.type!r}; "
                                "choose another STOKE_WORK_POOL_NAME")
        template = lock_template(base_job_template or run_coro_as_sync(
            get_default_base_job_template_for_infrastructure_type(pool.type)) or {}, pool, beam_args)
        if existing is None:
            client.create_work_pool(WorkPoolCreate(name=pool.name, type=pool.type, base_job_template=template))
        else:
            client.update_work_pool(pool.name, WorkPoolUpdate(base_job_template=template))


class WorkPoolError(RuntimeError):
    pass


def add_notifications_argument(parser: argparse.ArgumentParser) -> None:
    """`--notifications`, shared by `stoke deploy` and `stoke up`: a value naming no queue is a usage error."""
    from flows.notifications import NotificationError, checked

    def queue(value: str) -> str:
        try:
            return checked(value)
        except NotificationError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("--notifications ")) from None

    parser.add_argument("--notifications", type=queue, default=None, metavar="QUEUE",
                        help="read new objects from bucket notifications instead of listing SOURCE: "
                             "sqs://QUEUE_NAME (S3 events to SQS) or pubsub://projects/P/subscriptions/S (GCS to "
                             "Pub/Sub); the nightly run still lists all of SOURCE")


def main(argv: list[str] | None = None) -> int:
    from flows.run_options import (
        POLL_SECONDS_MAX,
        add_config_arguments,
        add_networks_argument,
        bounded,
        config_from,
        listed_networks,
    )

    parser = argparse.ArgumentParser(prog="stoke deploy", description=__doc__.split("\n")[0])
    add_config_arguments(parser, source="option")  # ROOT as the flow-run containers see it
    add_networks_argument(parser)
    parser.add_argument("--poll-seconds", type=bounded(float, 1, POLL_SECONDS_MAX), default=60,
                        help="how often watch-bucket lists SOURCE")
    parser.add_argument("--base-job-template", default=None,
                        help="JSON base job template for a new pool (e.g. infra/prefect/kubernetes-job-template.json)")
    parser.add_argument("--beam-args-file", default=None,
                        help="Beam runner options of the ingest, one a line (e.g. infra/beam/dataflow.args)")
    add_notifications_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    try:
        pool = WorkPool.from_env()
        if pool is None:
            raise WorkPoolError(f"set {POOL_ENV} to one of {', '.join(POOL_TYPES)} (unset, `stoke up` serves the flows)")
        template = None
        if args.base_job_template:
            template = _template(args.base_job_template)
        beam_args = read_beam_args(args.beam_args_file) if args.beam_args_file else None
        config = config_from(args)
        names = deploy(config, pool, template, beam_args, poll_seconds=args.poll_seconds,
                       notifications=args.notifications, networks=listed_networks(args))
    except ConfigError as error:  # the run configuration or a file an option names
        print(f"stoke deploy: error: {printable(str(error))}", file=sys.stderr)
        return BAD_SETTINGS
    except ValidationError as error:
        print(f"stoke deploy: error: {error.errors()[0]['loc'][0]}: {printable(error.errors()[0]['msg'])}",
              file=sys.stderr)
        return 1
    except (WorkPoolError, OSError, ValueError) as error:  # ValueError: a bad configuration too
        print(f"stoke deploy: error: {printable(str(error))}", file=sys.stderr)
        return 1
    from flows.alerts import described
    from flows.deployments import NIGHTLY

    summary = {"work_pool": pool.name, "type": pool.type, "deployments": names, "image": pool.image,
               "alerts": config.alerts.webhook is not None}
    print(json.dumps(summary, sort_keys=True) if args.json else
          f"registered {', '.join(names)} to work pool {pool.name} ({pool.type}); "
          f"start a worker: prefect worker start --pool {pool.name}\n{described(config, NIGHTLY)}", flush=True)
    return 0


def _template(path: str) -> dict:
    """The base job template a file holds: a JSON object."""
    text = read_option_file(path, "--base-job-template")
    try:
        template = config_files.loads(text, as_json=True)
    except ValueError as error:  # not JSON, or nested past plain data's bound
        raise ConfigError(f"--base-job-template {path} is not a JSON job template: {error}") from None
    if not isinstance(template, dict):
        raise ConfigError(f"--base-job-template {path} holds a {type(template).__name__}, not a JSON object")
    return template


if __name__ == "__main__":
    sys.exit(main())
