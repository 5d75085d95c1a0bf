"""watch-bucket on bucket notifications: S3 events delivered to SQS by moto's server (a real bucket
notification configuration), GCS notifications through google-cloud-pubsub's client on a fake
subscription (tests/flows/fake_pubsub.py). One event per window naming the new files, messages
deleted only after it, redeliveries harmless, foreign messages one line each."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import urllib.request
from urllib.parse import quote_plus

import boto3
import pytest
from prefect.events import emit_event

from beam_jobs.ingest import ingest
from components.common import files
from components.common.spans import Spans
from components.contracts.run_config import RunConfig
from flows import notifications
from flows import watch_bucket as watcher
from flows.demo import write_digits
from flows.watch_bucket import watch_bucket
from tests import runtime_only
from tests.flows.conftest import TINY_BEAM
from tests.flows.fake_pubsub import FakeSubscription, serve
from tests.flows.test_watch_bucket import events_for
from tests.prefect_homes import migrated_home
from tests.waiting import free_port, wait_for

QUICK = {"settle_seconds": 0.5, "wait_seconds": 5}
BIN = os.path.dirname(sys.executable)


@pytest.fixture
def announced(s3_bucket, tmp_path):
    """SOURCE s3://BUCKET/incoming, whose created objects S3 announces on an SQS queue (the
    configuration's own test event included), and the digits to upload there."""
    sqs, s3 = boto3.client("sqs"), boto3.client("s3")
    queue = f"q-{s3_bucket}"[:80]
    url = sqs.create_queue(QueueName=queue, Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    s3.put_bucket_notification_configuration(Bucket=s3_bucket, NotificationConfiguration={"QueueConfigurations": [
        {"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
    local = tmp_path / "digits"
    write_digits(str(local), limit=4)
    return {"source": f"s3://{s3_bucket}/incoming", "bucket": s3_bucket, "queue": f"sqs://{queue}", "url": url,
            "images": sorted(p for p in local.rglob("*.png")), "local": local, "root": str(tmp_path / "root")}


def upload(announced, images) -> list[str]:
    s3 = boto3.client("s3")
    for image in images:
        key = f"incoming/{image.relative_to(announced['local'])}"
        s3.put_object(Bucket=announced["bucket"], Key=key, Body=image.read_bytes())
    return sorted(f"{announced['source']}/{image.relative_to(announced['local'])}" for image in images)


def in_queue(url: str) -> int:
    counts = boto3.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return sum(int(v) for v in counts.values())


def test_uploads_are_one_event_naming_them_and_foreign_records_one_line_for_the_poll(announced, s3_endpoint, caplog):
    new = upload(announced, announced["images"][:3])
    s3 = boto3.client("s3")
    s3.put_object(Bucket=announced["bucket"], Key="incoming/3/notes.txt", Body=b"a sidecar, not an image")
    s3.put_object(Bucket=announced["bucket"], Key="elsewhere/1/a.png", Body=b"outside SOURCE")
    boto3.client("sqs").send_message(QueueUrl=announced["url"], MessageBody="{not json")
    boto3.client("sqs").send_message(QueueUrl=announced["url"], MessageBody=json.dumps({"Records": [
        {"eventName": "ObjectRemoved:Delete", "s3": {"bucket": {"name": announced["bucket"]},
                                                     "object": {"key": "incoming/0/x.png"}}}]}))

    with caplog.at_level(logging.INFO):
        result = watch_bucket(source=announced["source"], root=announced["root"],
                              notifications=announced["queue"], **QUICK)

    assert result["emitted"] and result["new_files"] == 3
    events = events_for(announced["source"])
    assert [e.payload for e in events] == [{"source": announced["source"], "new_files": 3, "files": new}]
    assert in_queue(announced["url"]) == 0  # all deleted, the dropped ones too
    lines = [r.getMessage() for r in caplog.records]
    [dropped] = [line for line in lines if line.startswith("dropped ")]  # one line for the poll
    assert dropped.startswith(f"dropped 3 notification records from {announced['queue'][6:]} ")
    assert "S3's test event" in dropped and "not JSON" in dropped and "'ObjectRemoved:Delete'" in dropped
    [ignored] = [line for line in lines if line.startswith("ignored")]
    assert ignored.startswith("ignored s3://") and "elsewhere/1/a.png: not under" in ignored
    assert "\n" not in dropped + ignored


def test_messages_stay_until_the_event_is_emitted(announced, s3_endpoint, monkeypatch):
    new = upload(announced, announced["images"][:2])

    def unreachable(*args, **kwargs):
        raise ConnectionError("the events API is unreachable")

    monkeypatch.setattr(watcher, "emit_event", unreachable)
    state = watch_bucket(source=announced["source"], root=announced["root"], notifications=announced["queue"],
                         return_state=True, **QUICK)
    assert state.is_failed()
    assert in_queue(announced["url"]) >= 2  # nothing deleted: no event went out
    monkeypatch.setattr(watcher, "emit_event", emit_event)

    result = watch_bucket(source=announced["source"], root=announced["root"], notifications=announced["queue"],
                          **QUICK)
    assert result["emitted"]
    assert [e.payload["files"] for e in events_for(announced["source"])] == [new]


def unemitted_event_deletes_nothing(announced, monkeypatch, caplog, fail) -> None:
    """Prefect's emit_event does not raise when it cannot emit: it logs and returns None. Then the
    messages stay in the queue, the run fails in one line, and the next run gets them again."""
    from prefect.events.worker import EventsWorker

    new = upload(announced, announced["images"][:2])
    try:
        fail()
        with caplog.at_level(logging.INFO):
            state = watch_bucket(source=announced["source"], root=announced["root"],
                                 notifications=announced["queue"], return_state=True, **QUICK)
    finally:
        EventsWorker.set_client_override(None)
        monkeypatch.undo()
    assert state.is_failed() and "could not be emitted" in state.message and "\n" not in state.message
    assert in_queue(announced["url"]) >= 2  # nothing deleted
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "could not be emitted" in r.getMessage()]
    assert len(said) == 1, said

    result = watch_bucket(source=announced["source"], root=announced["root"], notifications=announced["queue"],
                          **QUICK)
    assert result["emitted"] and in_queue(announced["url"]) == 0
    assert [e.payload["files"] for e in events_for(announced["source"])] == [new]


def test_emit_returning_none_deletes_no_message(announced, s3_endpoint, monkeypatch, caplog):
    unemitted_event_deletes_nothing(announced, monkeypatch, caplog,
                                    lambda: monkeypatch.setattr(watcher, "emit_event", lambda *args, **kwargs: None))


def test_no_events_client_deletes_no_message(announced, s3_endpoint, monkeypatch, caplog):
    """Prefect's own emit_event, with an events worker that sends nothing: it answers None."""
    from prefect.events.clients import NullEventsClient
    from prefect.events.worker import EventsWorker

    unemitted_event_deletes_nothing(announced, monkeypatch, caplog, lambda: EventsWorker.set_client_override(NullEventsClient))


def s3_record(bucket: str, key: str, name: str = "ObjectCreated:Put") -> dict:
    return {"eventName": name, "s3": {"bucket": {"name": bucket}, "object": {"key": quote_plus(key, safe="/")}}}


def test_a_bad_record_keeps_the_good_ones_of_its_message_and_is_deleted_after_the_event(announced, s3_endpoint,
                                                                                        caplog):
    new = upload(announced, announced["images"][:3])
    sqs, bucket = boto3.client("sqs"), announced["bucket"]
    sqs.purge_queue(QueueUrl=announced["url"])  # the notifications S3 sent: now one message names all three
    keys = [uri.removeprefix(f"s3://{bucket}/") for uri in new]
    records = [s3_record(bucket, keys[0]), None, s3_record(bucket, keys[1]),
               s3_record(bucket, keys[0], "ObjectRemoved:Delete"), {"eventName": "ObjectCreated:Put"},
               s3_record(bucket, keys[2])]
    sqs.send_message(QueueUrl=announced["url"], MessageBody=json.dumps({"Records": records}))
    with caplog.at_level(logging.INFO):
        result = watch_bucket(source=announced["source"], root=announced["root"],
                              notifications=announced["queue"], **QUICK)
    assert result["emitted"] and result["new_files"] == 3 and result["messages"] == 1
    assert [e.payload["files"] for e in events_for(announced["source"])] == [new]
    assert in_queue(announced["url"]) == 0
    [dropped] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped")]
    assert dropped.startswith("dropped 3 notification records ") and "record 1: " in dropped
    assert "record 3: S3 event 'ObjectRemoved:Delete'" in dropped and "record 4: " in dropped


def message(body) -> notifications.Message:
    return notifications.Message("m-1", "r-1", (body if isinstance(body, str) else json.dumps(body)).encode(), {})


def test_one_bad_record_among_ten_thousand_loses_none_of_the_others():
    records = [s3_record("b", f"incoming/{i}.png") for i in range(9_999)]
    records.insert(5_000, {"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"}}})
    found = notifications.created(message({"Records": records}))
    assert found.uris == [f"s3://b/incoming/{i}.png" for i in range(9_999)]
    assert found.dropped == ["record 5000: an S3 record without eventName, bucket or key"]


BAD_RECORDS = {
    "null": None, "a string": "ObjectCreated:Put", "a list": [1, 2], "empty": {}, "no s3": {"eventName": "ObjectCreated:Put"},
    "s3 not an object": {"eventName": "ObjectCreated:Put", "s3": "b/k"},
    "key a number": {"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"}, "object": {"key": 5}}},
    "bucket empty": {"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": ""}, "object": {"key": "k"}}},
    "event a number": {"eventName": 7, "s3": {"bucket": {"name": "b"}, "object": {"key": "k"}}},
    "a deletion": s3_record("b", "k", "ObjectRemoved:Delete"),
    "a huge event name": s3_record("b", "k", "ObjectCreated" + "x" * 100_000),
}


