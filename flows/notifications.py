"""Bucket notifications: the objects a bucket announces as created, read from a queue.

    sqs://QUEUE                                 S3 event notifications delivered to SQS (boto3)
    pubsub://projects/P/subscriptions/S          GCS notifications delivered to Pub/Sub

A queue hands out messages; `collect` gathers them until the queue has been quiet for a while (a
burst of uploads is one batch), `created` reads which new objects a message names, and `done`
deletes (SQS) or acknowledges (Pub/Sub) them. The watcher calls `done` only after it has emitted its
event: a crash in between delivers the messages again, which at worst asks for an ingest that finds
nothing new. An S3 event holds a list of records, and each is judged alone: a malformed or foreign
record is a reason in `Announced.dropped`, never the loss of the good records beside it.
Plain code, no Prefect: the watcher (flows/watch_bucket.py) decides what to do.
"""
from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
from dataclasses import dataclass

from components.contracts.secrets import without_secrets

SQS_WAIT_LIMIT = 20  # seconds: SQS's longest long poll
BATCH = 10  # messages per SQS receive and delete, its maximum
PUBSUB_PATH = re.compile(r"projects/[^/\s]+/subscriptions/[^/\s]+")
SQS_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}(\.fifo)?")  # SQS's own rule for queue names


class NotificationError(ValueError):
    """A --notifications value that names no queue; the message says what is expected."""


class Dropped(ValueError):
    """A record or message that names no created object (a test event, a deletion, garbage)."""


@dataclass(frozen=True)
class Announced:
    """What one message announces: the created objects' URIs, and why each other record (or the
    whole message) names none."""
    uris: list[str]
    dropped: list[str]


@dataclass(frozen=True)
class Message:
    id: str  # the queue's message id: one message received twice in a window counts once
    receipt: str  # what deletes or acknowledges it: SQS's receipt handle, Pub/Sub's ack id
    body: bytes
    attributes: dict[str, str]


def checked(uri: str) -> str:
    """A --notifications value, spelled as `open_queue` reads it; NotificationError when it names no queue
    (checked before anything is served or registered, without reaching the queue)."""
    scheme, has_scheme, rest = uri.strip().partition("://")
    scheme = scheme.lower()
    if has_scheme and ((scheme == "sqs" and SQS_NAME.fullmatch(rest)) or
                       (scheme == "pubsub" and PUBSUB_PATH.fullmatch(rest))):
        return f"{scheme}://{rest}"
    raise NotificationError(f"--notifications {without_secrets(repr(uri))}: expected sqs://QUEUE_NAME or "
                            "pubsub://projects/PROJECT/subscriptions/SUBSCRIPTION")


def open_queue(uri: str):
    """The queue a --notifications value names: an SqsQueue or a PubSubSubscription."""
    scheme, _, name = checked(uri).partition("://")
    return SqsQueue(name) if scheme == "sqs" else PubSubSubscription(name)


def collect(queue, wait_seconds: float, quiet_seconds: float, limit: int) -> list[Message]:
    """Messages until the queue has been quiet for `quiet_seconds` after the first one (waiting at
    most `wait_seconds` for that first one), or until `limit` are held."""
    held: dict[str, Message] = {}
    deadline = time.monotonic() + wait_seconds
    last = None
    while len(held) < limit:
        budget = (deadline if last is None else last + quiet_seconds) - time.monotonic()
        if budget <= 0:
            break
        got = queue.receive(budget, limit - len(held))
        if got:
            last = time.monotonic()
            held.update((m.id, m) for m in got)  # a redelivery within the window: the newest receipt
    return list(held.values())


def created(message: Message) -> Announced:
    """The objects a message announces as created, each of its records judged alone."""
    if "eventType" in message.attributes or "bucketId" in message.attributes:
        return _each([message.attributes], _gcs_object, single=True)
    try:
        body = json.loads(message.body)
    except (ValueError, RecursionError):
        return Announced([], ["not JSON: neither an S3 event nor a GCS notification"])
    if isinstance(body, dict) and body.get("Type") == "Notification" and isinstance(body.get("Message"), str):
        return created(Message(message.id, message.receipt, body["Message"].encode(), {}))  # through SNS
    if isinstance(body, dict) and body.get("Event") == "s3:TestEvent":
        return Announced([], ["S3's test event (sent when the notification is configured)"])
    records = body.get("Records") if isinstance(body, dict) else None
    if not isinstance(records, list) or not records:
        return Announced([], ["no Records: not an S3 event notification"])
    return _each(records, _s3_object, single=len(records) == 1)


