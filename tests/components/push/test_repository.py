"""The model repository on its own (no TensorFlow): versions appear and go in an order TF Serving
can never catch half-way, and only one process changes the repository at a time."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from components.common.repository import Repository, RepositoryError
from tests.components.conftest import fake_model
from tests.waiting import first_line, wait_for

_REMOVALS: list = []  # the audit hook below is installed once per process and records only when a test asks


def _audit(event, args):
    if _REMOVALS and event in ("os.remove", "os.rmdir", "shutil.rmtree", "os.rename"):
        _REMOVALS[0](event, args)


sys.addaudithook(_audit)


def lineage_bytes(version: int) -> bytes:
    return json.dumps({"model_name": "stoke", "version": version}).encode()


def test_retention_takes_saved_model_out_before_deleting(tmp_path):
    """While a version is deleted TF Serving may rescan: it must stop looking servable first."""
    source = fake_model(tmp_path / "model")
    repo = Repository(str(tmp_path / "root"), "stoke")
    for version in (101, 102):
        repo.publish(source, version, {"assets.extra/stoke_lineage.json": lineage_bytes(version)})
    old = os.path.join(repo.path, "101")
    servable_while_deleting = []

    def watch(event, args):
        path = str(args[0])
        if path.startswith(old) and path != os.path.join(old, "saved_model.pb"):
            servable_while_deleting.append((event, path, os.path.exists(os.path.join(old, "saved_model.pb"))))

    _REMOVALS.append(watch)
    try:
        with repo.lock("retention"):
            assert repo.apply_retention(1, "2026-01-01T00:00:00Z") == [101]
    finally:
        _REMOVALS.clear()
    assert servable_while_deleting and not any(present for _, _, present in servable_while_deleting)
    assert not os.path.exists(old) and repo.versions() == [102]
    assert repo.retired() == [101] and json.load(open(os.path.join(repo.path, "_retired", "101.json")))["retired_at"]


# A child process that waits for the start signal (a file), then publishes version 7 or holds the
# lock for `hold` seconds or until the file go.release appears: two of them started together race for
# real. "push-then-publish" holds the lock (its bucket lease lapsing `ttl` s after its last renewal) and
# publishes when the file go.publish appears.
RACER = textwrap.dedent("""
    import os, sys, time
    from components.common.repository import Repository, RepositoryError
    root, go, action, extra, hold, ttl = sys.argv[1:7]
    repo = Repository(root, "stoke")
    open(f"{go}.ready-{os.getpid()}", "w").close()  # imported: polling from here on
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        if action == "publish":
            repo.publish(extra, 7, {"assets.extra/stoke_lineage.json": b"{}"})
        else:
            with repo.lock(action.split("-")[0], wait=0, ttl=float(ttl)):
                if extra and action == "push":
                    os.mkdir(os.path.join(repo.path, extra))
                print("held", flush=True)
                if action == "push-then-publish":
                    while not os.path.exists(go + ".publish"):
                        time.sleep(0.01)
                    repo.publish(extra, 7, {"assets.extra/stoke_lineage.json": b"{}"})
                else:  # until `hold` s have passed or the test lets go (go.release)
                    deadline = time.monotonic() + float(hold)
                    while time.monotonic() < deadline and not os.path.exists(go + ".release"):
                        time.sleep(0.01)
        print("done", flush=True)
    except RepositoryError as error:
        print(error, flush=True)
        sys.exit(3)
