import os
import re
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Each pytest-xdist worker its own GPU slot (flows/gpus.py): the tests train on the CPU, and two
# workers queueing behind one slot would only make the suite slower.
os.environ.setdefault("STOKE_GPU_LOCK", os.path.join(tempfile.gettempdir(),
                                                     f"stoke-gpus-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.lock"))


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
    """Groups for pytest-xdist's `--dist loadgroup` (make test): the tests of one file run on one
    worker, so a model trained once per session by a file's fixture is trained once, not once per
    worker; the tests that share the flow run of tests/flows/conftest.py (`pushed_run`) are one
    group wherever they live. Without xdist the marker does nothing."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "pushed_run" if "pushed_run" in item.fixturenames else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))


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
