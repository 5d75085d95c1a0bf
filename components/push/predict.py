"""`stoke predict TARGET IMAGE...`: labels and probabilities from a model folder or a TF Serving URL.

TARGET is a SavedModel folder, a model repository folder (its newest version is used), or a TF
Serving model URL such as http://host:8501/v1/models/stoke (optionally .../versions/N or
.../labels/stable). The REST call uses TF Serving's row format with binary inputs in the
`{"b64": ...}` form, the documented way to send bytes through JSON.
"""
from __future__ import annotations

import posixpath
import sys
import tempfile

from components.common import program
from components.common.files import filesystem
from components.common.image_header import ImageRefused, open_image
from components.common.local_copies import UnsafeKey
from components.common.model_folders import loadable, survey
from components.common.serving import PredictError, rest_predict
from components.common.tf_files import local_copy
from components.contracts.schema import MAX_MEGAPIXELS, SERVING_INPUT, SERVING_SIGNATURE


def check_image(name: str, data: bytes) -> None:
    """Fails with a clear message unless `data` decodes as an image that the serving signature
    takes: an accepted format with at most MAX_MEGAPIXELS, both read from the header first."""
    try:
        with open_image(data, int(MAX_MEGAPIXELS * 1e6)) as image:
            image.load()
    except ImageRefused as refused:
        raise PredictError(f"{name} is not a readable image ({refused})") from None
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow's word for a damaged file, header or pixels
        raise PredictError(f"{name} is not a readable image ({exc})") from None


def resolve_model_dir(target: str) -> str:
    """A SavedModel folder as given, or the newest version inside a model repository folder (a
    version as push and the gate read it: components/common/model_folders.py)."""
    fs, path = filesystem(target)
    if fs.isdir(path):
        if loadable(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)):
            return target
        versions = survey(fs, path).versions
        if versions:
            return posixpath.join(target.rstrip("/"), str(versions[-1]))
    raise PredictError(f"{target} is neither a SavedModel folder nor a model repository with versions")


def local_predict(model_dir: str, images: list[bytes]) -> list[dict]:
    """Runs `serving_default` of the SavedModel in this process; same row format as the REST API."""
    import tensorflow as tf

    try:
        signature = tf.saved_model.load(model_dir).signatures[SERVING_SIGNATURE]
    except (OSError, KeyError, ValueError) as exc:
        raise PredictError(f"cannot load {SERVING_SIGNATURE} from {model_dir}: {exc}") from None
    out = signature(**{SERVING_INPUT: tf.constant(images, dtype=tf.string)})
    return [{"probabilities": [float(p) for p in out["probabilities"][i].numpy()],
             "class_ids": int(out["class_ids"][i].numpy()),
             "labels": out["labels"][i].numpy().decode()} for i in range(len(images))]


def predict(target: str, image_uris: list[str]) -> dict:
    images = []
    for uri in image_uris:
        fs, path = filesystem(uri)
        if not fs.exists(path):
            raise PredictError(f"{uri} does not exist")
        data = fs.cat_file(path)
        check_image(uri, data)
        images.append(data)
    if target.startswith(("http://", "https://")):
        predictions, model = rest_predict(target, images), target
    else:
        model = resolve_model_dir(target)
        with tempfile.TemporaryDirectory(prefix="stoke-predict-") as scratch:
            predictions = local_predict(local_copy(model, scratch, "model"), images)
    results = []
    for uri, p in zip(image_uris, predictions):
        probabilities = [float(v) for v in p["probabilities"]]
        results.append({"image": uri, "label": p["labels"], "class_id": int(p["class_ids"]),
                        "probability": max(probabilities), "probabilities": probabilities})
    return {"model": model, "predictions": results}


def run(argv: list[str] | None = None) -> int:
    parser = program.arguments("stoke predict", __doc__)
    parser.add_argument("target", help="SavedModel folder, model repository folder, or TF Serving model URL")
    parser.add_argument("images", nargs="+", help="image files (local paths or fsspec URIs)")
    args = parser.parse_args(argv)
    return program.main("stoke predict", args.json, lambda: predict(args.target, args.images), _describe,
                        errors=(PredictError, UnsafeKey))


def _describe(summary: dict) -> str:
    return "\n".join(f"{p['image']}: {p['label']} ({p['probability']:.3f})" for p in summary["predictions"])


if __name__ == "__main__":
    sys.exit(run())
