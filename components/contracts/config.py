"""Typed settings of each stage: Prefect renders them as flow parameters, the CLI as options.

Each field's description is its help text in both places. `add_arguments` and `from_arguments`
turn a model into argparse options and back, so a setting is declared once.
"""
from __future__ import annotations

import argparse
import re
import types
import typing
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from components.contracts import schema
from components.contracts.secrets import without_secrets

# The networks `stoke train` can fit (components/train/models.py builds each).
ModelName = Literal["small_cnn", "mobilenet_v3_small", "efficientnet_b0", "resnet50"]
MODEL_NAMES: tuple[str, ...] = typing.get_args(ModelName)

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
DISPATCHER_PORT, WORKER_PORT = 5050, 5051  # `stoke data-service`'s defaults

# Every settings model refuses inf and nan: a number that can never be reached (`--shard-mb inf`)
# would otherwise pass `gt=0` and fail late, deep in Beam or Keras, instead of as a setting.
SETTINGS_CONFIG = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)


# Where training and the gate keep local copies of the shards of a ROOT TensorFlow cannot read (s3://;
# components/common/shard_cache.py), declared once for every stage that reads them.
CACHE_DIR_HELP = ("local folder for copies of the shards when ROOT is on a store TensorFlow cannot read (s3://): "
                  "reused across runs (default: $STOKE_CACHE_DIR, else stoke-cache in the temp directory)")
CACHE_MAX_GB_HELP = "size cap of that cache in GB; the copies used longest ago are evicted first"


class IngestConfig(BaseModel):
    """Raw images to a new span of sharded TFRecords."""

    model_config = SETTINGS_CONFIG

    source: str = Field(
        description="folder of class subfolders, or a CSV/JSONL manifest of uri,label[,split]; "
        "a local path or an fsspec URI (s3://, gs://)"
    )
    root: str = Field(description="artifact ROOT: local path or fsspec URI")
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of sources for eval, by path hash")
    # Upper bounds far beyond any real use, so a typo or 1e308 is a settings error, not a Beam one.
    shard_mb: float = Field(128.0, gt=0, le=16384, description="target size of one shard file in MB")
    max_side: int = Field(
        512, ge=0, le=65535, description="shrink images whose longer side is larger, once, on ingest (JPEG by DCT scaling); "
        "0 keeps full size. 512 suits training at up to about 320 px; raise it for a larger --image-size")
    max_megapixels: float = Field(
        schema.MAX_MEGAPIXELS, gt=0, le=10000, description="set aside images with more pixels than this, read from "
        "the header before decoding (a small file can declare a huge image)")
    max_file_mb: float = Field(64.0, gt=0, le=16384, description="set aside source files larger than this, unread")
    max_bad_fraction: float = Field(
        0.05, ge=0.0, le=1.0, description="fail, publishing nothing, when more sources than this are bad"
    )
    blank_std: float = Field(
        2.0, ge=0.0, le=255.0, description="set aside images whose grey level (0-255) has a standard deviation below this, "
        "such as a dead camera's blank frames; 0 keeps them")
    compression: Literal["gzip", "zlib", "none"] = Field("gzip", description="codec of the shard files")
    allow_outside_source: bool = Field(
        False, description="let a manifest's rows name local paths, s3:// or gs:// files outside the manifest's "
        "folder (otherwise they are dead letters)")
    arrived: str | None = Field(
        None, description="a file of URIs in SOURCE, one a line, that bucket notifications announced: only these "
        "are read, instead of listing all of SOURCE (the nightly run's full listing catches what a lost "
        "notification missed)")


class DataCheckConfig(BaseModel):
    """A new span's statistics against the published history: errors quarantine the span."""

    model_config = SETTINGS_CONFIG

    root: str = Field(description="artifact ROOT: local path or fsspec URI")
    span: int | None = Field(None, gt=0, description="span to check (default: the newest published)")
    # 0.25: spans are often a few hundred records, where a class's share moves by a few points from
    # sampling alone (one standard error is 0.05 at 100 records and a share of 0.5); a quarter of the
    # records changing class is a different mix, not noise. TFDV's comparator takes any threshold.
    max_label_drift: float = Field(
        0.25, gt=0, le=1, description="quarantine the span when a class's share of its records differs from the "
        "history's by more than this (L-infinity, as TFDV's drift comparator); over half of it warns")
    max_same_image_share: float = Field(
        0.2, gt=0, le=1, description="quarantine the span when more than this share of its records share one "
        "dHash (a flood of near-identical frames)")
    min_class_examples: int = Field(
        5, ge=0, description="warn about a class with fewer training records than this in the span and its history")


