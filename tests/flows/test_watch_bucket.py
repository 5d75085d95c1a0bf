"""watch-bucket: one stoke.data.arrived event per settled burst, none when nothing changed, a local
folder and moto's S3 server alike."""
from __future__ import annotations

import threading
import time
import uuid

from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.events import emit_event
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.states import Cancelled, Running

from beam_jobs.sources import list_source
from components.common import files
from components.contracts import layout
from components.contracts.secrets import SOURCE_ENV, without_secrets
from flows.demo import write_digits
from flows.pipeline import pipeline
from flows.watch_bucket import EVENT, source_resource, watch_bucket
from tests.beam_jobs import images
from tests.credentials import PASSWORD, USER, basic_auth_server, shows
from tests.waiting import wait_for


def events_for(source: str) -> list:
    """stoke.data.arrived events about SOURCE, after a marker event sent last has arrived (events
    are stored asynchronously; the marker shows that everything sent before it is in)."""
    marker = f"stoke.test.marker.{uuid.uuid4().hex}"
    emit_event("stoke.test.marker", resource={"prefect.resource.id": marker})
    with get_client(sync_client=True) as client:
        wait_for(lambda: client.read_events(EventFilter(resource=EventResourceFilter(id=[marker])), limit=50).events,
                 "the marker event to reach the server", 30, every=0.1)
        return client.read_events(EventFilter(event=EventNameFilter(name=[EVENT]),
                                              resource=EventResourceFilter(id=[f"stoke.source.{source}"])), limit=50).events


def publish_everything_in(source: str, root: str) -> None:
    """A manifest holding every file of SOURCE, as the ingest job would publish it."""
    listing = list_source(source, 0.1)
    manifest = {"span": 1, "created": "2026-01-01T00:00:00Z", "compression": "gzip", "source": source,
                "counts": {"train": 0, "eval": 0, "dead_letter": 0, "duplicates": 0}, "labels": [], "shards": [],
                "sources": [{"uri": s.uri, "size": s.size, "version": s.version} for s in listing.sources]}
    files.write_json(files.join(layout.Root(root).span(1), layout.MANIFEST), manifest)


def test_a_burst_of_files_is_one_event_and_published_files_are_none(digits, tmp_path):
    root = str(tmp_path / "root")
    result = watch_bucket(source=digits, root=root, settle_seconds=0.2)
    assert result["emitted"] and result["new_files"] == 40
    events = events_for(digits)
    assert len(events) == 1
    assert events[0].payload == {"source": digits, "new_files": 40}

    publish_everything_in(digits, root)
    result = watch_bucket(source=digits, root=root, settle_seconds=0.2)
    assert not result["emitted"] and result["reason"] == "nothing new"
    assert len(events_for(digits)) == 1


def test_a_listing_that_is_still_changing_emits_nothing(tmp_path):
    source = str(tmp_path / "uploads")
    write_digits(source, limit=5)
    stop = threading.Event()

    def upload():  # one more file every 50 ms until the flow is done
        count = 5
        while not stop.is_set():
            count += 1
            write_digits(source, limit=count)
            time.sleep(0.05)

    uploader = threading.Thread(target=upload)
    uploader.start()
    try:
        result = watch_bucket(source=source, root=str(tmp_path / "root"), settle_seconds=1.0)
    finally:
        stop.set()
        uploader.join()
    assert not result["emitted"] and result["reason"] == "still changing"
    assert events_for(source) == []


def test_no_event_while_a_train_run_for_the_source_is_waiting_or_running(digits, tmp_path):
    with get_client(sync_client=True) as client:
        running = client.create_flow_run(pipeline, parameters={"source": digits}, state=Running())
        try:
            result = watch_bucket(source=digits, root=str(tmp_path / "root"), settle_seconds=0.2)
        finally:
            client.set_flow_run_state(running.id, Cancelled(), force=True)
        assert client.read_flow_run(running.id).state_type == StateType.CANCELLED
    assert not result["emitted"] and running.name in result["reason"]
    assert events_for(digits) == []


def test_new_files_in_an_s3_bucket_are_one_event(s3_bucket, tmp_path):
    source = f"s3://{s3_bucket}/digits"
    write_digits(source, limit=12)
    result = watch_bucket(source=source, root=str(tmp_path / "root"), settle_seconds=0.2)
    assert result["emitted"] and result["new_files"] == 12
    events = events_for(source)
    assert [e.payload for e in events] == [{"source": source, "new_files": 12}]
    assert events[0].resource.id == source_resource(source)["prefect.resource.id"]


def test_a_broken_span_manifest_fails_the_poll_at_once_naming_it(digits, tmp_path):
    root = str(tmp_path / "root")
    manifest = layout.Root(root).manifest(1)
    files.write_text(manifest, "{")
    state = watch_bucket(source=digits, root=root, settle_seconds=0.2, return_state=True)
    assert state.is_failed() and state.message.startswith(f"{manifest} is not JSON")
    assert events_for(digits) == []


def test_an_event_prefect_could_not_emit_fails_the_poll_instead_of_saying_emitted(digits, tmp_path, monkeypatch):
    """emit_event answers None when it could not emit (it logs why); the next poll asks again."""
    from flows import watch_bucket as watcher

    monkeypatch.setattr(watcher, "emit_event", lambda *args, **kwargs: None)
    state = watch_bucket(source=digits, root=str(tmp_path / "root"), settle_seconds=0.2, return_state=True)
    assert state.is_failed() and "could not be emitted; the next poll asks again" in state.message
    monkeypatch.undo()
    result = watch_bucket(source=digits, root=str(tmp_path / "root"), settle_seconds=0.2)
    assert result["emitted"] and len(events_for(digits)) == 1


def test_a_source_behind_a_password_is_listed_with_it_and_announced_without_it(tmp_path, monkeypatch):
    """The deployment's SOURCE holds *** for the password; the poll lists SOURCE with the one STOKE_SOURCE
    gives, and its event (what the train run it asks for gets as `source`) never holds it."""
    photos = tmp_path / "site" / "photos"
    for index, label in enumerate(["cat", "cat", "dog"]):
        (photos / label).mkdir(parents=True, exist_ok=True)
        (photos / label / f"{index}.jpg").write_bytes(images.rgb_jpeg(index))
    (photos / "manifest.csv").write_text("uri,label\ncat/0.jpg,cat\ncat/1.jpg,cat\ndog/2.jpg,dog\n")
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    with basic_auth_server(str(tmp_path / "site")) as port:
        real = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/photos/manifest.csv"
        shown = without_secrets(real)
        state = watch_bucket(source=shown, root=str(tmp_path / "root"), settle_seconds=0.2, return_state=True)
        assert state.is_failed() and SOURCE_ENV in state.message and state.message.count("\n") == 0
        monkeypatch.setenv(SOURCE_ENV, real)
        result = watch_bucket(source=shown, root=str(tmp_path / "root"), settle_seconds=0.2)
    assert result["emitted"] and result["new_files"] == 3, result
    assert [e.payload for e in events_for(shown)] == [{"source": shown, "new_files": 3}]
    assert not shows(str(result))