""")


def start(tmp_path, root: str, action: str, extra: str = "", hold: float = 1.5, ttl: float = 120) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RACER, root, str(tmp_path / "go"), action, extra, str(hold), str(ttl)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def race(tmp_path, root: str, action: str, extra: str = "") -> list[tuple[int, str]]:
    racers = [start(tmp_path, root, action, extra) for _ in range(2)]
    wait_for(lambda: all((tmp_path / f"go.ready-{p.pid}").exists() for p in racers), "both racers to poll", 120,
             every=0.05)
    (tmp_path / "go").write_text("go")
    # A holder lets go once the other racer has finished (refused): it need not sit out its whole hold.
    wait_for(lambda: any(p.poll() is not None for p in racers), "a racer to finish", 120, every=0.01)
    (tmp_path / "go.release").write_text("go")
    outputs = [p.communicate(timeout=120)[0] for p in racers]
    return sorted((p.returncode, out) for p, out in zip(racers, outputs))


def test_two_publishes_of_one_version_never_nest(tmp_path):
    """Both find version 7 free; the one that comes second must refuse, not land inside the first."""
    source = fake_model(tmp_path / "model", payload_mb=48)
    root = str(tmp_path / "root")
    outcomes = race(tmp_path, root, "publish", source)
    assert [code for code, _ in outcomes] == [0, 3], outcomes
    assert "version 7 already exists" in outcomes[1][1]
    repo = Repository(root, "stoke")
    assert repo.versions() == [7]
    assert sorted(os.listdir(os.path.join(repo.path, "7"))) == ["assets.extra", "fingerprint.pb", "saved_model.pb",
                                                                "variables"]
    assert not [name for name in os.listdir(repo.path) if name.startswith(".push-")]


def test_local_lock_names_its_holder_and_dies_with_it(tmp_path):
    root = str(tmp_path / "root")
    (tmp_path / "go").write_text("go")
    holder = start(tmp_path, root, "push", ".push-200", hold=60)  # a live push with its temp folder
    assert first_line(holder, "the holder to take the lock") == "held"
    repo = Repository(root, "stoke")
    try:
        with pytest.raises(RepositoryError, match=rf"^rollback of stoke: push \(pid {holder.pid} on [^)]+\) holds "
                                                  rf"{re.escape(repo.path)}/\.lock; waited 0\.5 s, try again"):
            with repo.lock("rollback", wait=0.5):
                pass
        assert os.path.isdir(os.path.join(repo.path, ".push-200"))
    finally:
        holder.kill()
        holder.wait()
    with repo.lock("rollback", wait=0):  # the kernel dropped the dead holder's lock
        assert repo.tidy().removed == [".push-200"]


def test_rollback_waits_for_a_live_push_and_spares_its_temp_folder(tmp_path, monkeypatch):
    from components.push import rollback

    source = fake_model(tmp_path / "model")
    root = str(tmp_path / "root")
    repo = Repository(root, "stoke")
    for version in (101, 102):
        repo.publish(source, version, {"assets.extra/stoke_lineage.json": lineage_bytes(version)})
    (tmp_path / "go").write_text("go")
    holder = start(tmp_path, root, "push", ".push-200", hold=60)
    assert first_line(holder, "the holder to take the lock") == "held"
    monkeypatch.setenv("STOKE_LOCK_WAIT_SECONDS", "0.5")
    try:
        with pytest.raises(RepositoryError, match=r"push \(pid .*waited 0\.5 s"):
            rollback.rollback(root, "stoke", reason="bad canary")
    finally:
        holder.kill()
        holder.wait()
    assert os.path.isdir(os.path.join(repo.path, ".push-200")) and repo.versions() == [101, 102]


def test_changes_outside_the_lock_are_refused(tmp_path):
    repo = Repository(str(tmp_path / "root"), "stoke")
    with pytest.raises(RepositoryError, match="inside Repository.lock"):
        repo.tidy()
    with pytest.raises(RepositoryError, match="inside Repository.lock"):
        repo.apply_retention(1, "now")


# ---------------------------------------------------------------- on a bucket (moto)


def test_bucket_lease_admits_one_holder_at_a_time(s3_bucket, tmp_path):
    import fsspec

    root = f"s3://{s3_bucket}/root"
    outcomes = race(tmp_path, root, "push")
    assert [code for code, _ in outcomes] == [0, 3], outcomes
    assert re.search(rf"push \(pid \d+ on [^)]+\) holds {root}/models/stoke/\.lock", outcomes[1][1]), outcomes
    assert not fsspec.filesystem("s3").exists(f"{s3_bucket}/root/models/stoke/.lock")  # released


def test_bucket_lease_of_a_live_holder_is_named_and_a_killed_ones_taken_over(s3_bucket, tmp_path):
    import fsspec

    root = f"s3://{s3_bucket}/root"
    (tmp_path / "go").write_text("go")
    holder = start(tmp_path, root, "push", hold=60, ttl=2)
    try:
        assert first_line(holder, "the holder to take the lock") == "held"
        repo = Repository(root, "stoke")
        with pytest.raises(RepositoryError, match=rf"^rollback of stoke: push \(pid {holder.pid} on [^)]+\) holds "
                                                  rf"{root}/models/stoke/\.lock, renewed \d+ s ago; it lapses 2 s "
                                                  r"after the last renewal; waited 0\.3 s"):
            with repo.lock("rollback", wait=0.3):
                pass
    finally:
        holder.kill()  # its lease stays behind, unrenewed
        holder.wait()
    fs = fsspec.filesystem("s3")
    with repo.lock("rollback", wait=30):  # waits for the dead holder's lease to lapse, then takes it over
        meta = fs.call_s3("head_object", Bucket=s3_bucket, Key="root/models/stoke/.lock")["Metadata"]
        assert meta["purpose"] == "rollback" and meta["holder"].startswith(f"pid {os.getpid()} on ")
    fs.invalidate_cache()
    assert not fs.exists(f"{s3_bucket}/root/models/stoke/.lock")


def test_bucket_push_that_lost_its_lease_publishes_nothing(s3_bucket, tmp_path):
    """A push frozen past its lease (a paused VM) is taken over; when it wakes, it must not publish."""
    import fsspec

    source = fake_model(tmp_path / "model")
    root = f"s3://{s3_bucket}/root"
    (tmp_path / "go").write_text("go")
    frozen = start(tmp_path, root, "push-then-publish", source, ttl=1)
    try:
        assert first_line(frozen, "the push to take the lock") == "held"
        os.kill(frozen.pid, signal.SIGSTOP)
        repo = Repository(root, "stoke")
        with repo.lock("push", wait=30):  # taken over once the frozen holder's lease lapsed
            os.kill(frozen.pid, signal.SIGCONT)
            (tmp_path / "go.publish").write_text("go")
            output = frozen.communicate(timeout=60)[0]
            assert frozen.returncode == 3 and "lost the lease" in output, output
            assert "stopping before anything becomes visible" in output
            meta = repo.fs.call_s3("head_object", Bucket=s3_bucket, Key="root/models/stoke/.lock")["Metadata"]
            assert meta["purpose"] == "push" and meta["holder"].startswith(f"pid {os.getpid()} on ")  # left alone
    finally:
        frozen.kill()
        frozen.wait()
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert repo.versions() == [] and not fs.exists(f"{s3_bucket}/root/models/stoke/7")


# ---------------------------------------------------------------- what TF Serving would take for a version


def repository_with(tmp_path, *versions: int) -> Repository:
    source = fake_model(tmp_path / "model")
    repo = Repository(str(tmp_path / "root"), "stoke")
    for version in versions:
        repo.publish(source, version, {"assets.extra/stoke_lineage.json": lineage_bytes(version)})
    return repo


def listing_of(folder) -> dict[str, bytes]:
    """Every file under `folder` (links followed) and its bytes."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder, followlinks=True) for f in files}


