"""The work-pool variant of the deployments: STOKE_WORK_POOL picks it; the Kubernetes template
renders, through the real Kubernetes worker's code, into a Job the Kubernetes schema accepts;
the Docker job variables are ones the Docker worker and docker-py take; `stoke deploy` registers
both deployments to the pool on a real Prefect server."""
from __future__ import annotations

import asyncio
import json
import uuid

import jsonschema
import kubernetes_validate
import pytest
from pydantic import ValidationError

from components.contracts.run_config import RunConfig
from flows import work_pools
from flows.work_pools import WorkPool
from tests.infra.conftest import find, infra, k8s_objects, load_compose, read_env_file

TEMPLATE = infra("prefect", "kubernetes-job-template.json")


@pytest.fixture(scope="module")
def template() -> dict:
    return json.load(open(TEMPLATE))


def test_one_setting_selects_the_pool():
    assert WorkPool.from_env({}) is None  # `stoke up` serves the flows itself
    assert WorkPool.from_env({"STOKE_WORK_POOL": " "}) is None
    pool = WorkPool.from_env({"STOKE_WORK_POOL": "kubernetes"})
    assert (pool.type, pool.name, pool.image, pool.gpus) == ("kubernetes", "stoke", work_pools.TRAINING_IMAGE, 1)
    pool = WorkPool.from_env({"STOKE_WORK_POOL": "docker", "STOKE_GPUS": "0", "STOKE_IMAGE": "r.io/stoke:1"})
    assert (pool.type, pool.gpus, pool.image) == ("docker", 0, "r.io/stoke:1")
    with pytest.raises(ValidationError):
        WorkPool.from_env({"STOKE_WORK_POOL": "slurm"})


def test_kubernetes_template_keeps_every_variable_the_worker_knows(template):
    from prefect_kubernetes.worker import KubernetesWorker

    default = KubernetesWorker.get_default_base_job_template()
    assert set(default["variables"]["properties"]) <= set(template["variables"]["properties"])
    assert set(default["job_configuration"]) == set(template["job_configuration"])
    pool = WorkPool(type="kubernetes")
    for gpu in (True, False):
        variables = pool.job_variables(gpu=gpu)
        jsonschema.validate(variables, template["variables"])
        assert set(variables) <= set(template["variables"]["properties"])


def render_job(template: dict, variables: dict) -> dict:
    """The Job manifest the Kubernetes worker would submit for one flow run."""
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, variables))
    config.prepare_for_flow_run(FlowRun(id=uuid.uuid4(), name="brave-otter", flow_id=uuid.uuid4()))
    return config.job_manifest