def option(name: str) -> str:
    """The command-line option of a setting: `shard_mb` -> `--shard-mb`."""
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], positional=()) -> None:
    """Adds one option per field of `model` (`--shard-mb`), or a positional argument."""
    for name, field in model.model_fields.items():
        kind, choices = _argument_type(field.annotation)
        help_text = field.description or ""
        if name in positional:
            parser.add_argument(name, type=kind, help=help_text)
            continue
        flag = option(name)
        required = field.is_required()
        if not required and field.default is not None:  # None: the description says what happens
            help_text += f" (default: {field.default})"
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                default=field.default, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=kind, choices=choices, required=required,
                                default=None if required else field.default, help=help_text)


def from_arguments(model: type[BaseModel], namespace: argparse.Namespace):
    """Builds `model` from parsed arguments; pydantic validates ranges and types."""
    return model(**{name: getattr(namespace, name) for name in model.model_fields})


def _argument_type(annotation):
    """The argparse type and choices for a field annotation such as `int | None` or a Literal."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = args[0]
        args = list(typing.get_args(annotation))
    if typing.get_origin(annotation) is Annotated:  # RunId: the pattern is pydantic's to check
        annotation = args[0]
    if typing.get_origin(annotation) is Literal:
        return type(args[0]), list(args)
    return annotation, None


# Small data: the default batch shrinks until an epoch has this many steps, down to SMALL_BATCH.
DEFAULT_BATCH = 64
SMALL_BATCH = 16
MIN_STEPS_PER_EPOCH = 20


# Named presets of the training settings. The defaults are for real photos on an accelerator; the
# demo's values train the 1,797 digits at 32 px in seconds per epoch on a CPU (400 steps at batch 32:
# 0.96-0.98 eval accuracy, README "Training"). No flips for digits: a mirrored digit is another glyph.
PresetName = Literal["production", "demo"]
PRESETS: dict[str, dict] = {
    "production": {"model": "efficientnet_b0", "image_size": 224, "epochs": 30, "flip": True, "probe_steps": 30},
    "demo": {"model": "small_cnn", "image_size": 32, "epochs": 8, "flip": False, "probe_steps": 10, "batch_size": 32},
}


class TrainConfig(BaseModel):
    """Published spans to a candidate SavedModel: tf.data input, Keras under a tf.distribute strategy."""

    model_config = SETTINGS_CONFIG

    root: str = Field(description="artifact ROOT: local path or fsspec URI (s3://, gs://)")
    preset: PresetName = Field(
        "production", description="defaults of the fields left unset: production (real photos on an accelerator: "
        "efficientnet_b0 at 224 px, flips, 30 epochs) or demo (the digits of `make run`: small_cnn at 32 px, "
        "no flips, 8 epochs, batch 32)")
    model: ModelName | None = Field(None, description="network to train (default: the preset's)")
    weights: str = Field(
        "none", description="initial weights: none, imagenet (keras.applications models; downloads them) or the "
        "path of a local Keras weights file (.h5), e.g. one keras.applications downloaded, for offline fine-tuning")
    image_size: int | None = Field(None, gt=0, description="side of the square input image in pixels "
                                   "(default: the preset's)")
    batch_size: int | None = Field(
        None, gt=0, description="batch size per replica (the global batch scales with replicas); default 64, "
        f"halved down to {SMALL_BATCH} while an epoch would have fewer than {MIN_STEPS_PER_EPOCH} steps (demo: 32)")
    epochs: int | None = Field(None, gt=0, description="passes over the training split (default: the preset's)")
    learning_rate: float = Field(3e-3, ge=0, description="peak learning rate (0 trains nothing: a control run)")
    schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="cosine: linear warm-up, then cosine decay to a hundredth of the peak at the last step")
    warmup_epochs: float = Field(1.0, ge=0, description="epochs of linear warm-up (at most a fifth of the run)")
    weight_decay: float = Field(1e-4, ge=0, description="AdamW decoupled weight decay (0: plain Adam)")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="label smoothing of the cross-entropy")
    ema: bool = Field(False, description="evaluate and export an exponential moving average of the weights "
                      "instead of the last step's")
    ema_momentum: float = Field(0.99, gt=0, lt=1, description="momentum of the weight average")
    seed: int | None = Field(None, ge=0, description="fixes shuffles, crops and initialisation (same seed, "
                             "same device: the same model)")
    precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = Field(
        "auto", description="auto: mixed_bfloat16 on Ampere+, mixed_float16 on GPUs >= 7.0, else float32")
    xla: bool | None = Field(None, description="compile steps with XLA (jit_compile); default on with a GPU")
    steps_per_execution: int = Field(1, gt=0, description="training steps per call into the compiled function")
    strategy: Literal["auto", "default", "one_device", "mirrored", "multi_worker"] = Field(
        "auto", description="auto: multi_worker when TF_CONFIG names a cluster, mirrored with >1 GPU, else one_device")
    run_id: RunId | None = Field(None, description="run folder under ROOT/runs; the same id resumes a stopped run")
    spans: str | None = Field(None, description="spans to read, e.g. 3 or 1,4-6 (default: all published)")
    steps_per_epoch: int | None = Field(None, gt=0, description="cap on steps per epoch (default: one pass)")
    skip_corrupt: bool = Field(False, description="skip unreadable records of corrupt shards and count them")
    flip: bool | None = Field(None, description="random horizontal flips; off for digits, text, anything handed "
                              "(default: the preset's)")
    cache: str | None = Field(None, description="cache decoded images: 'memory' or a file path prefix")
    shuffle_buffer: int = Field(2048, gt=0, description="records in the shuffle buffer")
    backup_every: int | None = Field(None, gt=0, description="back up for resume every N steps (default: each epoch)")
    profile_steps: str = Field("10,20", description="TensorBoard profiler step range; 'none' turns it off")
    probe_steps: int | None = Field(None, ge=0, description="steps of the input-bound probe after training (0: skip; "
                                    "default: the preset's)")
    cpu_devices: int | None = Field(None, gt=0, description="split the CPU into N logical devices (mirrored without GPUs)")
    data_service: ServiceAddress | None = Field(
        None, description="grpc://HOST:PORT of a tf.data service dispatcher (`stoke data-service`): the training "
        "input pipeline up to the batch runs on its workers, evaluation stays here")
    cache_dir: str | None = Field(None, description=CACHE_DIR_HELP)
    cache_max_gb: float = Field(100.0, gt=0, le=1e6, description=CACHE_MAX_GB_HELP)

    def resolved(self) -> TrainConfig:
        """These settings with every field left unset (None) taken from the preset."""
        unset = {name: value for name, value in PRESETS[self.preset].items() if getattr(self, name) is None}
        return self.model_copy(update=unset)


class GateConfig(BaseModel):
    """The gate: TFMA on the run's eval split, against the newest served version, plus a serving check."""

    model_config = SETTINGS_CONFIG

    root: str = Field(description="artifact ROOT: local path or fsspec URI")
    run_id: RunId = Field(description="run folder under ROOT/runs holding the candidate")
    model_name: ServedModelName = Field("stoke", description="model in ROOT/models to compare against")
    min_accuracy: float | None = Field(
        None, ge=0.0, le=1.0, description="lowest accuracy to bless (default: must beat the eval split's majority-class rate)")
    max_regression: float = Field(
        0.01, ge=0.0, le=1.0, description="allowed absolute accuracy drop below the served version "
                                          "(--decision evidence: a larger drop must be shown by the interval)")
    decision: Literal["evidence", "point"] = Field(
        "evidence", description="evidence: refuse a drop beyond --max-regression only when the paired interval of the "
                                "difference (both models on the same eval records) lies wholly beyond it, also against "
                                "the best retained version; point: compare the two accuracies as they are")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="confidence of the paired interval of the difference "
                                                                "(--decision evidence); McNemar's p-value is reported beside it")
    top_k: int = Field(5, gt=0, description="k of the top-k accuracy (capped at the number of classes)")
    warmup_images: int = Field(8, gt=0, le=256, description="real eval images in the warm-up requests")
    cache_dir: str | None = Field(None, description=CACHE_DIR_HELP)
    cache_max_gb: float = Field(100.0, gt=0, le=1e6, description=CACHE_MAX_GB_HELP)


