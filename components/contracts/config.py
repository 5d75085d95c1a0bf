"""The settings of each stage: one group of the run configuration (run_config.py) per stage.

A setting is declared once, here, as a field: its description is its help text in `stoke <stage>
--help`, in `stoke config show`, in the Prefect UI and in the docs. Fields whose default is "the
preset's" are None until a preset (presets.py) fills them.
"""
from __future__ import annotations

import os
import re
import urllib.parse
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, model_validator

from components.contracts import schema
from components.contracts.buckets import bucket_problem
from components.contracts.results import QUALITY_ISSUES
from components.contracts.secrets import without_secrets

# The networks Stoke names itself (components/common/builtin_networks.py builds each). train.network also takes
# any of keras.applications' networks by name, and the user's own code: `module:function` (an importable module) or
# `path/to/file.py:function` (a file beside the run configuration). Every kind enters training the same way: a
# function of (number of classes, image size, weights) that returns a Keras model from uint8 images to logits
# (components/common/networks.py, docs/train.md).
NETWORKS: tuple[str, ...] = ("small_cnn", "mobilenet_v3_small", "efficientnet_b0", "resnet50")
APPLICATIONS = "keras.applications."  # keras.applications.<Name>: one of tf_keras' applications, by its name
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
NETWORK_FORMS = (f"a built-in network ({', '.join(NETWORKS)}), keras.applications.<Name>, module:function or "
                 "path/to/file.py:function beside the run configuration")


def network_parts(reference: str) -> tuple[str, str, str | None]:
    """(kind, where, function) of a train.network: ("builtin", name, None), ("application", Name, None),
    ("module", "package.module", "function") or ("file", "path/to/file.py", "function"); a ValueError saying
    what it may be otherwise. A file's path may be absolute, or a URI, only where a configuration's file
    reference was found already (components/common/network_code.py locate); `..` never leaves a folder."""
    if not isinstance(reference, str) or reference != reference.strip() or not reference:
        raise ValueError(f"not a network: name {NETWORK_FORMS}")
    if reference in NETWORKS:
        return "builtin", reference, None
    if reference.startswith(APPLICATIONS) and re.fullmatch(IDENTIFIER, reference[len(APPLICATIONS):]):
        return "application", reference[len(APPLICATIONS):], None
    where, colon, function = reference.rpartition(":")
    if not colon or not re.fullmatch(IDENTIFIER, function):
        raise ValueError(f"not a network: name {NETWORK_FORMS}")
    if where.endswith(".py"):
        if ".." in where.replace("\\", "/").split("/"):
            raise ValueError(f"{where} leaves the configuration's folder ('..'): name a file in that folder or "
                             "below it")
        return "file", where, function
    if re.fullmatch(rf"{IDENTIFIER}(\.{IDENTIFIER})*", where):
        return "module", where, function
    raise ValueError(f"not a network: name {NETWORK_FORMS}")


def check_network(reference: str) -> str:
    network_parts(reference)
    return reference


NetworkReference = Annotated[str, AfterValidator(check_network)]

# A run id names a folder under ROOT/runs, and a model name a folder under ROOT/models and a URL path
# segment of TF Serving: letters, digits and a few marks only, so no '..', '/' or scheme reaches
# the file system. The layout (components/contracts/layout.py) enforces both for every entry point.
RUN_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$"
MODEL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise ValueError(f"bad run id {run_id!r}: letters, digits, '.', '_' and '-' only "
                         "(at most 128, not starting with '.' or '-')")
    return run_id


RunId = Annotated[str, AfterValidator(check_run_id)]