def _each(records: list, read, single: bool) -> Announced:
    found = Announced([], [])
    for number, record in enumerate(records):
        try:
            found.uris.append(read(record))
        except Dropped as why:
            found.dropped.append(str(why) if single else f"record {number}: {why}")
    return found


def _s3_object(record) -> str:
    try:
        name, bucket, key = record["eventName"], record["s3"]["bucket"]["name"], record["s3"]["object"]["key"]
    except (KeyError, TypeError):
        return _dropped("an S3 record without eventName, bucket or key")
    if not (isinstance(name, str) and name.startswith("ObjectCreated:")):
        return _dropped(f"S3 event {_short(name)}: not a created object")
    if not (isinstance(bucket, str) and isinstance(key, str) and bucket and key):
        return _dropped("an S3 record whose bucket or key is not a name")
    return f"s3://{bucket}/{urllib.parse.unquote_plus(key)}"  # keys arrive URL-encoded, spaces as +


def _gcs_object(attributes: dict[str, str]) -> str:
    kind, bucket, name = attributes.get("eventType"), attributes.get("bucketId"), attributes.get("objectId")
    if kind != "OBJECT_FINALIZE":
        return _dropped(f"GCS event {_short(kind)}: not a created object")
    if not (bucket and name):
        return _dropped("a GCS notification without bucketId or objectId")
    return gcs_uri(bucket, name)


def gcs_uri(bucket: str, name: str) -> str:
    return f"gs://{bucket}/{name}"


def _dropped(reason: str):
    raise Dropped(reason)


def _short(value) -> str:
    """A value from a message as a reason shows it: whatever its size, a log line stays short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class SqsQueue:
    """An SQS queue by name, through boto3 (AWS_* settings and AWS_ENDPOINT_URL, as s3fs reads them)."""

    def __init__(self, name: str):
        import boto3

        self.name = name
        self.client = boto3.client("sqs")
        self.url = self.client.get_queue_url(QueueName=name)["QueueUrl"]

    def receive(self, wait_seconds: float, limit: int) -> list[Message]:
        # Whole seconds only: a window shorter than one second waits one.
        wait = min(max(math.ceil(wait_seconds), 1), SQS_WAIT_LIMIT)
        answer = self.client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=min(limit, BATCH),
                                             WaitTimeSeconds=wait)
        return [Message(m["MessageId"], m["ReceiptHandle"], m.get("Body", "").encode(), {})
                for m in answer.get("Messages", [])]

    def done(self, messages: list[Message]) -> list[str]:
        """Deletes the messages; returns the ids SQS would not delete (they come back: harmless)."""
        failed = []
        for start in range(0, len(messages), BATCH):
            entries = [{"Id": str(i), "ReceiptHandle": m.receipt} for i, m in enumerate(messages[start:start + BATCH])]
            answer = self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
            failed += [messages[start + int(f["Id"])].id for f in answer.get("Failed", [])]
        return failed


class PubSubSubscription:
    """A Pub/Sub subscription, through google-cloud-pubsub (PUBSUB_EMULATOR_HOST reaches an emulator)."""

    def __init__(self, path: str):
        from google.cloud import pubsub_v1

        self.name = path
        self.client = pubsub_v1.SubscriberClient()

    def receive(self, wait_seconds: float, limit: int) -> list[Message]:
        from google.api_core import exceptions

        try:
            answer = self.client.pull(subscription=self.name, max_messages=limit, timeout=max(wait_seconds, 0.1))
        except exceptions.DeadlineExceeded:
            return []
        return [Message(r.message.message_id, r.ack_id, bytes(r.message.data), dict(r.message.attributes))
                for r in answer.received_messages]

    def done(self, messages: list[Message]) -> list[str]:
        """Acknowledges the messages (Pub/Sub reports no per-message failures on a plain subscription)."""
        for start in range(0, len(messages), 1000):
            self.client.acknowledge(subscription=self.name, ack_ids=[m.receipt for m in messages[start:start + 1000]])
        return []
