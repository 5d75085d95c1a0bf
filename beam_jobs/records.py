"""One source file to one training record, or the reason it cannot be one: ingest's work per image.

Free of Beam, so the worker processes of beam_jobs/image_pool.py start in a fraction of a second;
beam_jobs/ingest_pipeline.py runs it in Beam's workers or hands it to those processes.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

from beam_jobs import quality
from beam_jobs.local import NotRegularFile, open_source
from beam_jobs.near_lookup import NearRules, Published
from beam_jobs.quality import Rules
from beam_jobs.shards import unit
from components.common.files import is_uri
from components.common.images import Limits, Rejected, normalize
from components.common.signatures import sha256
from components.contracts import schema

MB = 1024 * 1024


@dataclass(frozen=True)
class Conversion:
    """What every record of one job is converted by; `published` is the staged dHashes' file; `queries` the
    query each file named there is read with (its signature: beam_jobs/sources.py, Source.query), handed to
    the workers with the job itself, as Beam hands them the job's code, never in the staged lists under ROOT."""
    limits: Limits = Limits()
    rules: Rules = Rules()
    near: NearRules = NearRules()
    published: str | None = None
    compression: str = "gzip"  # of the shards: a record leaves as the unit their files hold (beam_jobs/shards.py)
    queries: tuple[tuple[str, str], ...] = ()  # (name, query): hashable, as a pool's key (beam_jobs/image_pool.py)

    @classmethod
    def of(cls, config, published: str | None = None, queries: tuple[tuple[str, str], ...] = ()) -> Conversion:
        """From the ingest settings."""
        limits = Limits(max_side=config.max_side, max_pixels=int(config.max_megapixels * 1e6),
                        max_bytes=int(config.max_file_mb * MB), blank_std=config.blank_std)
        return cls(limits, Rules.of(config), NearRules.of(config), published, config.compression, queries)


class Converter:
    """Sources to (record, None) or (None, dead-letter reason); the published dHashes loaded once."""

    def __init__(self, conversion: Conversion, published: Published | None = None):
        self.conversion = conversion
        uri = conversion.published
        self.published = published or (Published(uri, conversion.near.bits) if uri else None)
        self.queries = dict(conversion.queries)

    def __call__(self, source: dict) -> tuple[tuple[str, bytes, dict] | None, str | None]:
        """(split, the record's unit, signature), or the reason there is none: framed and compressed here,
        where conversion runs in parallel, so Beam's threads only write."""
        query = self.queries.get(source["uri"])
        source = {**source, "query": query} if query else source
        try:
            split, example, signature = to_example(source, self.conversion, self.published)
        except Rejected as rejected:
            return None, str(rejected)
        return (split, unit(example, self.conversion.compression), signature), None


def to_example(source: dict, conversion: Conversion, published: Published | None) -> tuple[str, bytes, dict]:
    """Reads, verifies and normalizes one source into (split, serialized tf.Example, signature): the
    split is its original's when it is a near-copy of a published image that it may follow."""
    limits, rules, near = conversion.limits, conversion.rules, conversion.near
    data = read_source(source, limits.max_bytes)
    image = normalize(data, limits.max_side, limits.max_pixels)
    if limits.blank_std and image.pixels.std < limits.blank_std:
        raise Rejected(f"blank image: std {image.pixels.std:.1f} of 0-255 grey, below --blank-std {limits.blank_std:g}")
    found = quality.issues(image.pixels.quality.as_dict(), image.width, image.height, rules)
    aside = sorted(rules.set_aside & found.keys())
    if aside:
        raise Rejected(quality.reason(aside[0], found[aside[0]]))
    split, fixed = source["split"], bool(source.get("fixed"))
    signature = {
        "uri": source["uri"], "sha256": sha256(data), "dhash": image.pixels.dhash, "mirror": image.pixels.mirror,
        "mean": image.pixels.mean, "std": image.pixels.std, "label": source["label"], "format": image.format,
        "width": image.width, "height": image.height, "bytes": len(image.encoded),
        "blocks": base64.b64encode(image.pixels.blocks).decode("ascii"),  # for near-copies among alike pictures
    }
    match = published.match(image.pixels.dhash, image.pixels.mirror) if published and near.eligible(
        image.width, image.height) else None
    if match and match.get("crowded"):
        signature["crowded"] = True  # among pictures too alike for dHash to name the one it copies
    elif match:
        match["moved"] = near.mode == "follow" and not fixed and match["split"] != split
        split = match["split"] if match["moved"] else split
        signature["near"] = match
    signature.update({"split": split, **({"fixed": True} if fixed else {}), **({"issues": sorted(found)} if found else {})})
    return split, schema.encode_example(
        encoded=image.encoded, image_format=image.format, height=image.height, width=image.width,
        label=source["label_id"], text=source["label"], source=source["uri"],
    ), signature


def read_source(source: dict, max_bytes: int | None) -> bytes:
    """The file's bytes, read with its query when it has one. A file listed larger than `max_bytes` is never
    opened, and no more than that is read of one that grew after it was listed."""
    if max_bytes and source["size"] > max_bytes:
        raise Rejected(_too_large(source["size"], max_bytes))
    try:
        with open_source(source["uri"] + source.get("query", "")) as f:
            # As much as was listed and a byte more, to see it grew: a read of the limit's size would first
            # allocate all of it (64 MB: 0.02 ms of the 1.1 a small JPEG costs).
            data = f.read(source["size"] + 1)
            if len(data) > source["size"]:
                data += f.read(max_bytes + 1 - len(data) if max_bytes else -1)
    except NotRegularFile as error:
        raise Rejected(str(error)) from None
    except Exception as error:
        from components.common import store_errors  # on a failure only: the image workers start without it

        # A store's answer for this file; a local disk's error other than a file gone fails the job, as a
        # failing disk must not send file after file to the dead letters.
        local = not is_uri(source["uri"]) and not isinstance(error, FileNotFoundError)
        reason = None if local else store_errors.refused(error, source["uri"])
        if reason is None:  # another try may read it (a server busy), or none could: the job fails
            raise
        raise Rejected("not found: removed after it was listed" if reason == store_errors.NOT_FOUND else reason) from None
    if max_bytes and len(data) > max_bytes:
        raise Rejected(_too_large(len(data), max_bytes))
    return data


def _too_large(size: int, max_bytes: int) -> str:
    return f"file too large: {size / MB:,.1f} MB, more than the limit of {max_bytes / MB:g} MB (--max-file-mb)"