@pytest.mark.parametrize("where", [0, 1, 2])  # first, between, last
@pytest.mark.parametrize("bad", BAD_RECORDS, ids=list(BAD_RECORDS))
def test_each_kind_of_bad_record_is_left_out_alone_wherever_it_stands(bad, where):
    records = [s3_record("b", "incoming/a.png"), s3_record("b", "incoming/b c.png")]
    records.insert(where, BAD_RECORDS[bad])
    for body in ({"Records": records}, {"Type": "Notification", "Message": json.dumps({"Records": records})}):  # SNS too
        found = notifications.created(message(body))
        assert found.uris == ["s3://b/incoming/a.png", "s3://b/incoming/b c.png"]
        [why] = found.dropped
        assert why.startswith(f"record {where}: ") and len(why) < 200, why


@pytest.mark.parametrize("body, why", [
    ("{not json", "not JSON"), ({"Event": "s3:TestEvent"}, "S3's test event"), ({"Records": []}, "no Records"),
    ({"Records": "x"}, "no Records"), ([1, 2], "no Records"), ({"Records": [None]}, "an S3 record without"),
])
def test_a_message_that_names_nothing_says_why_once(body, why):
    found = notifications.created(message(body))
    assert found.uris == [] and len(found.dropped) == 1 and found.dropped[0].startswith(why), found


