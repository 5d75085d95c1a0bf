"""Every reader of the model repository takes the same version for the newest one TF Serving serves:
the gate's baseline, the label check's model, `stoke lineage`, `stoke predict`, the serving image's
models.config and `stoke rollback`. A repository holding both forms of SavedModel, strangers TF
Serving would read as versions and names it skips; models made by hand (no TensorFlow)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from components.common.repository import Repository
from components.contracts.label_set import LabelSet
from components.contracts.layout import Root
from components.contracts.results import SpanManifest

SAMPLES = pathlib.Path(__file__).parents[1] / "contracts" / "samples"
SAMPLE_LINEAGE = SAMPLES / "stoke_lineage.json"
LABELS = ["red", "green", "blue"]


def version_folder(folder: pathlib.Path, version: int | None, graph: str = "saved_model.pb") -> None:
    (folder / "variables").mkdir(parents=True)
    (folder / "variables" / "variables.index").write_bytes(b"index")
    (folder / graph).write_bytes(b"graph")
    if version is not None:
        record = json.loads(SAMPLE_LINEAGE.read_text()) | {"version": version}
        record.pop("rolled_back", None)
        (folder / "assets.extra").mkdir()
        (folder / "assets.extra" / "stoke_lineage.json").write_text(json.dumps(record))


@pytest.fixture
def root(tmp_path) -> str:
    """Versions 100 (saved_model.pb) and 200 (saved_model.pbtxt, so the newest), strangers with higher
    numbers that TF Serving would read as versions, and Unicode digits it skips."""
    base = tmp_path / "root" / "models" / "stoke"
    version_folder(base / "100", 100)
    version_folder(base / "200", 200, graph="saved_model.pbtxt")
    (base / "300").mkdir()  # the highest number in TF Serving's sight, and nothing it can load
    version_folder(base / "0400", None)  # version 400 to TF Serving
    version_folder(tmp_path / "elsewhere", None)
    (base / "500").symlink_to(tmp_path / "elsewhere")
    for name in ("²", "٣", "０１"):  # int() reads the last two as 3 and 1
        version_folder(base / name, None)
    return str(tmp_path / "root")


def test_the_newest_served_version_is_the_same_for_every_reader(root):
    from components.datacheck.predictions import Served, served
    from components.gate.gate import _served
    from components.push.predict import resolve_model_dir
    from components.push.show_lineage import lineage

    repo = Repository(root, "stoke")
    assert repo.versions() == [100, 200] and repo.newest() == 200
    assert sorted(repo.survey().strangers) == ["0400", "300", "500"]

    gate = _served(repo, LabelSet(LABELS))
    assert gate.version == 200 and gate.uri == repo.version_uri(200) and sorted(gate.retained) == [100, 200]
    assert [note.split(" is not compared with")[0] for note in gate.notes if "is not compared" in note] == [
        os.path.join(repo.path, name) for name in ("0400", "300", "500")]

    span = SpanManifest.model_validate(json.loads((SAMPLES / "_MANIFEST.json").read_text()) | {"span": 99})
    label_check = served(Root(root), "stoke", span)
    assert isinstance(label_check, Served) and label_check.uri == repo.version_uri(200)
    assert lineage(root)["version"] == 200 and lineage(root)["served_versions"] == [100, 200]
    assert resolve_model_dir(repo.uri) == repo.version_uri(200)


def test_the_serving_context_holds_the_versions_and_nothing_else(root):
    from components.push.serving_image import render

    rendered = render(root, "stoke")
    assert rendered["versions"] == [100, 200] and rendered["labels"] == {"stable": 100, "canary": 200}
    config = open(os.path.join(root, "serving", "models.config")).read()
    assert "versions: 100\n" in config and "versions: 200\n" in config and config.count("versions:") == 2
    mirrored = os.path.join(root, "serving", "models", "stoke")
    assert sorted(os.listdir(mirrored)) == ["100", "200"]
    assert os.path.exists(os.path.join(mirrored, "200", "saved_model.pbtxt"))


def test_rollback_takes_the_newest_served_version_and_sets_strangers_aside(root, tmp_path):
    from components.push import rollback

    done = rollback.rollback(root, "stoke", reason="canary errors")
    repo = Repository(root, "stoke")
    assert done["rolled_back"] == 200 and done["serving_version"] == 100 and repo.versions() == [100]
    assert sorted(aside["name"] for aside in done["set_aside"]) == ["0400", "300", "500"]
    assert sorted(os.listdir(repo.path)) == sorted([".lock", "100", "rolled-back-200", "set-aside-0400", "set-aside-300",
                                                    "set-aside-500", "²", "٣", "０１"])
    assert os.path.exists(os.path.join(repo.path, "rolled-back-200", "saved_model.pbtxt"))
    assert os.path.exists(tmp_path / "elsewhere" / "saved_model.pb")  # a link moves; its target stays


@pytest.mark.parametrize("given", ["٣", "０１", "007", "-1", "9223372036854775808"])
def test_lineage_takes_a_version_as_stoke_writes_them(root, given, capsys):
    from components.push.show_lineage import run

    with pytest.raises(SystemExit) as exit_:
        run([given, "--root", root])
    assert exit_.value.code == 2 and "is no version number" in capsys.readouterr().err


def test_a_render_replaces_a_link_in_the_context_and_never_writes_through_it(root, tmp_path):
    """The context's files are written whole and renamed into place: a link put at one of their names goes,
    and what it points to (here the served versions' graphs) stays as it was."""
    from components.push.serving_image import render

    render(root, "stoke")
    serving, repository = pathlib.Path(root, "serving"), pathlib.Path(root, "models", "stoke")
    targets = {"models.config": repository / "200" / "saved_model.pbtxt", "Dockerfile": repository / "100" / "saved_model.pb",
               "models/stoke/200/assets.extra/stoke_lineage.json": repository / "200" / "assets.extra" / "stoke_lineage.json"}
    before = {name: target.read_bytes() for name, target in targets.items()}
    for name, target in targets.items():
        (serving / name).unlink()
        (serving / name).symlink_to(target)

    render(root, "stoke")

    assert {name: target.read_bytes() for name, target in targets.items()} == before
    assert not any((serving / name).is_symlink() for name in targets)
    assert "versions: 200" in (serving / "models.config").read_text()
    assert "FROM tensorflow/serving" in (serving / "Dockerfile").read_text()


def test_a_lineage_belongs_to_its_folder_and_a_model_put_at_a_number_taken_out_has_none(root, tmp_path):
    """Rolled back, a version keeps its lineage in rolled-back-<version>; retired, in _retired/<version>.json.
    Those speak for the number only while no folder holds it: a SavedModel put there later has no lineage of
    its own, so warm start trains fully, the gate knows nothing of its classes, `stoke lineage` has nothing
    to show, and the runs of the versions taken out are still theirs."""
    from components.common.repository import RepositoryError
    from components.common.run_retention import held_by_repository
    from components.contracts.run_config import RunConfig
    from components.gate.gate import _served
    from components.push import push, rollback
    from components.push.show_lineage import lineage
    from components.train import warm

    base = pathlib.Path(root, "models", "stoke")
    for folder in ("300", "0400", "500"):  # only Stoke's versions here
        (base / folder).unlink() if (base / folder).is_symlink() else shutil.rmtree(base / folder)
    record = json.loads((base / "200" / "assets.extra" / "stoke_lineage.json").read_text())
    record.update(run_id="night-200", labels=LABELS[::-1])  # a lineage that would refuse LABELS, were it read
    (base / "200" / "assets.extra" / "stoke_lineage.json").write_text(json.dumps(record))
    rollback.rollback(root, "stoke", reason="canary errors")
    repo = Repository(root, "stoke")
    with repo.lock("retention"):
        repo.retire(100, "2026-01-01T00:00:00Z")
    version_folder(base / "200", None)  # a SavedModel without lineage, put at the numbers taken out
    version_folder(base / "100", None)
    assert repo.versions() == [100, 200] and repo.rolled_back() == [200] and repo.retired() == [100]

    assert repo.lineage(200) is None and repo.lineage(100) is None
    assert repo.lineage(200, rolled_back=True).run_id == "night-200"
    for version in (None, 200, 100):
        with pytest.raises(RepositoryError, match=f"no lineage for version {version or 200} of stoke"):
            lineage(root, "stoke", version)
    config = RunConfig(source=root, root=root, preset="cpu", train={"network": "small_cnn"}).resolved()
    assert warm.decide(config, LabelSet(LABELS), [1, 2]).reason == "served version 200 has no lineage to compare with"
    served = _served(repo, LabelSet(LABELS))
    assert served.version == 200 and served.refusals == [] and served.uri == repo.version_uri(200)
    assert held_by_repository(Root(root)) == {"night-200": "model stoke version 200, rolled back came from it"}
    again = push.earlier_push(repo, Root(root).run("night-200"))  # its push is the version rolled back
    assert again is not None and again.version == 200
