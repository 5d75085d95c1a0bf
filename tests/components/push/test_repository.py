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
import time

import pytest

from components.common.repository import Repository, RepositoryError

_REMOVALS: list = []  # the audit hook below is installed once per process and records only when a test asks


def _audit(event, args):
    if _REMOVALS and event in ("os.remove", "os.rmdir", "shutil.rmtree", "os.rename"):
        _REMOVALS[0](event, args)


sys.addaudithook(_audit)


def fake_model(folder, payload_mb: int = 0) -> str:
    """A folder shaped like a SavedModel; `payload_mb` makes copying it take a while."""
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"graph")
    (folder / "fingerprint.pb").write_bytes(b"fp")
    (folder / "variables" / "variables.index").write_bytes(b"index")
    (folder / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(1 << 20) * max(payload_mb, 1))
    return str(folder)


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
# lock for `hold` seconds: two of them started together race for real. "push-then-publish" holds the
# lock (its bucket lease lapsing `ttl` s after its last renewal) and publishes when the file go.publish appears.
RACER = textwrap.dedent("""
    import os, sys, time
    from components.common.repository import Repository, RepositoryError
    root, go, action, extra, hold, ttl = sys.argv[1:7]
    repo = Repository(root, "stoke")
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
                else:
                    time.sleep(float(hold))
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
    time.sleep(1.0)  # both imported and polling
    (tmp_path / "go").write_text("go")
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
    assert holder.stdout.readline().strip() == "held"
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
        assert repo.remove_partial() == [".push-200"]


def test_rollback_waits_for_a_live_push_and_spares_its_temp_folder(tmp_path, monkeypatch):
    from components.push import rollback

    source = fake_model(tmp_path / "model")
    root = str(tmp_path / "root")
    repo = Repository(root, "stoke")
    for version in (101, 102):
        repo.publish(source, version, {"assets.extra/stoke_lineage.json": lineage_bytes(version)})
    (tmp_path / "go").write_text("go")
    holder = start(tmp_path, root, "push", ".push-200", hold=60)
    assert holder.stdout.readline().strip() == "held"
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
        repo.remove_partial()
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
        assert holder.stdout.readline().strip() == "held"
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
        assert frozen.stdout.readline().strip() == "held"
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
