import os
import re
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

# `make test` runs each test file on one worker (--dist loadfile), so a model a file's fixture trains
# once per session is trained once. These files start first, the longest first (a long file started
# late is the tail of the whole run), with the first users of what the run makes once for all workers
# (tests/once.py: the gate scenario, the first flow run), so that it is ready before the files that
# read it come up. --durations says how long each takes; a stale order costs minutes, never a result.
# The rest keep their collection order (--no-loadscope-reorder).
LONG_FILES = (
    "tests/benchmarks/test_year.py",
    "tests/components/train/test_transfer.py",
    "tests/components/train/test_train.py",
    "tests/flows/test_photos.py",
    "tests/flows/test_train_flow_s3.py",
    "tests/components/gate/test_gate.py",
    "tests/flows/test_train_flow.py",
    "tests/flows/test_own_network.py",
    "tests/infra/test_prefect_postgres.py",
    "tests/flows/test_datacheck_flow.py",
    "tests/flows/test_cli.py",
    "tests/flows/test_one_line_errors.py",
    "tests/flows/test_deployments.py",
    "tests/flows/test_alerts.py",
    "tests/components/train/test_data_service.py",
    "tests/components/train/test_profile.py",
    "tests/components/train/test_data_service_exposure.py",
    "tests/flows/test_gpus.py",
    "tests/flows/test_notifications.py",
    "tests/components/train/test_train_s3.py",
)


# components/train sets TF_USE_LEGACY_KERAS in the process that imports it, for the trainer's own TensorFlow.
# Test modules import it when collected; every program a later test starts (a gate, a flow's stages) would
# inherit it, as it never does from `stoke run`.
_LEGACY_KERAS = os.environ.get("TF_USE_LEGACY_KERAS")


@pytest.fixture(autouse=True)
def _environment_as_the_session_began():
    if _LEGACY_KERAS is None:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
    else:
        os.environ["TF_USE_LEGACY_KERAS"] = _LEGACY_KERAS


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session", autouse=True)
def cache_of_this_session(tmp_path_factory):
    """The shard cache's folder (also the shard digests', the GPU slot's and `stoke run`'s Prefect homes)
    in the session's temporary folder, whatever the environment says: a test never writes the user's
    ~/.cache/stoke nor finds what an earlier session, or another worker's test, left there."""
    os.environ["STOKE_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "stoke-cache")


@pytest.fixture(scope="session", autouse=True)
def gpu_slot_of_this_session(tmp_path_factory):
    """Each pytest process its own GPU slot (flows/gpu_slot.py), in its own temporary folder: the tests
    train on the CPU, and a worker queueing behind another worker's slot, or behind another test
    session's on the same machine, would only make the suite slower (or wait out a test's bound)."""
    os.environ.setdefault("STOKE_GPU_LOCK", str(tmp_path_factory.getbasetemp() / "gpus.lock"))


@pytest.fixture(autouse=True)
def environment_as_found():
    """Each test starts from the environment the session set up (its fixtures included) and leaves it
    so: a variable one test sets would change what every later test on its worker does, such as the
    PREFECT_HOME that `stoke run`, called in-process, sets for the rest of its process."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def no_beam_job_left_behind():
    """A test may give up on a Beam job (beam_jobs/bounded.py), but on its own list: a job in the
    process's list makes any later failed ingest in this process end the process while the job runs
    (bounded.exit_code), taking the pytest worker and the test it is running with it. Checked on the
    list, not on whether the job still runs, so the test that leaves one fails every time."""
    before = _given_up_on()
    yield
    if [job for job in _given_up_on() if job not in before]:
        pytest.fail("the test left a Beam job it gave up on in beam_jobs.bounded._ABANDONED: give the test a list "
                    "of its own (monkeypatch) and end the job before the test does")


def _given_up_on() -> list:
    bounded = sys.modules.get("beam_jobs.bounded")
    return list(bounded._ABANDONED) if bounded is not None else []


@pytest.fixture(scope="session")
def prefect_api():
    """One Prefect test server per session (per xdist worker) for every test that runs a flow or
    registers deployments: a harness opened and closed by one module would leave its API address
    behind for a later flow in the same process."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3-compatible server (moto) on 127.0.0.1; s3fs, boto3 and child processes reach it through
    the standard AWS_* variables, exactly as they would reach MinIO or AWS."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    saved = dict(os.environ)
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    yield endpoint
    os.environ.clear()
    os.environ.update(saved)
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint, request):
    """A fresh bucket, named after the test."""
    import boto3

    name = "t-" + re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:50].strip("-")  # as S3 names buckets
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def gcs_endpoint():
    """A GCS emulator (gcp-storage-emulator, in memory) on 127.0.0.1, with the bucket `stoke-gcs`;
    gcsfs and google-cloud-storage, here and in child processes, reach it through STORAGE_EMULATOR_HOST."""
    from gcp_storage_emulator import server as emulator

    emulator.HANDLERS = (*_moves(), *emulator.HANDLERS)
    server = emulator.create_server("127.0.0.1", 0, in_memory=True, default_bucket="stoke-gcs")
    server.start()
    endpoint = f"http://127.0.0.1:{server._api._httpd.server_port}"
    saved = dict(os.environ)
    os.environ.update({"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "stoke-test"})
    yield endpoint
    os.environ.clear()
    os.environ.update(saved)
    server.stop()


def _moves():
    """GCS's objects.move (`POST .../o/SRC/moveTo/o/DEST`, which gcsfs's mv tries first) for the
    emulator, which lacks it: without it every move waits out gcsfs's retries before its fallback."""
    from http import HTTPStatus

    from gcp_storage_emulator import settings
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    def move(request, response, storage, *args, **kwargs):
        bucket, source, dest = (request.params[k] for k in ("bucket_name", "object_id", "dest_object_id"))
        try:
            moved = objects._copy(request.base_url, storage, bucket, source, bucket, dest)
        except NotFound:
            response.status = HTTPStatus.NOT_FOUND
            return
        objects._delete(storage, bucket, source)
        response.json(moved)

    return tuple((rf"^{prefix}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/(?P<dest_object_id>.*[^/]+)$",
                  {"POST": move}) for prefix in (settings.API_ENDPOINT, ""))
