"""watch-bucket on bucket notifications: S3 events delivered to SQS by moto's server (a real bucket
notification configuration), GCS notifications through google-cloud-pubsub's client on a fake
subscription (tests/flows/fake_pubsub.py). One event per window naming the new files, messages
deleted only after it, redeliveries harmless, foreign messages one line each."""
from __future__ import annotations

import json
import logging

import boto3
import pytest
from prefect.events import emit_event

from beam_jobs.ingest import ingest
from components.common import files
from components.contracts.layout import Root
from components.contracts.run_config import IngestSettings
from flows import notifications
from flows import watch_bucket as watcher
from flows.demo import write_digits
from flows.watch_bucket import watch_bucket
from tests.flows.conftest import TINY_BEAM
from tests.flows.fake_pubsub import FakeSubscription, serve
from tests.flows.test_watch_bucket import events_for

QUICK = {"settle_seconds": 0.5, "wait_seconds": 5}


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


def test_uploads_are_one_event_naming_them_and_foreign_messages_one_line_each(announced, s3_endpoint, caplog):
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
    dropped = [line for line in lines if line.startswith(("dropped message", "ignored"))]
    assert len(dropped) == 4, dropped
    assert any("S3's test event" in line for line in dropped)
    assert any("not JSON" in line for line in dropped)
    assert any("'ObjectRemoved:Delete'" in line for line in dropped)
    assert any(line.startswith("ignored s3://") and "elsewhere/1/a.png: not under" in line for line in dropped)
    assert all("\n" not in line for line in dropped)


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
        summary = ingest(IngestSettings(source=announced["source"], root=announced["root"], arrived=arrived), TINY_BEAM)
        assert summary.published == (number == 0), summary.message
    [manifest] = Root(announced["root"]).manifests()
    assert sorted(s.uri for s in manifest.sources) == new  # only the named files were read

    nightly = ingest(IngestSettings(source=announced["source"], root=announced["root"]), TINY_BEAM)
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
    assert len(dropped) == 3, dropped
