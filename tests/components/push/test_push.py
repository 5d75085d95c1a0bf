"""`stoke push`, `stoke rollback`, `stoke lineage` and `stoke predict` on the shared gate scenario."""
from __future__ import annotations

import base64
import http.server
import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

from components.common.files import read_json, write_json
from components.common.repository import KILL_AFTER_FILES_ENV, KILL_AFTER_STEP_ENV, KILL_STEPS, Repository
from components.common.spans import Spans
from components.contracts.layout import Root
from components.push import predict, rollback, show_lineage
from tests.components.conftest import tiny_image
from tests.components.gate_runs import copy_root, gate_scenario, listing, push_run, scenario_serving_checks, validate_run
from tests.credentials import PASSWORD, TOKEN, USER, holding, shows
from tests.waiting import web_server


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    return gate_scenario(tmp_path_factory)


def test_blessed_run_is_pushed_with_warmup_and_lineage(trained_runs):
    code, pushed = trained_runs["push"]["good"]
    assert code == 0 and pushed["pushed"] and pushed["previous_version"] is None
    version_dir = pushed["model_uri"]
    assert os.path.basename(version_dir) == str(pushed["version"])
    for name in ("saved_model.pb", "assets.extra/tf_serving_warmup_requests", "assets.extra/stoke_lineage.json"):
        assert os.path.exists(os.path.join(version_dir, name)), name
    record = json.load(open(os.path.join(version_dir, "assets.extra", "stoke_lineage.json")))
    assert record["run_id"] == "good" and record["labels"] == ["red", "green", "blue"]
    assert record["spans"][0]["span"] == 1 and len(record["spans"][0]["manifest_sha256"]) == 64
    assert record["spans"][0]["counts"]["eval"] == 24
    assert record["tensorflow_version"].startswith("2.21") and record["serving_image"] == "tensorflow/serving:2.21.0"
    assert record["blessing"]["blessed"] and record["metrics"]["accuracy"] == pushed["metrics"]["accuracy"]
    assert record["code_version"]["package"] == "0.1.0"
    # The answers its gate recorded, kept beside it, and the reference it names for later candidates: itself,
    # the first version; the serving image carries neither the answers nor a use for them.
    with open(os.path.join(version_dir, "assets.extra", "stoke_answers.json.gz"), "rb") as kept:
        assert kept.read() == open(os.path.join(trained_runs["root"], "runs", "good", "answers.json.gz"), "rb").read()
    assert record["reference"] == pushed["version"]
    mirrored = os.path.join(trained_runs["root"], "serving", "models", "stoke", str(pushed["version"]), "assets.extra")
    assert sorted(os.listdir(mirrored)) == ["model_card.json", "model_card.md", "stoke_lineage.json",
                                           "tf_serving_warmup_requests"]
    environment = record["environment"]  # what training recorded in metrics.json, carried as it was
    assert environment == trained_runs["train"]["good"]["environment"]
    assert environment["tensorflow"] == record["tensorflow_version"] and environment["python"] == platform.python_version()
    assert environment["tf_keras"].startswith("2.21") and environment["beam"] and environment["tfma"]
    assert len(environment["packages_sha256"]) == 64
    assert pushed["commands"]["docker_build"].startswith("docker build -t stoke-serving-stoke:")
    assert not pushed["image"]["built"] and "container engine" in pushed["image"]["reason"]


def test_refused_run_is_not_pushed_and_repository_unchanged(trained_runs):
    code, refused = trained_runs["push"]["flat"]
    assert code == 1 and "is not blessed" in refused["error"] and "below the served version" in refused["error"]
    assert trained_runs["listing"]["after_flat"] == trained_runs["listing"]["after_good"]


def test_third_run_is_a_newer_float32_version(trained_runs):
    import tensorflow as tf

    first, third = trained_runs["push"]["good"][1], trained_runs["push"]["mixed"][1]
    assert trained_runs["train"]["mixed"]["precision"] == "mixed_bfloat16"
    assert third["pushed"] and third["version"] > first["version"] and third["previous_version"] == first["version"]
    assert Repository(trained_runs["root"], "stoke").versions() == [first["version"], third["version"]]
    # Gated against the first version, the reference; trained fully, it is the reference once pushed.
    assert trained_runs["validate"]["mixed"][1]["reference"] == {"version": first["version"], "kept": False}
    assert Repository(trained_runs["root"], "stoke").lineage(third["version"]).reference == third["version"]
    outputs = tf.saved_model.load(third["model_uri"]).signatures["serving_default"].structured_outputs
    assert outputs["probabilities"].dtype == tf.float32