def test_a_crash_between_event_and_delete_redelivers_without_a_second_span(announced, s3_endpoint, monkeypatch,
                                                                           tmp_path):
    boto3.client("s3").put_object(Bucket=announced["bucket"], Key="incoming/9/early.png",
                                  Body=announced["images"][3].read_bytes())
    boto3.client("sqs").purge_queue(QueueUrl=announced["url"])  # a file whose notification was lost
    new = upload(announced, announced["images"][:3])

    def crash(self, messages):
        raise KeyboardInterrupt("killed after the event, before the delete")

    monkeypatch.setattr(notifications.SqsQueue, "done", crash)
    with pytest.raises(KeyboardInterrupt):
        watch_bucket(source=announced["source"], root=announced["root"], notifications=announced["queue"], **QUICK)
    monkeypatch.undo()
    result = watch_bucket(source=announced["source"], root=announced["root"], notifications=announced["queue"],
                          **QUICK)
    assert result["emitted"] and in_queue(announced["url"]) == 0
    events = events_for(announced["source"])
    assert [e.payload["files"] for e in events] == [new, new]  # delivered twice

    for number, event in enumerate(events):  # each event's train run ingests the files it names
        arrived = str(tmp_path / f"arrived-{number}.txt")
        files.write_text(arrived, "\n".join(event.payload["files"]) + "\n")
        summary = ingest(RunConfig(source=announced["source"], root=announced["root"]), TINY_BEAM, arrived=arrived)
        assert summary.published == (number == 0), summary.message
    [manifest] = Spans(announced["root"]).manifests(checked=False)
    assert sorted(s.uri for s in manifest.sources) == new  # only the named files were read

    nightly = ingest(RunConfig(source=announced["source"], root=announced["root"]), TINY_BEAM)
    assert nightly.published and nightly.new_sources == 1  # the full listing finds what was not announced

    upload(announced, announced["images"][:1])  # the same bytes again: the same ETag, already published
    again = watch_bucket(source=announced["source"], root=announced["root"], notifications=announced["queue"],
                         **QUICK)
    assert not again["emitted"] and again["reason"] == "nothing new" and in_queue(announced["url"]) == 0


@pytest.fixture(scope="module")
def pubsub(tmp_path_factory):
    subscription = FakeSubscription()
    server, port = serve(subscription)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port}")
        yield subscription
    server.stop(None)


def finalized(subscription: FakeSubscription, bucket: str, name: str, kind: str = "OBJECT_FINALIZE") -> str:
    resource = {"bucket": bucket, "name": name, "size": "1", "generation": "1"}
    return subscription.publish(json.dumps(resource).encode(), eventType=kind, bucketId=bucket, objectId=name,
                                objectGeneration="1", payloadFormat="JSON_API_V1")


