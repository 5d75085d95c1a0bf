"""The environment a model is trained in, as its lineage keeps it: Python, the libraries that shape the
model (TensorFlow, tf_keras, Beam, TFMA, numpy, Pillow), CUDA and cuDNN as TensorFlow was built with them,
the GPU driver, and the packages: the lock they were installed from (`make lock` writes them), by its
SHA-256, and whatever is installed beside it; installed without a lock, the SHA-256 of the installed set.
"""
from __future__ import annotations

import hashlib
import platform
import re
from importlib import metadata
from pathlib import Path

from components.common.nvml import nvml_session, query
from components.contracts.results import Environment

# The locks beside the code (the repository's root, where `make install` and the images install Stoke
# editable from). The test lock holds the runtime lock and the test tools, so it is tried first.
REPO = Path(__file__).resolve().parents[2]
LOCKS = ("requirements/test.lock", "requirements/runtime.lock")
# Not the lock's business: Stoke itself (the lineage's code_version records it) and pip, which
# `python -m venv` puts in every venv and uv leaves there.
NOT_LOCKED = frozenset({"stoke", "pip"})
# The libraries named on their own, by their distributions.
LIBRARIES = {"tf_keras": "tf-keras", "beam": "apache-beam", "tfma": "tensorflow-model-analysis", "numpy": "numpy",
             "pillow": "pillow"}

# One pin of a lock as uv writes it: `name==version ; marker \`, its hashes on the lines after.
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;(?P<marker>[^\\]*))?\\?\s*$")


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them: `tf_keras`, `TF-Keras` and `tf.keras` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """name -> version of every distribution this Python imports from (the first on sys.path, as import finds)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        if name and name not in found:
            found[name] = dist.version
    return found


def locked(path: Path) -> dict[str, str]:
    """name -> version of the lock's packages that install on this machine (their markers hold here)."""
    from packaging.markers import Marker

    pins = {}
    for line in path.read_text().splitlines():
        pin = _PIN.match(line)
        if pin and (not (pin["marker"] or "").strip() or Marker(pin["marker"]).evaluate()):
            pins[canonical(pin["name"])] = pin["version"]
    return pins


def differences(lock: dict[str, str], have: dict[str, str]) -> list[str]:
    """How the installed packages differ from a lock's, one phrase each; none when they are the same set."""
    return off_lock(lock, have) + [f"{name}=={have[name]} is not in the lock"
                                   for name in sorted(have.keys() - lock.keys() - NOT_LOCKED)]


def off_lock(lock: dict[str, str], have: dict[str, str]) -> list[str]:
    """The lock's packages that are not installed, or not at the lock's version, one phrase each."""
    from packaging.version import Version

    said = []
    for name, want in sorted(lock.items()):
        if name not in have:
            said.append(f"{name} {want} is not installed")
        elif Version(want) != Version(have[name]):
            said.append(f"{name} {have[name]} is installed, the lock has {want}")
    return said


def packages(have: dict[str, str] | None = None) -> dict:
    """The `lock`, `lock_sha256`, `unlocked` and `packages_sha256` of an Environment: the first lock whose every
    package is installed at its version, and what is installed beside it."""
    have = {name: version for name, version in (installed() if have is None else have).items() if name not in NOT_LOCKED}
    pins = sorted(f"{name}=={version}" for name, version in have.items())
    record = {"lock": None, "lock_sha256": None, "unlocked": pins,
              "packages_sha256": hashlib.sha256("\n".join(pins).encode()).hexdigest()}
    for name in LOCKS:
        path = REPO / name
        if path.is_file() and not off_lock(lock := locked(path), have):
            return record | {"lock": name, "lock_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                             "unlocked": [pin for pin in pins if pin.split("==")[0] not in lock]}
    return record


def record() -> Environment:
    """This process's environment; it imports TensorFlow (training has)."""
    import tensorflow as tf

    have = installed()
    build = tf.sysconfig.get_build_info()
    with nvml_session() as (nvml, _):
        driver = query(nvml, "nvmlSystemGetDriverVersion") if nvml else None
    return Environment(
        python=platform.python_version(), tensorflow=tf.__version__,
        **{key: have.get(dist) for key, dist in LIBRARIES.items()},
        cuda=build.get("cuda_version") if build.get("is_cuda_build") else None,
        cudnn=build.get("cudnn_version") if build.get("is_cuda_build") else None,
        gpu_driver=driver, **packages(have))