def test_a_run_is_never_pushed_twice(trained_runs):
    before = listing(trained_runs["root"])
    code, again = push_run(trained_runs["root"], "good")
    assert code == 0 and not again["pushed"] and again["already_pushed"]
    assert again["version"] == trained_runs["push"]["good"][1]["version"]
    assert listing(trained_runs["root"]) == before


def test_interrupted_push_leaves_no_partial_version(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    repo = Repository(root, "stoke")
    third = trained_runs["push"]["mixed"][1]["version"]
    shutil.rmtree(os.path.join(root, "models", "stoke", str(third)))  # back to just before the third push
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    env = dict(os.environ, **{KILL_AFTER_FILES_ENV: "2"})
    killed = subprocess.run([sys.executable, "-m", "components.push", "--root", root, "--run-id", "mixed", "--json"],
                            env=env, capture_output=True, text=True)
    assert killed.returncode == -9
    names = os.listdir(repo.path)
    assert [n for n in names if n.isdigit()] == [str(trained_runs["push"]["good"][1]["version"])]
    assert any(n.startswith(".push-") for n in names)  # the leftover is invisible to TF Serving
    code, pushed = push_run(root, "mixed")
    assert code == 0 and pushed["pushed"] and pushed["cleaned_partial"]
    assert not any(n.startswith(".push-") for n in os.listdir(repo.path))
    assert pushed["version"] > third  # never reuses a number, not even a failed one


@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_push_killed_after_publishing_is_finished_by_its_retry(trained_runs, tmp_path, step):
    """Killed once the version exists, before retention or the serving render: the retry reports the
    version it pushed and finishes the rest, so --keep holds and ROOT/serving serves what exists."""
    root = copy_root(trained_runs, tmp_path)
    repo = Repository(root, "stoke")
    first, third = trained_runs["push"]["good"][1]["version"], trained_runs["push"]["mixed"][1]["version"]
    shutil.rmtree(os.path.join(root, "models", "stoke", str(third)))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    env = dict(os.environ, **{KILL_AFTER_STEP_ENV: step})
    killed = subprocess.run([sys.executable, "-m", "components.push", "--root", root, "--run-id", "mixed", "--keep",
                             "1", "--no-build-image", "--json"], env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    new = repo.newest()
    assert new > third and first in repo.versions() + repo.retired()
    code, again = push_run(root, "mixed", "--keep", "1")
    assert code == 0 and again["already_pushed"] and again["version"] == new, again
    assert repo.versions() == [new] and again["versions"] == [new] and again["retired"] in ([first], [])
    rendered = json.load(open(os.path.join(root, "serving", "commands.json")))
    assert rendered["versions"] == [new] and again["commands"] == rendered["commands"]
    assert os.listdir(os.path.join(root, "serving", "models", "stoke")) == [str(new)]
    code, twice = push_run(root, "mixed", "--keep", "1")  # and a third attempt finds nothing left to do
    assert code == 0 and twice["already_pushed"] and twice["retired"] == [] and twice["versions"] == [new]


def test_a_retry_of_an_old_push_leaves_newer_pushes_alone(trained_runs, tmp_path):
    """An already pushed run that is no longer the newest: its retry must not apply its own --keep
    to versions another push made."""
    root = copy_root(trained_runs, tmp_path)
    repo = Repository(root, "stoke")
    before = repo.versions()
    code, again = push_run(root, "good", "--keep", "1")
    assert code == 0 and again["already_pushed"] and repo.versions() == before and again["retired"] == []


# `stoke push` in a child process that marks its arrival at the repository's lock in FOLDER (its first
# argument) and publishes only once both pushes have arrived there: the second push has done all its
# checks before the first version exists, as two pushes started at the same moment may.
SLOW_PUSH = """
import os, sys, time
from components.common import repository
from components.push import push
folder = sys.argv.pop(1)
lock, publish = repository.Repository.lock, repository.Repository.publish

def arriving(self, *args, **kwargs):
    open(os.path.join(folder, str(os.getpid())), "w").close()
    return lock(self, *args, **kwargs)

def after_both_arrived(*args, **kwargs):
    deadline = time.monotonic() + 120
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return publish(*args, **kwargs)

repository.Repository.lock, repository.Repository.publish = arriving, after_both_arrived
sys.exit(push.run(sys.argv[1:]))
"""


def test_two_pushes_at_once_take_turns(trained_runs, tmp_path):
    """Two blessed runs validated against the same served version, pushed at the same moment:
    one becomes the new version, the other is told to gate again; nothing nests."""
    root = copy_root(trained_runs, tmp_path)
    third = trained_runs["push"]["mixed"][1]["version"]
    shutil.rmtree(os.path.join(root, "models", "stoke", str(third)))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    shutil.copytree(os.path.join(root, "runs", "mixed"), os.path.join(root, "runs", "twin"))
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    pushes = [subprocess.Popen([sys.executable, "-c", SLOW_PUSH, str(arrived), "--root", root, "--run-id", run_id,
                                "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for run_id in ("mixed", "twin")]
    results = [(p.wait(timeout=300), json.loads(p.communicate()[0].strip().splitlines()[-1])) for p in pushes]
    pushed = [summary for code, summary in results if code == 0 and summary["pushed"]]
    refused = [summary for code, summary in results if code == 1]
    assert len(pushed) == 1 and len(refused) == 1, results
    assert "Run `stoke gate` again" in refused[0]["error"]
    repo = Repository(root, "stoke")
    assert repo.versions() == [trained_runs["push"]["good"][1]["version"], pushed[0]["version"]]
    assert "saved_model.pb" in os.listdir(pushed[0]["model_uri"])
    assert not [n for n in os.listdir(pushed[0]["model_uri"]) if n.isdigit() or n.startswith(".push-")]


def test_a_push_reads_the_trained_tensorflow_without_loading_tensorflow(trained_runs, tmp_path):
    """The version TensorFlow's own SavedModel class reads, from a push that never imports TensorFlow
    (the stage's lightest part would cost seconds of CPU loading it)."""
    from tensorflow.core.protobuf import saved_model_pb2

    root = copy_root(trained_runs, tmp_path)
    shutil.rmtree(os.path.join(root, "models", "stoke", str(trained_runs["push"]["mixed"][1]["version"])))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    code = ("import json, sys; from components.push import push; code = push.run(sys.argv[1:]); "
            "print(json.dumps([code, [m for m in ('tensorflow', 'keras') if m in sys.modules]]))")
    done = subprocess.run([sys.executable, "-c", code, "--root", root, "--run-id", "mixed", "--json"],
                          capture_output=True, text=True, timeout=120)
    *_, summary, outcome = done.stdout.strip().splitlines()
    assert json.loads(outcome) == [0, []], done.stderr[-2000:]
    written = saved_model_pb2.SavedModel()
    written.ParseFromString(open(os.path.join(root, "runs", "mixed", "candidate", "saved_model.pb"), "rb").read())
    assert json.loads(summary)["trained_tensorflow"] == written.meta_graphs[0].meta_info_def.tensorflow_version
    assert written.meta_graphs[0].meta_info_def.tensorflow_version.startswith("2.")


def test_a_model_newer_than_every_pinned_server_is_refused_in_one_line(trained_runs, tmp_path):
    """The push reads the TensorFlow that wrote the candidate and refuses it, before writing anything,
    when no TF Serving release the table pins (components/common/serving.py) is as new."""
    from tensorflow.core.protobuf import saved_model_pb2

    root = copy_root(trained_runs, tmp_path)
    shutil.rmtree(os.path.join(root, "models", "stoke", str(trained_runs["push"]["mixed"][1]["version"])))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    path = os.path.join(root, "runs", "mixed", "candidate", "saved_model.pb")
    model = saved_model_pb2.SavedModel()
    model.ParseFromString(open(path, "rb").read())
    model.meta_graphs[0].meta_info_def.tensorflow_version = "2.22.0"
    open(path, "wb").write(model.SerializeToString())
    before = listing(root)
    code, summary = push_run(root, "mixed")
    assert code == 1 and not summary["pushed"]
    assert summary["error"] == ("the model was written by TensorFlow 2.22.0, newer than the newest TF Serving Stoke pins "
                                "(tensorflow/serving:2.21.0); add its release to SERVING_RELEASES in "
                                "components/common/serving.py")
    assert listing(root) == before and not os.path.exists(os.path.join(root, "runs", "mixed", "push_intent.json"))


def test_a_push_stopped_before_recording_it_is_not_repeated(trained_runs, tmp_path, monkeypatch):
    """Killed after the version appeared and before pushed.json: a retry, or a new validation and
    push, finds the version by its lineage instead of refusing or pushing the run a second time."""
    scenario_serving_checks(trained_runs, monkeypatch)
    root = copy_root(trained_runs, tmp_path)
    third = trained_runs["push"]["mixed"][1]["version"]
    pushed_json = os.path.join(root, "runs", "mixed", "pushed.json")
    os.remove(pushed_json)
    before = listing(root)
    code, again = push_run(root, "mixed")
    assert code == 0 and again["already_pushed"] and again["version"] == third, again
    assert json.load(open(pushed_json))["version"] == third and listing(root) == before

    os.remove(pushed_json)
    code, summary = validate_run(root, "mixed")
    assert code == 0 and summary["served_version"] == third
    code, again = push_run(root, "mixed")
    assert again.get("already_pushed") and again["version"] == third, again
    assert listing(root) == before


def _before_third_push(trained_runs, tmp_path) -> str:
    """A copy of ROOT where run `mixed` is blessed, validated against the first version, not pushed yet."""
    root = copy_root(trained_runs, tmp_path)
    shutil.rmtree(os.path.join(root, "models", "stoke", str(trained_runs["push"]["mixed"][1]["version"])))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    return root


def test_a_run_gated_without_recorded_answers_is_pushed_as_before(trained_runs, tmp_path):
    """A run an older gate blessed has no answers.json.gz or `reference` in its gate.json: its version holds no
    answers and names no reference, so the next gate compares with it alone."""
    root = _before_third_push(trained_runs, tmp_path)
    run = os.path.join(root, "runs", "mixed")
    os.remove(os.path.join(run, "answers.json.gz"))
    gated = json.load(open(os.path.join(run, "gate.json")))
    del gated["reference"]
    json.dump(gated, open(os.path.join(run, "gate.json"), "w"))
    code, pushed = push_run(root, "mixed", "--no-build-image")
    assert code == 0 and pushed["pushed"], pushed
    assert Repository(root, "stoke").lineage(pushed["version"]).reference is None
    assert sorted(os.listdir(os.path.join(pushed["model_uri"], "assets.extra"))) == [
        "model_card.json", "model_card.md", "stoke_lineage.json", "tf_serving_warmup_requests"]


def test_a_served_version_in_text_form_survives_the_next_push(trained_runs, tmp_path):
    """TF Serving loads saved_model.pbtxt too: such a version is served, so push neither deletes it
    nor finds the repository changed since the gate compared the run with it."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    root = _before_third_push(trained_runs, tmp_path)
    first = trained_runs["push"]["good"][1]["version"]
    folder = os.path.join(root, "models", "stoke", str(first))
    proto = saved_model_pb2.SavedModel.FromString(open(os.path.join(folder, "saved_model.pb"), "rb").read())
    open(os.path.join(folder, "saved_model.pbtxt"), "w").write(text_format.MessageToString(proto))
    os.remove(os.path.join(folder, "saved_model.pb"))
    before = listing(root)
    code, pushed = push_run(root, "mixed", "--no-build-image")
    assert code == 0 and pushed["pushed"] and pushed["previous_version"] == first, pushed
    assert pushed["cleaned_partial"] == [] and pushed["set_aside"] == []
    assert Repository(root, "stoke").versions() == [first, pushed["version"]]
    assert set(before) <= set(listing(root))  # nothing of the first version went
    assert sorted(os.listdir(os.path.join(root, "serving", "models", "stoke"))) == [str(first), str(pushed["version"])]


def test_a_push_refuses_a_version_number_past_int64_in_one_line(trained_runs, tmp_path, capsys):
    """A number past 2**63-1 would fail TF Serving's parse of models.config: the server would not start."""
    root = _before_third_push(trained_runs, tmp_path)
    first = trained_runs["push"]["good"][1]["version"]
    shutil.copytree(os.path.join(root, "models", "stoke", str(first)),
                    os.path.join(root, "models", "stoke", f"rolled-back-{2**63 - 1}"))
    before = listing(root)
    code, refused = push_run(root, "mixed", "--no-build-image")
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "has no version number left: 9223372036854775807 is taken" in refused["error"]
    assert listing(root) == before and not os.path.exists(os.path.join(root, "runs", "mixed", "pushed.json"))


def test_a_folder_named_by_other_digits_stops_nothing(trained_runs, tmp_path):
    """str.isdigit() takes '²', and int() Arabic-Indic or fullwidth digits: TF Serving takes none of
    them for a version, and neither does push; they are left where they are."""
    root = _before_third_push(trained_runs, tmp_path)
    first = trained_runs["push"]["good"][1]["version"]
    for name in ("²", "٣", "０１"):
        shutil.copytree(os.path.join(root, "models", "stoke", str(first)), os.path.join(root, "models", "stoke", name))
    code, pushed = push_run(root, "mixed", "--no-build-image")
    assert code == 0 and pushed["pushed"] and pushed["previous_version"] == first, pushed
    assert pushed["versions"] == [first, pushed["version"]] and pushed["set_aside"] == []
    assert {"²", "٣", "０１"} <= set(os.listdir(os.path.join(root, "models", "stoke")))


def test_retention_keeps_the_newest_and_lineage_of_retired(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    third = trained_runs["push"]["mixed"][1]["version"]
    shutil.rmtree(os.path.join(root, "models", "stoke", str(third)))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    code, pushed = push_run(root, "mixed", "--keep", "1")
    first = trained_runs["push"]["good"][1]["version"]
    assert code == 0 and pushed["retired"] == [first] and pushed["versions"] == [pushed["version"]]
    record = show_lineage.lineage(root, "stoke", first)
    assert record["status"] == "retired" and record["run_id"] == "good" and record["retired_at"]


def test_rollback_moves_the_newest_aside_and_refuses_the_last(trained_runs, tmp_path):
    root = copy_root(trained_runs, tmp_path)
    first, third = trained_runs["push"]["good"][1]["version"], trained_runs["push"]["mixed"][1]["version"]
    done = rollback.rollback(root, "stoke", reason="canary errors")
    assert done["rolled_back"] == third and done["serving_version"] == first
    assert Repository(root, "stoke").versions() == [first]
    assert os.path.exists(os.path.join(root, "models", "stoke", f"rolled-back-{third}", "saved_model.pb"))
    record = show_lineage.lineage(root, "stoke", third)
    assert record["status"] == "rolled back" and record["rolled_back"]["reason"] == "canary errors"
    assert f"versions: {first}" in open(os.path.join(root, "serving", "models.config")).read()
    assert f"versions: {third}" not in open(os.path.join(root, "serving", "models.config")).read()
    assert rollback.run(["--root", root, "--json"]) == 1  # the only version stays
    assert Repository(root, "stoke").versions() == [first]


def test_lineage_of_the_served_version(trained_runs, capsys):
    assert show_lineage.run(["--root", trained_runs["root"]]) == 0
    text = capsys.readouterr().out
    third = trained_runs["push"]["mixed"][1]["version"]
    assert f"version {third} (served)" in text and "run mixed" in text
    assert f"reference: version {third} (later candidates are held to it class by class)" in text
    assert "span 1:" in text
    tensorflow = trained_runs["train"]["mixed"]["environment"]["tensorflow"]
    assert f"environment: Python {platform.python_version()}, TensorFlow {tensorflow}" in text
    assert show_lineage.run(["--root", trained_runs["root"], "--model-name", "a/../b"]) == 1


def test_a_lineage_from_before_environments_says_so(trained_runs, tmp_path, capsys):
    root = copy_root(trained_runs, tmp_path)
    version = trained_runs["push"]["mixed"][1]["version"]
    path = os.path.join(root, "models", "stoke", str(version), "assets.extra", "stoke_lineage.json")
    record = json.load(open(path))
    del record["environment"]
    with open(path, "w") as f:
        json.dump(record, f)
    assert show_lineage.run(["--root", root]) == 0
    assert "environment: not recorded" in capsys.readouterr().out


def test_the_lineage_names_the_classes_a_version_keeps_without_answering(trained_runs, tmp_path, capsys):
    """A run whose spans carried no blue record (blue's span held back, a later class let in) keeps blue's id:
    its version's lineage carries the label set as training made it, and `stoke lineage` says so."""
    root = copy_root(trained_runs, tmp_path)
    third = trained_runs["push"]["mixed"][1]["version"]
    shutil.rmtree(os.path.join(root, "models", "stoke", str(third)))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))
    metrics = os.path.join(root, "runs", "mixed", "metrics.json")
    json.dump({**json.load(open(metrics)), "untrained": ["blue"]}, open(metrics, "w"))
    code, pushed = push_run(root, "mixed")
    assert code == 0 and pushed["pushed"], pushed
    record = Repository(root, "stoke").lineage(pushed["version"])
    assert record.labels == ["red", "green", "blue"] and record.untrained == ["blue"]
    assert record.label_set.answered == ["red", "green"]
    capsys.readouterr()
    assert show_lineage.run(["--root", root]) == 0
    assert "never answers blue: no record of the spans it was trained on carries it" in capsys.readouterr().out


def test_a_password_older_spans_and_versions_kept_stays_out_of_the_push_its_image_and_every_answer(
        trained_runs, tmp_path, capsys):
    """A span and a version published before Stoke kept credentials out hold SOURCE's password and signature:
    the push writes none of it into the new version or ROOT/serving (the image's build context), whose copy of
    the old version's lineage is written without it (never through the link to the version's own file, which
    keeps what it has), and `stoke lineage` and `stoke spans` show none of it."""
    from components.datacheck import span_status

    root = copy_root(trained_runs, tmp_path)
    first, third = trained_runs["push"]["good"][1]["version"], trained_runs["push"]["mixed"][1]["version"]
    old = f"http://{USER}:{PASSWORD}@127.0.0.1:9/photos/manifest.csv?hmac={TOKEN}#access_token={TOKEN}"
    manifest = os.path.join(root, "data", "spans", "span-00001", "_MANIFEST.json")
    json.dump({**json.load(open(manifest)), "source": old}, open(manifest + ".tmp", "w"))
    os.replace(manifest + ".tmp", manifest)
    metrics = os.path.join(root, "runs", "mixed", "metrics.json")  # trained on the span as it is now
    json.dump(read_json(metrics) | {"span_manifests": {"1": Spans(root).manifest_sha256(1)}}, open(metrics, "w"))
    kept = os.path.join(root, "models", "stoke", str(first), "assets.extra", "stoke_lineage.json")
    record = json.load(open(kept))
    record["spans"][0]["source"] = old
    json.dump(record, open(kept, "w"))
    copied = os.path.join(root, "serving", "models", "stoke", str(first), "assets.extra", "stoke_lineage.json")
    os.remove(copied)
    os.link(kept, copied)  # as a push on one disk mirrors a version
    shutil.rmtree(os.path.join(root, "models", "stoke", str(third)))
    os.remove(os.path.join(root, "runs", "mixed", "pushed.json"))

    code, pushed = push_run(root, "mixed")
    assert code == 0 and pushed["pushed"], pushed
    assert holding(pushed["model_uri"]) == [] and holding(os.path.join(root, "serving")) == []
    assert json.load(open(copied))["spans"][0]["source"] == "http://alice:***@127.0.0.1:9/photos/manifest.csv?***"
    spans_pushed = json.load(open(os.path.join(pushed["model_uri"], "assets.extra", "stoke_lineage.json")))["spans"]
    assert spans_pushed[0]["span"] == 1 and spans_pushed[0]["source"] == "http://alice:***@127.0.0.1:9/photos/manifest.csv"
    assert shows(open(kept).read())  # the old version itself is left as it was
    capsys.readouterr()
    for argv in ([str(first)], [str(first), "--json"], [str(pushed["version"]), "--json"]):
        assert show_lineage.run(["--root", root, *argv]) == 0
    assert span_status.run(["--root", root]) == 0 and span_status.run(["--root", root, "--json"]) == 0
    printed = capsys.readouterr()
    assert "alice:***@127.0.0.1:9" in printed.out and not shows(printed.out + printed.err)


class FakeServing(http.server.BaseHTTPRequestHandler):
    """Answers TF Serving's REST predict API with the real SavedModel, after checking the body
    against the documented row format: {"signature_name", "instances": [{"image_bytes": {"b64"}}]}."""

    model_dir = ""
    bodies: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append((self.path, body))
        ok = (self.path == "/v1/models/stoke:predict" and body.get("signature_name") == "serving_default"
              and all(set(i) == {"image_bytes"} and set(i["image_bytes"]) == {"b64"} for i in body["instances"]))
        if not ok:
            self._send(400, {"error": "malformed request"})
            return
        images = [base64.b64decode(i["image_bytes"]["b64"]) for i in body["instances"]]
        self._send(200, {"predictions": predict.local_predict(self.model_dir, images)})

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_predict_locally_and_over_rest(trained_runs, tmp_path):
    images = []
    for label in range(3):
        path = tmp_path / f"{label}.jpg"
        path.write_bytes(tiny_image(label, 9000 + label))
        images.append(str(path))
    local = predict.predict(os.path.join(trained_runs["root"], "models", "stoke"), images)
    assert local["model"].endswith(str(trained_runs["push"]["mixed"][1]["version"]))
    assert all(abs(sum(p["probabilities"]) - 1) < 1e-4 for p in local["predictions"])

    FakeServing.model_dir = local["model"]
    with web_server(FakeServing) as port:
        remote = predict.predict(f"http://127.0.0.1:{port}/v1/models/stoke", images)
    path, body = FakeServing.bodies[-1]
    assert base64.b64decode(body["instances"][0]["image_bytes"]["b64"]) == open(images[0], "rb").read()
    assert [p["label"] for p in remote["predictions"]] == [p["label"] for p in local["predictions"]]


def test_predict_rejects_a_corrupt_image(trained_runs, tmp_path, capsys):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(tiny_image(0, 1)[:40])
    code = predict.run([os.path.join(trained_runs["root"], "models", "stoke"), str(broken), "--json"])
    assert code == 1
    assert "is not a readable image" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


def test_object_store_push_copies_saved_model_last(trained_runs, s3_bucket):
    """No rename on S3: every other file first, saved_model.pb last; a folder without it is partial."""
    import fsspec

    root = f"s3://{s3_bucket}/root"
    fs = fsspec.filesystem("s3")
    fs.pipe_file(f"{s3_bucket}/root/models/stoke/5/variables/variables.index", b"half a push")
    repo = Repository(root, "stoke")
    with repo.lock("push"):  # no mark of a push of Stoke's: set aside whole, not deleted
        tidied = repo.tidy()
        assert repo.versions() == [] and tidied.removed == [] and [a.name for a in tidied.set_aside] == ["5"]
    assert fs.cat_file(f"{s3_bucket}/root/models/stoke/set-aside-5/variables/variables.index") == b"half a push"

    order = []
    original = repo.fs.pipe_file

    def recording(path, data, **kwargs):
        order.append(path.rsplit("/5000/", 1)[-1])
        return original(path, data, **kwargs)

    repo.fs.pipe_file = recording  # s3fs binds its sync methods per instance
    try:
        repo.publish(trained_runs["push"]["good"][1]["model_uri"], 5000, {"assets.extra/note": b"x"})
    finally:
        repo.fs.pipe_file = original
    assert order[0].endswith("/models/stoke/.push-5000")  # the mark, before anything of the version
    assert order[-1] == "saved_model.pb" and "variables/variables.index" in order
    assert repo.versions() == [5000] and repo.next_version() > 5000
    assert not fs.exists(f"{s3_bucket}/root/models/stoke/.push-5000")  # and gone once it is complete


def test_a_span_changed_since_training_stops_the_push(trained_runs, tmp_path):
    """The lineage names each span by the manifest training read: a span whose manifest is another since (its
    folder deleted by hand and the number published again) would make it name records the model never saw."""
    root = _before_third_push(trained_runs, tmp_path)
    manifest = Root(root).manifest(1)
    write_json(manifest, read_json(manifest) | {"created": "2031-01-01T00:00:00Z"})
    before = listing(root)
    code, refused = push_run(root, "mixed", "--no-build-image")
    assert code == 1 and refused["error"].startswith("span 1 changed since run mixed trained on it ("), refused
    assert refused["error"].endswith("train again") and listing(root) == before


def test_each_pushed_version_has_a_model_card_that_agrees_with_the_gate_and_the_data_check(trained_runs):
    """assets.extra/model_card.json and .md beside the lineage, mirrored into the serving context and linked
    from the report: its figures are the gate's (per-class accuracy, the comparison with the version it
    replaced) and the data check's (each span's status and findings), its intervals Wilson's as the gate
    computes them, its training counts the spans' own."""
    from components.common.spans import Spans
    from components.contracts.layout import Root, RunDir
    from components.contracts.lineage import ModelCard
    from components.gate.evidence import _z, wilson
    from components.report.report import build_report, render_markdown

    code, pushed = trained_runs["push"]["mixed"]
    folder = os.path.join(pushed["model_uri"], "assets.extra")
    card = ModelCard.model_validate(json.load(open(os.path.join(folder, "model_card.json"))))
    gate = json.load(open(os.path.join(trained_runs["root"], "runs", "mixed", "gate.json")))
    assert (card.version, card.run_id, card.labels) == (pushed["version"], "mixed", gate["labels"])
    assert card.accuracy == gate["metrics"]["accuracy"] and card.example_count == gate["metrics"]["example_count"]
    assert card.replaced_version == gate["baseline_version"] == trained_runs["push"]["good"][1]["version"]
    assert card.evidence.model_dump(mode="json") == gate["comparison"] and card.gate_notes == gate["notes"]
    per_class = {c["label"]: c for c in gate["comparison"]["per_class"]["classes"]}
    for c in card.classes:
        assert c.accuracy == gate["metrics"]["per_class_accuracy"][c.label]
        assert c.eval_records == gate["metrics"]["per_class_examples"][c.label] == per_class[c.label]["example_count"]
        assert c.right == per_class[c.label]["right"] and c.verdict == per_class[c.label]["verdict"]
        assert c.baseline_accuracy == gate["baseline"]["per_class_accuracy"][c.label]
        assert c.interval == pytest.approx(wilson(c.right, c.eval_records, _z(card.confidence)), abs=1e-4)
        assert f"{c.label}: only {c.eval_records} eval records" in " ".join(card.limitations)  # 8 each: few
    manifest = json.load(open(os.path.join(trained_runs["root"], "data", "spans", "span-00001", "_MANIFEST.json")))
    assert sum(c.train_records for c in card.classes) == manifest["counts"]["train"]
    record = Spans(Root(trained_runs["root"])).check_record(1).record
    (span,) = card.spans
    assert (span.span, span.data_check, span.train, span.eval) == (1, record.status, 64, 24)
    assert span.warnings == [a.message for a in record.anomalies if a.file is None]
    assert card.environment.model_dump(mode="json") == trained_runs["train"]["mixed"]["environment"]

    text = open(os.path.join(folder, "model_card.md")).read()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["Model details", "Intended use", "Factors", "Metrics", "Evaluation data", "Training data",
                        "Quantitative analyses", "Caveats and recommendations"]
    assert f"{card.example_count} eval records of span 1 (the eval split" in text
    first = card.classes[0]
    assert f"| {first.label} | {first.train_records} | {first.eval_records} | {first.right} | {first.accuracy:.2f} |" in text
    served = os.path.join(trained_runs["root"], "serving", "models", "stoke", str(card.version), "assets.extra")
    assert open(os.path.join(served, "model_card.md")).read() == text
    assert pushed["model_card"] == os.path.join(folder, "model_card.md")
    report = render_markdown(build_report(RunDir(os.path.join(trained_runs["root"], "runs", "mixed"))))
    assert f"Model card: [`{pushed['model_card']}`]({pushed['model_card']})" in report
