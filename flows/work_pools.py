"""Where flow runs execute, chosen by one setting, STOKE_WORK_POOL:

    (unset)      `stoke up` serves the deployments and runs their flow runs in its own process
    process      a `prefect worker start --pool stoke` on a machine with Stoke installed runs them
    docker       a Docker worker starts each flow run in the training image, with the GPUs, a big
                 /dev/shm and unlimited locked memory (`docker run --gpus all --shm-size ...`)
    kubernetes   a Kubernetes worker starts each flow run as a Job in the training image, with a
                 GPU request; create the pool from infra/prefect/kubernetes-job-template.json

    stoke deploy --source S --root R [--parameters JSON] [--json]

registers train/nightly and watch-bucket/poll (flows/deployments.py, the same schedules and
trigger) to that pool, creating the pool when the server has none of that name. Only train/nightly
asks for GPUs: a poll that lists a bucket would otherwise hold one all day.
Also read: STOKE_WORK_POOL_NAME (default `stoke`), STOKE_IMAGE, STOKE_GPUS, STOKE_ROOT_VOLUME,
STOKE_DOCKER_NETWORK. Flow runs inherit the worker's Prefect settings (API URL, auth string);
anything else they need, such as bucket credentials, goes into the pool's `env` job variable.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flows.parameters import read_beam_args

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


def deploy(source: str, root: str, pool: WorkPool, base_job_template: dict | None = None,
           beam_args: str | None = None, **options) -> list[str]:
    """Creates the pool if missing and registers the deployments to it; returns their names.
    `beam_args`: the Beam runner options of the train deployment's ingest."""
    from flows.deployments import build_deployments
    from flows.parameters import BEAM_ARGS_ENV

    ensure_pool(pool, base_job_template)
    names = []
    for deployment in build_deployments(source, root, **options):
        training = deployment.flow_name == "train"
        env = {BEAM_ARGS_ENV: beam_args} if training and beam_args else None
        deployment.job_variables = pool.job_variables(gpu=training, env=env)
        deployment.apply(work_pool_name=pool.name)
        names.append(f"{deployment.flow_name}/{deployment.name}")
    return names


def ensure_pool(pool: WorkPool, base_job_template: dict | None = None) -> None:
    """Creates the pool with the given template, or the worker type's default; an existing pool is kept."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.utilities.asyncutils import run_coro_as_sync
    from prefect.workers.utilities import get_default_base_job_template_for_infrastructure_type

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_work_pool(pool.name)
        except ObjectNotFound:
            existing = None
        if existing is not None:
            if existing.type != pool.type:
                raise WorkPoolError(f"work pool {pool.name!r} exists with type {existing.type!r}, not {pool.type!r}; "
                                    "choose another STOKE_WORK_POOL_NAME")
            return
        template = base_job_template or run_coro_as_sync(
            get_default_base_job_template_for_infrastructure_type(pool.type)) or {}
        client.create_work_pool(WorkPoolCreate(name=pool.name, type=pool.type, base_job_template=template))


class WorkPoolError(RuntimeError):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stoke deploy", description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="bucket or folder to watch and train from")
    parser.add_argument("--root", required=True, help="artifact ROOT as the flow-run containers see it")
    parser.add_argument("--poll-seconds", type=float, default=60, help="how often watch-bucket lists SOURCE")
    parser.add_argument("--parameters", type=json.loads, default=None,
                        help="default parameters of train/nightly as JSON, e.g. '{\"train\": {\"epochs\": 30}}'; "
                             "a run or an arrival event overrides them key by key (a stage group as a whole)")
    parser.add_argument("--base-job-template", default=None,
                        help="JSON base job template for a new pool (e.g. infra/prefect/kubernetes-job-template.json)")
    parser.add_argument("--beam-args-file", default=None,
                        help="Beam runner options of the ingest, one a line (e.g. infra/beam/dataflow.args)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    try:
        pool = WorkPool.from_env()
        if pool is None:
            raise WorkPoolError(f"set {POOL_ENV} to one of {', '.join(POOL_TYPES)} (unset, `stoke up` serves the flows)")
        template = None
        if args.base_job_template:
            with open(args.base_job_template) as f:
                template = json.load(f)
        beam_args = read_beam_args(args.beam_args_file) if args.beam_args_file else None
        names = deploy(args.source, args.root, pool, template, beam_args, poll_seconds=args.poll_seconds,
                       train_parameters=args.parameters)
    except ValidationError as error:
        print(f"stoke deploy: error: {error.errors()[0]['loc'][0]}: {error.errors()[0]['msg']}", file=sys.stderr)
        return 1
    except (WorkPoolError, OSError, ValueError) as error:
        print(f"stoke deploy: error: {error}", file=sys.stderr)
        return 1
    summary = {"work_pool": pool.name, "type": pool.type, "deployments": names, "image": pool.image}
    print(json.dumps(summary, sort_keys=True) if args.json else
          f"registered {', '.join(names)} to work pool {pool.name} ({pool.type}); "
          f"start a worker: prefect worker start --pool {pool.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
