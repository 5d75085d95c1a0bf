"""The report's verdict on the input pipeline, from the probe's figures: input-bound or not, and the
cheapest change that would feed the model faster (a training setting before a new ingest, or more
CPU through the tf.data service)."""
from __future__ import annotations

import math

from components.common.program import setting_hint
from components.contracts.config import DISPATCHER_PORT
from components.contracts.results import InputProbe


def verdict(probe: InputProbe, image_size: int | None = None) -> str:
    if probe.input_images_per_sec is None:
        return "not measured"
    rate, model = probe.input_images_per_sec, probe.model_images_per_sec_synthetic
    if model is None:
        return f"input pipeline alone: {figure(rate)} images/s"
    if probe.input_bound:
        text = (f"**input-bound**: the input pipeline delivers {figure(rate)} images/s, the model could take "
                f"{figure(model)}; the accelerator waited about {figure(probe.input_wait_seconds, 1)} s")
        fix = cheapest_fix(probe, image_size) or data_service_fix(probe)
        return f"{text}. Cheapest fix: {fix}" if fix else text
    return f"not input-bound: input {figure(rate)} images/s against the model's {figure(model)} images/s"


def cheapest_fix(probe: InputProbe, image_size: int | None) -> str | None:
    """The cheapest change that makes the input faster, of those the probe's figures show: a training
    setting before a new ingest, and one ingest for every setting it should change."""
    if probe.cache is None and probe.decoded_gb is not None and probe.memory_gb \
            and probe.decoded_gb < probe.memory_gb / 4:
        return (f"train with the image cache in memory, {setting_hint('train', {'train.image_cache': 'memory'})}: "
                f"the training split decoded is about {figure(probe.decoded_gb, 1)} GB, and later epochs then skip "
                "reading and decoding")
    settings, reasons = {}, []
    if image_size and probe.stored_short_side and probe.stored_short_side > 2 * image_size:
        settings["ingest.max_side"] = max(512, 2 * image_size)
        reasons.append(f"the spans store images with a {probe.stored_short_side} px shorter side for "
                       f"{image_size} px training, and every epoch decodes them")
    if probe.compression in ("gzip", "zlib") and (probe.jpeg_share or 0) > 0.5:
        settings["ingest.compression"] = "none"
        reasons.append(f"{probe.compression.upper()} saves under 1% on JPEG bytes and every epoch inflates them")
    if not settings:
        return None
    return f"ingest the source again into a new ROOT with {setting_hint('ingest', settings)}: " + "; ".join(reasons)


def data_service_fix(probe: InputProbe) -> str | None:
    """When this host's cores cannot feed the model: how many tf.data service workers of its speed
    would (the model's rate over the input pipeline's rate here, which one such worker delivers)."""
    if not probe.input_images_per_sec or not probe.model_images_per_sec_synthetic:
        return None
    workers = math.ceil(probe.model_images_per_sec_synthetic / probe.input_images_per_sec)
    train = setting_hint("train", {"train.data_service": f"grpc://HOST:{DISPATCHER_PORT}"})
    return (f"more CPU: run the input pipeline on {workers} tf.data service workers of this host's speed "
            f"({figure(probe.model_images_per_sec_synthetic)} images/s for the model over {figure(probe.input_images_per_sec)} "
            f"per worker): `stoke data-service dispatcher --host HOST --trusted-network` on one machine, `stoke "
            f"data-service worker --dispatcher HOST:{DISPATCHER_PORT} --host WORKER --trusted-network` on each of "
            f"{workers}, then train with {train}; on a network that admits only "
            f"them and the trainers: any peer that reaches their ports can run TensorFlow ops on the workers")


def figure(value, digits: int = 0) -> str:
    """A number as the report prints it: thousands separated, `digits` decimals for floats, "-" for None."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"
