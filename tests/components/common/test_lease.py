"""One writer at a time, on a local disk (flock) and on an S3 bucket (a lease object, on moto)."""
import os
import re
import threading
import time

import fsspec
import pytest

from components.common.lease import LeaseHeld, LeaseLost, exclusive, held


def test_a_local_lock_admits_one_holder_at_a_time_and_names_it(tmp_path):
    path = str(tmp_path / "data" / ".lock")
    with exclusive(path, "test") as held:
        with pytest.raises(LeaseHeld, match=rf"^test \(pid {os.getpid()} on [^)]+\) holds {re.escape(path)}$"):
            with exclusive(path, "other"):
                pass
        held.check()
    with exclusive(path, "test"):
        pass


def test_a_writer_waits_for_the_holder_up_to_its_deadline(tmp_path):
    path = str(tmp_path / ".lock")
    inside, done = threading.Event(), threading.Event()

    def holder():
        with exclusive(path, "first"):
            inside.set()
            done.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait(10)
    with pytest.raises(LeaseHeld, match="first"):
        with exclusive(path, "impatient", wait=0.3):
            pass
    threading.Timer(0.5, done.set).start()
    with exclusive(path, "patient", wait=30):  # gets it once the holder lets go
        assert done.is_set()
    thread.join()


def test_a_writer_that_has_to_wait_is_told_once_why(tmp_path):
    path, told = str(tmp_path / ".lock"), []
    with exclusive(path, "first"):
        with pytest.raises(LeaseHeld, match="first"):
            with exclusive(path, "second", wait=1.0, waiting=told.append):
                pass
    assert len(told) == 1 and isinstance(told[0], LeaseHeld) and str(told[0]).startswith("first (pid ")
    with exclusive(path, "third", wait=30, waiting=told.append):  # free: no wait, nothing to tell
        pass
    assert len(told) == 1


def test_a_writer_waits_for_a_bucket_lease_until_its_holder_lets_go(s3_bucket):
    uri, told, released = f"s3://{s3_bucket}/data/.lock", [], threading.Event()

    def release_when_told(held):
        told.append(held)
        threading.Timer(0.5, released.set).start()

    holder = exclusive(uri, "nightly", ttl=60)
    holder.__enter__()
    threading.Thread(target=lambda: (released.wait(30), holder.__exit__(None, None, None)), daemon=True).start()
    with exclusive(uri, "data-triggered", ttl=60, wait=60, waiting=release_when_told):
        assert released.is_set()
    assert len(told) == 1 and "nightly" in str(told[0])


def test_two_writers_racing_for_a_bucket_lease_get_one_lease(s3_bucket):
    uri = f"s3://{s3_bucket}/root/data/.lock"
    start, inside, outcomes = threading.Barrier(2), threading.Event(), []

    def writer():
        start.wait()
        try:
            with exclusive(uri, "race"):
                outcomes.append("held")
                inside.wait(10)  # until the other has tried
        except LeaseHeld as error:
            outcomes.append(error.holder)
            inside.set()

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 2 and outcomes.count("held") == 1 and any("pid" in o for o in outcomes)
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert not fs.exists(uri)  # released
    with exclusive(uri, "after"):
        pass


def test_a_live_lease_is_renewed_and_a_dead_one_lapses(s3_bucket):
    uri = f"s3://{s3_bucket}/lease"
    with exclusive(uri, "long", ttl=3) as held:
        time.sleep(4)  # longer than the TTL: only renewals keep it
        with pytest.raises(LeaseHeld, match=r"holds .*it lapses 3 s after the last renewal"):
            with exclusive(uri, "other"):
                pass
        held.check()

    fs = fsspec.filesystem("s3")
    fs.call_s3("put_object", Bucket=s3_bucket, Key="lease", Body=b"{}",  # as a writer that died left it
               Metadata={"holder": "gone pid 1", "ttl": "1"})
    with pytest.raises(LeaseHeld, match="gone pid 1"):
        with exclusive(uri, "too soon"):
            pass
    time.sleep(2.1)
    with exclusive(uri, "after the holder died") as held:
        held.check()


def test_a_lease_written_just_before_a_whole_second_is_not_lapsed_just_after_it(s3_bucket):
    """S3 dates a lease and its reply in whole seconds: 0.1 s apart can read as a second."""
    uri = f"s3://{s3_bucket}/lease"
    fs = fsspec.filesystem("s3")
    for _ in range(3):  # three boundaries, so one unlucky scheduling cannot hide a lapse
        time.sleep((0.92 - time.time()) % 1)  # until 0.08 s before a whole second
        fs.call_s3("put_object", Bucket=s3_bucket, Key="lease", Body=b"{}",
                   Metadata={"holder": "alive pid 3", "ttl": "1"})
        time.sleep((0.05 - time.time()) % 1)  # until just past it
        with pytest.raises(LeaseHeld, match="alive pid 3"):
            with exclusive(uri, "too soon"):
                pass


def test_a_holder_whose_lease_was_taken_over_learns_it_and_leaves_the_new_one(s3_bucket):
    uri = f"s3://{s3_bucket}/lease"
    fs = fsspec.filesystem("s3")
    with exclusive(uri, "slow", ttl=1) as held:
        fs.call_s3("put_object", Bucket=s3_bucket, Key="lease", Body=b"{}", Metadata={"holder": "next pid 2"})
        time.sleep(0.6)  # two renewal periods
        with pytest.raises(LeaseLost, match="another writer took it over"):
            held.check()
    assert fs.call_s3("head_object", Bucket=s3_bucket, Key="lease")["Metadata"] == {"holder": "next pid 2"}


def test_the_wait_counts_from_the_first_refusal_however_long_asking_took(tmp_path):
    """A store that answers slowly (a bucket on a busy machine) can take longer to refuse than the whole wait: the
    writer still says it waits, and waits its time, before it is refused."""
    path, told = str(tmp_path / ".lock"), []
    with exclusive(path, "first"):
        with pytest.raises(LeaseHeld, match="first"):
            with exclusive(path, "second", wait=1e-9, waiting=told.append):
                pass
    assert len(told) == 1


def test_a_look_at_a_local_lease_says_held_free_or_none_and_leaves_it_as_it_was(tmp_path):
    path = str(tmp_path / "runs" / ".running" / "a.lock")
    assert held(path) is None and not os.path.exists(path)  # a look creates nothing
    with exclusive(path, "a run"):
        assert held(path) is True
    assert held(path) is False  # the kernel dropped it: let go, or its holder died
    with exclusive(path, "its own", own=True):  # a lease no other writer takes goes with its holder
        assert held(path) is True
    assert held(path) is None


def test_a_look_at_a_bucket_lease_says_held_until_it_lapses(s3_bucket):
    uri = f"s3://{s3_bucket}/runs/.running/a.lock"
    assert held(uri) is None
    with exclusive(uri, "a run", ttl=3):
        time.sleep(4)  # renewed: held beyond its TTL
        assert held(uri) is True
    assert held(uri) is None  # let go: the object goes
    fsspec.filesystem("s3").call_s3("put_object", Bucket=s3_bucket, Key="runs/.running/a.lock", Body=b"{}",
                                    Metadata={"holder": "gone pid 1", "ttl": "1"})  # as a run that died left it
    assert held(uri) is True
    time.sleep(2.1)
    assert held(uri) is False