def check_model_name(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(MODEL_NAME_PATTERN, name):
        raise ValueError(f"bad model name {name!r}: letters, digits, '_' and '-' only (1 to 64)")
    return name


ServedModelName = Annotated[str, AfterValidator(check_model_name)]

# ROOT is written by every stage, each a process of its own, and read by later runs and other machines: a
# local path or a bucket every process reaches alike. fsspec's other schemes are each wrong for it: memory://
# lives in one process, http(s)://, tar://, zip://, github:// and data: URLs are read-only, and a chain
# (simplecache::s3://, "a::b") reads one place through another, each process with a cache of its own. SOURCE is
# only read, so it may also be an http(s):// manifest or folder; a chain or a data: URL is refused there too.
ROOT_SCHEMES = ("file", "s3", "gs")
SOURCE_SCHEMES = (*ROOT_SCHEMES, "http", "https")
DATA_URL = "data:"  # fsspec's one protocol without '//' (an inline file: `data:text/csv;base64,...`)

# TensorFlow reads a path as a pattern where it loads a checkpoint (a SavedModel's variables: the gate's candidate,
# a warm start's served version, TF Serving's loader), and Beam's file reads (the gate's TFMA) and fsspec's glob
# read theirs alike: below `exp[1]` the brackets match only `exp1`, a backslash escapes, and `*` or `?` match a
# neighbour too. So the folders TensorFlow reads below (ROOT, the shard cache, the temporary folder) hold none.
PATTERN_CHARACTERS = "*?[\\"


def pattern_problem(path: str, what: str) -> str | None:
    """Why TensorFlow could not load the models saved below `path` (`what`, e.g. "ROOT"), or None; the caller
    says what to change."""
    found = " and ".join(f"'{c}'" for c in dict.fromkeys(path) if c in PATTERN_CHARACTERS)
    if not found:
        return None
    return (f"{what} {path} holds {found}, which TensorFlow reads as a pattern where it loads a model (the run "
            "would train, then find no model to gate)")


NO_PATTERN = "a folder whose path has none of * ? [ \\"


def _check_location(uri: str, what: str, schemes: tuple[str, ...], why: str) -> str:
    allowed = f"name a local path, {', '.join(f'{scheme}://' for scheme in schemes[:-1])} or {schemes[-1]}://"
    shown = without_secrets(repr(uri))
    if not uri.strip():
        raise ValueError(f"{what} is empty: {allowed}")
    if "::" in uri:
        raise ValueError(f"{shown}: '::' (fsspec's chaining) is not taken for {what}; {allowed}")
    if uri[:len(DATA_URL)].lower() == DATA_URL:
        raise ValueError(f"{shown}: a data: URL is not taken for {what}, which {why}; {allowed}")
    scheme = uri.partition("://")[0] if "://" in uri else None
    if scheme is not None and scheme not in schemes:
        raise ValueError(f"{shown}: {scheme}:// is not taken for {what}, which {why}; {allowed}")
    bad_bucket = bucket_problem(uri)
    if bad_bucket:
        raise ValueError(f"{shown}: {without_secrets(bad_bucket)}")
    return uri


def check_root(uri: str) -> str:
    _check_location(uri, "ROOT", ROOT_SCHEMES, "each stage writes from a process of its own")
    problem = pattern_problem(local_folder(uri) if uri.startswith("file://") or "://" not in uri else uri, "ROOT")
    if problem:
        raise ValueError(without_secrets(f"{problem}; rename the folder, or name another ROOT, {NO_PATTERN}"))
    return uri


def local_folder(path: str) -> str:
    """A local path or file:// URI as the absolute path fsspec and TensorFlow are handed (a relative one below the
    working folder)."""
    return os.path.abspath(path.removeprefix("file://"))


def check_source(uri: str) -> str:
    return _check_location(uri, "SOURCE", SOURCE_SCHEMES, "ingest reads from a process of its own")


RootLocation = Annotated[str, AfterValidator(check_root)]
SourceLocation = Annotated[str, AfterValidator(check_source)]

# A tf.data service dispatcher or worker: HOST:PORT, the dispatcher also as grpc://HOST:PORT (how
# tf.data names it). HOST is a name or an IPv4 address, or an IPv6 one in brackets; nothing else
# (a path, credentials, another scheme) is taken, since the address reaches gRPC as it is.
SERVICE_ADDRESS = re.compile(r"^(?:grpc://)?(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def check_service_address(address: str) -> str:
    """`address` as grpc://HOST:PORT, or a ValueError saying what a service address looks like."""
    match = SERVICE_ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if not match or not 0 < int(match["port"]) < 65536:
        raise ValueError(f"bad tf.data service address {without_secrets(repr(address))}: grpc://HOST:PORT is needed, "
                         "with a port from 1 to 65535 (e.g. grpc://127.0.0.1:5050)")
    return f"grpc://{match['host']}:{int(match['port'])}"


ServiceAddress = Annotated[str, AfterValidator(check_service_address)]


def check_quality_issues(names: str) -> str:
    """A comma-separated list of quality issues, as `a,b` in their canonical order."""
    given = {name.strip() for name in names.split(",") if name.strip()}
    unknown = sorted(given - set(QUALITY_ISSUES))
    if unknown:
        raise ValueError(f"unknown quality issue {unknown[0]!r}: name some of {', '.join(QUALITY_ISSUES)}")
    return ",".join(name for name in QUALITY_ISSUES if name in given)


QualityIssues = Annotated[str, AfterValidator(check_quality_issues)]
DISPATCHER_PORT, WORKER_PORT = 5050, 5051  # `stoke data-service`'s defaults

# Every number has an upper bound far beyond any real use, checked when the configuration is read, so an
# absurd value (`train.epochs=1e26`, a span range of 10^12, a 100,000 px image) is a setting's one-line
# error instead of a MemoryError, an out-of-memory tensor or a stage that runs until its timeout.
MAX_EPOCHS = 100_000
MAX_STEPS = 100_000_000  # optimizer steps: over a year at three steps a second
MAX_IMAGE_SIZE = 2048  # px a side; ImageNet networks train at 224 to 600
MAX_BATCH = 16_384  # records per replica
MAX_RECORDS_HELD = 1_000_000  # records in the shuffle buffer, all in memory
MAX_LEARNING_RATE = 10.0
MAX_SEED = 2**32 - 1  # NumPy's seeds, which keras.utils.set_random_seed sets too
MAX_SPAN = 999_999_999
MAX_SPANS_NAMED = 100_000  # spans one list may name: beyond, `all` (or no list) says it
MAX_SPANS_TEXT = 1000  # characters of a span list


def span_ranges(text: str | None) -> list[tuple[int, int]] | None:
    """`"3"`, `"1,4"`, `"2-5"` or `"1-3,7"` as (first, last) ranges of span numbers, checked: each number
    from 1 to MAX_SPAN, at most MAX_SPANS_NAMED spans in all; None for None, "" or "all" (every span)."""
    if text is None or str(text).strip() in ("", "all"):
        return None
    text = str(text)
    if len(text) > MAX_SPANS_TEXT:
        raise ValueError(f"span list of {len(text)} characters: at most {MAX_SPANS_TEXT} (`all` names every span)")
    ranges = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]{1,18})\s*(?:-\s*([0-9]{1,18})\s*)?", part)
        if not match:
            raise ValueError(f"bad span list {text!r}: use span numbers and ranges such as 1,3-5")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if not 1 <= low <= high:
            raise ValueError(f"bad span range {part.strip()!r}: spans count from 1, the first of a range first")
        if high > MAX_SPAN:
            raise ValueError(f"span {high} in {part.strip()!r} is past the highest span number, {MAX_SPAN:,}")
        ranges.append((low, high))
    named = sum(high - low + 1 for low, high in ranges)
    if named > MAX_SPANS_NAMED:
        raise ValueError(f"span list {text!r} names {named:,} spans: at most {MAX_SPANS_NAMED:,} (`all` names every span)")
    return ranges


