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
