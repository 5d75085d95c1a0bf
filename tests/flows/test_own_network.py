"""A network of the user's own, end to end: the example residual network, named beside a run configuration, is
tried by preflight, trained by the train flow under MirroredStrategy over two logical CPUs in mixed bfloat16, gated
and pushed; the next night warm-starts from it (XLA, one device); an edit of its file makes the night after a full
retrain that says why; the served version answers REST-shaped requests in a fresh process that has neither the
example nor Stoke. A network that does not keep the contract stops `stoke run` before ingest with exit 2, and a
deployment's run cannot choose a network of code its deployment does not list."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from components.common.files import read_result
from components.common.repository import Repository
from components.contracts.layout import Root
from components.contracts.results import TrainMetrics
from components.contracts.run_config import RunConfig
from tests.components.conftest import TRAIN_LABELS, tiny_image, write_span
from tests.flows.conftest import TINY_BEAM
from tests.flows.test_deployments import TRIGGER

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "networks" / "residual.py"
BIN = os.path.dirname(sys.executable)
# The user's settings for the first night: the residual network beside this file, mirrored over two logical
# CPUs in mixed bfloat16 (XLA stays off: jit_compile does not run under MirroredStrategy over logical CPUs).
NIGHT_1 = {"preset": "demo", "beam_args": TINY_BEAM, "preflight": {"sample_mb": 4}, "ingest": {"shard_mb": 8},
           "datacheck": {"min_class_examples": 1},
           "train": {"network": "residual.py:network", "epochs": 2, "batch_size": 8, "input_probe_steps": 0,
                     "trace_steps": "none", "strategy": "mirrored", "cpu_devices": 2, "precision": "mixed_bfloat16",
                     "xla": False},
           "gate": {"min_accuracy": 0.0, "top_k": 2}, "push": {"build_image": False}}
# The nights after, trained by hand from the same folder: one device, with XLA.
LATER = {"preset": "demo", "train": {"network": "residual.py:network", "epochs": 1, "batch_size": 8,
                                     "input_probe_steps": 0, "trace_steps": "none", "strategy": "one_device",
                                     "precision": "mixed_bfloat16", "xla": True}}


def colours(folder: pathlib.Path, count: int, offset: int = 0) -> None:
    """Photos in class folders: `count` images of each colour class."""
    for label, name in enumerate(TRAIN_LABELS):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(offset, offset + count):
            (folder / name / f"{i}.jpg").write_bytes(tiny_image(label, 100 * label + i))


def first_night(base: pathlib.Path) -> dict:
    """`stoke run photos --root ROOT --config project/night.yaml --run-id night-1`, as the CLI runs it."""
    import argparse

    from flows.commands import add_run_arguments, checked, flow_parameters
    from flows.pipeline import pipeline

    project, source, root = base / "project", base / "photos", base / "root"
    project.mkdir()
    shutil.copy(EXAMPLE, project / "residual.py")
    (project / "night.yaml").write_text(json.dumps(NIGHT_1))
    colours(source, 20)
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    run_id, config = checked(parser.parse_args([str(source), "--root", str(root), "--config",
                                                str(project / "night.yaml"), "--run-id", "night-1"]))
    state = pipeline(**flow_parameters(config), run_id=run_id, return_state=True)
    return {"project": str(project), "root": str(root), "completed": state.is_completed(),
            "message": state.message, "summary": state.result() if state.is_completed() else None}


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> dict:
    made = first_night(tmp_path_factory.mktemp("own-network"))
    assert made["completed"], made["message"]
    return made


def train_by_hand(project: str, root: str, run_id: str, capsys) -> dict:
    from components.train import trainer

    (pathlib.Path(project) / "later.yaml").write_text(json.dumps(LATER))
    code = trainer.run(["--config", f"{project}/later.yaml", "--root", root, "--run-id", run_id, "--json"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0, last
    return json.loads(last)


def test_the_users_network_is_tried_trained_gated_pushed_and_kept_with_its_run(nights):
    root, summary = Root(nights["root"]), nights["summary"]
    run = root.run("night-1")
    assert summary["blessed"] and summary["pushed_version"], summary
    code = (pathlib.Path(nights["project"]) / "residual.py").read_bytes()
    digest = hashlib.sha256(code).hexdigest()
    # The run records the network by its copy beside config.json, which every stage read.
    recorded = json.loads(pathlib.Path(run.config).read_text())
    assert recorded["train"]["network"] == "code/residual.py:network"
    assert pathlib.Path(run.code, "residual.py").read_bytes() == code
    check = next(c for c in json.loads(pathlib.Path(run.result("preflight")).read_text())["checks"]
                 if c["name"] == "network")
    assert check["status"] == "ok" and check["facts"] == {"identity": "residual.py:network", "digest": digest}
    trained = read_result(run.metrics, TrainMetrics)
    assert (trained.network, trained.network_digest) == ("residual.py:network", digest)
    assert (trained.strategy, trained.replicas, trained.precision) == ("mirrored", 2, "mixed_bfloat16")
    lineage = Repository(root.uri, "stoke").lineage(summary["pushed_version"])
    assert (lineage.training.network, lineage.training.network_digest) == ("residual.py:network", digest)
    assert f"Network `residual.py:network`, its code's SHA-256 `{digest}`" in pathlib.Path(run.report_md).read_text()


def test_the_export_answers_rest_requests_in_a_process_without_the_users_code(nights, tmp_path):
    """TF Serving loads the graph: a fresh Python that can import neither the example nor Stoke (isolated mode,
    no PYTHONPATH, an empty working folder) answers the REST API's row format, with the code moved away."""
    from components.common.serving import rest_body

    images = [tiny_image(label, 9000 + label) for label in range(3)]
    answer = ("import base64, json, sys; import tensorflow as tf\n"
              "body = json.load(sys.stdin)\n"
              "serve = tf.saved_model.load(sys.argv[1]).signatures[body['signature_name']]\n"
              "images = [base64.b64decode(row['image_bytes']['b64']) for row in body['instances']]\n"
              "out = serve(image_bytes=tf.constant(images))\n"
              "print(json.dumps({'predictions': [{'labels': l.decode(), 'probabilities': p.tolist()} for l, p in "
              "zip(out['labels'].numpy(), out['probabilities'].numpy())]}))\n")
    code, copy = pathlib.Path(nights["project"], "residual.py"), pathlib.Path(Root(nights["root"]).run("night-1").code)
    aside = tmp_path / "aside"
    shutil.move(copy, aside)
    shutil.move(code, aside / "users.py")
    try:
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "TF_USE_LEGACY_KERAS")}
        version = Repository(nights["root"], "stoke").version_uri(nights["summary"]["pushed_version"])
        done = subprocess.run([sys.executable, "-I", "-c", answer, version],
                              input=json.dumps(rest_body(images)), capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=300)
    finally:
        shutil.move(aside / "users.py", code)
        shutil.move(aside, copy)
    assert done.returncode == 0, done.stderr[-3000:]
    predictions = json.loads(done.stdout.strip().splitlines()[-1])["predictions"]
    assert len(predictions) == 3 and all(p["labels"] in TRAIN_LABELS for p in predictions)
    assert all(len(p["probabilities"]) == 3 and abs(sum(p["probabilities"]) - 1) < 1e-4 for p in predictions)