def check_spans(text: str) -> str:
    span_ranges(text)
    return text


SpanList = Annotated[str, AfterValidator(check_spans)]


def trace_range(text: str) -> tuple[int, int] | None:
    """The first and last step the profiler traces, from `10,20`; None for none (also "", "0", "off")."""
    if text.strip().lower() in ("", "none", "0", "off"):
        return None
    match = re.fullmatch(r"\s*([0-9]{1,9})\s*,\s*([0-9]{1,9})\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)) <= MAX_STEPS:
        raise ValueError(f"bad trace steps {text!r}: two step numbers such as 10,20, the first at least 1 and at most "
                         f"the second, up to {MAX_STEPS:,} (or none)")
    return int(match.group(1)), int(match.group(2))


def check_trace_steps(text: str) -> str:
    trace_range(text)
    return text


TraceSteps = Annotated[str, AfterValidator(check_trace_steps)]


def check_cache_folder(folder: str) -> str:
    """shard_cache.dir: a local folder, which TensorFlow reads the copies from."""
    if "://" in folder or "::" in folder:
        raise ValueError(f"{without_secrets(repr(folder))} is not a local folder: the shard cache holds local copies")
    problem = pattern_problem(local_folder(folder), "the shard cache")
    if problem:
        raise ValueError(f"{problem}; name {NO_PATTERN}")
    return folder


CacheFolder = Annotated[str, AfterValidator(check_cache_folder)]

# Every settings model refuses inf and nan: a number that can never be reached (`--shard-mb inf`)
# would otherwise pass `gt=0` and fail late, deep in Beam or Keras, instead of as a setting.
SETTINGS_CONFIG = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)


