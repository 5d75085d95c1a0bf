"""The bucket an s3:// or gs:// URI names, checked by its store's naming rules before any request: a bad
name is a settings error (SOURCE, ROOT) or a manifest row's dead letter, with the rule it breaks, never a
client library's traceback (botocore refuses `Bad_Bucket!` with a ParamValidationError) nor a "not found"
that leaves a reader guessing whether the key or the bucket is wrong.

S3: 3 to 63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit, no
`..`, not an IP address (docs.aws.amazon.com, bucket naming rules). The names S3 allowed in us-east-1
before March 2018 (capitals, underscores, up to 255) are refused too: no bucket can be made with them
today, and a typo is far likelier than such a bucket. GCS: the same, and underscores; up to 222 when dotted,
each dot-separated part at most 63 (cloud.google.com/storage/docs/buckets#naming).
"""
from __future__ import annotations

import re

STORES = {"s3": "S3", "s3a": "S3", "gs": "GCS", "gcs": "GCS"}
_CHARACTERS = {"S3": "a-z0-9.-", "GCS": "a-z0-9._-"}
_IP_ADDRESS = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
# `s3:key`, `gs:/bucket/key`: a store's scheme without `//`, which fsspec would take for a local path
_WITHOUT_SLASHES = re.compile(r"(?i)(s3a?|gs|gcs):(?!//)")


def store_of(uri: str) -> str | None:
    """"S3" or "GCS" for a bucket URI (any case of its scheme), else None."""
    scheme, has_scheme, _ = uri.partition("://")
    return STORES.get(scheme.lower()) if has_scheme else None


def bucket_problem(uri: str) -> str | None:
    """What is wrong with the bucket that `uri` names, or None: a URI of no bucket store, or a good name."""
    if _WITHOUT_SLASHES.match(uri):
        scheme = uri.split(":", 1)[0].lower()
        return f"{scheme}: without // names no bucket: write {scheme}://BUCKET/KEY"
    store = store_of(uri)
    if store is None:
        return None
    scheme, bucket = uri.split("://", 1)[0].lower(), uri.split("://", 1)[1].split("/", 1)[0]
    if not bucket:
        return f"no bucket named: write {scheme}://BUCKET/KEY"
    longest = 222 if store == "GCS" and "." in bucket else 63
    why = (f"{len(bucket)} character{'s' * (len(bucket) != 1)}, not 3 to {longest}" if not 3 <= len(bucket) <= longest
           else "a character other than " + _described(store) if not re.fullmatch(f"[{_CHARACTERS[store]}]+", bucket)
           else "it must start and end with a letter or digit" if not (bucket[0] + bucket[-1]).isalnum()
           else "'..' in it" if ".." in bucket
           else "an IP address" if _IP_ADDRESS.fullmatch(bucket)
           else "a part between dots longer than 63 characters" if max(map(len, bucket.split("."))) > 63
           else None)
    shown = bucket if len(bucket) <= 80 else f"{bucket[:80]}..."
    return f"{shown!r} is no {store} bucket name: {why}" if why else None


def _described(store: str) -> str:
    return "lowercase letters, digits, '.', '_' and '-'" if store == "GCS" else "lowercase letters, digits, '.' and '-'"
