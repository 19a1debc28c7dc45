"""Training metrics: one JSON line per logged step, the loss curve as a PNG, and a finished
run's samples as a picture (for a tracker's image panel).

A line that is not a metrics record (a torn line from a kill, an edit, bytes that are not
UTF-8, a line over ``MAX_LINE_BYTES``) never stops a run: ``read_metrics`` skips it, with a
warning naming the first such line (a torn last line, the trace of a kill, is skipped quietly),
and a resumed run rewrites the log with the records it keeps, so the log holds only records.
A record is a JSON object with an int ``step`` >= 0 and numbers ``loss`` and ``lr``
(``loss``: the mean of the steps' losses since the record before, so a curve of records is
not one batch's noise).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import stat
import warnings
from pathlib import Path

import numpy as np

from addnorm.utils.files import write_file_atomic
from addnorm.utils.publish import save_figure

__all__ = [
    "MAX_LINE_BYTES",
    "MetricsLog",
    "draw_samples",
    "loss_window_from_state",
    "plot_loss_curve",
    "plot_quality",
    "read_metrics",
]

# A record is about 150 bytes; a longer line is no record and is skipped unread.
MAX_LINE_BYTES = 2**16
_log = logging.getLogger(__name__)


class MetricsLog:
    """Appends records (``{"step", "loss", "lr", "tokens_per_s", "elapsed_s"}``) to a JSONL
    file, flushing each line so a killed run keeps what it logged.

    Args:
        path: the JSONL file.
        resume_from_step: None starts a new file; an int keeps the existing records with
            ``step <= resume_from_step`` (those a resumed run does not repeat; lines that are
            not records are dropped, with a warning) and appends.
    """

    def __init__(self, path: str | os.PathLike, *, resume_from_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_from_step is not None:
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_from_step]
        text = "".join(json.dumps(record) + "\n" for record in kept)
        # A new file in place of the old (whatever it was: never opened for writing, so a FIFO
        # left there cannot block).
        write_file_atomic(self.path, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def write(self, record: dict) -> None:
        """Append one record as a JSON line."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics JSONL file, in order; lines that are not records are skipped
    (see the module docstring). A missing file, or one that is not a regular file, has none."""
    path = Path(path)
    try:
        f = open(path, "rb", opener=_open_nonblocking)
    except (FileNotFoundError, IsADirectoryError):
        return []
    records, skipped = [], []
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            _log.warning("addnorm: %s is not a regular file; read as no metrics", path)
            return []
        for number in itertools.count(1):
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (block := f.readline(MAX_LINE_BYTES)) and not block.endswith(b"\n"):
                    pass
                skipped.append((number, f"longer than {MAX_LINE_BYTES} bytes"))
                continue
            record, why = _parse_record(line)
            if record is not None:
                records.append(record)
            elif line.endswith(b"\n") or f.peek(1):  # (a torn last line: a kill, quietly)
                skipped.append((number, why))
    if skipped:
        number, why = skipped[0]
        _log.warning(
            "addnorm: %s: skipped %d line(s) that are not metrics records (line %d: %s)",
            path, len(skipped), number, why,
        )
    return records


def _parse_record(line: bytes) -> tuple[dict | None, str]:
    """The record a line holds, or None and why not."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 ({err.reason} at byte {err.start})"
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None, "not JSON"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    step = record.get("step")
    if type(step) is not int or step < 0:
        return None, f"step {step!r} is not an int >= 0"
    for key in ("loss", "lr"):
        if type(record.get(key)) not in (int, float):
            return None, f"{key} {record.get(key)!r} is not a number"
    return record, ""


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def plot_loss_curve(
    metrics_path: str | os.PathLike,
    png_path: str | os.PathLike,
    *,
    title: str = "",
    ylabel: str = "loss (cross-entropy, nats)",
) -> Path:
    """Draw training loss (and learning rate, on a second axis) against step into a PNG.

    Draws on a bare ``Figure`` with an Agg canvas, so no global matplotlib backend is set.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    steps = [r["step"] for r in records]
    fig = Figure(figsize=(7, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(steps, [r["loss"] for r in records], color="tab:blue", label="training loss")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    lr_axis = ax.twinx()
    lr_axis.plot(steps, [r["lr"] for r in records], color="tab:orange", alpha=0.6, label="lr")
    lr_axis.set_ylabel("learning rate")
    ax.set_title(title or "training loss")
    lines = ax.get_lines() + lr_axis.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="center right")
    return save_figure(fig, png_path, dpi=100)  # whole or not at all; a link replaced


def plot_quality(
    metrics_path: str | os.PathLike,
    png_path: str | os.PathLike,
    *,
    metric: str,
    final: tuple[float, float] | None = None,
    probe_label: str = "probe",
    final_label: str = "final evaluation",
    ylabel: str = "loss",
    title: str = "",
) -> Path | None:
    """Draw where quality arrives: the probes' ``metric`` (records' ``probe_<metric>``) and
    the training loss against training time, with the final evaluation as one marked point
    (``final``: its training time in seconds and value). None when no record holds a probe.

    Draws on a bare ``Figure`` with an Agg canvas, so no global matplotlib backend is set.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = [r for r in read_metrics(metrics_path) if "elapsed_s" in r]
    probed = [r for r in records if isinstance(r.get(f"probe_{metric}"), int | float)]
    if not probed:
        return None
    fig = Figure(figsize=(7, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([r["elapsed_s"] for r in probed], [r[f"probe_{metric}"] for r in probed],
            "o-", color="tab:green", label=f"{metric} ({probe_label})")
    if final is not None:
        ax.plot([final[0]], [final[1]], "*", markersize=14, color="tab:red",
                label=f"{metric} ({final_label})")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_ylim(0.0, 1.02)
    loss_axis = ax.twinx()
    loss_axis.plot([r["elapsed_s"] for r in records], [r["loss"] for r in records],
                   color="tab:blue", alpha=0.5, label="training loss")
    loss_axis.set_ylabel(ylabel)
    loss_axis.set_yscale("log")
    ax.set_title(title or f"{metric.replace('_', ' ')} and loss against training time")
    lines = ax.get_lines() + loss_axis.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="lower right")
    return save_figure(fig, png_path, dpi=100)  # whole or not at all; a link replaced


def draw_samples(samples: list[dict], *, title: str = "") -> np.ndarray:
    """A run's samples (``metrics.json``'s ``"samples"``) as one (H, W, 3) uint8 picture:
    images (a ``"pixels"`` grid each, 0..16, or 0..``"max"`` where a sample names its scale,
    labelled by their ``"class"``) side by side, or
    else the samples' text, one line each (``input -> prediction (answer)``, or every field).
    Drawn on a bare ``Figure`` with an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    images = [s for s in samples if isinstance(s.get("pixels"), list)]
    if images:
        fig = Figure(figsize=(1.2 * len(images), 1.6), layout="constrained")
        axes = fig.subplots(1, len(images), squeeze=False)[0]
        for ax, sample in zip(axes, images, strict=True):
            pixels = np.asarray(sample["pixels"], dtype=float)
            if "max" in sample:  # a user's images: (S, S) gray or (S, S, 3) colour, 0..max
                top = float(sample["max"])
                if pixels.ndim == 3:
                    ax.imshow(np.clip(pixels / top, 0.0, 1.0))
                else:
                    ax.imshow(pixels, cmap="gray", vmin=0, vmax=top)
            else:  # the digits: dark ink on light, 0..16
                ax.imshow(pixels, cmap="gray_r", vmin=0, vmax=16)
            ax.set_title(str(sample.get("class", "")), fontsize=9)
            ax.set_axis_off()
        if title:
            fig.suptitle(title, fontsize=10)
    else:
        lines = [_sample_line(sample) for sample in samples] or ["(no samples)"]
        lines = [title, "", *lines] if title else lines
        fig = Figure(figsize=(8, 0.17 * len(lines) + 0.2))
        fig.text(0.01, 0.97, "\n".join(lines), va="top", family="monospace", fontsize=9)
    canvas = FigureCanvasAgg(fig)
    with warnings.catch_warnings():  # scripts the font lacks (the dates' CJK) draw as boxes
        warnings.filterwarnings("ignore", message="Glyph .* missing")
        canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _sample_line(sample: dict) -> str:
    if {"input", "prediction", "answer"} <= set(sample):
        mark = "ok" if sample["prediction"] == sample["answer"] else "wrong"
        return f"{sample['input']} -> {sample['prediction']}  ({sample['answer']}: {mark})"
    return "  ".join(f"{key}: {value}" for key, value in sample.items())[:200]


def loss_window_from_state(saved: object) -> tuple[float, int]:
    """The ``loss_window`` of a checkpoint's state: the losses summed since the last record,
    and how many; a checkpoint from before it kept none starts a new window. TypeError or
    ValueError (turned into a ``CheckpointError`` naming the file) for any other value."""
    if saved is None:
        return 0.0, 0
    if not isinstance(saved, dict) or set(saved) != {"sum", "steps"}:
        raise ValueError(f"loss_window must be {{'sum': float, 'steps': int}}, got {saved!r}")
    total, steps = saved["sum"], saved["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"loss_window steps must be an int >= 0, got {steps!r}")
    if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total):
        raise ValueError(f"loss_window sum must be a finite number, got {total!r}")
    return float(total), steps