class ShardCacheConfig(BaseModel):
    """Local copies of the shards, for a ROOT on a store TensorFlow cannot read (s3://; components/common/shard_cache.py):
    preflight checks the folder, training and the gate fill and read it."""

    model_config = SETTINGS_CONFIG

    dir: CacheFolder | None = Field(None, description="local folder for the copies, reused across runs, your own (made "
                                    "0700; default: $STOKE_CACHE_DIR, else $XDG_CACHE_HOME/stoke or ~/.cache/stoke)")
    max_gb: float = Field(100.0, gt=0, le=1e6, description="size cap of that folder in GB; the copies used "
                          "longest ago are evicted first")


class RunsConfig(BaseModel):
    """The retention rule of ROOT/runs (components/common/run_retention.py), applied as each run ends and by
    `stoke runs prune`: a run folder keeps its heavy parts, then only its record, then goes."""

    model_config = SETTINGS_CONFIG

    # 10 trained runs: a week and a half of nightly runs to compare in TensorBoard or gate by hand, at
    # about 2.5 MB each for small_cnn and some 50 MB for efficientnet_b0 (its candidate alone is ~20 MB).
    keep: int = Field(10, ge=1, le=100000, description="newest runs that trained which keep their heavy parts "
                      "(candidate, backup, TensorBoard logs with the profiler trace, TFMA output, warm-up requests); "
                      "older ones keep only their record, and a run whose model the repository holds stays whole")
    # 100 records: about three months of nightly reports, at roughly 0.25 MB each (their plots, mostly).
    keep_records: int = Field(100, ge=1, le=1000000, description="newest runs whose record (configuration, "
                              "the stages' results, report, gate verdict, plots) is kept; older run folders are deleted, "
                              "except one whose model the repository holds")

    @model_validator(mode="after")
    def _records_outlive_heavy_parts(self):
        if self.keep_records < self.keep:
            raise ValueError(f"keep_records ({self.keep_records}) must be at least keep ({self.keep}): a run keeps "
                             "its record for longer than its heavy parts")
        return self


def check_webhook(url: SecretStr) -> SecretStr:
    """alerts.webhook: an http(s) URL with a host. The whole URL is the secret (a chat's incoming webhook
    holds its token in the path), so the refusal never repeats it."""
    parts = urllib.parse.urlsplit(url.get_secret_value())
    if parts.scheme not in ("http", "https") or not parts.hostname or re.search(r"\s", url.get_secret_value()):
        raise ValueError("an http:// or https:// URL is needed, such as a chat's incoming webhook")
    return url


class AlertsConfig(BaseModel):
    """Alerts of the deployments (`stoke up`, `stoke deploy`; flows/alerts.py): a train/nightly run that fails or
    crashes, and runs in a row that push no model, are sent to a webhook. `webhook` is a secret: kept in a Prefect
    notification block, never in the deployments' parameters, a run's config.json or `stoke config show`."""

    model_config = SETTINGS_CONFIG

    webhook: Annotated[SecretStr, AfterValidator(check_webhook)] | None = Field(
        None, exclude=True, description="URL the alerts are POSTed to, as JSON {\"text\": ...} (what Slack, "
        "Mattermost and Google Chat incoming webhooks take); unset: no alerts")
    # 3: one quiet night or one refused candidate says little, and a weekend without photos stays below it; a
    # feed that stopped, or a gate that refuses every candidate, is known on the third night.
    after: int = Field(3, ge=1, le=10_000, description="alert when this many runs in a row of the model pushed "
                       "nothing, each refused by the gate or skipped (nothing new to train on), and again after each "
                       "further as many; a failed run is alerted on its own and neither counts nor ends the row")


