"""PNG plots written to any ROOT (local or fsspec): the one place that knows matplotlib's set-up."""
from __future__ import annotations

import io

from components.common.files import write_whole


def pyplot():
    """matplotlib.pyplot on the Agg backend: stage programs and flow workers have no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure, uri: str) -> None:
    """Writes `figure` as a PNG at `uri`, whole (a full disk leaves the one before, or none), and frees it."""
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot().close(figure)
    write_whole(uri, buffer.getvalue())


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


def differences(rows: list[tuple[str, float, float, float]], max_regression: float, uri: str, title: str = "") -> None:
    """Each (name, difference, lower, upper) as a point with its interval, against the allowed
    regression: an interval wholly left of the red line is a drop beyond it with evidence."""
    figure, ax = pyplot().subplots(figsize=(7, 0.6 * len(rows) + 1.6))
    for y, (_, difference, lower, upper) in enumerate(rows):
        colour = "tab:red" if upper < -max_regression else "tab:blue"
        ax.errorbar([difference], [y], xerr=[[difference - lower], [upper - difference]], fmt="o", color=colour,
                    capsize=4)
    left = min([-max_regression] + [lower for _, _, lower, _ in rows])
    ax.axvspan(min(left * 1.1, -max_regression - 0.01), -max_regression, color="tab:red", alpha=0.08)
    ax.axvline(-max_regression, color="tab:red", linestyle="--", label=f"allowed regression -{max_regression:g}")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [name for name, *_ in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("accuracy, candidate minus served version")
    ax.legend(loc="best", fontsize="small")
    if title:
        ax.set_title(title)
    save(figure, uri)


def label_shares(span: dict[str, int], history: dict[str, int], uri: str, title: str = "") -> None:
    """Each class's share of the span's records beside its share of the history's, as paired bars."""
    names = sorted(set(span) | set(history))
    figure, ax = pyplot().subplots(figsize=(max(5.0, 0.6 * len(names) + 2), 3.6))
    for offset, (counts, label, colour) in enumerate(((history, "history", "tab:grey"), (span, "this span", "tab:blue"))):
        total = sum(counts.values()) or 1
        ax.bar([i + 0.4 * offset - 0.2 for i in range(len(names))], [counts.get(n, 0) / total for n in names],
               width=0.4, label=f"{label} ({sum(counts.values())} records)", color=colour)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_ylabel("share of records")
    ax.legend(loc="best", fontsize="small")
    if title:
        ax.set_title(title)
    save(figure, uri)


def image_sheet(images: list[tuple[bytes, str]], uri: str, columns: int = 8) -> None:
    """Encoded images in a grid, each under its title; one that does not decode is left blank."""
    import numpy as np
    from PIL import Image

    columns = max(1, min(columns, len(images)))
    rows = -(-len(images) // columns)
    figure, axes = pyplot().subplots(rows, columns, figsize=(1.7 * columns, 1.9 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (data, title) in zip(axes.flat, images):
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.draft("RGB", (128, 128))  # a JPEG decodes at a DCT scale near the thumbnail's
                image.thumbnail((128, 128))
                ax.imshow(np.asarray(image.convert("RGB")))
        except (OSError, ValueError, Image.DecompressionBombError):
            pass
        ax.set_title(title, fontsize=7)
    save(figure, uri)


def gpu_use(result: dict, uri: str) -> bool:
    """Draws utilization and PCIe traffic per GPU over time into a PNG at `uri` (local or fsspec).
    Returns False, writing nothing, when there are no samples to draw."""
    if not result.get("samples"):
        return False
    figure, (busy, link) = pyplot().subplots(2, 1, sharex=True, figsize=(8, 5))
    for device in result["devices"]:
        rows = [s for s in result["samples"] if s["gpu"] == device["gpu"]]
        t = [s["t"] for s in rows]
        label = f"GPU {device['gpu']} {device.get('name') or ''}".strip()
        (line,) = busy.plot(t, [s["utilization_pct"] for s in rows], label=label)
        if any(s["pcie_rx_mbps"] is not None for s in rows):
            colour = line.get_color()
            link.plot(t, [s["pcie_rx_mbps"] for s in rows], color=colour,
                      label=f"GPU {device['gpu']} host to device")
            link.plot(t, [s["pcie_tx_mbps"] for s in rows], "--", color=colour,
                      label=f"GPU {device['gpu']} device to host")
    busy.set_ylabel("utilization %")
    busy.set_ylim(0, 100)
    busy.legend(loc="lower right", fontsize="small")
    link.set_ylabel("PCIe MB/s")
    link.set_xlabel("seconds")
    if link.lines:
        link.legend(loc="upper right", fontsize="small")
    save(figure, uri)
    return True
