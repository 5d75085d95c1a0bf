"""A ROOT file that is not what it should be ends every entry point in one line naming it: a
`_MANIFEST.json` that is not UTF-8, nested deeper than the parser goes, a folder, cut short or empty;
a `labels.json` cut short, empty or not a list of names."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from components.contracts.layout import Root
from tests.beam_jobs import images
from tests.components.conftest import TRAIN_LABELS, tiny_records, write_span

MANIFEST_DAMAGE = {
    "not UTF-8": lambda path: open(path, "wb").write(b'{"span": 1, "source": "\xff\xfe"}'),
    "nested 50,000 deep": lambda path: open(path, "w").write("[" * 50_000 + "]" * 50_000),
    "a folder": lambda path: (os.remove(path), os.mkdir(path)),
    "cut short": lambda path: open(path, "w").write('{"span": 1,'),
    "empty": lambda path: open(path, "w").close(),
}
IN_MEMORY = ["--direct_running_mode=in_memory"]
MANIFEST_WORDS = {"not UTF-8": "not UTF-8", "nested 50,000 deep": "nested too deep", "a folder": "is a folder",
                  "cut short": "is not JSON", "empty": "is not JSON"}


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("broken") / "root")
    write_span(root, 1, {"train": tiny_records(6), "eval": tiny_records(3, offset=6)}, TRAIN_LABELS,
               {"train": 1, "eval": 1})
    return root


@pytest.fixture
def damaged_copy(published, tmp_path):
    def damage(kind: str) -> str:
        root = str(tmp_path / "root")
        shutil.copytree(published, root)
        MANIFEST_DAMAGE[kind](Root(root).manifest(1))
        return root
    return damage


def _one_line(capsys, prog: str) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.strip().splitlines() if line.startswith(f"{prog}: ")]
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("kind", sorted(MANIFEST_DAMAGE))
def test_ingest_and_train_stop_on_a_damaged_manifest_with_one_line(kind, damaged_copy, tmp_path, capsys):
    from beam_jobs.ingest import run as ingest
    from components.train.trainer import run as train

    root = damaged_copy(kind)
    manifest = Root(root).manifest(1)
    (tmp_path / "source" / "cat").mkdir(parents=True)
    assert ingest([str(tmp_path / "source"), "--root", root]) == 1
    line = _one_line(capsys, "stoke ingest")
    assert manifest in line and MANIFEST_WORDS[kind] in line
    assert train(["--root", root, "--preset", "demo", "--run-id", "r"]) == 1
    line = _one_line(capsys, "stoke train")
    assert manifest in line and MANIFEST_WORDS[kind] in line


@pytest.mark.parametrize("kind", sorted(MANIFEST_DAMAGE))
def test_preflight_fails_its_manifest_check_on_a_damaged_manifest(kind, damaged_copy, capsys):
    from components.preflight.preflight import run as preflight

    root = damaged_copy(kind)
    assert preflight(["--root", root, "--sample-mb", "1", "--json"]) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (check,) = [c for c in summary["checks"] if c["name"] == "span manifests"]
    assert check["status"] == "fail" and MANIFEST_WORDS[kind] in check["summary"]


@pytest.mark.parametrize("labels", ['["a", "b"', "", '{"a": 0}', '["a", 7]'])
def test_a_damaged_labels_file_stops_ingest_with_one_line_saying_how_to_recover(labels, published, tmp_path, capsys):
    from beam_jobs.ingest import run as ingest

    root = str(tmp_path / "root")
    shutil.copytree(published, root)
    with open(Root(root).labels, "w") as f:
        f.write(labels)
    (tmp_path / "source" / "cat").mkdir(parents=True)
    (tmp_path / "source" / "cat" / "0.jpg").write_bytes(images.rgb_jpeg())  # new: ingest needs the labels
    assert ingest([str(tmp_path / "source"), "--root", root, *IN_MEMORY]) == 1
    line = _one_line(capsys, "stoke ingest")
    assert Root(root).labels in line