class PreflightConfig(BaseModel):
    """Preflight: the machine, checked before any GPU hour is spent."""

    model_config = SETTINGS_CONFIG

    require_gpu: bool = Field(False, description="fail, not warn, when no GPU is usable")
    min_read_mbps: float | None = Field(
        None, gt=0, le=1e6, description="fail when sequential reads under ROOT are slower than this (MB/s)")
    sample_mb: int = Field(64, gt=0, le=16384, description="MiB to read when timing the disk")


class IngestConfig(BaseModel):
    """Ingest: the new images of SOURCE to a new span of sharded TFRecords (Beam)."""

    model_config = SETTINGS_CONFIG

    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of sources for eval, by path hash")
    # Upper bounds far beyond any real use, so a typo or 1e308 is a settings error, not a Beam one.
    shard_mb: float = Field(128.0, gt=0, le=16384, description="target size of one shard file in MB")
    max_side: int = Field(
        512, ge=0, le=65535, description="shrink images whose longer side is larger, once, on ingest (JPEG by DCT "
        "scaling); 0 keeps full size. 512 suits training at up to about 320 px; raise it for a larger train.image_size")
    max_megapixels: float = Field(
        schema.MAX_MEGAPIXELS, gt=0, le=10000, description="set aside images with more pixels than this, read from "
        "the header before decoding (a small file can declare a huge image)")
    max_file_mb: float = Field(64.0, gt=0, le=16384, description="set aside source files larger than this, unread")
    max_bad_fraction: float = Field(
        0.05, ge=0.0, le=1.0, description="fail, publishing nothing, when more than this share of the new files that "
        "are not copies are unreadable or broken (images set aside for their quality, such as blank frames, do not "
        "count)")
    blank_std: float = Field(
        2.0, ge=0.0, le=255.0, description="set aside images whose grey level (0-255) has a standard deviation below "
        "this, such as a dead camera's blank frames; 0 keeps them")
    near_copies: Literal["follow", "set_aside", "report"] = Field(
        "follow", description="a new image within ingest.near_copy_bits of dHash of a published or another new one "
        "(re-encoded, resized, cropped, EXIF-rotated or mirrored): follow joins that image's split, set_aside keeps it "
        "out as a dead letter, report only counts it; splits a manifest gives are never changed")
    near_copy_bits: int = Field(
        6, ge=0, le=10, description="dHash bits (of 64) within which two images are near-copies; a re-encode, a resize to "
        "half or a mirror image stays within 3, distinct photographs are 9 or more apart")
    near_copy_min_side: int = Field(
        16, ge=0, le=65535, description="images with a shorter side below this (px) are never called near-copies: "
        "their 9x8 dHash thumbnail says nothing (7 of 8 distinct 8x8 digits have a twin within 4 bits)")
    blurry_below: float = Field(
        1170.0, ge=0, le=1e7, description="blurry: the variance of the Laplacian of the 64 px grey thumbnail is below this "
        "(cleanvision's threshold); 0 turns it off")
    dark_below: float = Field(
        0.32, ge=0, le=1, description="dark: the 99th percentile of brightness (0-1) is below this; 0 turns it off")
    light_above: float = Field(
        0.95, ge=0, le=1, description="light: the 5th percentile of brightness (0-1) is above this; 0 turns it off")
    low_information_below: float = Field(
        2.0, ge=0, le=8, description="low-information: the grey histogram's entropy (bits) is below this; 0 turns it off")
    odd_aspect_below: float = Field(
        0.35, ge=0, le=1, description="odd aspect ratio: the shorter side is less than this share of the longer; "
        "0 turns it off")
    odd_size_iqr: float = Field(
        3.0, ge=0, le=100, description="odd size: sqrt(width x height) lies this many interquartile ranges outside the "
        "span's quartiles (and over 2x from its median); 0 turns it off")
    report_grayscale: bool = Field(True, description="report RGB images whose channels are equal (grayscale)")
    quality_set_aside: QualityIssues = Field(
        "", description="quality issues whose images are set aside (dead letters) instead of reported, comma-separated "
        "among blurry, dark, light, low_information, odd_aspect_ratio, odd_size, grayscale (blank frames: blank_std)")
    compression: Literal["gzip", "zlib", "none"] = Field("gzip", description="codec of the shard files")
    allow_outside_source: bool = Field(
        False, description="let a manifest's rows name local paths, s3:// or gs:// files outside the manifest's "
        "folder (otherwise they are dead letters)")
    wait_minutes: float = Field(
        60.0, ge=0, le=24 * 60, description="how long to wait for another ingest into ROOT (another run's) to "
        "finish before failing, publishing nothing; 0 fails at once (the wait counts toward timeouts.ingest)")