def test_the_next_night_warm_starts_and_an_edit_of_the_code_is_a_full_retrain_that_says_why(nights, tmp_path, capsys):
    from components.train import warm

    project, root = str(tmp_path / "project"), str(tmp_path / "root")
    shutil.copytree(nights["project"], project)
    shutil.copytree(nights["root"], root)
    labels = Root(root).labels
    names = json.loads(pathlib.Path(labels).read_text())
    records = [(tiny_image(TRAIN_LABELS.index(name), 7000 + i), "jpeg", names.index(name))
               for i in range(8) for name in names]
    write_span(root, 2, {"train": records}, names, {"train": 1})

    served = nights["summary"]["pushed_version"]
    second = train_by_hand(project, root, "night-2", capsys)
    assert (second["start"]["kind"], second["start"]["from_version"]) == ("warm", served), second["start"]
    assert (second["xla"], second["strategy"], second["network"]) == (True, "one_device", "residual.py:network")

    with open(f"{project}/residual.py", "a") as f:
        f.write("# wider next time\n")
    third = train_by_hand(project, root, "night-3", capsys)
    assert third["start"]["kind"] == "full", third["start"]
    assert third["start"]["reason"].startswith(f"network code changed (SHA-256 {second['network_digest'][:12]} to "
                                               f"{third['network_digest'][:12]}) since served version {served}")
    assert (pathlib.Path(Root(root).run("night-3").code) / "residual.py").read_text().endswith("# wider next time\n")

    # A version pushed before the digest was recorded: its code is not known, so no warm start either.
    lineage = Repository(root, "stoke").lineage_uri(served)
    recorded = json.loads(pathlib.Path(lineage).read_text())
    del recorded["training"]["network_digest"]
    pathlib.Path(lineage).write_text(json.dumps(recorded))
    config = RunConfig(root=root, preset="demo", train={"network": f"{project}/residual.py:network"}).resolved()
    assert warm.decide(config, names, [1, 2]).reason.startswith("network code unrecorded")