@pytest.mark.parametrize("gpu, gpus", [(True, 1), (False, 0)])
def test_kubernetes_flow_run_job_is_valid_and_asks_for_gpus(template, gpu, gpus):
    job = render_job(template, WorkPool(type="kubernetes").job_variables(gpu=gpu, env={"STOKE_BEAM_ARGS": "--a=1"}))
    kubernetes_validate.validate(job, "1.30.0", strict=False)
    # prefect-kubernetes insists on completions/parallelism inside the pod spec (its default
    # template has them there); the API server drops the two unknown fields with a warning.
    # Everything else must pass the strict schema.
    spec = job["spec"]["template"]["spec"]
    assert (spec.pop("completions"), spec.pop("parallelism")) == (1, 1)
    kubernetes_validate.validate(job, "1.30.0", strict=True)
    (container,) = spec["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == gpus
    assert container["image"] == work_pools.TRAINING_IMAGE
    # The image's entry point is `stoke train`; the flow run's own command must run instead.
    assert container["command"] == ["/usr/bin/env"] and container["args"][:3] == ["prefect", "flow-run", "execute"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    objects = k8s_objects()
    claim = next(v for v in spec["volumes"] if v["name"] == "root")["persistentVolumeClaim"]["claimName"]
    find(objects, "PersistentVolumeClaim", claim)
    find(objects, "ServiceAccount", spec["serviceAccountName"])
    assert {"name": "root", "mountPath": work_pools.ROOT_MOUNT} in container["volumeMounts"]
    assert next(v for v in spec["volumes"] if v["name"] == "shm")["emptyDir"]["medium"] == "Memory"


def test_docker_job_variables_are_ones_the_docker_worker_and_docker_py_take():
    import docker.types
    from prefect_docker.worker import DockerWorker, DockerWorkerJobConfiguration

    variables = WorkPool(type="docker").job_variables(gpu=True)
    default = DockerWorker.get_default_base_job_template()
    assert set(variables) <= set(default["variables"]["properties"])
    config = asyncio.run(DockerWorkerJobConfiguration.from_template_and_values(default, variables))
    assert config.image == work_pools.TRAINING_IMAGE
    create = dict(config.container_create_kwargs)
    assert create.pop("entrypoint") == ["/usr/bin/env"]
    host = docker.types.HostConfig(version="1.44", **create)  # docker-py's own conversion, no daemon
    assert host["ShmSize"] == 8 * 1024**3
    assert {u["Name"]: u["Hard"] for u in host["Ulimits"]} == {"memlock": -1, "stack": work_pools.STACK_BYTES}
    assert host["DeviceRequests"] == [{"Driver": "", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]
    assert "device_requests" not in WorkPool(type="docker").job_variables(gpu=False)["container_create_kwargs"]
    # Flow-run containers mount the volume the compose stack names stoke-root.
    compose = load_compose("compose.yaml", env=read_env_file(infra(".env.example")))
    volume, mount = config.volumes[0].split(":")
    assert compose["volumes"][volume]["name"] == volume and mount == work_pools.ROOT_MOUNT
    assert config.networks == [f"{compose['name']}_default"]  # where prefect-server and minio are


def test_process_pool_needs_no_job_variables():
    assert WorkPool(type="process").job_variables(gpu=True) == {}


def test_deploy_registers_both_deployments_to_the_pool(prefect_api, template, tmp_path):
    from prefect import get_client

    pool = WorkPool(type="kubernetes", name="stoke-k8s")
    options = "--runner=DataflowRunner --project=p"
    config = RunConfig(source="s3://bucket/incoming", root=work_pools.ROOT_MOUNT, preset="demo")
    names = work_pools.deploy(config, pool, template, options, poll_seconds=120)
    assert names == ["train/nightly", "watch-bucket/poll"]
    names_again = work_pools.deploy(config, pool, template, options)  # idempotent
    assert names_again == names
    with get_client(sync_client=True) as client:
        registered = client.read_work_pool("stoke-k8s")
        assert registered.type == "kubernetes"
        assert registered.base_job_template == work_pools.lock_template(template, pool, options)
        nightly = client.read_deployment_by_name("train/nightly")
        poll = client.read_deployment_by_name("watch-bucket/poll")
    assert nightly.work_pool_name == poll.work_pool_name == "stoke-k8s"
    assert nightly.job_variables["gpus"] == 1 and poll.job_variables["gpus"] == 0
    assert "image" not in nightly.job_variables and "root_claim" not in nightly.job_variables  # the pool fixes them
    # The flow reads the deployment's Beam options from here; the locked pool passes no env on.
    assert nightly.job_variables["env"] == {"STOKE_BEAM_ARGS": options} and "env" not in poll.job_variables
    assert nightly.parameters == {"source": "s3://bucket/incoming", "root": work_pools.ROOT_MOUNT, "preset": "demo",
                                  "skip_unchanged": True}
    assert nightly.entrypoint == "flows.pipeline.pipeline"
    assert nightly.schedules and poll.schedules  # the same schedules `stoke up` serves
    with pytest.raises(work_pools.WorkPoolError, match="exists with type 'kubernetes'"):
        work_pools.deploy(RunConfig(source="s3://bucket/incoming", root="/r"), WorkPool(type="docker", name="stoke-k8s"))


def test_stoke_deploy_without_the_setting_says_what_to_set(monkeypatch, capsys):
    monkeypatch.delenv("STOKE_WORK_POOL", raising=False)
    assert work_pools.main(["--source", "s3://photos/in", "--root", "/r"]) == 1
    assert "set STOKE_WORK_POOL to one of process, docker, kubernetes" in capsys.readouterr().err


ATTACKS = {"command": "sh -c 'touch /tmp/owned'", "env": {"STOKE_BEAM_ARGS": "--environment_config=sh",
           "LD_PRELOAD": "/tmp/x.so", "PYTHONPATH": "/tmp/evil"}, "working_dir": "/tmp/evil",
           "image": "evil:latest", "service_account_name": "admin", "namespace": "kube-system",
           "volumes": ["/:/host"], "privileged": True, "container_create_kwargs": {"privileged": True},
           "networks": ["host"], "image_pull_policy": "Always", "job_manifest": {}}


@pytest.mark.parametrize("kind", ["process", "docker", "kubernetes"])
def test_a_flow_run_cannot_override_what_the_deployment_fixes(kind, template):
    """Whoever may create a flow run passes job variables; the locked template leaves only names,
    labels, output and (bounded) GPUs to them: command, env, image, account and mounts are fixed."""
    from prefect.utilities.asyncutils import run_coro_as_sync
    from prefect.workers.utilities import get_default_base_job_template_for_infrastructure_type

    pool = WorkPool(type=kind)
    base = template if kind == "kubernetes" else run_coro_as_sync(
        get_default_base_job_template_for_infrastructure_type(kind))
    locked = work_pools.lock_template(base, pool, "--runner=DirectRunner")
    variables = set(locked["variables"]["properties"])
    assert variables <= work_pools.OPEN_VARIABLES, variables
    assert not variables & set(ATTACKS)
    config = worker_config(kind, locked, {**pool.job_variables(gpu=True), **ATTACKS})
    honest = worker_config(kind, locked, pool.job_variables(gpu=True))
    assert config == honest
    assert "touch" not in json.dumps(config) and "evil" not in json.dumps(config) and "admin" not in json.dumps(config)
    assert not config.get("env")  # no env in the job configuration: nothing for a run's env to merge into


def test_kubernetes_gpus_stay_per_deployment_and_bounded(template):
    locked = work_pools.lock_template(template, WorkPool(type="kubernetes", gpus=1), None)
    schema = locked["variables"]
    jsonschema.validate({"gpus": 0}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"gpus": 8}, schema)


def worker_config(kind: str, template: dict, variables: dict) -> dict:
    """The job configuration the pool's real worker code builds for one flow run."""
    if kind == "process":
        from prefect.workers.process import ProcessJobConfiguration as Config
    elif kind == "docker":
        from prefect_docker.worker import DockerWorkerJobConfiguration as Config
    else:
        from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration as Config
    config = asyncio.run(Config.from_template_and_values(template, variables))
    return json.loads(config.model_dump_json())


@pytest.mark.parametrize("gpu", [True, False])
def test_the_locked_kubernetes_template_still_renders_a_valid_job(template, gpu):
    pool = WorkPool(type="kubernetes")
    locked = work_pools.lock_template(template, pool, "--runner=DirectRunner")
    job = render_job(locked, {"gpus": 1 if gpu else 0, "env": {"PYTHONPATH": "/tmp/evil"}, "image": "evil:1"})
    spec = job["spec"]["template"]["spec"]
    spec.pop("completions"), spec.pop("parallelism")
    kubernetes_validate.validate(job, "1.30.0", strict=True)
    (container,) = spec["containers"]
    assert container["image"] == work_pools.TRAINING_IMAGE and int(container["resources"]["limits"]["nvidia.com/gpu"]) == int(gpu)
    assert "/tmp/evil" not in json.dumps(job)
    # The Beam options reach the flow from its deployment record, not from the Job's env.
    assert not [e for e in container["env"] if e["name"] in ("STOKE_BEAM_ARGS", "PYTHONPATH")]