class DataCheckConfig(BaseModel):
    """The data check: a new span's statistics against the history, its labels against the served model; errors quarantine it."""

    model_config = SETTINGS_CONFIG

    # 0.125: spans are often a few hundred records, where a class's share moves by a few points from
    # sampling alone (one standard error is 0.05 at 100 records and a share of 0.5); an eighth of the records
    # changing class is a change of mix worth a look. A look, not a quarantine: arrivals are rarely
    # stratified (components/datacheck/mix.py). TFDV's comparator takes any threshold.
    max_label_drift: float = Field(
        0.125, gt=0, le=1, description="warn when a class's share of the span's records differs from the history's "
        "by more than this (L-infinity, as TFDV's drift comparator); a change of mix alone never quarantines")
    # 3: one arrival without a class is a skewed night (one line, one camera), two can be a weekend;
    # a third in a row, each large enough to have shown the class, is a feed that stopped.
    vanished_after: int = Field(
        3, ge=1, le=10_000, description="quarantine the span when a class of the history has been missing, each time beyond "
        "chance, from this many arrivals in a row, the span's included (a feed that died); fewer warn")
    max_same_image_share: float = Field(
        0.2, gt=0, le=1, description="quarantine the span when more than this share of its files are one picture "
        "as ingest judged them: exact copies, and near-copies whose block colours agree too (a stuck camera)")
    min_class_examples: int = Field(
        5, ge=0, le=10**9, description="warn about a class with fewer training records than this in the span and its history")


def check_weights(weights: str) -> str:
    """train.weights: none, imagenet or the path of a local Keras .h5 file (whether it exists is the run's
    to say: the machine that trains is not always the one that reads the setting)."""
    if weights in ("none", "imagenet"):
        return weights
    if "://" in weights or not weights.endswith(".h5"):
        raise ValueError(f"{without_secrets(repr(weights))}: none, imagenet or the path of a local Keras .h5 "
                         "weights file")
    return weights


def check_image_cache(cache: str) -> str:
    """train.image_cache: memory, or a local path prefix (the file cache is bound to its data by a lock on a
    local disk)."""
    if cache != "memory" and "://" in cache:
        raise ValueError(f"{without_secrets(repr(cache))} is not a local path: the file cache is bound to its data "
                         "by a lock on a local disk; give a local path prefix, or memory")
    return cache


Weights = Annotated[str, AfterValidator(check_weights)]
ImageCache = Annotated[str, AfterValidator(check_image_cache)]

# Small data: the default batch shrinks until an epoch has this many steps, down to SMALL_BATCH.
DEFAULT_BATCH = 64
SMALL_BATCH = 16
MIN_STEPS_PER_EPOCH = 20


