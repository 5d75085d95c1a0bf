"""ROOT/serving/: the build context of the serving image, rendered from components/push/templates.

Dockerfile (and Dockerfile.gpu) from a pinned tensorflow/serving tag, a copy of the kept versions
under models/<name>/ (the context is self-contained: `docker build ROOT/serving` needs nothing
else), models.config with the version labels stable/canary, batching.config, monitoring.config
for Prometheus, and the exact `docker build` / `docker run` commands in commands.json.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import posixpath
import re
import shlex
import string
import subprocess
from importlib import resources

from components.common import processes
from components.common.files import filesystem, is_local, join, uri_of, write_json, write_whole
from components.common.local_copies import clear
from components.common.model_folders import SAVED_MODEL, SAVED_MODEL_TEXT, SERVING_FILES
from components.common.repository import ANSWERS_FILE, ASSETS_EXTRA, LINEAGE_FILE, Repository
from components.common.serving import SERVING_IMAGE, SERVING_RELEASES, docker_engine, serving_release
from components.contracts.layout import Root
from components.contracts.secrets import without_secrets

log = logging.getLogger(__name__)

METRICS_PATH = "/monitoring/prometheus/metrics"
GRPC_PORT = 8500
REST_PORT = 8501
MODEL_BASE_PATH = "/models"  # inside the image: /models/<name>/<version>, as models.config names it
USER_ID = 10001  # the server runs as this unprivileged uid; nothing it reads needs more
BUILD_SECONDS = 30 * 60  # pulling the base image and copying the models
BATCHING = {"max_batch_size": 32, "batch_timeout_micros": 2000, "max_enqueued_batches": 100,
            "num_batch_threads": 4, "allowed_batch_sizes": (1, 4, 8, 16, 32)}


class ServingError(Exception):
    """A refusal with a message for the user."""


def template(name: str) -> string.Template:
    return string.Template(resources.files("components.push.templates").joinpath(name).read_text())


def version_tuple(text: str) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", text or "")[:3]
    return tuple(int(n) for n in numbers) + (0,) * (3 - len(numbers))


def server_for(trained_tf: str) -> str:
    """The serving image for models TensorFlow `trained_tf` wrote (components/common/serving.py's table);
    refuses, in one line, a TensorFlow newer than every release the table names."""
    release = serving_release(trained_tf)
    if release is None:
        newest = max(SERVING_RELEASES.values(), key=version_tuple)
        raise ServingError(f"the model was written by TensorFlow {trained_tf}, newer than the newest TF Serving "
                           f"Stoke pins ({SERVING_IMAGE}:{newest}); add its release to SERVING_RELEASES in "
                           "components/common/serving.py")
    return f"{SERVING_IMAGE}:{release}"


def saved_model_tf_version(model_uri: str) -> str:
    """The TensorFlow version recorded in a SavedModel's MetaGraphDef, from either form TF Serving loads."""
    from google.protobuf import message, text_format

    fs, path = filesystem(model_uri)
    proto = _saved_model_view()()
    binary = posixpath.join(path, SAVED_MODEL)
    try:
        if fs.exists(binary):
            proto.ParseFromString(fs.cat_file(binary))
        else:  # the view knows three fields: the text form's others are skipped, as the binary's are
            text_format.Parse(fs.cat_file(posixpath.join(path, SAVED_MODEL_TEXT)).decode("utf-8", "replace"), proto,
                              allow_unknown_field=True, allow_unknown_extension=True)
    except (message.DecodeError, text_format.ParseError) as error:
        raise ServingError(f"{model_uri} holds no SavedModel TensorFlow can read ({str(error)[:200]})") from None
    return proto.meta_graphs[0].meta_info_def.tensorflow_version if proto.meta_graphs else ""


@functools.cache
def _saved_model_view():
    """saved_model.proto's SavedModel reduced to the fields on the way to the version (numbers as in
    tensorflow/core/protobuf/saved_model.proto and meta_graph.proto; protobuf skips the others).
    TensorFlow's generated class would cost a push about 6 s of CPU to import TensorFlow, for one string."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    view = descriptor_pb2.FileDescriptorProto(name="stoke/saved_model_view.proto", package="stoke.view", syntax="proto3")
    for message, name, number, kind, label in (
            ("SavedModel", "meta_graphs", 2, ".stoke.view.MetaGraphDef", field.LABEL_REPEATED),
            ("MetaGraphDef", "meta_info_def", 1, ".stoke.view.MetaInfoDef", field.LABEL_OPTIONAL),
            ("MetaInfoDef", "tensorflow_version", 5, None, field.LABEL_OPTIONAL)):
        view.message_type.add(name=message).field.add(
            name=name, number=number, label=label, type=field.TYPE_MESSAGE if kind else field.TYPE_STRING,
            type_name=kind)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(view)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("stoke.view.SavedModel"))


def render_text(model_name: str, versions: list[int], trained_tf: str, bucket_models: str | None = None) -> dict[str, str]:
    """The text files of the build context (no model files); with `bucket_models` (ROOT/models on an
    object store), models.bucket.config too: the same versions, read from the bucket by the server."""
    if not versions:
        raise ServingError(f"model {model_name} has no version to serve")
    canary = versions[-1]
    stable = versions[-2] if len(versions) > 1 else versions[-1]
    batching = dict(BATCHING)
    batching["allowed_batch_sizes"] = "\n".join(f"allowed_batch_sizes: {s}" for s in BATCHING["allowed_batch_sizes"])
    image = {"model_name": model_name, "trained_tf": trained_tf, "grpc_port": GRPC_PORT, "rest_port": REST_PORT,
             "model_base_path": MODEL_BASE_PATH, "metrics_path": METRICS_PATH, "user_id": USER_ID}
    base = server_for(trained_tf)
    files = {
        "Dockerfile": template("Dockerfile.tmpl").substitute(base_image=base, **image),
        "Dockerfile.gpu": template("Dockerfile.tmpl").substitute(base_image=f"{base}-gpu", **image),
        "models.config": template("models.config.tmpl").substitute(
            model_name=model_name, stable=stable, canary=canary, model_base_path=MODEL_BASE_PATH,
            version_lines="\n".join(f"        versions: {v}" for v in versions)),
        "batching.config": template("batching.config.tmpl").substitute(**batching),
        "monitoring.config": template("monitoring.config.tmpl").substitute(metrics_path=METRICS_PATH),
        "prometheus.yml": template("prometheus.yml.tmpl").substitute(model_name=model_name, metrics_path=METRICS_PATH),
    }
    if bucket_models:
        files["models.bucket.config"] = files["models.config"].replace(
            f'base_path: "{MODEL_BASE_PATH}/{model_name}"', f'base_path: "{bucket_models}/{model_name}"')
    return files


# What TF Serving needs to read a model repository in a bucket (the serving image's Dockerfile says more).
BUCKET_ENV = {"s3": ("AWS_REGION", "S3_ENDPOINT", "S3_USE_HTTPS", "S3_VERIFY_SSL", "AWS_ACCESS_KEY_ID",
                     "AWS_SECRET_ACCESS_KEY"),
              "gs": ("GOOGLE_APPLICATION_CREDENTIALS",)}


def image_name(model_name: str, newest: int) -> str:
    return f"stoke-serving-{model_name}:{newest}".lower()


def build_arguments(serving_uri: str, model_name: str, newest: int) -> list[str]:
    """`docker build` of the context as an argument list, made from its folder and the newest version: what
    push runs. commands.json holds the same as text for the user, and is never read back to be run."""
    return ["docker", "build", "-t", image_name(model_name, newest), serving_uri]


def commands(serving_uri: str, model_name: str, newest: int) -> dict[str, str]:
    image = image_name(model_name, newest)
    ports = f"-p {GRPC_PORT}:{GRPC_PORT} -p {REST_PORT}:{REST_PORT}"
    return {
        "image": image,
        "docker_build": shlex.join(build_arguments(serving_uri, model_name, newest)),
        "docker_build_gpu": shlex.join(["docker", "build", "-f", join(serving_uri, "Dockerfile.gpu"),
                                        "-t", f"{image}-gpu", serving_uri]),
        "docker_run": f"docker run --rm {ports} {image}",
        "docker_run_gpu": f"docker run --rm --gpus all {ports} {image}-gpu",
        "predict": f"stoke predict http://localhost:{REST_PORT}/v1/models/{model_name} IMAGE...",
    }


def bucket_serving(serving_uri: str, image: str) -> dict | None:
    """With ROOT in a bucket: the server reading the versions from it (models.bucket.config mounted
    over the image's models.config), and the environment it needs for that."""
    scheme = serving_uri.split("://", 1)[0] if "://" in serving_uri else None
    if scheme is None:
        return None
    env = BUCKET_ENV.get(scheme, ())
    ports = f"-p {GRPC_PORT}:{GRPC_PORT} -p {REST_PORT}:{REST_PORT}"
    return {"config": "models.bucket.config", "env": list(env),
            "docker_run": " ".join(["docker run --rm", ports, *(f"-e {name}" for name in env),
                                    '-v "$PWD/models.bucket.config:/config/models.config:ro"', image])}


def render(root: Root | str, model_name: str) -> dict:
    """Renders ROOT/serving for the model's current versions and returns what was written."""
    root = root if isinstance(root, Root) else Root(root)
    repo = Repository(root, model_name)
    versions = repo.versions()
    if not versions:
        raise ServingError(f"{repo.uri} holds no version to serve")
    trained_tf = max(map(functools.partial(trained_tensorflow, repo), versions), key=version_tuple)
    serving = root.serving
    fs, base = filesystem(serving)
    files = render_text(model_name, versions, trained_tf, None if is_local(fs) else join(root.uri, "models"))
    fs.makedirs(base, exist_ok=True)
    for name, text in files.items():
        write_whole(join(serving, name), text.encode())
    changed = _mirror_versions(repo, versions, fs, posixpath.join(base, "models", model_name))
    cmds = commands(serving, model_name, versions[-1])
    summary = {"serving_uri": serving, "model_name": model_name, "versions": versions,
               "labels": {"stable": versions[-2] if len(versions) > 1 else versions[-1], "canary": versions[-1]},
               "serving_image": server_for(trained_tf), "trained_tensorflow": trained_tf,
               "files": sorted(files), "commands": cmds}
    bucket = bucket_serving(serving, cmds["image"])
    write_json(join(serving, "commands.json"), summary | ({"bucket": bucket} if bucket else {}))
    return summary | {"changed": changed}


def trained_tensorflow(repo: Repository, version: int) -> str:
    """The TensorFlow that wrote a kept version: its lineage's, or its SavedModel's for one Stoke did not push."""
    lineage = repo.lineage(version)
    return lineage.tensorflow_version if lineage else saved_model_tf_version(repo.version_uri(version))


def _mirror_versions(repo: Repository, versions: list[int], fs, target: str) -> list[str]:
    """Makes target/<v> match the kept versions: hard links on one local disk (no second copy of
    the weights), copies elsewhere; saved_model.pb (or .pbtxt) last, as in the repository. A mirror is
    checked against its version at each render (_differs) and mirrored again when it differs: what
    `docker build` ships is the version, whatever was put in its place. Each lineage is written without
    credentials (`_lineage_copy`): the image holds what the context holds. The answers the gate recorded stay
    in the repository. Returns what it changed, in words."""
    changed = []
    if is_local(fs):
        for folder in (posixpath.dirname(target), target):  # Stoke's folders: a link there would lead elsewhere
            if os.path.islink(folder):
                os.unlink(folder)
                changed.append(f"replaced the link {folder} by a folder")
                log.warning("%s: %s", target, changed[-1])
    fs.makedirs(target, exist_ok=True)
    # An object store has no empty folders: before the first version, the target is not there at all.
    present = {posixpath.basename(p.rstrip("/")) for p in fs.ls(target, detail=False)} if fs.exists(target) else set()
    for name in sorted(present - {str(v) for v in versions}):
        _remove(fs, posixpath.join(target, name))
        changed.append(f"removed {name}, no longer kept")
    for version in versions:
        dest, source = posixpath.join(target, str(version)), posixpath.join(repo.path, str(version))
        if str(version) in present:
            why = _differs(fs, source, dest)
            if why is None:
                _lineage_copy(fs, source, dest)
                continue
            changed.append(f"mirrored version {version} again ({why})")
            log.warning("%s: %s", target, changed[-1])
            _remove(fs, dest)
        else:
            changed.append(f"mirrored version {version}")
        files = sorted(fs.find(source), key=lambda p: posixpath.relpath(p, source) in SERVING_FILES)
        for path in files:
            out = posixpath.join(dest, posixpath.relpath(path, source))
            if out.endswith(ANSWERS):
                continue  # the gate's record of the version, for later gates: nothing the server reads
            fs.makedirs(posixpath.dirname(out), exist_ok=True)
            if out.endswith(LINEAGE):
                _lineage_copy(fs, source, dest)
                continue
            if is_local(fs):
                try:
                    os.link(path, out)
                    continue
                except OSError:
                    pass
            fs.copy(path, out)
    return changed


LINEAGE = f"/{ASSETS_EXTRA}/{LINEAGE_FILE}"
ANSWERS = f"/{ASSETS_EXTRA}/{ANSWERS_FILE}"


def _differs(fs, source: str, dest: str) -> str | None:
    """How the mirror `dest` differs from the version `source`, or None when it holds the same files: each of
    the same size and SHA-256, or on a disk the version's own file through a hard link. Its lineage is a copy
    of its own (_lineage_copy); a symbolic link is never the same (`docker build` copies the link, not the file)."""
    local = is_local(fs)
    if local and os.path.islink(dest):
        return "it is a symbolic link"
    want = {posixpath.relpath(p, source): info for p, info in fs.find(source, detail=True).items()
            if not p.endswith(ANSWERS)}  # the answers stay in the repository
    have = {posixpath.relpath(p, dest): info for p, info in fs.find(dest, detail=True).items()}
    for name in sorted(want.keys() | have.keys()):
        if name not in have:
            return f"{name} is missing"
        if name not in want:
            return f"{name} is not the version's"
        if have[name].get("islink") or have[name].get("type") != "file":
            return f"{name} is a symbolic link" if have[name].get("islink") else f"{name} is not a file"
        if "/" + name == LINEAGE:
            continue
        mine, theirs = posixpath.join(source, name), posixpath.join(dest, name)
        if local and os.path.samestat(os.stat(mine), os.lstat(theirs)):
            continue  # a hard link: the version's file itself
        if want[name].get("size") != have[name].get("size") or _sha256(fs, mine) != _sha256(fs, theirs):
            return f"{name} differs from the version's"
    return None


def _sha256(fs, path: str) -> str:
    with fs.open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _remove(fs, path: str) -> None:
    """Removes a mirror: on a disk a link itself, never what it points to, or a folder with all in it."""
    if is_local(fs):
        clear(path)
    else:
        fs.rm(path, recursive=True)


def _lineage_copy(fs, version: str, dest: str) -> None:
    """The version's lineage in the context, written (never linked, never through a link: write_whole
    replaces what holds the name) without the credentials a version pushed before Stoke kept them out
    may hold in its spans' SOURCE."""
    source, out = version + LINEAGE, dest + LINEAGE
    if not fs.exists(source):
        return
    text = without_secrets(fs.cat_file(source).decode())
    if fs.exists(out) and fs.cat_file(out).decode() == text:
        return
    write_whole(uri_of(fs, out), text.encode())


def build_image(serving_uri: str, model_name: str, newest: int, base_image: str) -> dict:
    """Builds the image of the context `serving_uri` (build_arguments) when a container engine answers and
    its base image's tag (`base_image`, as render chose it) exists; otherwise says why not."""
    fs, _ = filesystem(serving_uri)
    if not is_local(fs):
        return {"built": False, "reason": "the build context is on an object store; copy it locally to build"}
    if not docker_engine():
        return {"built": False, "reason": "no container engine answers (`docker info` failed or docker is absent)"}
    problem = base_image_problem(base_image)
    if problem:
        return {"built": False, "reason": problem}
    try:
        result = processes.run(build_arguments(serving_uri, model_name, newest), timeout=BUILD_SECONDS)
    except subprocess.TimeoutExpired:
        return {"built": False, "reason": f"docker build did not finish within {BUILD_SECONDS} s"}
    if result.returncode != 0:
        return {"built": False, "reason": f"docker build failed: {result.stderr.strip()[-300:]}"}
    return {"built": True}


def base_image_problem(image: str) -> str | None:
    """None when the engine holds `image` or can pull it (the pull the build would make anyway);
    else why the build cannot start from it. SERVING_RELEASES is written by hand: a tag that does not
    exist would otherwise surface as a pull error halfway through `docker build`."""
    try:
        if processes.run(["docker", "image", "inspect", image], timeout=60).returncode == 0:
            return None
        pulled = processes.run(["docker", "pull", image], timeout=BUILD_SECONDS)
    except subprocess.TimeoutExpired:
        return f"docker pull {image} did not finish within {BUILD_SECONDS} s"
    if pulled.returncode == 0:
        return None
    said = next((line.strip() for line in reversed((pulled.stderr + pulled.stdout).splitlines()) if line.strip()),
                f"exit code {pulled.returncode}")[:300]
    if "manifest unknown" in said.lower() or "not found" in said.lower():
        return (f"{image} does not exist in its registry ({said}); set its row of SERVING_RELEASES in "
                "components/common/serving.py to a tensorflow/serving tag that exists")
    return f"cannot pull {image}, the base of the serving image: {said}"
