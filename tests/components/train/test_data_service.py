"""Training on tf.data service: a dispatcher (fault-tolerant, with a work dir) and two workers, each a
process of its own started through `stoke data-service`'s program, all on 127.0.0.1 and shared by
the module. The last test stops them."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from components.common.files import read_result, write_json
from components.common.spans import Spans
from components.contracts.config import TrainConfig
from components.contracts.layout import Root
from components.contracts.results import TrainMetrics
from components.report.report import write_report
from components.train import data, data_service
from flows import cli
from tests.components.conftest import TRAIN_LABELS, tiny_image, tiny_records, write_span
from tests.components.gate_runs import TINY, validate_run
from tests.waiting import free_port, wait_for

PROGRAM = [sys.executable, "-m", "components.train.data_service"]
RECORDS = 30  # the record-count span: one label per record, so labels name records


@dataclasses.dataclass
class Server:
    process: subprocess.Popen
    address: str
    lines: list  # stderr, as it arrives

    def stop(self, signum=signal.SIGTERM) -> tuple[int, str]:
        self.process.send_signal(signum)
        out = self.process.stdout.read()  # stderr is the reader thread's
        return self.process.wait(timeout=60), out


def add_worker(address: str) -> Server:
    """One more worker, once the dispatcher lists it (a killed worker stays on the list: count by name)."""
    worker = start("worker", "--dispatcher", address)
    wait_for(lambda: worker.address in data_service.workers(address), "the new worker to register")
    return worker


def errors(capfd) -> list[str]:
    """The error lines on stderr (TensorFlow's first import in this process logs its own lines too)."""
    return [line for line in capfd.readouterr().err.splitlines() if ": error: " in line]


def start(*argv: str, port: int = 0) -> Server:
    # On 127.0.0.1, with the flag: this machine has interfaces besides loopback, where the servers listen too.
    process = subprocess.Popen([*PROGRAM, *argv, "--port", str(port), "--trusted-network", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
    serving = wait_for(lambda: next((line for line in lines if ": serving at " in line), None),
                       "the server's address", process=process)
    return Server(process, serving.split(": serving at ")[1].split()[0], lines)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    dispatcher = start("dispatcher", "--work-dir", str(tmp_path_factory.mktemp("dispatcher")), "--worker-timeout", "5")
    workers = [start("worker", "--dispatcher", dispatcher.address) for _ in range(2)]
    wait_for(lambda: len(data_service.workers(dispatcher.address)) == 2, "two workers")
    yield {"dispatcher": dispatcher, "workers": workers, "address": dispatcher.address}
    for server in [*workers, dispatcher]:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="module")
def numbered_root(tmp_path_factory) -> str:
    """RECORDS training records in 4 shards, record i labelled i: a batch's labels say which records it holds."""
    root = str(tmp_path_factory.mktemp("numbered"))
    labels = [f"r{i}" for i in range(RECORDS)]
    write_span(root, 1, {"train": [(tiny_image(i % 3, i, 16), "jpeg", i) for i in range(RECORDS)]},
               labels, {"train": 4})
    return root


SETTINGS = TrainConfig(image_size=16, flip=False, seed=7)


def records(root: str, **changes):
    options = data.PipelineOptions(batch_size=4, training=True, seed=7)
    return Spans(root).shards("train", None), SETTINGS, dataclasses.replace(options, **changes)


def through_service(shards, settings, options, address):
    """The training batches as the trainer reads them with train.data_service."""
    return data.through_service(data.make_dataset(shards, settings, options), address)


def labels_of(batches) -> list[int]:
    return [int(x) for _, labels in batches for x in labels.numpy()]


def test_one_pass_through_two_workers_holds_every_record_once(service, numbered_root):
    one_pass = through_service(*records(numbered_root, repeat=False, batch_size=1), service["address"])
    assert sorted(labels_of(one_pass)) == list(range(RECORDS))


def test_a_worker_killed_mid_pass_does_not_stop_the_stream(service, numbered_root):
    extra = add_worker(service["address"])
    batches = iter(through_service(*records(numbered_root), service["address"]))
    labels_of([next(batches)])
    extra.stop(signal.SIGKILL)
    # The rest of the killed worker's file is lost for that pass; the stream goes on from the other
    # two, and the passes after it hold every record.
    after = labels_of(next(batches) for _ in range(3 * RECORDS // 4))
    assert set(after) == set(range(RECORDS))


def test_training_through_the_service_survives_a_lost_worker_and_is_blessed(service, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("served"))
    write_span(root, 1, {"train": tiny_records(64), "eval": tiny_records(24, offset=5000)},
               TRAIN_LABELS, {"train": 4, "eval": 2})
    registered = len(data_service.workers(service["address"]))
    extra = add_worker(service["address"])
    trainer = subprocess.Popen(
        [sys.executable, "-m", "components.train", "--root", root, "--run-id", "svc", *TINY, "--epochs", "3",
         "--precision", "float32", "--data-service", service["address"], "--json"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = []
    for line in trainer.stdout:  # the first epoch's progress event: then a worker goes
        lines.append(line)
        if '"event"' in line:
            extra.stop(signal.SIGKILL)
            break
    lines += trainer.stdout.readlines()
    assert trainer.wait(timeout=300) == 0
    summary = json.loads(lines[-1])
    assert summary["total_steps"] == 3 * (64 // 8)
    assert summary["data_service"]["address"] == service["address"]
    assert summary["data_service"]["processing_mode"] == "distributed_epoch"
    assert summary["data_service"]["workers"] == registered + 1  # one of them was killed after the first epoch
    code, validation = validate_run(root, "svc")
    assert code == 0 and validation["blessed"], validation["reasons"]
    run = Root(root).run("svc")
    assert read_result(run.metrics, TrainMetrics).data_service.address == service["address"]
    write_json(run.result("train"), summary)  # the train stage's result, which the report reads
    markdown = write_report(run)["markdown"]
    assert f"Input pipeline on the tf.data service at `{service['address']}` (distributed_epoch): " \
           f"{registered + 1} workers when training started" in markdown


@pytest.mark.parametrize("address", ["http://127.0.0.1:5050", "grpc://127.0.0.1", "grpc://127.0.0.1:70000",
                                     "grpc://127.0.0.1:5050/x", "grpc://user@127.0.0.1:5050", "127.0.0.1:5050\n"])
def test_a_bad_address_is_one_line_everywhere(address, small_spans_root, capfd):
    from components.train import trainer

    assert trainer.run(["--root", small_spans_root, "--data-service", address]) == 2
    assert cli.main(["run", "src", "--root", small_spans_root, "--set", f"train.data_service={address}"]) == 2
    assert cli.main(["data-service", "worker", "--dispatcher", address]) == 1
    lines = errors(capfd)
    assert [line.split(": error: ")[0] for line in lines] == ["stoke train", "stoke run", "stoke data-service worker"]
    assert all("grpc://HOST:PORT" in line for line in lines)


def test_the_flow_and_its_deployments_take_the_address_as_a_train_setting():
    from pydantic import ValidationError

    from components.contracts.run_config import RunConfig
    from flows.pipeline import recorded

    config = RunConfig(source="s", root="r", train=TrainConfig(data_service="127.0.0.1:5050"))
    assert config.train.data_service == "grpc://127.0.0.1:5050"
    handed = recorded(config)  # config.json, which the train program reads
    assert handed["train"]["data_service"] == "grpc://127.0.0.1:5050"
    with pytest.raises(ValidationError, match="grpc://HOST:PORT"):
        TrainConfig(data_service="http://127.0.0.1:5050")


def test_no_dispatcher_there_is_one_line(small_spans_root, capfd):
    from components.train import trainer

    nobody = f"grpc://127.0.0.1:{free_port()}"
    assert trainer.run(["--root", small_spans_root, "--data-service", nobody]) == 1
    assert cli.main(["data-service", "worker", "--dispatcher", nobody, "--trusted-network", "--dispatcher-wait", "1"]) == 1
    lines = errors(capfd)
    assert len(lines) == 2 and all(f"no tf.data service dispatcher answers at {nobody}" in e for e in lines)
    assert lines[1].endswith("; start it (`stoke data-service dispatcher`), or wait longer with --dispatcher-wait"), lines
    for wait in ("nan", "inf", "-1"):  # a wait no deadline ends, or none at all
        assert cli.main(["data-service", "worker", "--dispatcher", nobody, "--trusted-network", "--dispatcher-wait",
                         wait]) == 1
        assert errors(capfd) == [f"stoke data-service worker: error: --dispatcher-wait {float(wait):g}: seconds from 0 "
                                 "to 86400"]


def test_a_worker_started_before_its_dispatcher_waits_for_it(tmp_path):
    """Pods start in any order: a worker whose dispatcher does not answer yet says so once, and waits."""
    port = free_port()
    worker = subprocess.Popen([*PROGRAM, "worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0",
                               "--trusted-network", "--dispatcher-wait", "600"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(worker.stderr), daemon=True).start()
    dispatcher = None
    try:
        wait_for(lambda: any("; waiting up to " in line for line in lines), "the worker to wait", process=worker)
        dispatcher = start("dispatcher", port=port)
        serving = wait_for(lambda: next((line for line in lines if ": serving at " in line), None), "the worker to serve",
                           process=worker)
        address = serving.split(": serving at ")[1].split()[0]
        wait_for(lambda: address in data_service.workers(dispatcher.address), "the worker to register")
        (waiting,) = [line for line in lines if "; waiting up to " in line]
        assert waiting.startswith(f"stoke data-service worker: no tf.data service dispatcher answers at "
                                  f"grpc://127.0.0.1:{port} yet (") and waiting.rstrip().endswith("waiting up to 600 s")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        for process in (worker, dispatcher and dispatcher.process):
            if process and process.poll() is None:
                process.kill()
                process.wait()


def test_a_worker_stopped_while_it_waits_for_its_dispatcher_leaves_before_serving():
    worker = subprocess.Popen([*PROGRAM, "worker", "--dispatcher", f"127.0.0.1:{free_port()}", "--trusted-network",
                               "--dispatcher-wait", "600", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(worker.stderr), daemon=True).start()
    try:
        wait_for(lambda: any("; waiting up to " in line for line in lines), "the worker to wait", process=worker)
        worker.send_signal(signal.SIGTERM)
        out = worker.stdout.read()
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert json.loads(out.strip().splitlines()[-1]) == {"role": "worker", "address": None, "stopped": True}


def test_cache_and_the_service_are_refused_together(service, small_spans_root, capfd):
    from components.train import trainer

    assert trainer.run(["--root", small_spans_root, "--data-service", service["address"], "--image-cache", "memory"]) == 2
    assert "train.image_cache and train.data_service do not go together" in capfd.readouterr().err


def test_servers_serve_only_where_told(service, capfd):
    """Workers register under the host given; a host of another machine, or a port in use, is refused."""
    assert all(w.startswith("127.0.0.1:") for w in data_service.workers(service["address"]))
    port = service["address"].rsplit(":", 1)[1]
    for argv, why in ((["--host", "192.0.2.1"], "not an address of this machine"),
                      (["--host", "no-such-host.invalid"], "not an address this machine can resolve"),
                      (["--port", port], "another server holds it"), (["--port", "70000"], "a port from 0")):
        assert cli.main(["data-service", "dispatcher", *argv]) == 1
        (line,) = errors(capfd)
        assert line.startswith("stoke data-service dispatcher: error: ") and why in line


def test_servers_stop_cleanly_on_sigterm_even_with_the_dispatcher_gone_first(service, numbered_root):
    reading = iter(through_service(*records(numbered_root), service["address"]))
    next(reading)  # a trainer still holds a job when everything is stopped at once, dispatcher first
    for server in [service["dispatcher"], *service["workers"]]:
        code, out = server.stop()
        summary = json.loads(out.strip().splitlines()[-1])
        assert code == 0 and summary["stopped"] is True, server.lines
        assert any(": stopped" in line for line in server.lines)
