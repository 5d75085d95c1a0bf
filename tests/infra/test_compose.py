"""infra/compose.yaml: valid under the Compose Specification's schema, every reference resolved,
secrets only from .env, and its ports, paths, images and settings equal to the code's."""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
from importlib import resources

import dockerfile
import jsonschema
import pytest
import yaml

from components.common.serving import SERVING_VERSION
from components.contracts.layout import Root
from components.push import serving_image as serving
from flows import work_pools
from flows.cli import programs
from flows.commands import PREFECT_PORT
from tests.infra.conftest import INFRA, REPO, infra, interpolate, load_compose, run_tool, variables

SECRETS = {"PREFECT_API_AUTH_STRING", "POSTGRES_PASSWORD", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"}
ROOT_ONLY = {"init-volumes"}  # chowns the named volumes, then exits; documented in compose.yaml


def flags(command: list[str]) -> dict[str, str]:
    return dict(part[2:].split("=", 1) for part in command if part.startswith("--") and "=" in part)


@pytest.fixture(scope="module")
def schema():
    return json.loads(resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text())


@pytest.mark.parametrize("files", [("compose.yaml",), ("compose.yaml", "compose.gpu.yaml")])
def test_valid_under_the_compose_spec_schema(schema, env_example, files):
    document = load_compose(*files, env=env_example)
    jsonschema.validators.validator_for(schema)(schema).validate(document)


def test_schema_check_catches_a_misspelt_key(schema, compose):
    broken = json.loads(json.dumps(compose))
    broken["services"]["worker"]["depends"] = broken["services"]["worker"].pop("depends_on")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validators.validator_for(schema)(schema).validate(broken)


# Long one-line shell commands in health checks read better unbroken.
YAMLLINT = ("{extends: default, rules: {line-length: {max: 300}, document-start: disable, "
            "comments: {min-spaces-from-content: 1}, truthy: {check-keys: false}}}")


def test_yamllint_passes_every_yaml_file():
    files = [str(p) for p in pathlib.Path(INFRA).rglob("*.yaml")]
    assert len(files) >= 8
    result = run_tool("yamllint", "-f", "parsable", "-d", YAMLLINT, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_catches_a_duplicate_key_that_yaml_loaders_drop(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("services:\n  a:\n    image: busybox:1.37.0\n    image: busybox:latest\n")
    assert yaml.safe_load(path.read_text())["services"]["a"]["image"] == "busybox:latest"  # silently
    assert "key-duplicates" in run_tool("yamllint", "-f", "parsable", "-d", YAMLLINT, str(path)).stdout


def test_secrets_come_only_from_the_environment(env_example):
    text = open(infra("compose.yaml")).read()
    used = variables(text)
    for name, op in used:
        if name in SECRETS:
            assert op == ":?", f"{name} must be required (${{{name}:?...}}), never defaulted"
        else:
            assert op in (":-", "-") or name in env_example, f"{name} has no default and is not in .env.example"
    assert SECRETS <= {name for name, _ in used} <= set(env_example) | {n for n, op in used if op in (":-", "-")}
    with pytest.raises(KeyError, match="PREFECT_API_AUTH_STRING|POSTGRES_PASSWORD|MINIO"):
        load_compose("compose.yaml", env={})  # no .env: compose refuses, nothing runs with a default secret
    for value in env_example.values():
        if "change-me" in value:  # the placeholders are not pasted into the stack as defaults or values
            assert f"-{value}}}" not in text and f": {value}\n" not in text and f"={value}" not in text


def test_dotenv_is_never_committed():
    ignored = subprocess.run(["git", "check-ignore", "-q", "infra/.env"], cwd=REPO)
    assert ignored.returncode == 0
    tracked = subprocess.run(["git", "ls-files", "--", "*.env", ".env", "infra/.env"], cwd=REPO,
                             capture_output=True, text=True).stdout.split()
    assert tracked == []


def test_references_and_start_order(compose):
    services = compose["services"]
    declared = set(compose["volumes"])
    for name, service in services.items():
        for target, rule in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on undefined {target}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target}'s health, which has no check"
            if rule["condition"] == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} must be a one-shot"
        for mount in service.get("volumes") or []:
            source = mount.split(":")[0]
            assert source in declared, f"{name} mounts undeclared volume {source}"
        if service.get("restart") == "unless-stopped":
            assert "healthcheck" in service, f"long-running {name} has no health check"
    assert compose["volumes"][work_pools.ROOT_VOLUME]["name"] == work_pools.ROOT_VOLUME


def test_images_pinned_and_users_unprivileged(compose):
    for name, service in compose["services"].items():
        image = service["image"]
        tag = image.rpartition(":")[2]
        assert ":" in image and tag and tag != "latest", f"{name}: {image}"
        if name in ROOT_ONLY:
            continue
        user = str(service.get("user", "")).split(":")[0]
        assert user and user not in ("0", "root"), f"{name} runs as root"
    assert compose["services"]["serving"]["image"] == f"{serving.SERVING_IMAGE}:{SERVING_VERSION}"
    assert compose["services"]["worker"]["image"] == work_pools.TRAINING_IMAGE


def test_gpu_overlay_gives_the_worker_and_serving_all_gpus(env_example):
    both = load_compose("compose.yaml", "compose.gpu.yaml", env=env_example)
    for name in ("worker", "serving"):
        (device,) = both["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    assert both["services"]["serving"]["image"] == f"{serving.SERVING_IMAGE}:{SERVING_VERSION}-gpu"
    assert both["services"]["worker"]["shm_size"] == work_pools.SHM_SIZE  # the base file's flags are kept


def test_worker_runs_training_with_its_limits(compose):
    worker = compose["services"]["worker"]
    assert worker["shm_size"] == work_pools.SHM_SIZE
    assert worker["ulimits"] == {"memlock": -1, "stack": work_pools.STACK_BYTES}
    assert f"{work_pools.ROOT_VOLUME}:{work_pools.ROOT_MOUNT}" in worker["volumes"]
    assert worker["build"]["target"] == "training"
    stages = [c.value[2] for c in dockerfile.parse_file(infra("training", "Dockerfile")) if c.cmd == "FROM" and len(c.value) == 3]
    assert worker["build"]["target"] in stages
    context = os.path.normpath(os.path.join(INFRA, worker["build"]["context"]))
    assert context == REPO and os.path.join(context, worker["build"]["dockerfile"]) == infra("training", "Dockerfile")


def test_prefect_server_client_and_pool_agree_with_the_code(compose):
    services = compose["services"]
    server = services["prefect-server"]
    entry = server["entrypoint"]
    port = int(entry[entry.index("--port") + 1])
    assert port == PREFECT_PORT and f"{PREFECT_PORT}:{PREFECT_PORT}" in server["ports"][0]
    assert server["environment"]["PREFECT_SERVER_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert "@postgres:5432/" in server["environment"]["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
    auth = server["environment"]["PREFECT_SERVER_API_AUTH_STRING"]
    for name in ("worker", "deploy"):
        env = services[name]["environment"]
        assert env["PREFECT_API_URL"] == f"http://prefect-server:{PREFECT_PORT}/api"
        assert env["PREFECT_API_AUTH_STRING"] == auth  # clients send what the server checks
    worker = services["worker"]["entrypoint"]
    deploy = services["deploy"]["entrypoint"]
    assert deploy[:2] == ["stoke", "deploy"] and programs()["deploy"][0] == "flows.work_pools"
    pool = work_pools.WorkPool.from_env(services["deploy"]["environment"])
    assert worker[worker.index("--pool") + 1] == pool.name and worker[worker.index("--type") + 1] == pool.type
    assert deploy[deploy.index("--root") + 1] == work_pools.ROOT_MOUNT
    source = deploy[deploy.index("--source") + 1]
    bucket = services["minio-init"]["environment"]["STOKE_BUCKET"]
    assert source == f"s3://{bucket}/incoming" and "incoming/.keep" in services["minio-init"]["entrypoint"][-1]
    assert services["worker"]["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"


def test_serving_watches_the_model_repository_on_the_codes_ports(compose, env_example):
    service = compose["services"]["serving"]
    options = flags(service["command"])
    assert int(options["port"]) == serving.GRPC_PORT and int(options["rest_api_port"]) == serving.REST_PORT
    model = env_example["STOKE_MODEL_NAME"]
    assert options["model_name"] == model
    assert options["model_base_path"] == Root(work_pools.ROOT_MOUNT).models(model)
    assert {f"127.0.0.1:{p}:{p}" for p in (serving.GRPC_PORT, serving.REST_PORT)} <= set(service["ports"])
    assert f"{work_pools.ROOT_VOLUME}:{work_pools.ROOT_MOUNT}:ro" in service["volumes"]
    # The model folder it watches exists before the first push.
    assert f"mkdir -p {options['model_base_path']}" in compose["services"]["init-volumes"]["command"][-1]


def test_serving_health_check_is_the_serving_images(compose):
    rendered = serving.render_text(compose["services"]["serving"]["command"][2].split("=")[1], [1], "2.21.0")
    health = [c for c in dockerfile.parse_string(rendered["Dockerfile"]) if c.cmd == "HEALTHCHECK"][0]
    assert compose["services"]["serving"]["healthcheck"]["test"] == list(health.value)


def test_bucket_init_script_is_valid_shell(compose):
    for name in ("minio-init", "init-volumes", "check-secrets", "data-worker"):
        service = compose["services"][name]
        script = (service.get("entrypoint") or service["command"])[-1]
        assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0, name
        shlex.split(script)


def test_env_example_interpolates_every_value(env_example):
    text = yaml.safe_load(open(infra("compose.yaml")))
    assert "${" not in json.dumps(interpolate(text, env_example))


def test_the_stack_refuses_to_start_on_placeholder_secrets(compose, env_example):
    check = compose["services"]["check-secrets"]
    script = check["command"][-1]
    placeholders = subprocess.run(["sh", "-c", script], env=check["environment"], capture_output=True, text=True)
    assert env_example["POSTGRES_PASSWORD"] == "change-me" and placeholders.returncode == 1
    assert "change-me placeholder" in placeholders.stderr
    real = {name: "s3cret-" + name for name in check["environment"]}
    assert subprocess.run(["sh", "-c", script], env=real).returncode == 0
    services = compose["services"]

    def waits_for_check(name, seen=()):
        needs = set(services[name].get("depends_on") or {})
        return "check-secrets" in needs or any(waits_for_check(n, (*seen, n)) for n in needs - set(seen))

    assert all(waits_for_check(name) for name in services if name != "check-secrets")


def test_unauthenticated_services_do_not_follow_stoke_bind(env_example):
    opened = load_compose("compose.yaml", env={**env_example, "STOKE_BIND": "0.0.0.0"})["services"]
    assert all(port.startswith("0.0.0.0:") for port in opened["prefect-server"]["ports"] + opened["minio"]["ports"])
    assert all(port.startswith("127.0.0.1:") for port in opened["serving"]["ports"] + opened["tensorboard"]["ports"])


def data_service_argv(service: dict) -> list[str]:
    """The data-service program's arguments a service starts it with, as its process (PID 1) would get them."""
    entry = service["entrypoint"]
    command = shlex.split(entry[-1]) if entry[:2] == ["sh", "-c"] else entry
    if command[0] == "exec":
        command = command[1:]
    assert command[:3] == ["python3", "-m", programs()["data-service"][0]]  # the program itself, not a wrapper
    return [part.replace("$(hostname)", "data-worker-1") for part in command[3:]]


def test_data_service_runs_the_program_on_the_codes_ports_unpublished(compose):
    from components.contracts.config import DISPATCHER_PORT, WORKER_PORT, check_service_address
    from components.train import data_service

    services = compose["services"]
    dispatcher, worker = services["data-dispatcher"], services["data-worker"]
    assert programs()["data-service"][0] == "components.train.data_service"
    entry = data_service._parser().parse_args(data_service_argv(dispatcher))  # the program takes every flag
    assert entry.role == "dispatcher" and entry.port == DISPATCHER_PORT
    assert entry.work_dir.startswith(work_pools.ROOT_MOUNT + "/")  # kept across restarts
    assert f"{work_pools.ROOT_VOLUME}:{work_pools.ROOT_MOUNT}" in dispatcher["volumes"]
    command = data_service._parser().parse_args(data_service_argv(worker))
    assert command.role == "worker" and command.port == WORKER_PORT
    address = check_service_address(command.dispatcher)
    assert address == f"grpc://data-dispatcher:{DISPATCHER_PORT}" and entry.host == "data-dispatcher"
    assert f"grpc://127.0.0.1:{DISPATCHER_PORT}" in dispatcher["healthcheck"]["test"][-1]
    assert f"('127.0.0.1', {WORKER_PORT})" in worker["healthcheck"]["test"][-1]
    for service in (dispatcher, worker):
        assert "ports" not in service and service["profiles"] == ["data-service"]
        assert service["image"] == work_pools.TRAINING_IMAGE


def test_data_service_serves_the_network_only_on_an_internal_one_with_its_trainers(compose):
    from components.train import data_service

    services, networks = compose["services"], compose["networks"]
    trusting = {name for name, s in services.items() if "--trusted-network" in json.dumps(s.get("entrypoint"))}
    assert trusting == {"data-dispatcher", "data-worker"}
    for name in trusting:
        service = services[name]
        assert data_service._parser().parse_args(data_service_argv(service)).trusted_network is True
        assert "ports" not in service and "network_mode" not in service, name  # nothing published, not the host's
        assert service["networks"] == ["data-service"], name
    assert networks["data-service"]["internal"] is True
    members = {name for name, s in services.items() if "data-service" in (s.get("networks") or [])}
    assert members == trusting | {"worker"}  # and the Prefect worker, whose flow runs train through the service
    assert "default" in services["worker"]["networks"]  # which still reaches Prefect and the bucket


def test_data_service_containers_hold_no_secrets_and_cannot_write_their_image(compose):
    for name in ("data-dispatcher", "data-worker"):
        service = compose["services"][name]
        assert "environment" not in service and "env_file" not in service and "secrets" not in service, name
        assert service["read_only"] is True and "/tmp" in service["tmpfs"], name
        assert service["cap_drop"] == ["ALL"] and "no-new-privileges:true" in service["security_opt"], name
        assert str(service["user"]).split(":")[0] not in ("0", "root")
    worker = compose["services"]["data-worker"]
    assert f"{work_pools.ROOT_VOLUME}:{work_pools.ROOT_MOUNT}:ro" in worker["volumes"]  # reads ROOT, writes nothing
