import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


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

    name = "t-" + request.node.name.lower().replace("_", "-")[:50]
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def gcs_endpoint():
    """A GCS emulator (gcp-storage-emulator, in memory) on 127.0.0.1, with the bucket `stoke-gcs`;
    gcsfs and google-cloud-storage, here and in child processes, reach it through STORAGE_EMULATOR_HOST."""
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket="stoke-gcs")
    server.start()
    endpoint = f"http://127.0.0.1:{server._api._httpd.server_port}"
    saved = dict(os.environ)
    os.environ.update({"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "stoke-test"})
    yield endpoint
    os.environ.clear()
    os.environ.update(saved)
    server.stop()
