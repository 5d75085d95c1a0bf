"""`stoke predict TARGET IMAGE...`: labels and probabilities from a model folder or a TF Serving URL.

TARGET is a SavedModel folder, a model repository folder (its newest version is used), or a TF
Serving model URL such as http://host:8501/v1/models/stoke (optionally .../versions/N or
.../labels/stable). The REST call uses TF Serving's row format with binary inputs in the
`{"b64": ...}` form, the documented way to send bytes through JSON.
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import posixpath
import sys
import urllib.error
import urllib.request

from components.contracts import program
from components.contracts.files import filesystem
from components.contracts.schema import SERVING_INPUT, SERVING_SIGNATURE


class PredictError(Exception):
    """A refusal with a message for the user."""


def rest_body(images: list[bytes], signature: str = SERVING_SIGNATURE) -> dict:
    """The JSON body of TF Serving's predict API: one instance per image, bytes as {"b64": ...}."""
    return {"signature_name": signature,
            "instances": [{SERVING_INPUT: {"b64": base64.b64encode(image).decode("ascii")}} for image in images]}


# A predict answer holds a few numbers per class and image; anything near this is not one.
MAX_ANSWER_BYTES = 32 << 20


def rest_predict(url: str, images: list[bytes], timeout: float = 60.0) -> list[dict]:
    """POSTs to `<model url>:predict` and returns one dict per image (TF Serving's row format)."""
    request = urllib.request.Request(url.rstrip("/") + ":predict", data=json.dumps(rest_body(images)).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            content_type = response.headers.get_content_type()
            data = response.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        detail = _snippet(exc.read(64 << 10))
        try:
            detail = str(json.loads(detail).get("error", detail))
        except (ValueError, AttributeError):
            pass
        raise PredictError(f"{url} answered {exc.code}: {_snippet(detail.encode())}") from None
    except http.client.HTTPException as exc:
        raise PredictError(f"{url} sent something that is not an HTTP answer ({type(exc).__name__})") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PredictError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
    if len(data) > MAX_ANSWER_BYTES:
        raise PredictError(f"{url} answered more than {MAX_ANSWER_BYTES >> 20} MB, larger than any predict answer "
                           "for these images; is it a TF Serving model URL?")
    try:
        answer = json.loads(data)
    except ValueError:
        raise PredictError(f"{url} answered something that is not JSON ({content_type}): {_snippet(data)}") from None
    predictions = answer.get("predictions") if isinstance(answer, dict) else None
    if not isinstance(predictions, list) or len(predictions) != len(images):
        raise PredictError(f"{url} answered without one prediction per image: {_snippet(data)}")
    for row in predictions:
        if not _is_row(row):
            raise PredictError(f"{url} answered predictions in an unexpected form (want probabilities, class_ids "
                               f"and labels per image): {_snippet(json.dumps(row).encode())}")
    return predictions


def _is_row(row) -> bool:
    """One image's prediction as the serving signature writes it."""
    return (isinstance(row, dict) and isinstance(row.get("probabilities"), list) and row["probabilities"]
            and all(isinstance(p, (int, float)) for p in row["probabilities"])
            and isinstance(row.get("class_ids"), int) and isinstance(row.get("labels"), str))


def _snippet(data: bytes, limit: int = 200) -> str:
    """The start of an answer, printable on one line."""
    text = data[:limit].decode(errors="replace")
    return "".join(c if c.isprintable() else " " for c in text) + ("..." if len(data) > limit else "")


def check_image(name: str, data: bytes) -> None:
    """Fails with a clear message unless `data` decodes as an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except UnidentifiedImageError:
        raise PredictError(f"{name} is not a readable image (unknown or corrupt format)") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise PredictError(f"{name} is not a readable image ({exc})") from None


def resolve_model_dir(target: str) -> str:
    """A SavedModel folder as given, or the newest integer version inside a model repository folder."""
    fs, path = filesystem(target)
    if fs.exists(posixpath.join(path, "saved_model.pb")):
        return target
    if fs.isdir(path):
        versions = sorted(int(posixpath.basename(p.rstrip("/"))) for p in fs.ls(path, detail=False)
                          if posixpath.basename(p.rstrip("/")).isdigit()
                          and fs.exists(posixpath.join(p, "saved_model.pb")))
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
        predictions = local_predict(model, images)
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
                        errors=(PredictError,))


def _describe(summary: dict) -> str:
    return "\n".join(f"{p['image']}: {p['label']} ({p['probability']:.3f})" for p in summary["predictions"])


if __name__ == "__main__":
    sys.exit(run())
