"""The retention rule of ROOT/runs on run folders laid out by hand (no training): the newest keep their heavy
parts, older ones their record, the oldest go; a run whose model the repository holds, or that is still
running, is never touched; a prune stopped halfway is finished by the next; the same on S3."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import time

import pytest

from components.common import run_retention
from components.common.files import filesystem, join, write_bytes, write_json
from components.common.lease import exclusive
from components.common.repository import Repository
from components.common.run_retention import RetentionError, after_run, prune
from components.contracts.config import RunsConfig
from components.contracts.layout import Root, RunDir

DAY = 24 * 3600.0
SAMPLE_LINEAGE = pathlib.Path(__file__).parents[1] / "contracts" / "samples" / "stoke_lineage.json"
RECORD = ["config.json", "metrics.json", "report.json", "report.md", "gate.json",
          "BLESSED", "curves.png", "confusion_matrix.png"]
HEAVY = ["candidate/saved_model.pb", "candidate/variables/variables.index",
         "candidate/variables/variables.data-00000-of-00001", "tensorboard/train/events.out.tfevents.1",
         "tensorboard/plugins/profile/2026_01_01/host.xplane.pb", "tfma/metrics-00000-of-00001.tfrecord",
         "warmup/tf_serving_warmup_requests"]
BACKUP = ["backup/chkpt.index", "backup/chkpt.data-00000-of-00001", "backup/checkpoint"]


def make_run(root: str, run_id: str, age_days: float = 0.0, *, report: bool = True, heavy: bool = True,
             backup: bool = False) -> RunDir:
    """A run folder with the files the layout names, `age_days` old (times are set only on a local disk).
    config.json is written first and report.json last, as every attempt of a run writes them."""
    run = Root(root).run(run_id)
    names = [n for n in RECORD if report or n not in ("report.json", "report.md")]
    names += (HEAVY if heavy else []) + (BACKUP if backup else [])
    names.sort(key=lambda n: (n == "report.json", n != "config.json"))
    for name in names:
        size = 5000 if name.split("/")[0] in ("candidate", "tensorboard") else 100
        write_bytes(join(run.uri, name), json.dumps({"pad": "x" * size}).encode() if name.endswith(".json") else
                    b"x" * size)
    set_age(run, age_days)
    return run


def set_age(run: RunDir, age_days: float, only: str | None = None) -> None:
    fs, path = filesystem(run.uri)
    if not fs.isdir(path) or "file" not in fs.protocol:
        return
    when = time.time() - age_days * DAY
    for found in fs.find(path):
        if only is None or found.endswith("/" + only):
            os.utime(found, (when, when), follow_symlinks=False)


def files(run: RunDir) -> set[str]:
    fs, path = filesystem(run.uri)
    return {f[len(path.rstrip("/")) + 1:] for f in fs.find(path)} if fs.exists(path) else set()


def serve(root: str, tmp_path, version: int, run_id: str, model: str = "stoke") -> Repository:
    """A version in the repository whose lineage names `run_id`, as a push leaves it."""
    lineage = json.loads(SAMPLE_LINEAGE.read_text())
    lineage.update(version=version, run_id=run_id, model_name=model, run_uri=Root(root).run(run_id).uri)
    source = tmp_path / f"model-{model}-{version}"
    (source / "variables").mkdir(parents=True)
    (source / "saved_model.pb").write_bytes(b"graph")
    (source / "variables" / "variables.index").write_bytes(b"index")
    repository = Repository(root, model)
    repository.publish(str(source), version, {"assets.extra/stoke_lineage.json": json.dumps(lineage).encode()})
    return repository


def fates(summary) -> dict[str, tuple[str, str]]:
    return {fate.run_id: (fate.state, fate.action) for fate in summary.runs}


def test_the_newest_runs_stay_whole_older_ones_keep_their_record_and_the_oldest_go(tmp_path):
    root = str(tmp_path / "root")
    runs = [make_run(root, f"run-{n}", age_days=n) for n in range(1, 7)]  # run-1 the newest
    skipped = make_run(root, "skipped", age_days=2.5, heavy=False)  # a run that trained nothing: a record already
    strangers = [os.path.join(root, "runs", name) for name in ("notes.txt", ".trash/old", "lost+found/x", "a b/c")]
    for path in strangers:  # no run folders: not the rule's to remove
        write_bytes(path, b"not a run")
        os.utime(path, (time.time() - 30 * DAY,) * 2)

    summary = prune(Root(root), RunsConfig(keep=2, keep_records=5))

    assert fates(summary) == {"run-1": ("whole", "keep"), "run-2": ("whole", "keep"), "skipped": ("record", "keep"),
                              "run-3": ("whole", "record"), "run-4": ("whole", "record"),
                              "run-5": ("whole", "delete"), "run-6": ("whole", "delete")}
    for run in runs[:2]:
        assert files(run) == set(RECORD + HEAVY)
    for run in runs[2:4]:  # heavy parts first: the record stays, with the marker that says so
        assert files(run) == set(RECORD) | {"pruned.json"}
        assert json.loads(pathlib.Path(run.pruned).read_text())["kept"] == "record"
    for run in runs[4:]:
        assert not os.path.exists(run.uri)
    assert files(skipped) == set(RECORD) and all(os.path.exists(path) for path in strangers)
    assert summary.freed == sum(f.freed for f in summary.runs) > 0 and summary.error is None

    again = prune(Root(root), RunsConfig(keep=2, keep_records=5))  # nothing left to do: the rule is a fixed point
    assert {f.action for f in again.runs} == {"keep"} and again.freed == 0


def test_a_run_whose_model_the_repository_holds_is_kept_whole_however_old(tmp_path):
    root = str(tmp_path / "root")
    served = make_run(root, "served", age_days=30)
    aside = make_run(root, "rolled-back", age_days=29)
    other = make_run(root, "other-model", age_days=28)
    retired = make_run(root, "retired", age_days=27)
    newer = [make_run(root, f"new-{n}", age_days=n) for n in range(1, 4)]
    serve(root, tmp_path, 3, "served")
    repository = serve(root, tmp_path, 4, "rolled-back")
    serve(root, tmp_path, 1, "other-model", model="digits")
    serve(root, tmp_path, 2, "retired")
    with repository.lock("rollback"):
        repository.take_out(4)
        repository.retire(2, "2026-01-01T00:00:00Z")  # its model is deleted: its run follows the rule

    summary = prune(Root(root), RunsConfig(keep=1, keep_records=2))

    for run in (served, aside, other):
        assert files(run) == set(RECORD + HEAVY), run.run_id
    assert fates(summary)["served"] == ("whole", "keep")
    assert {f.run_id: f.why for f in summary.runs}["rolled-back"] == "model stoke version 4, rolled back came from it"
    assert not os.path.exists(retired.uri) and not os.path.exists(newer[2].uri)
    assert files(newer[0]) == set(RECORD + HEAVY) and files(newer[1]) == set(RECORD) | {"pruned.json"}


def test_a_lineage_that_cannot_be_read_stops_the_prune_before_anything_goes(tmp_path):
    root = str(tmp_path / "root")
    runs = [make_run(root, f"run-{n}", age_days=n) for n in range(1, 4)]
    repository = serve(root, tmp_path, 5, "run-3")
    pathlib.Path(repository.lineage_uri(5)).write_text("{not json")

    with pytest.raises(RetentionError, match="lineage of version 5 of model stoke cannot be read"):
        prune(Root(root), RunsConfig(keep=1, keep_records=1))
    assert all(files(run) == set(RECORD + HEAVY) for run in runs)

    # At the end of a run the same failure is a summary with its error, never an exception.
    current = make_run(root, "current", report=False)
    summary = after_run(current)
    assert summary.error and "cannot be read" in summary.error and "tries again" in summary.in_words()
    assert json.loads(pathlib.Path(current.retention).read_text())["error"] == summary.error
    assert all(files(run) == set(RECORD + HEAVY) for run in runs)


def test_a_run_in_progress_is_left_alone(tmp_path):
    root = str(tmp_path / "root")
    make_run(root, "newest", age_days=0.1)
    training = make_run(root, "training", age_days=5, report=False, backup=True)  # killed or still at it
    set_age(training, 0.2, only="events.out.tfevents.1")  # it wrote a file lately
    retried = make_run(root, "retried", age_days=6, backup=True)  # its report is from a failed attempt...
    set_age(retried, 0.5, only="config.json")  # ...and a retry of the same run id has begun since
    abandoned = make_run(root, "abandoned", age_days=9, report=False, backup=True)  # killed, never resumed

    summary = prune(Root(root), RunsConfig(keep=1, keep_records=1))

    assert fates(summary) == {"newest": ("whole", "keep"), "retried": ("in progress", "keep"),
                              "training": ("in progress", "keep"), "abandoned": ("whole", "delete")}
    assert files(training) == set(RECORD + HEAVY + BACKUP) - {"report.json", "report.md"}
    assert files(retried) == set(RECORD + HEAVY + BACKUP)  # its backup is what the retry resumes from
    assert not os.path.exists(abandoned.uri)
    assert "no report yet" in {f.run_id: f.why for f in summary.runs}["training"]


def test_a_killed_run_beyond_the_newest_loses_its_backup_once_it_is_over(tmp_path):
    root = str(tmp_path / "root")
    make_run(root, "newest", age_days=1)
    killed = make_run(root, "killed", age_days=8, report=False, backup=True)

    assert fates(prune(Root(root), RunsConfig(keep=1, keep_records=5)))["killed"] == ("whole", "record")
    assert files(killed) == set(RECORD) - {"report.json", "report.md"} | {"pruned.json"}


def test_a_prune_stopped_halfway_reads_as_such_and_the_next_finishes_it(tmp_path, monkeypatch):
    root = str(tmp_path / "root")
    make_run(root, "newest", age_days=1)
    lighter, doomed = make_run(root, "lighter", age_days=2), make_run(root, "doomed", age_days=3)
    removals = []

    def stop_at_the_second(run, name):
        if len(removals) == 1:
            raise OSError(5, "Input/output error", join(run.uri, name))
        removals.append(join(run.uri, name))
        real_remove(run, name)

    real_remove = run_retention._remove
    monkeypatch.setattr(run_retention, "_remove", stop_at_the_second)
    with pytest.raises(OSError):
        prune(Root(root), RunsConfig(keep=1, keep_records=2))
    monkeypatch.setattr(run_retention, "_remove", real_remove)

    # The file that makes the candidate loadable went first, the record stays, and the marker says what is going.
    assert removals == [lighter.saved_model]
    assert "candidate/saved_model.pb" not in files(lighter) and "candidate/variables/variables.index" in files(lighter)
    assert "metrics.json" in files(lighter)
    found = fates(prune(Root(root), RunsConfig(keep=1, keep_records=2), dry_run=True))
    assert found["lighter"] == ("record", "record") and found["doomed"] == ("whole", "delete")

    doomed_marker = run_retention.Pruned(run_id="doomed", pruned_at="2026-01-01T00:00:00Z", kept="nothing")
    write_json(doomed.pruned, doomed_marker.to_json())  # a deletion stopped after its marker and the report
    os.remove(doomed.report_json)
    found = fates(prune(Root(root), RunsConfig(keep=1, keep_records=100), dry_run=True))
    assert found["doomed"] == ("deleting", "delete")  # not a run in progress, though its report is gone

    prune(Root(root), RunsConfig(keep=1, keep_records=100))
    assert files(lighter) == set(RECORD) | {"pruned.json"} and not os.path.exists(doomed.uri)


def test_a_run_that_ran_again_after_it_was_pruned_is_whole_again(tmp_path):
    root = str(tmp_path / "root")
    make_run(root, "older", age_days=3)
    again = make_run(root, "again", age_days=2)
    marker = run_retention.Pruned(run_id="again", pruned_at="2026-01-01T00:00:00Z", kept="nothing")
    write_json(again.pruned, marker.to_json())
    set_age(again, 2, only="pruned.json")
    set_age(again, 1, only="config.json")  # the same run id ran again since: its config.json is newer
    set_age(again, 0.9, only="report.json")

    summary = prune(Root(root), RunsConfig(keep=1, keep_records=5))
    assert fates(summary) == {"again": ("whole", "keep"), "older": ("whole", "record")}
    assert set(RECORD + HEAVY) <= files(again)


def test_one_prune_at_a_time(tmp_path, monkeypatch):
    root = str(tmp_path / "root")
    old = [make_run(root, f"run-{n}", age_days=n) for n in range(1, 4)]
    monkeypatch.setattr(run_retention, "LEASE_WAIT", 0.0)
    with exclusive(Root(root).prune_lock, "prune of the run folders"):
        with pytest.raises(RetentionError, match="prune of the run folders"):
            prune(Root(root), RunsConfig(keep=1, keep_records=1))
    assert all(files(run) == set(RECORD + HEAVY) for run in old)


def test_the_rule_on_s3(s3_bucket, tmp_path):
    root = f"s3://{s3_bucket}/root"
    # S3 dates objects in whole seconds: runs written within one are ordered by their ids, as named here.
    served, middle, newest = (make_run(root, name) for name in ("run-1-served", "run-2", "run-3"))
    running = make_run(root, "run-4-running", report=False)
    serve(root, tmp_path, 7, "run-1-served")
    assert all(time.time() - 600 < f.started <= time.time() + 600 for f in run_retention.survey(Root(root)))

    summary = prune(Root(root), RunsConfig(keep=2, keep_records=3))  # the running one counts as trained

    assert fates(summary) == {"run-4-running": ("in progress", "keep"), "run-3": ("whole", "keep"),
                              "run-2": ("whole", "record"), "run-1-served": ("whole", "keep")}
    assert files(newest) == set(RECORD + HEAVY) and files(served) == set(RECORD + HEAVY)
    assert files(middle) == set(RECORD) | {"pruned.json"}
    assert files(running) == set(RECORD + HEAVY) - {"report.json", "report.md"}

    summary = prune(Root(root), RunsConfig(keep=1, keep_records=1))
    assert fates(summary)["run-3"] == ("whole", "delete") and fates(summary)["run-2"] == ("record", "delete")
    assert not files(newest) and not files(middle)
    assert files(served) == set(RECORD + HEAVY) and files(running) == set(RECORD + HEAVY) - {"report.json", "report.md"}
    fs, lease = filesystem(Root(root).prune_lock)
    assert not fs.exists(lease)  # the lease went with the prune that held it


def test_the_runs_of_the_versions_push_keeps_stay_and_a_retired_ones_follows_the_rule(tmp_path):
    root = str(tmp_path / "root")
    runs = [make_run(root, f"night-{n}", age_days=10 - n) for n in range(1, 6)]  # night-5 the newest
    for n, run in enumerate(runs[:3], start=1):
        repository = serve(root, tmp_path, n, run.run_id)
    with repository.lock("retention"):
        assert repository.apply_retention(2, "2026-01-01T00:00:00Z") == [1]  # push.keep 2: night-1's version retired

    prune(Root(root), RunsConfig(keep=1, keep_records=1))

    assert files(runs[1]) == files(runs[2]) == set(RECORD + HEAVY)  # versions 2 and 3, however old
    assert files(runs[4]) == set(RECORD + HEAVY)
    assert not os.path.exists(runs[0].uri) and not os.path.exists(runs[3].uri)


def test_the_rule_on_gcs(gcs_endpoint):
    root = "gs://stoke-gcs/retention"
    older, newest = make_run(root, "run-1"), make_run(root, "run-2")
    summary = prune(Root(root), RunsConfig(keep=1, keep_records=5))
    assert fates(summary) == {"run-2": ("whole", "keep"), "run-1": ("whole", "record")}
    assert files(older) == set(RECORD) | {"pruned.json"} and files(newest) == set(RECORD + HEAVY)
    assert all(time.time() - 600 < f.started <= time.time() + 600 for f in run_retention.survey(Root(root)))


def test_links_in_a_run_folder_are_removed_never_followed(tmp_path):
    root = str(tmp_path / "root")
    make_run(root, "newest", age_days=1)
    lighter, doomed = make_run(root, "lighter", age_days=2), make_run(root, "doomed", age_days=3)
    outside = tmp_path / "elsewhere"
    for name in ("logs", "notes", "model"):
        (outside / name).mkdir(parents=True)
        (outside / name / "keep.txt").write_text("not the run's")
    os.symlink(outside / "logs", os.path.join(lighter.uri, "tensorboard", "moved"))  # a heavy part's link
    os.symlink(outside / "model", os.path.join(doomed.uri, "candidate", "variables", "shared"))
    os.symlink(outside / "notes", os.path.join(doomed.uri, "notes"))  # a link at the top of the folder
    set_age(lighter, 2)
    set_age(doomed, 3)

    prune(Root(root), RunsConfig(keep=1, keep_records=2))

    assert files(lighter) == set(RECORD) | {"pruned.json"} and not os.path.exists(doomed.uri)
    assert all((outside / name / "keep.txt").read_text() == "not the run's" for name in ("logs", "notes", "model"))


def test_a_link_anywhere_in_a_run_folder_never_takes_the_prune_out_of_it(tmp_path):
    """A link is removed itself, whatever it points to and at whatever depth, and nothing is removed or
    written through one: not the served version, nor a folder elsewhere, nor a loop that never ends."""
    root = str(tmp_path / "root")
    make_run(root, "newest", age_days=1)
    served = pathlib.Path(serve(root, tmp_path, 7, "newest").version_uri(7))
    outside = tmp_path / "elsewhere"
    (outside / "metrics").mkdir(parents=True)
    (outside / "metrics" / "keep.txt").write_text("not the run's")
    protected = {p: p.read_bytes() for p in [*served.rglob("*"), *outside.rglob("*")] if p.is_file()}
    record = {name: make_run(root, name, age_days=age) for age, name in enumerate(
        ["whole", "deeper", "file", "loop", "marker", "hard"], start=2)}
    doomed = make_run(root, "doomed", age_days=20)

    def link(run: RunDir, name: str, target) -> None:
        path = pathlib.Path(run.uri, name)
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        path.symlink_to(target)

    link(record["whole"], "candidate", "../../models/stoke/7")  # the candidate is the served version
    link(record["whole"], "tfma", outside)
    link(record["deeper"], "candidate/variables", served / "variables")
    link(record["deeper"], "tfma/metrics-00000-of-00001.tfrecord", outside / "metrics")
    link(record["file"], "candidate/saved_model.pb", served / "saved_model.pb")
    link(record["loop"], "candidate", "candidate")  # ELOOP on the way to candidate/saved_model.pb
    link(record["marker"], "pruned.json.tmp", served / "saved_model.pb")  # where the marker is written first
    pathlib.Path(record["hard"].saved_model).unlink()
    os.link(served / "saved_model.pb", record["hard"].saved_model)  # another name of the same file: removing it is fine
    link(doomed, "candidate", served)
    for age, run in enumerate([*record.values(), doomed], start=2):
        set_age(run, 20 if run is doomed else age)

    summary = prune(Root(root), RunsConfig(keep=1, keep_records=7))

    assert fates(summary) == {"newest": ("whole", "keep"), **{name: ("whole", "record") for name in record},
                              "doomed": ("whole", "delete")}
    assert {p: p.read_bytes() for p in protected} == protected and Repository(root, "stoke").versions() == [7]
    for run in record.values():
        assert files(run) == set(RECORD) | {"pruned.json"}, run.run_id
        assert not os.path.lexists(os.path.join(run.uri, "candidate")), run.run_id
    assert not os.path.lexists(doomed.uri)
    again = prune(Root(root), RunsConfig(keep=1, keep_records=7))  # nothing left half done
    assert {f.action for f in again.runs} == {"keep"}


def test_keys_that_spell_a_way_out_of_a_run_folder_on_a_bucket_are_its_own(s3_bucket, tmp_path):
    """A bucket has no links, and a key is a name, '..' and all: a run folder's keys that read as paths to
    the served version are removed as they are spelled, and the version keeps every file."""
    root = f"s3://{s3_bucket}/root"
    doomed, lighter, newest = (make_run(root, name) for name in ("run-1", "run-2", "run-3"))
    served = serve(root, tmp_path, 7, "run-3").version_uri(7)
    fs, path = filesystem(served)
    protected = {key: fs.cat_file(key) for key in fs.find(path)}
    climbing = ["candidate/../../../models/stoke/7/saved_model.pb", "tfma/../../../models/stoke/7/variables",
                "../../models/stoke/7/saved_model.pb", "./candidate/../../../models/stoke/7/saved_model.pb"]
    for run in (doomed, lighter):
        for key in climbing:
            write_bytes(f"{run.uri}/{key}", b"the run's own")

    summary = prune(Root(root), RunsConfig(keep=1, keep_records=2))

    assert fates(summary) == {"run-3": ("whole", "keep"), "run-2": ("whole", "record"), "run-1": ("whole", "delete")}
    assert {key: fs.cat_file(key) for key in fs.find(path)} == protected
    assert files(lighter) == set(RECORD) | {"pruned.json"} | set(climbing[2:]) and not files(doomed)