class TrainConfig(BaseModel):
    """Training: published spans to a candidate SavedModel, tf.data input, Keras under a tf.distribute strategy."""

    model_config = SETTINGS_CONFIG

    network: NetworkReference | None = Field(
        None, description="network to train: a built-in one (small_cnn, mobilenet_v3_small, efficientnet_b0, "
        "resnet50), keras.applications.<Name> (e.g. keras.applications.ConvNeXtTiny), or your own code, "
        "module:function or path/to/file.py:function beside the run configuration (docs/train.md, Your own network); "
        "default: the preset's")
    weights: Weights | None = Field(
        None, description="initial weights: none (from scratch), imagenet (keras.applications' ImageNet weights, from "
        "the Keras cache ~/.keras/models or downloaded) or the path of a local Keras .h5 weights file, e.g. the "
        "*_notop.h5 keras.applications downloads, for offline fine-tuning (default: the preset's)")
    image_size: int | None = Field(None, gt=0, le=MAX_IMAGE_SIZE, description="side of the square input image in "
                                   "pixels (default: the preset's)")
    batch_size: int | None = Field(
        None, gt=0, le=MAX_BATCH, description="batch size per replica (the global batch scales with replicas); "
        f"default 64, halved down to {SMALL_BATCH} while an epoch would have fewer than {MIN_STEPS_PER_EPOCH} steps")
    epochs: int | None = Field(None, gt=0, le=MAX_EPOCHS, description="passes over the training split (default: the "
                               "preset's; unset, the fewest that make train.min_steps steps)")
    min_steps: int | None = Field(
        None, gt=0, le=MAX_STEPS, description="with train.epochs unset: train the fewest whole epochs that make at "
        "least this many optimizer steps, so a few hundred images get as many steps as thousands (default: the preset's)")
    learning_rate: float = Field(3e-3, ge=0, le=MAX_LEARNING_RATE, description="peak learning rate (0 trains nothing: "
                                 "a control run); with pretrained weights, the head phase's")
    head_epochs: int | None = Field(
        None, ge=0, le=MAX_EPOCHS, description="with pretrained weights: the first this many epochs train the new head "
        "alone, the backbone frozen; the rest fine-tune the backbone too (default: a third of the epochs, rounded up; "
        "0: no head phase; all the epochs: the head alone)")
    fine_tune_learning_rate: float = Field(
        1e-4, ge=0, le=MAX_LEARNING_RATE, description="with pretrained weights: peak learning rate once the backbone is "
        "unfrozen, far below the head's so the pretrained features change little")
    warm_start: bool = Field(True, description="start from the served model's weights when it has this run's network, "
                             "image size and labels, and train on the spans it has not learnt from plus a replay "
                             "sample of those it has (docs/train.md, Warm start); false: a full retrain")
    replay: float = Field(1.0, ge=0, le=1000, description="a warm run's replay sample: history records per new record, "
                          "stratified by class, each class at least 16 (or all it has)")
    full_every: int = Field(7, gt=0, le=MAX_EPOCHS, description="after this many warm runs in a row, a full retrain "
                            "(warm-started networks drift from what a fresh run would learn)")
    warm_learning_rate: float | None = Field(
        None, ge=0, le=MAX_LEARNING_RATE, description="a warm run's peak learning rate (default: a third of "
        "train.learning_rate; with pretrained weights, train.fine_tune_learning_rate)")
    schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="cosine: linear warm-up, then cosine decay to a hundredth of the peak at the last step")
    lr_warmup_epochs: float = Field(1.0, ge=0, le=MAX_EPOCHS, description="epochs of the learning rate's linear warm-up "
                                    "(at most a fifth of the run)")
    weight_decay: float = Field(1e-4, ge=0, le=10, description="AdamW decoupled weight decay (0: plain Adam)")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="label smoothing of the cross-entropy")
    ema: bool = Field(False, description="evaluate and export an exponential moving average of the weights "
                      "instead of the last step's")
    ema_momentum: float = Field(0.99, gt=0, lt=1, description="momentum of the weight average")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="fixes shuffles, crops and initialisation (same seed, "
                             "same device: the same model)")
    precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = Field(
        "auto", description="auto: mixed_bfloat16 on Ampere+, mixed_float16 on GPUs >= 7.0, else float32")
    xla: bool | None = Field(None, description="compile steps with XLA (jit_compile); default on with a GPU")
    steps_per_execution: int = Field(1, gt=0, le=10_000, description="training steps per call into the compiled function")
    strategy: Literal["auto", "default", "one_device", "mirrored", "multi_worker"] = Field(
        "auto", description="auto: multi_worker when TF_CONFIG names a cluster, mirrored with >1 GPU, else one_device")
    spans: SpanList | None = Field(None, description="spans to read, e.g. 3 or 1,4-6 (default: all published)")
    steps_per_epoch: int | None = Field(None, gt=0, le=MAX_STEPS, description="cap on steps per epoch (default: one pass)")
    skip_corrupt: bool = Field(False, description="skip unreadable records of corrupt shards and count them")
    # Off by default: the served model judging its successor's data is a feedback loop (what it gets wrong
    # would never be learnt), and a mis-sorted file is best moved at its source; the data check names them.
    drop_suspected_label_errors: bool = Field(
        False, description="leave out of training the records the data check's label check flagged as suspected label "
        "errors (the served model confidently contradicts their label); the gate's eval records stay as they are")
    flip: bool | None = Field(None, description="random horizontal flips; off for digits, text, anything handed "
                              "(default: the preset's)")
    image_cache: ImageCache | None = Field(None, description="keep the decoded images after the first epoch: 'memory' "
                                    "or a local path prefix (one cache per split, named for the data it holds)")
    shuffle_buffer: int = Field(2048, gt=0, le=MAX_RECORDS_HELD, description="records in the shuffle buffer")
    backup_every: int | None = Field(None, gt=0, le=MAX_STEPS, description="back up for resume every N steps "
                                     "(default: each epoch)")
    trace_steps: TraceSteps = Field("10,20", description="steps the TensorBoard profiler traces, e.g. 10,20; 'none' "
                             "turns it off")
    input_probe_steps: int | None = Field(
        None, ge=0, le=10_000, description="steps of the input-bound probe after training (0: skip; default: the preset's)")
    cpu_devices: int | None = Field(None, gt=0, le=256, description="split the CPU into N logical devices (mirrored "
                                    "without GPUs)")
    data_service: ServiceAddress | None = Field(
        None, description="grpc://HOST:PORT of a tf.data service dispatcher (`stoke data-service`): the training "
        "input pipeline up to the batch runs on its workers, evaluation stays here")

    @model_validator(mode="after")
    def _cache_or_service(self):
        if self.image_cache and self.data_service:
            raise ValueError("train.image_cache and train.data_service do not go together: a service worker's files "
                             "change from pass to pass, so its cache would hold part of the split")
        return self