def test_gcs_notifications_through_pubsub_are_acknowledged_after_the_event(pubsub, tmp_path, caplog, monkeypatch):
    # The watcher stats each announced file in SOURCE: a local folder stands in for the bucket here,
    # so the notifications name it as file:// objects of a "bucket" that is the folder's path.
    source = tmp_path / "incoming"
    write_digits(str(source), limit=2)
    images = sorted(str(p.relative_to(source)) for p in source.rglob("*.png"))
    path = "projects/p/subscriptions/stoke"
    ids = [finalized(pubsub, "photos", f"incoming/{name}") for name in images]
    foreign = [finalized(pubsub, "another-bucket", f"incoming/{images[0]}"),
               finalized(pubsub, "photos", f"incoming/{images[0]}", kind="OBJECT_DELETE"),
               pubsub.publish(b"\x00garbage")]
    monkeypatch.setattr(notifications, "gcs_uri", lambda bucket, name: (
        f"{tmp_path}/{name}" if bucket == "photos" else f"gs://{bucket}/{name}"))

    def unreachable(*args, **kwargs):
        raise ConnectionError("the events API is unreachable")

    monkeypatch.setattr(watcher, "emit_event", unreachable)
    state = watch_bucket(source=str(source), root=str(tmp_path / "root"), notifications=f"pubsub://{path}",
                         return_state=True, **QUICK)
    assert state.is_failed() and pubsub.acked == [] and pubsub.unacknowledged() == 5
    monkeypatch.setattr(watcher, "emit_event", emit_event)
    pubsub.expire_leases()
    caplog.clear()

    with caplog.at_level(logging.INFO):
        result = watch_bucket(source=str(source), root=str(tmp_path / "root"), notifications=f"pubsub://{path}",
                              **QUICK)
    assert result["emitted"] and result["new_files"] == 2
    assert [e.payload["files"] for e in events_for(str(source))] == [[f"{source}/{name}" for name in images]]
    assert sorted(pubsub.acked) == sorted(ids + foreign) and pubsub.unacknowledged() == 0
    dropped = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("dropped", "ignored"))]
    assert len(dropped) == 2 and dropped[0].startswith("dropped 2 notification records "), dropped


def test_a_notifications_value_with_a_password_fails_the_run_without_echoing_it(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        state = watch_bucket(source=str(tmp_path), root=str(tmp_path / "root"), notifications="sqs://u:hunter2@queue",
                             return_state=True)
    assert state.is_failed() and "sqs://u:***@queue" in state.message and "hunter2" not in state.message
    assert caplog.records and not any("hunter2" in r.getMessage() for r in caplog.records)


def test_stoke_up_reads_the_queue_with_the_runtime_dependencies_alone(announced, s3_endpoint, tmp_path,
                                                                      tmp_path_factory):
    """`stoke up --notifications sqs://...`, its server and the poll it serves, with the packages only the test
    extras install made unimportable (tests/runtime_only.py): what `make install` installs reads and deletes the
    queue's messages. (They name nothing new under SOURCE, so no training run follows.)"""
    boto3.client("s3").put_object(Bucket=announced["bucket"], Key="elsewhere/1/a.png", Body=b"outside SOURCE")
    assert in_queue(announced["url"]) == 2  # S3's test event and the foreign object
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in runtime_only.environment(tmp_path / "runtime").items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(migrated_home(tmp_path_factory, tmp_path / "home")), PREFECT_RUNNER_POLL_FREQUENCY="1")
    with open(tmp_path / "up.out", "w") as out, open(tmp_path / "up.err", "w") as err:
        up = subprocess.Popen([os.path.join(BIN, "stoke"), "up", "--source", announced["source"], "--root",
                               announced["root"], "--notifications", announced["queue"], "--port", str(port),
                               "--poll-seconds", "3600", "--json"], stdout=out, stderr=err, env=env)
    try:
        poll = wait_for(lambda: _get(f"{api}/deployments/name/watch-bucket/poll"), "stoke up to serve the poll", 180,
                        process=up)
        polled = subprocess.run([os.path.join(BIN, "prefect"), "deployment", "run", "watch-bucket/poll", "--watch",
                                 *(f"-p={name}={value}" for name, value in QUICK.items())],
                                env={**env, "PREFECT_API_URL": api}, capture_output=True, text=True, timeout=300)
        runs = _post(f"{api}/flow_runs/filter", {"deployments": {"id": {"any_": [poll["id"]]}}})
        states = [r["state_type"] for r in runs if r["state_type"] != "SCHEDULED"]
        assert polled.returncode == 0 and states == ["COMPLETED"], polled.stdout[-3000:]
        assert in_queue(announced["url"]) == 0
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=90)
    assert up.returncode == 0 and json.loads((tmp_path / "up.out").read_text().strip().splitlines()[-1])["stopped"]


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)
    except OSError:
        return None


def _post(url: str, body: dict):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)
