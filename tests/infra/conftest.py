"""Loading infra/ as the engines would: compose files interpolated from .env.example, every
Kubernetes object of the kustomization, Dockerfiles through BuildKit's own parser."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import urllib.request

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFRA = os.path.join(REPO, "infra")
BIN = os.path.dirname(sys.executable)


@contextlib.contextmanager
def prefect_server(env: dict, home, port: int):
    """`prefect server start` with ENV on 127.0.0.1:PORT, its log under HOME, until the block ends."""
    from components.common import processes
    from tests.waiting import wait_for

    log = open(home / "server.log", "wb")
    server = processes.start([os.path.join(BIN, "prefect"), "server", "start", "--host", "127.0.0.1",
                              "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _healthy(port) or server.poll() is not None, "the Prefect server", 120)
        assert server.poll() is None, (home / "server.log").read_text()[-3000:]
        yield env
    finally:
        processes.stop(server, 30)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def infra(*parts: str) -> str:
    return os.path.join(INFRA, *parts)


def read_env_file(path: str) -> dict[str, str]:
    values = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


_VARIABLE = re.compile(r"\$(?:(\$)|\{(\w+)(?:(:?[-?])([^}]*))?\}|(\w+))")


def interpolate(value, env: dict[str, str]):
    """Compose's interpolation: $$, ${X}, ${X:-default}, ${X-default}, ${X:?error}, ${X?error}, $X."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def replace(match):
        dollar, name, op, arg, bare = match.groups()
        if dollar:
            return "$"
        name = name or bare
        present = name in env and (env[name] != "" or op in ("-", "?"))
        if op in (":-", "-"):
            return env[name] if present else arg
        if op in (":?", "?"):
            if not present:
                raise KeyError(f"{name}: {arg}")
            return env[name]
        return env.get(name, "")

    return _VARIABLE.sub(replace, value)


def variables(text: str) -> list[tuple[str, str | None]]:
    """(name, operator) of every ${...} in a compose file's text."""
    return [(m.group(2) or m.group(5), m.group(3)) for m in _VARIABLE.finditer(text) if not m.group(1)]


def load_compose(*files: str, env: dict[str, str]) -> dict:
    """The files merged the way `docker compose -f a -f b` merges these (mappings deep, the rest replaced)."""
    merged: dict = {}
    for name in files:
        merge(merged, interpolate(yaml.safe_load(open(infra(name))), env))
    return merged


def merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def kustomization() -> dict:
    return yaml.safe_load(open(infra("k8s", "kustomization.yaml")))


def k8s_objects() -> list[dict]:
    objects = []
    for name in kustomization()["resources"]:
        objects += [doc for doc in yaml.safe_load_all(open(infra("k8s", name))) if doc]
    return objects


def run_tool(name: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """A linter installed with the test extra, next to this Python."""
    path = os.path.join(BIN, name)
    assert os.path.exists(path), f"{name} is missing: pip install -e '.[test]'"
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=60, **kwargs)


@pytest.fixture(scope="session")
def env_example() -> dict[str, str]:
    return read_env_file(infra(".env.example"))


@pytest.fixture(scope="session")
def compose(env_example) -> dict:
    return load_compose("compose.yaml", env=env_example)


@pytest.fixture(scope="session")
def objects() -> list[dict]:
    return k8s_objects()


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert matches, f"{kind}/{name} is referenced but not defined in infra/k8s"
    return matches[0]


def pod_specs(objects: list[dict]):
    """(object, pod spec) of every workload."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield obj, obj["spec"]["template"]["spec"]