class PushConfig(BaseModel):
    """A blessed candidate into the TF Serving model repository, plus the serving image build context."""

    model_config = SETTINGS_CONFIG

    root: str = Field(description="artifact ROOT: local path or fsspec URI")
    run_id: RunId = Field(description="run folder under ROOT/runs holding the blessed candidate")
    model_name: ServedModelName = Field("stoke", description="model name in ROOT/models and TF Serving")
    keep: int = Field(3, gt=0, description="newest versions kept in the repository (older ones are retired)")
    build_image: bool = Field(True, description="build the serving image when a container engine answers")


class PreflightConfig(BaseModel):
    """Preflight (`stoke preflight`): the machine, checked before any GPU hour is spent."""

    model_config = SETTINGS_CONFIG

    root: str = Field(description="artifact ROOT: local path or fsspec URI")
    source: str | None = Field(None, description="raw image source; its disk is checked too when local")
    require_gpu: bool = Field(False, description="fail, not warn, when no GPU is usable")
    min_read_mbps: float | None = Field(
        None, gt=0, description="fail when sequential reads under ROOT are slower than this (MB/s)")
    sample_mb: int = Field(64, gt=0, description="MiB to read when timing the disk")
    cache_dir: str | None = Field(None, description=CACHE_DIR_HELP)
    cache_max_gb: float = Field(100.0, gt=0, le=1e6, description=CACHE_MAX_GB_HELP)
