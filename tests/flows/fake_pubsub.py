"""A Pub/Sub subscription on 127.0.0.1 for google-cloud-pubsub's own client (PUBSUB_EMULATOR_HOST):
the Subscriber service's Pull and Acknowledge over real gRPC, with Google's message types. Google's
emulator ships with the gcloud SDK, not on PyPI, and needs Java; this holds what the watcher uses.

Messages are leased when pulled and handed out again only when the test says the lease ran out
(`expire_leases`), as Pub/Sub redelivers after the ack deadline."""
from __future__ import annotations

import itertools
import threading
from concurrent import futures

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1.types import AcknowledgeRequest, PubsubMessage, PullRequest, PullResponse, ReceivedMessage


class FakeSubscription:
    def __init__(self):
        self.waiting: dict[str, PubsubMessage] = {}  # ack id -> message, not yet pulled (or lease expired)
        self.leased: dict[str, PubsubMessage] = {}
        self.acked: list[str] = []  # message ids, in the order acknowledged
        self.pulls = 0
        self.changed = threading.Condition()
        self.ids = itertools.count(1)

    def publish(self, data: bytes, **attributes: str) -> str:
        number = next(self.ids)
        with self.changed:
            self.waiting[f"ack-{number}"] = PubsubMessage(data=data, attributes=attributes, message_id=str(number))
            self.changed.notify_all()
        return str(number)

    def expire_leases(self) -> None:
        with self.changed:
            self.waiting.update(self.leased)
            self.leased.clear()
            self.changed.notify_all()

    def unacknowledged(self) -> int:
        with self.changed:
            return len(self.waiting) + len(self.leased)

    def pull(self, request: PullRequest, context) -> PullResponse:
        with self.changed:
            self.pulls += 1
            # As Pub/Sub: wait for a message, then answer with what is there, or empty at the deadline.
            self.changed.wait_for(lambda: self.waiting, timeout=max(min(context.time_remaining() or 1, 5) - 0.1, 0))
            taken = list(itertools.islice(self.waiting.items(), request.max_messages or 1000))
            for ack_id, message in taken:
                del self.waiting[ack_id]
                self.leased[ack_id] = message
        return PullResponse(received_messages=[ReceivedMessage(ack_id=a, message=m) for a, m in taken])

    def acknowledge(self, request: AcknowledgeRequest, context) -> empty_pb2.Empty:
        with self.changed:
            for ack_id in request.ack_ids:
                message = self.leased.pop(ack_id, None)
                if message is not None:
                    self.acked.append(message.message_id)
        return empty_pb2.Empty()


def serve(subscription: FakeSubscription) -> tuple[grpc.Server, int]:
    """A gRPC server on a free loopback port answering as google.pubsub.v1.Subscriber."""
    handlers = {
        "Pull": grpc.unary_unary_rpc_method_handler(
            subscription.pull, request_deserializer=PullRequest.deserialize, response_serializer=PullResponse.serialize),
        "Acknowledge": grpc.unary_unary_rpc_method_handler(
            subscription.acknowledge, request_deserializer=AcknowledgeRequest.deserialize,
            response_serializer=empty_pb2.Empty.SerializeToString),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port