def test_a_version_in_text_form_is_a_version_and_never_deleted(tmp_path):
    """TF Serving loads saved_model.pbtxt as well as saved_model.pb: such a folder is served, so it is
    the newest version, and no change to the repository deletes it."""
    repo = repository_with(tmp_path, 100)
    text = os.path.join(repo.path, "200")
    os.makedirs(os.path.join(text, "variables"))
    open(os.path.join(text, "saved_model.pbtxt"), "w").write("saved_model_schema_version: 1\n")
    before = listing_of(text)
    assert repo.versions() == [100, 200] and repo.newest() == 200
    with repo.lock("push"):
        tidied = repo.tidy()
        assert tidied.removed == [] and tidied.set_aside == []
        assert repo.apply_retention(1, "2026-01-01T00:00:00Z") == [100]
    assert repo.versions() == [200] and listing_of(text) == before
    repo.publish(fake_model(tmp_path / "next"), 300, {})
    with repo.lock("push"):
        assert repo.apply_retention(1, "2026-01-02T00:00:00Z") == [200]  # retired like any version: lineage kept
    assert not os.path.exists(text) and repo.retired() == [100, 200]


def _file(path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(name.encode())


# What an accident or another tool leaves in the repository that TF Serving reads as a version
# (strings::safe_strto64: spaces around, '-', leading zeros) and Stoke does not write.
STRANGERS = {
    "empty folder": ("300", lambda p: p.mkdir()),
    "only variables/": ("300", lambda p: _file(p / "variables" / "variables.index", "index")),
    "a file": ("300", lambda p: _file(p, "not a folder")),
    "a session bundle": ("300", lambda p: (_file(p / "export.meta", "meta"), _file(p / "saved_model.pb", "g"))),
    "a symbolic link": ("300", lambda p: (_file(p.parent.parent.parent / "elsewhere" / "saved_model.pb", "g"),
                                          p.symlink_to(p.parent.parent.parent / "elsewhere"))),
    "leading zeros": ("0300", lambda p: _file(p / "saved_model.pb", "g")),
    "negative": ("-1", lambda p: _file(p / "saved_model.pb", "g")),
    "a space before": (" 300", lambda p: _file(p / "saved_model.pb", "g")),
    "a newline after": ("300\n", lambda p: _file(p / "saved_model.pb", "g")),
}


@pytest.mark.parametrize("kind", STRANGERS)
def test_a_stranger_is_set_aside_out_of_tf_servings_sight_never_deleted(tmp_path, kind, caplog):
    from components.common.model_folders import serving_reads

    repo = repository_with(tmp_path, 100)
    name, make = STRANGERS[kind]
    make(tmp_path / "root" / "models" / "stoke" / name)
    stranger = os.path.join(repo.path, name)
    link_target = os.readlink(stranger) if os.path.islink(stranger) else None
    before = listing_of(stranger) if os.path.isdir(stranger) else open(stranger, "rb").read()
    assert serving_reads(name) is not None  # TF Serving would take it for a version
    assert repo.versions() == [100] and list(repo.survey().strangers) == [name]

    with repo.lock("push"):
        tidied = repo.tidy()
    assert tidied.removed == [] and [aside.name for aside in tidied.set_aside] == [name]
    moved = tidied.set_aside[0].moved_to
    assert os.path.dirname(moved) == repo.path and serving_reads(os.path.basename(moved)) is None
    assert not os.path.lexists(stranger)
    if link_target:  # the link moved; what it points at is as it was
        assert os.readlink(moved) == link_target and os.path.exists(os.path.join(link_target, "saved_model.pb"))
    assert (listing_of(moved) if os.path.isdir(moved) else open(moved, "rb").read()) == before
    assert f"set aside {stranger} as {os.path.basename(moved)}" in caplog.text
    assert repo.versions() == [100]
    with repo.lock("push"):
        assert repo.tidy().set_aside == []  # once is enough


def test_a_second_stranger_of_one_name_is_set_aside_beside_the_first(tmp_path):
    repo = repository_with(tmp_path, 100)
    for _ in range(2):
        os.mkdir(os.path.join(repo.path, "300"))
        with repo.lock("push"):
            repo.tidy()
    assert sorted(n for n in os.listdir(repo.path) if n.startswith("set-aside-")) == ["set-aside-300",
                                                                                      "set-aside-300-2"]


# Names TF Serving skips (its parser takes ASCII digits only, within int64) and Stoke leaves alone;
# str.isdigit() and int() take the Unicode digits.
IGNORED = ["²", "٣", "١٢٣", "０１", "9223372036854775808", "99999999999999999999", "+5", "5a", "notes", "1.5"]


def test_names_tf_serving_skips_are_no_versions_and_are_left_alone(tmp_path):
    repo = repository_with(tmp_path, 100)
    for name in IGNORED:
        _file(tmp_path / "root" / "models" / "stoke" / name / "saved_model.pb", "g")
    before = sorted(os.listdir(repo.path)) + [".lock"]
    assert repo.versions() == [100] and repo.survey().strangers == {}
    assert repo.every_number_used() == [100] and repo.next_version() > 100
    with repo.lock("push"):
        assert repo.tidy().set_aside == [] and repo.apply_retention(1, "2026-01-01T00:00:00Z") == []
    assert sorted(os.listdir(repo.path)) == sorted(before)


def test_version_numbers_end_where_tf_serving_int64_does(tmp_path):
    """A version above 2**63-1 would make models.config fail to parse ("Value out of range"): the
    server would not start. The last number is usable; after it, push refuses in one line."""
    repo = repository_with(tmp_path, 2**63 - 1)
    assert repo.versions() == [2**63 - 1]
    with pytest.raises(RepositoryError, match=r"has no version number left: 9223372036854775807 is taken and TF "
                                              r"Serving reads versions as int64") as refused:
        repo.next_version()
    assert "\n" not in str(refused.value)
    with pytest.raises(RepositoryError, match="is no version number TF Serving reads"):
        repo.publish(fake_model(tmp_path / "next"), 2**63, {})
    assert repo.versions() == [2**63 - 1] and not any(n.startswith(".push-") for n in os.listdir(repo.path))


@pytest.mark.parametrize("holder", ["rolled-back-9223372036854775807/saved_model.pb",
                                    "_retired/9223372036854775807.json"])
def test_a_number_rolled_back_or_retired_counts_up_to_the_end_too(tmp_path, holder):
    repo = repository_with(tmp_path, 100)
    _file(tmp_path / "root" / "models" / "stoke" / holder, "{}")
    with pytest.raises(RepositoryError, match="has no version number left"):
        repo.next_version()


def test_retention_never_deletes_what_it_does_not_recognise(tmp_path):
    """Older folders that hold a SavedModel but are no versions of Stoke's: int() reads '0050' as 50
    and '٣' as 3, but the paths of versions 50 and 3 are elsewhere; none of them is retired."""
    repo = repository_with(tmp_path, 100, 200)
    for name in ("50", "0050", "-7", "٣"):
        _file(tmp_path / "root" / "models" / "stoke" / name / ("saved_model.pb" if name != "50" else "x"), "g")
    with repo.lock("retention"):
        assert repo.apply_retention(1, "2026-01-01T00:00:00Z") == [100]
    assert {"50", "0050", "-7", "٣", "200"} <= set(os.listdir(repo.path)) and repo.retired() == [100]


PUBLISH = "import sys; from components.common.repository import Repository; " \
          "Repository(sys.argv[1], 'stoke').publish(sys.argv[2], 7, {'assets.extra/stoke_lineage.json': b'{}'})"


def test_on_a_bucket_only_a_push_marked_as_stokes_is_deleted(s3_bucket, tmp_path):
    """No rename on a bucket: a push writes into the version folder itself, marked `.push-<version>`
    until saved_model.pb is in. A push killed mid-copy leaves both, and only those are deleted; a
    folder TF Serving cannot load without that mark (an upload by hand, a copy by another tool) is
    set aside whole, and a version in text form is kept."""
    import fsspec

    from components.common.repository import KILL_AFTER_FILES_ENV

    root, base = f"s3://{s3_bucket}/root", f"{s3_bucket}/root/models/stoke"
    killed = subprocess.run([sys.executable, "-c", PUBLISH, root, fake_model(tmp_path / "model")],
                            env=dict(os.environ, **{KILL_AFTER_FILES_ENV: "2"}), capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert fs.exists(f"{base}/.push-7") and fs.exists(f"{base}/7") and not fs.exists(f"{base}/7/saved_model.pb")
    fs.pipe_file(f"{base}/8/variables/variables.index", b"by hand")
    fs.pipe_file(f"{base}/9/saved_model.pbtxt", b"saved_model_schema_version: 1\n")
    repo = Repository(root, "stoke")
    assert repo.versions() == [9] and repo.every_number_used() == [7, 9]
    with repo.lock("push"):
        tidied = repo.tidy()
    assert tidied.removed == ["7", ".push-7"]
    assert [(a.name, a.moved_to) for a in tidied.set_aside] == [("8", f"{root}/models/stoke/set-aside-8")]
    fs.invalidate_cache()
    assert fs.cat_file(f"{base}/set-aside-8/variables/variables.index") == b"by hand"
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(base)) == ["9", "set-aside-8"]
    assert repo.versions() == [9] and repo.next_version() > 9
