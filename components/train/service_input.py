"""The training input on tf.data service: the pipeline up to the batch runs on the service's workers
(`stoke data-service`), the trainer only receives batches. Evaluation stays in the trainer.

Processing mode: `distributed_epoch`. The dispatcher hands each split (a shard file) of a pass over
the data to one worker, so every training record is read once per pass across all workers, as
in-process. `parallel_epochs` would have every worker run every pass: with N workers each record N
times an epoch.

The workers run the in-process pipeline unchanged, repeat included: the dispatcher hands out the
files of pass 2 once those of pass 1 are all handed out, each worker batches its own stream, and the
trainer takes batches from whichever worker has one. Nothing waits at an epoch's end, and a lost
worker never stalls the stream (a finite pass would wait for the lost worker's part forever).

What changes against in-process training:
- A Keras epoch is steps_per_epoch batches as before, but the passes of the workers overlap at their
  edges: a worker may start pass 2 while another finishes pass 1. Over the run each record is read
  once per pass.
- `--seed` still fixes initialisation and each worker's shuffles, crops and flips, but which worker
  reads which file, and so the order of batches, depends on timing: runs are not bit-reproducible.
- A worker lost mid-pass loses what it held: the rest of its file and its buffered batches are not
  handed out again in that pass (at most once); the other workers go on, and later passes read every
  record. The dispatcher stops assigning work to it after `--worker-timeout` without a heartbeat
  (GetWorkers still lists it: the workers a run records are those registered).
- Resuming (the same --run-id) starts at a fresh pass, as in-process training does.
"""
from __future__ import annotations

import time

PROCESSING_MODE = "distributed_epoch"
# Workers may join after the trainer starts (a Deployment scaling up beside the Job): wait this long.
WORKER_WAIT_SECONDS = 60.0
ANSWER_SECONDS = 10.0
_GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"


class ServiceError(RuntimeError):
    """A dispatcher that does not answer, or has no workers; the message says which."""


def workers(address: str, timeout: float = ANSWER_SECONDS) -> list[str]:
    """The addresses of the workers registered with the dispatcher at `address` (grpc://HOST:PORT),
    asked over the dispatcher's own gRPC API."""
    import grpc

    with grpc.insecure_channel(address.removeprefix("grpc://")) as channel:
        ask = channel.unary_unary(_GET_WORKERS, request_serializer=bytes, response_deserializer=_worker_addresses)
        try:
            return ask(b"", timeout=timeout)  # GetWorkersRequest has no fields: its encoding is empty
        except grpc.RpcError as error:
            raise ServiceError(f"no tf.data service dispatcher answers at {address}: "
                               f"{error.details() or error.code().name}") from None


def connect(address: str, wait: float = WORKER_WAIT_SECONDS) -> dict:
    """What the run records of the service: its address, mode and workers, once it has one."""
    deadline = time.monotonic() + wait
    while not (found := workers(address)) and time.monotonic() < deadline:
        time.sleep(1.0)
    if not found:
        raise ServiceError(f"the tf.data service dispatcher at {address} has no workers after {wait:g} s; start "
                           f"some with `stoke data-service worker --dispatcher {address.removeprefix('grpc://')}`")
    return {"address": address, "processing_mode": PROCESSING_MODE, "workers": len(found)}


def through_service(dataset, address: str, job_name: str | None = None):
    """`dataset` run on the service's workers. Trainers that share a `job_name` share its passes:
    each batch goes to one of them."""
    import tensorflow as tf

    batches = dataset.apply(tf.data.experimental.service.distribute(PROCESSING_MODE, address, job_name=job_name))
    return batches.prefetch(tf.data.AUTOTUNE)


def _worker_addresses(response: bytes) -> list[str]:
    """GetWorkersResponse: `repeated WorkerInfo workers = 1`, each with `string address = 1`."""
    return [address.decode() for number, worker in _fields(response) if number == 1
            for field, address in _fields(worker) if field == 1]


def _fields(message: bytes):
    """(field number, bytes) of each length-delimited field of a protobuf message; others skipped."""
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        kind = key & 7
        if kind == 2:
            length, at = _varint(message, at)
            yield key >> 3, message[at:at + length]
            at += length
        elif kind == 0:
            _, at = _varint(message, at)
        else:
            at += {1: 8, 5: 4}[kind]


def _varint(message: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = message[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at
