"""TensorFlow Serving as every stage meets it: the pinned server image, whether a container engine
answers, and the REST predict client (TF Serving's row format, bytes as `{"b64": ...}`, the
documented way to send bytes through JSON)."""
from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

from components.common import processes
from components.contracts.schema import SERVING_INPUT, SERVING_SIGNATURE

# The tensorflow/serving release that serves the models each TensorFlow (major.minor) trains: the rule,
# in docs/push.md, is the model's own TensorFlow's release (TF Serving's releases follow TensorFlow's, and a
# server older than the TensorFlow that wrote a model may not know its ops); a TensorFlow older than the
# first row is served by the first row's release; one newer than the last row is refused by the push, until
# its row is added. Each tag is written by hand, so `stoke push --build-image` has the container engine find
# or pull it before building (components/push/serving_image.py). Checked on 2026-12-01: 2.21.0 is the
# newest release seen (PyPI has tensorflow-serving-api 2.21.0, released 2026-09, from the same release, and
# the public tutorial github.com/subirroy71/tfserving_tutorial serves SavedModels exported by
# tensorflow==2.21.0 from `tensorflow/serving:2.21.0` in its CI's end-to-end run; its 2.21.0-gpu tag was
# seen named, not run); TF Serving's own release PRs seen stop at 2.20.0 (tensorflow/serving#4135).
SERVING_RELEASES = {"2.20": "2.20.0", "2.21": "2.21.0"}
# The release for the TensorFlow pyproject.toml pins: the stock server infra/ runs and the gate's check.
SERVING_VERSION = SERVING_RELEASES["2.21"]
SERVING_IMAGE = "tensorflow/serving"


def serving_release(trained_tf: str) -> str | None:
    """The tensorflow/serving release for models TensorFlow `trained_tf` wrote (SERVING_RELEASES' rule);
    None when it is newer than every row."""
    wrote = _minor(trained_tf)
    rows = sorted(SERVING_RELEASES, key=_minor)
    if wrote > _minor(rows[-1]):
        return None
    return SERVING_RELEASES[next((row for row in reversed(rows) if _minor(row) <= wrote), rows[0])]


def _minor(version: str) -> tuple[int, int]:
    numbers = [int(n) for n in re.findall(r"\d+", version or "")[:2]]
    return tuple(numbers + [0] * (2 - len(numbers)))


def docker_engine() -> bool:
    """True when a container engine answers (the docker CLI alone is not enough)."""
    if not shutil.which("docker"):
        return False
    try:
        return processes.run(["docker", "info"], timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


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
    deadline = time.monotonic() + timeout  # for the whole answer: a server dripping bytes cannot outlast it
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            content_type = response.headers.get_content_type()
            data = _read_until(response, deadline, url, timeout)
    except urllib.error.HTTPError as exc:
        detail = _snippet(exc.read(64 << 10))
        try:
            detail = str(json.loads(detail).get("error", detail))
        except (ValueError, AttributeError):
            pass
        raise PredictError(f"{url} answered {exc.code}: {_snippet(detail.encode())}") from None
    except http.client.HTTPException as exc:
        raise PredictError(f"{url} sent something that is not an HTTP answer ({type(exc).__name__})") from None
    except TimeoutError:
        raise PredictError(f"{url} did not answer within {timeout:g} s") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PredictError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
    if len(data) > MAX_ANSWER_BYTES:
        raise PredictError(f"{url} answered more than {MAX_ANSWER_BYTES >> 20} MB, larger than any predict answer "
                           "for these images; is it a TF Serving model URL?")
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python recurses
        raise PredictError(f"{url} answered something that is not JSON ({content_type}): {_snippet(data)}") from None
    predictions = answer.get("predictions") if isinstance(answer, dict) else None
    if not isinstance(predictions, list) or len(predictions) != len(images):
        raise PredictError(f"{url} answered without one prediction per image: {_snippet(data)}")
    for row in predictions:
        if not _is_row(row):
            raise PredictError(f"{url} answered predictions in an unexpected form (want probabilities, class_ids "
                               f"and labels per image): {_snippet(json.dumps(row).encode())}")
    return predictions


def _read_until(response, deadline: float, url: str, timeout: float) -> bytes:
    """The answer's body, at most MAX_ANSWER_BYTES + 1 of it, read by the deadline: each read waits
    at most what is left of it, so the whole answer takes at most `timeout` after the request."""
    chunks, size = [], 0
    while size <= MAX_ANSWER_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PredictError(f"{url} did not answer within {timeout:g} s")
        _socket_timeout(response, left)
        chunk = response.read1(min(1 << 20, MAX_ANSWER_BYTES + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _socket_timeout(response, seconds: float) -> None:
    sock = getattr(getattr(response.fp, "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def _is_row(row) -> bool:
    """One image's prediction as the serving signature writes it."""
    return (isinstance(row, dict) and isinstance(row.get("probabilities"), list) and row["probabilities"]
            and all(isinstance(p, (int, float)) for p in row["probabilities"])
            and isinstance(row.get("class_ids"), int) and isinstance(row.get("labels"), str))


def _snippet(data: bytes, limit: int = 200) -> str:
    """The start of an answer, printable on one line."""
    text = data[:limit].decode(errors="replace")
    return "".join(c if c.isprintable() else " " for c in text) + ("..." if len(data) > limit else "")