class GateConfig(BaseModel):
    """The gate: TFMA on the eval split of every checked span, against the newest served version, plus a serving check."""

    model_config = SETTINGS_CONFIG

    min_accuracy: float | None = Field(
        None, ge=0.0, le=1.0, description="lowest accuracy to bless (default: must beat the eval split's "
        "majority-class rate)")
    max_regression: float = Field(
        0.01, ge=0.0, le=1.0, description="allowed absolute accuracy drop below the served version "
                                          "(decision evidence: a larger drop must be shown by the interval)")
    decision: Literal["evidence", "point"] = Field(
        "evidence", description="evidence: refuse a drop beyond max_regression only when the paired interval of the "
                                "difference (both models on the same eval records) lies wholly beyond it, also against "
                                "the best retained version; point: compare the two accuracies as they are")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="confidence of the paired interval of the difference "
                                                                "(decision evidence); McNemar's p-value is reported beside it; "
                                                                "1 - confidence is the per-class rule's level")
    per_class: bool = Field(
        True, description="also refuse a candidate that answers one class worse than the served version, or than "
                          "the reference (the version it is held to across nights), with evidence (McNemar's exact "
                          "one-sided test per class, Holm's correction over the classes, at level 1 - confidence) by "
                          "more than max_regression, under either decision")
    top_k: int = Field(5, gt=0, le=100_000, description="k of the top-k accuracy (capped at the number of classes)")
    warmup_images: int = Field(8, gt=0, le=256, description="real eval images in TF Serving's warm-up requests")


class PushConfig(BaseModel):
    """Push: a blessed candidate into the TF Serving model repository, plus the serving image build context."""

    model_config = SETTINGS_CONFIG

    keep: int = Field(3, gt=0, le=10_000, description="newest versions kept in the repository (older ones are retired)")
    build_image: bool = Field(True, description="build the serving image when a container engine answers")
