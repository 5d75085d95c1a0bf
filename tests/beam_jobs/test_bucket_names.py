"""A bucket name its store would refuse, or a bucket URI that names no file, is a dead letter with the rule
it breaks when a manifest row gives it, and a one-line settings error (exit 2) as SOURCE or ROOT: never
botocore's traceback (it refuses `Bad_Bucket!` before any request), never a vague "not found"."""
from __future__ import annotations

import json

import boto3
import pytest

from beam_jobs.ingest import run
from components.common.program import BAD_SETTINGS
from components.contracts.buckets import bucket_problem
from tests.beam_jobs import images
from tests.beam_jobs.test_ingest import IN_MEMORY, dead_letters, ingest

SAYS = {
    "s3://Bad_Bucket!/x.jpg": "'Bad_Bucket!' is no S3 bucket name: a character other than lowercase letters, digits, "
                              "'.' and '-'",
    "s3://UPPER/x.jpg": "'UPPER' is no S3 bucket name: a character other than",
    "s3://under_score/x.jpg": "'under_score' is no S3 bucket name: a character other than",
    "s3:///x.jpg": "no bucket named: write s3://BUCKET/KEY",
    "gs:///x.jpg": "no bucket named: write gs://BUCKET/KEY",
    "s3://" + "a" * 70 + "/x.jpg": "is no S3 bucket name: 70 characters, not 3 to 63",
    "s3://ab/x.jpg": "'ab' is no S3 bucket name: 2 characters, not 3 to 63",
    "s3://bucket..name/x.jpg": "'bucket..name' is no S3 bucket name: '..' in it",
    "s3://-bad/x.jpg": "'-bad' is no S3 bucket name: it must start and end with a letter or digit",
    "s3://192.168.1.1/x.jpg": "'192.168.1.1' is no S3 bucket name: an IP address",
    "gs://Bad_Bucket!/x.jpg": "'Bad_Bucket!' is no GCS bucket name: a character other than lowercase letters, digits, "
                              "'.', '_' and '-'",
    "S3://Bad_Bucket!/x.jpg": "'Bad_Bucket!' is no S3 bucket name",
    "s3:x.jpg": "s3: without // names no bucket: write s3://BUCKET/KEY",
    "gs:/bucket/x.jpg": "gs: without // names no bucket: write gs://BUCKET/KEY",
}


@pytest.mark.parametrize("uri, says", SAYS.items())
def test_a_bad_bucket_name_says_the_rule_it_breaks(uri, says):
    assert says in bucket_problem(uri)


@pytest.mark.parametrize("uri", ["s3://photos-bucket/x.jpg", "s3://a.b-c/x", "s3a://photos/x", "gs://bad_bucket/x.jpg",
                                 "gs://a." + "b" * 63 + "/x", "/local/s3:x.jpg", "./s3:x.jpg", "http://host/Bad_Bucket!/x"])
def test_a_good_bucket_name_or_no_bucket_at_all_passes(uri):
    assert bucket_problem(uri) is None


def test_manifest_rows_naming_bad_buckets_are_dead_letters(s3_endpoint, s3_bucket, gcs_endpoint, tmp_path, capsys):
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.put_object(Bucket=s3_bucket, Key="m/cat/a.jpg", Body=images.rgb_jpeg(1))
    rows = [*SAYS, "s3://b/", f"s3://{s3_bucket}/", f"s3://{s3_bucket}", "gs://stoke-gcs//", "gs://bad_bucket/x.jpg"]
    s3.put_object(Bucket=s3_bucket, Key="m/m.csv", Body="uri,label\ncat/a.jpg,cat\n" + "".join(f"{r},cat\n" for r in rows))
    root = tmp_path / "root"
    code, summary = ingest(f"s3://{s3_bucket}/m/m.csv", root, *IN_MEMORY, "--allow-outside-source",
                           "--max-bad-fraction", "0.99", capsys=capsys)
    assert code == 0 and summary["counts"]["train"] + summary["counts"]["eval"] == 1, summary
    found = {letter["uri"]: letter["reason"] for letter in dead_letters(root, 1)}
    for row, says in SAYS.items():
        assert says in found.pop(row), row
    assert found.pop("s3://b/").startswith("'b' is no S3 bucket name")
    assert found == {f"s3://{s3_bucket}/": "names a bucket, not a file: write s3://BUCKET/KEY",
                     f"s3://{s3_bucket}": "names a bucket, not a file: write s3://BUCKET/KEY",
                     "gs://stoke-gcs//": "names a bucket, not a file: write gs://BUCKET/KEY",
                     "gs://bad_bucket/x.jpg": "not found"}  # a good GCS name, of no bucket


@pytest.mark.parametrize("argv", [["s3://Bad_Bucket!/photos", "--root", "ROOT"], ["s3:///photos", "--root", "ROOT"],
                                  ["gs://Bad_Bucket!/m.csv", "--root", "ROOT"], ["s3:photos", "--root", "ROOT"],
                                  ["PHOTOS", "--root", "s3://Bad_Bucket!/root"]])
def test_a_bad_bucket_as_source_or_root_is_a_settings_error(argv, tmp_path, capsys):
    argv = [arg.replace("ROOT", str(tmp_path / "root")).replace("PHOTOS", str(tmp_path)) for arg in argv]
    code = run([*argv, "--json"])
    printed = capsys.readouterr()
    (line,) = printed.err.strip().splitlines()
    assert code == BAD_SETTINGS and "Traceback" not in printed.err, printed.err
    assert line.startswith("stoke ingest: error: --") and ("bucket name" in line or "names no bucket" in line), line
    assert json.loads(printed.out.strip().splitlines()[-1])["published"] is False
    assert not (tmp_path / "root").exists()


def test_stoke_run_refuses_a_bad_bucket_before_it_starts(tmp_path, capsys):
    from flows import cli

    assert cli.main(["run", "gs://Bad_Bucket!/photos", "--root", str(tmp_path / "root")]) == BAD_SETTINGS
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("stoke run: error: source: ") and "is no GCS bucket name" in line, line
    assert not (tmp_path / "root").exists()
