"""A bucket's refusal is one line that names the store, the bucket and what to set, for S3 (botocore and
s3fs, also through moto on 127.0.0.1) and GCS (google-auth and gcsfs, their own exception classes)."""
from __future__ import annotations

import errno

import pytest

from components.common import program, store_errors
from components.common.store_errors import StoreError, naming, problem
from tests.components.contracts.test_program import _client_error, _translated

SOURCE, ROOT = "s3://photos/incoming", "gs://stoke-root/stoke"


def test_missing_s3_credentials_name_the_bucket_and_what_to_set():
    from botocore.exceptions import NoCredentialsError

    found = problem(NoCredentialsError(), SOURCE, ROOT)
    assert found.summary == "no S3 credentials for bucket photos" and not found.transient
    for setting in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "instance role", "AWS_ENDPOINT_URL"):
        assert setting in found.fix


def test_missing_gcs_credentials_name_the_bucket_and_what_to_set():
    from gcsfs.retry import HttpError
    from google.auth.exceptions import DefaultCredentialsError

    anonymous = HttpError({"code": 401, "message": "Anonymous caller does not have storage.objects.list access"})
    for error in (DefaultCredentialsError("Your default credentials were not found"), anonymous):
        found = problem(error, SOURCE, ROOT)
        assert found.summary.startswith("no GCS credentials for bucket stoke-root"), found
        for setting in ("GOOGLE_APPLICATION_CREDENTIALS", "gcloud auth application-default login", "STORAGE_EMULATOR_HOST"):
            assert setting in found.fix


@pytest.mark.parametrize("code", ["InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"])
def test_refused_credentials_say_the_stores_reason(code):
    for error in (_client_error(code, 403), _translated(code, 403)):  # as botocore raises it, and as s3fs does
        found = problem(error, SOURCE)
        assert found.summary == f"S3 refused the credentials for bucket photos ({code}: the store's words)"
        assert "AWS_ACCESS_KEY_ID" in found.fix and not found.transient


def test_access_denied_a_bodiless_403_and_a_missing_bucket_each_say_so():
    denied = problem(_translated("AccessDenied", 403), SOURCE)
    assert denied.summary.startswith("S3 denied access to bucket photos (AccessDenied") and "s3:GetObject" in denied.fix
    head = problem(_translated("403", 403), SOURCE)  # a HEAD's 403 cannot say which: both fixes
    assert "wrong credentials, or ones that may not read it" in head.summary
    assert "AWS_ACCESS_KEY_ID" in head.fix and "s3:ListBucket" in head.fix
    assert problem(_translated("NoSuchBucket", 404), SOURCE).summary == "S3 bucket photos does not exist"
    assert problem(OSError("Forbidden: stoke-root/stoke\nno storage.objects.list"), ROOT).summary.startswith(
        "GCS denied access to bucket stoke-root")


def test_a_store_that_does_not_answer_is_transient():
    from botocore.exceptions import EndpointConnectionError

    found = problem(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), SOURCE)
    assert found.transient and found.summary.startswith("cannot reach S3 for bucket photos")
    busy = problem(_translated("SlowDown", 503), SOURCE)
    assert busy.transient and busy.summary.startswith("S3 is busy or unavailable for bucket photos")


def test_what_is_no_stores_refusal_is_left_alone():
    assert problem(_translated("NoSuchKey", 404), SOURCE) is None  # a missing object: the caller's to word
    assert problem(FileNotFoundError(errno.ENOENT, "No such file", "/in/a.png"), SOURCE) is None  # a local file's
    assert problem(ValueError("bad manifest"), SOURCE) is None
    assert problem(OSError(errno.ECONNRESET, "reset"), "/local/source") is None  # no bucket among the URIs


def test_naming_turns_a_stores_exception_into_one_line_and_lets_the_rest_through():
    from botocore.exceptions import NoCredentialsError

    with pytest.raises(StoreError) as raised, naming(ROOT), naming(SOURCE):
        raise NoCredentialsError()
    assert str(raised.value).startswith("no S3 credentials for bucket photos: set AWS_ACCESS_KEY_ID")  # the inner name
    assert program.os_error_line(raised.value) == str(raised.value) and not program.transient(raised.value)
    with pytest.raises(KeyError), naming(SOURCE):
        raise KeyError("a bug")


def test_a_heads_bare_403_is_replaced_by_the_refusal_a_get_names(s3_bucket, s3_endpoint, monkeypatch):
    """moto with its IAM checks on: S3 answers a HEAD with a bare 403, a GET with the reason."""
    import fsspec
    import requests

    fsspec.filesystem("s3").pipe_file(f"{s3_bucket}/cat/0.png", b"x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN000000000")
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    requests.post(f"{s3_endpoint}/moto-api/reset-auth", data=b"0")
    try:
        with pytest.raises(PermissionError) as head:
            fs.info(f"{s3_bucket}/cat")
        with pytest.raises(PermissionError) as named:
            store_errors.info(fs, f"{s3_bucket}/cat")
    finally:
        requests.post(f"{s3_endpoint}/moto-api/reset-auth", data=b"inf")
    assert "403 Forbidden" in problem(head.value, f"s3://{s3_bucket}").summary
    assert "(InvalidAccessKeyId" in problem(named.value, f"s3://{s3_bucket}").summary


def test_the_endpoint_a_line_names_shows_no_password(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:s3cret@127.0.0.1:9000")
    found = problem(_translated("NoSuchBucket", 404), SOURCE)
    assert "s3cret" not in str(found) and "AWS_ENDPOINT_URL (now http://minio:***@127.0.0.1:9000)" in found.fix


def test_one_files_refusal_is_its_dead_letter_and_what_no_file_would_pass_is_not():
    """`refused`: the reason one file is a dead letter, or None for what fails the run (credentials no file
    would pass, a store busy or away), as an S3 or GCS answer reaches ingest's listing and reads."""
    from botocore.exceptions import NoCredentialsError
    from gcsfs.retry import HttpError

    uri = "gs://photos/cat/a.jpg"
    assert store_errors.refused(_translated("AccessDenied", 403), uri) == "access denied (AccessDenied: the store's words)"
    assert store_errors.refused(HttpError({"code": 403, "message": "no storage.objects.get"}), uri) == (
        "access denied (no storage.objects.get, 403)")
    assert store_errors.refused(_translated("NoSuchBucket", 404), uri) == "not found: there is no bucket photos"
    assert store_errors.refused(FileNotFoundError(uri), uri) == "not found"
    for run_wide in (NoCredentialsError(), _translated("InvalidAccessKeyId", 403), _translated("ExpiredToken", 400),
                     HttpError({"code": 401, "message": "Anonymous caller"}), _translated("SlowDown", 503),
                     HttpError({"code": 503, "message": "busy"}), OSError(errno.ECONNRESET, "reset")):
        assert store_errors.refused(run_wide, uri) is None, run_wide
