"""PNG plots written to any ROOT (local or fsspec): the one place that knows matplotlib's set-up."""
from __future__ import annotations

import io
import posixpath

from components.layout import filesystem


def pyplot():
    """matplotlib.pyplot on the Agg backend: stage programs and flow workers have no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure, uri: str) -> None:
    """Writes `figure` as a PNG at `uri` and frees it."""
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot().close(figure)
    fs, path = filesystem(uri)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, buffer.getvalue())


def confusion_matrix(matrix: list[list[float]], labels: list[str], uri: str, title: str = "") -> None:
    """Counts per (actual, predicted) label, darker where higher."""
    size = max(4.0, 0.5 * len(labels) + 2)
    figure, ax = pyplot().subplots(figsize=(size, size))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("actual")
    if title:
        ax.set_title(title)
    peak = max((max(row) for row in matrix if row), default=0)
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            ax.text(j, i, f"{count:g}", ha="center", va="center", fontsize=8,
                    color="white" if peak and count > peak / 2 else "black")
    save(figure, uri)