def test_a_network_that_breaks_the_contract_stops_stoke_run_before_ingest_with_exit_2(tmp_path):
    from prefect.settings import PREFECT_API_URL

    photos = tmp_path / "photos"
    colours(photos, 2)
    (tmp_path / "wide.py").write_text(EXAMPLE.read_text().replace("Dense(num_classes)", "Dense(10)"))
    done = subprocess.run([os.path.join(BIN, "stoke"), "run", str(photos), "--root", str(tmp_path / "root"), "--preset",
                           "demo", "--set", "train.network=wide.py:network", "--run-id", "wide", "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[-1] == ("stoke run: error: preflight: network failed: train.network wide.py:network returns float32 "
                         "[None, 10] for 2 classes: one logit a class, [N, 2]"), lines[-1]
    assert not any("ingest: -m " in line for line in lines)  # stopped before ingest
    assert not os.path.exists(Root(str(tmp_path / "root")).span(1))  # ingest published nothing


@pytest.mark.parametrize("parameters, says", [
    ({"train": {"network": "/tmp/theirs.py:network"}}, "train.network /tmp/theirs.py:network: a run of this "
     "deployment may choose a built-in network, a keras.applications one or one of the networks it lists"),
    ({"networks": ["/tmp/theirs.py:network"]}, "networks: the networks a run may choose belong to the deployment"),
    # A webhook too is the deployment's, and a secret: Prefect would keep it in the clear with the run's parameters.
    ({"alerts": {"webhook": "https://hooks.example/services/T0/B0/s3cr3t-t0ken", "after": 2}},
     "alerts.webhook: the webhook is the deployment's"),
])
def test_a_deployment_run_may_choose_only_what_its_deployment_lets_it(tmp_path, parameters, says):
    """A real deployment and a flow run of it, run as a worker runs one (`python -m prefect.engine`): its
    parameters are refused before anything runs, and what a run may not hold is taken out of its record."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    from flows.deployments import build_deployments

    root = tmp_path / "root"
    listed = str(EXAMPLE.parent / "backbone_head.py") + ":network"
    config = RunConfig(source=str(tmp_path), root=str(root), train={"network": f"{EXAMPLE}:network"})
    nightly, _ = build_deployments(config, networks=[listed])
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(nightly.apply())
        try:
            assert deployment.parameters["networks"] == [listed]
            run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
            done = subprocess.run([sys.executable, "-m", "prefect.engine", str(run.id)], capture_output=True, text=True,
                                  timeout=300, env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()})
            state, kept = client.read_flow_run(run.id).state, client.read_flow_run(run.id).parameters
        finally:  # left behind, its trigger would answer other tests' events with runs nobody serves
            client.delete_deployment(deployment.id)
            for automation in client.read_automations_by_name(TRIGGER):
                client.delete_automation(automation.id)
    assert state.type.value == "FAILED", (state, done.stderr[-3000:])
    assert says in state.message, state.message
    assert not root.exists()  # nothing written, nothing run
    assert "s3cr3t-t0ken" not in json.dumps(kept) + state.message
