"""infra/k8s: every object valid against Kubernetes' schemas (bundled, offline), every reference
resolved, the TF_CONFIG the training Job builds parsed by the trainer's own logic, and ports,
paths, images and users equal to the code's."""
from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys

import kubernetes_validate
import pytest

from components.common import program
from components.common.serving import SERVING_VERSION
from components.contracts.layout import Root
from components.push import serving_image as serving
from components.train import placement
from flows import work_pools
from flows.commands import PREFECT_PORT
from tests.infra.conftest import find, infra, kustomization, pod_specs, read_env_file
from tests.infra.test_compose import flags

K8S_VERSION = "1.30.0"  # the oldest release the manifests promise to work on
EXTERNAL = {("Secret", "stoke-secrets")}  # made from the uncommitted .env, see config.yaml


def containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


def test_kustomization_lists_every_manifest():
    listed = set(kustomization()["resources"])
    present = {n for n in os.listdir(infra("k8s")) if n.endswith(".yaml") and n != "kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("version", [K8S_VERSION, kubernetes_validate.utils.latest_version()])
def test_every_object_is_valid_against_the_kubernetes_schema(objects, version):
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_schema_check_catches_a_misplaced_field(objects):
    job = json.loads(json.dumps(find(objects, "Job", "stoke-train")))
    job["spec"]["template"]["spec"]["completions"] = 2  # a Job field in the pod spec
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_every_referenced_object_exists(objects):
    names = {(o["kind"], o["metadata"]["name"]) for o in objects} | EXTERNAL
    for _obj, spec in pod_specs(objects):
        if "serviceAccountName" in spec:
            assert ("ServiceAccount", spec["serviceAccountName"]) in names
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
        claimed = {t["metadata"]["name"] for t in _obj["spec"].get("volumeClaimTemplates", [])}
        mounted = {v["name"] for v in spec.get("volumes", [])} | claimed
        for container in containers(spec):
            assert {m["name"] for m in container.get("volumeMounts", [])} <= mounted
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in names
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    assert ("Secret", ref["secretKeyRef"]["name"]) in names
                if "configMapKeyRef" in ref:
                    assert ("ConfigMap", ref["configMapKeyRef"]["name"]) in names
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in names
        for subject in binding["subjects"]:
            assert (subject["kind"], subject["name"]) in names


def test_external_secret_keys_are_in_env_example(objects):
    keys = read_env_file(infra(".env.example"))
    for _, spec in pod_specs(objects):
        for container in containers(spec):
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in keys
    command = "kubectl -n stoke create secret generic stoke-secrets --from-env-file=infra/.env"
    assert command in open(infra("k8s", "config.yaml")).read()


def test_services_select_pods_and_name_their_ports(objects):
    workloads = list(pod_specs(objects))
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matches = [(obj, spec) for obj, spec in workloads
                   if selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()]
        assert matches, f"Service {service['metadata']['name']} selects no pods"
        ports = {p["name"]: p["containerPort"] for _, spec in matches for c in spec["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert ports[port["targetPort"]] == port["port"]
    for obj, _spec in workloads:
        if obj["kind"] == "Deployment":
            assert obj["spec"]["selector"]["matchLabels"].items() <= obj["spec"]["template"]["metadata"]["labels"].items()


def test_images_pinned_users_unprivileged_gpus_requested(objects):
    for _obj, spec in pod_specs(objects):
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        for container in containers(spec):
            tag = container["image"].rpartition(":")[2]
            assert ":" in container["image"] and tag and tag != "latest", container["image"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for kind, name in (("Job", "stoke-train"), ("Deployment", "stoke-serving")):
        (container,) = find(objects, kind, name)["spec"]["template"]["spec"]["containers"]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    train = find(objects, "Job", "stoke-train")["spec"]["template"]["spec"]
    assert train["containers"][0]["image"] == work_pools.TRAINING_IMAGE
    assert find(objects, "Deployment", "stoke-prefect-worker")["spec"]["template"]["spec"]["containers"][0]["image"] \
        == work_pools.TRAINING_IMAGE
    shm = next(v for v in train["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"


def test_root_and_settings_agree_with_the_code(objects):
    config = find(objects, "ConfigMap", "stoke-config")["data"]
    assert config["PREFECT_API_URL"] == f"http://prefect-server:{PREFECT_PORT}/api"
    assert config["STOKE_ROOT"] == work_pools.ROOT_MOUNT
    find(objects, "PersistentVolumeClaim", work_pools.ROOT_VOLUME)
    assert "ReadWriteMany" in find(objects, "PersistentVolumeClaim", work_pools.ROOT_VOLUME)["spec"]["accessModes"]
    for _obj, spec in pod_specs(objects):
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                mounts = [m for c in spec["containers"] for m in c.get("volumeMounts", []) if m["name"] == volume["name"]]
                assert all(m["mountPath"] == work_pools.ROOT_MOUNT for m in mounts)
    worker = find(objects, "Deployment", "stoke-prefect-worker")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert worker[:3] == ["prefect", "worker", "start"]
    default = work_pools.WorkPool(type="kubernetes")
    assert worker[worker.index("--pool") + 1] == default.name and worker[worker.index("--type") + 1] == "kubernetes"


def test_serving_deployment_matches_the_code_and_the_images_health_check(objects):
    config = find(objects, "ConfigMap", "stoke-config")["data"]
    container = find(objects, "Deployment", "stoke-serving")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{serving.SERVING_IMAGE}:{SERVING_VERSION}-gpu"
    options = flags(container["command"])
    assert int(options["port"]) == serving.GRPC_PORT and int(options["rest_api_port"]) == serving.REST_PORT
    assert options["model_name"] == config["STOKE_MODEL_NAME"]
    assert options["model_base_path"] == Root(config["STOKE_ROOT"]).models(config["STOKE_MODEL_NAME"])
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"grpc": serving.GRPC_PORT, "http": serving.REST_PORT}
    import dockerfile

    rendered = serving.render_text(config["STOKE_MODEL_NAME"], [1], "2.21.0")
    health = [c for c in dockerfile.parse_string(rendered["Dockerfile"]) if c.cmd == "HEALTHCHECK"][0]
    assert ["CMD", *container["readinessProbe"]["exec"]["command"]] == list(health.value)


# ---------------------------------------------------------------- TF_CONFIG per pod


@pytest.fixture(scope="module")
def fake_stoke(tmp_path_factory):
    """A `stoke` on PATH that prints what it was started with: its argv and TF_CONFIG."""
    folder = tmp_path_factory.mktemp("bin")
    path = folder / "stoke"
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "print(json.dumps({'argv': sys.argv[1:], 'tf_config': os.environ.get('TF_CONFIG')}))\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(folder)


def start_pod(job: dict, index: int, objects: list[dict], path: str) -> dict:
    """Runs the Job's container command as the kubelet would for completion index `index`."""
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {"PATH": f"{path}:{os.environ['PATH']}", "JOB_COMPLETION_INDEX": str(index)}
    for source in container.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in container["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/job-name']":
            env[variable["name"]] = job["metadata"]["name"]  # the label Kubernetes puts on the Job's pods
    command = [sys.executable if part == "python3" else part for part in container["command"]]
    result = subprocess.run(command + container.get("args", []), env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_each_pod_builds_the_tf_config_multi_worker_training_expects(objects, fake_stoke):
    job = find(objects, "Job", "stoke-train")
    spec = job["spec"]
    workers = spec["completions"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == workers >= 2
    pod = spec["template"]["spec"]
    service = find(objects, "Service", pod["subdomain"])
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    (port,) = service["spec"]["ports"]
    env = {v["name"]: v.get("value") for v in pod["containers"][0]["env"]}
    assert int(env["WORKERS"]) == workers and env["WORKER_SERVICE"] == pod["subdomain"]
    assert int(env["WORKER_PORT"]) == port["port"]

    chiefs = []
    for index in range(workers):
        started = start_pod(job, index, objects, fake_stoke)
        cluster = placement.parse_tf_config(started["tf_config"])
        assert cluster == placement.Cluster(workers, "worker", index, _has_chief=False)
        assert placement.choose_strategy("auto", cluster, gpu_count=1) == "multi_worker"
        chiefs.append(cluster.is_chief)
        # Indexed Job pods are named <job>-<index>; with the Service as subdomain that is their DNS name.
        hosts = json.loads(started["tf_config"])["cluster"]["worker"]
        assert hosts == [f"{job['metadata']['name']}-{i}.{service['metadata']['name']}:{port['port']}" for i in range(workers)]
        argv = started["argv"]
        assert argv[0] == "train"
        config, facts = program.stage_config("train", program.stage_arguments("train", argv[1:]))  # every flag is the trainer's
        assert config.train.strategy == "multi_worker" and facts.run_id == job["metadata"]["name"]
        assert config.root == work_pools.ROOT_MOUNT
    assert chiefs == [True] + [False] * (workers - 1)  # exactly one chief writes the candidate


def test_a_broken_tf_config_would_be_refused(objects, fake_stoke):
    # The check above has teeth: the trainer's parser rejects a task index outside the cluster.
    job = json.loads(json.dumps(find(objects, "Job", "stoke-train")))
    started = start_pod(job, job["spec"]["completions"], objects, fake_stoke)
    with pytest.raises(ValueError, match="out of range"):
        placement.parse_tf_config(started["tf_config"])


def test_only_the_training_pods_reach_each_others_worker_port(objects):
    job = find(objects, "Job", "stoke-train")
    policy = find(objects, "NetworkPolicy", "stoke-train")
    pods = job["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods.items()
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [find(objects, "Service", "stoke-train")["spec"]["ports"][0]["port"]]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= pods.items() and "namespaceSelector" not in source


# ---------------------------------------------------------------- tf.data service


def data_service_args(container: dict) -> argparse.Namespace:
    """The data-service program's settings from a container's command, parsed by the program itself
    ($(POD_IP) as the kubelet expands it)."""
    from components.train import data_service

    command = container["command"]
    assert command[:3] == ["python3", "-m", "components.train.data_service"]  # PID 1 is the program: it gets SIGTERM
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    return data_service._parser().parse_args([part.replace("$(POD_IP)", "10.1.2.3") for part in command[3:]])


def data_service_pods(objects: list[dict]) -> list[tuple[dict, dict]]:
    return [(obj, spec) for obj, spec in pod_specs(objects)
            if obj["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "data-service"]


def test_data_service_is_wired_to_the_training_job_on_the_codes_ports(objects):
    from components.contracts.config import DISPATCHER_PORT, WORKER_PORT, check_service_address

    dispatcher = find(objects, "StatefulSet", "stoke-data-dispatcher")
    service = find(objects, "Service", "stoke-data-dispatcher")
    assert dispatcher["spec"]["serviceName"] == service["metadata"]["name"] and dispatcher["spec"]["replicas"] == 1
    (port,) = service["spec"]["ports"]
    assert port["port"] == DISPATCHER_PORT
    (container,) = dispatcher["spec"]["template"]["spec"]["containers"]
    args = data_service_args(container)
    assert args.role == "dispatcher" and args.port == DISPATCHER_PORT
    # Fault-tolerant: the work dir is a volume of its own, kept across restarts.
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == args.work_dir]
    assert mount["name"] in {t["metadata"]["name"] for t in dispatcher["spec"]["volumeClaimTemplates"]}
    worker = data_service_args(find(objects, "Deployment", "stoke-data-worker")["spec"]["template"]["spec"]["containers"][0])
    assert worker.role == "worker" and worker.port == WORKER_PORT
    assert check_service_address(worker.dispatcher) == f"grpc://{service['metadata']['name']}:{DISPATCHER_PORT}"
    assert args.host == worker.host == "10.1.2.3"  # each registers under its pod IP
    (train,) = find(objects, "Job", "stoke-train")["spec"]["template"]["spec"]["containers"]
    args = train["args"]
    assert args[args.index("--data-service") + 1] == f"grpc://{service['metadata']['name']}:{DISPATCHER_PORT}"


def test_data_service_serves_the_network_only_behind_its_network_policy(objects):
    pods = data_service_pods(objects)
    assert {obj["kind"] for obj, _ in pods} == {"StatefulSet", "Deployment"}
    policy = find(objects, "NetworkPolicy", "stoke-data-service")
    assert "Ingress" in policy["spec"]["policyTypes"]
    for obj, spec in pods:
        (container,) = spec["containers"]
        assert data_service_args(container).trusted_network is True
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        assert not spec.get("hostNetwork") and not spec.get("hostPID")  # the node's interfaces are not the pod's
        assert all("hostPort" not in p for p in container["ports"])
    for service in (o for o in objects if o["kind"] == "Service"):
        if service["spec"]["selector"].get("app.kubernetes.io/name", "").startswith("stoke-data-"):
            assert service["spec"].get("type", "ClusterIP") == "ClusterIP" and "externalIPs" not in service["spec"]
    for rule in policy["spec"]["ingress"]:  # peers only by pod labels: no addresses, no other namespaces
        assert all(set(source) == {"podSelector"} for source in rule["from"])


def test_data_service_pods_hold_no_secrets_and_cannot_write_their_image(objects):
    for obj, spec in data_service_pods(objects):
        name = obj["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False, name  # no token for the cluster's API
        assert not any(set(v) & {"secret", "projected"} for v in spec.get("volumes", [])), name
        (container,) = spec["containers"]
        assert "envFrom" not in container and not any("valueFrom" in v and "secretKeyRef" in v["valueFrom"]
                                                      for v in container["env"]), name
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False, name
        assert context["runAsNonRoot"] is True and context["capabilities"]["drop"] == ["ALL"], name
        assert spec["securityContext"]["runAsUser"] != 0
        scratch = next(v["name"] for v in spec["volumes"] if "emptyDir" in v)
        assert {"name": scratch, "mountPath": "/tmp"} in container["volumeMounts"], name
        assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] == "root")  # workers read ROOT


def test_data_service_workers_scale_on_cpu(objects):
    hpa = find(objects, "HorizontalPodAutoscaler", "stoke-data-worker")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "stoke-data-worker"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    worker = find(objects, "Deployment", "stoke-data-worker")["spec"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["requests"]["cpu"]  # utilization is measured against the request
    assert hpa["spec"]["minReplicas"] <= find(objects, "Deployment", "stoke-data-worker")["spec"]["replicas"]


def test_only_training_and_data_service_pods_reach_the_data_service(objects):
    from components.contracts.config import DISPATCHER_PORT, WORKER_PORT

    policy = find(objects, "NetworkPolicy", "stoke-data-service")
    selected = policy["spec"]["podSelector"]["matchLabels"]
    for kind, name in (("StatefulSet", "stoke-data-dispatcher"), ("Deployment", "stoke-data-worker")):
        assert selected.items() <= find(objects, kind, name)["spec"]["template"]["metadata"]["labels"].items()
    (rule,) = policy["spec"]["ingress"]
    assert sorted(p["port"] for p in rule["ports"]) == [DISPATCHER_PORT, WORKER_PORT]
    train = find(objects, "Job", "stoke-train")["spec"]["template"]["metadata"]["labels"]
    sources = [s["podSelector"]["matchLabels"] for s in rule["from"]]
    assert all("namespaceSelector" not in s for s in rule["from"])
    assert any(s.items() <= train.items() for s in sources) and selected in sources
