"""Training metrics: one JSON line per logged step, and the loss curve as a PNG."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["MetricsLog", "plot_loss_curve", "read_metrics"]


class MetricsLog:
    """Appends records (``{"step", "loss", "lr", "tokens_per_s", "elapsed_s"}``) to a JSONL
    file, flushing each line so a killed run keeps what it logged.

    Args:
        path: the JSONL file.
        resume_from_step: None starts a new file; an int keeps the existing lines with
            ``step <= resume_from_step`` (those a resumed run does not repeat) and appends.
    """

    def __init__(self, path: str | os.PathLike, *, resume_from_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_from_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_from_step]
        with open(self.path, "w", encoding="utf-8") as f:
            for record in kept:
                f.write(json.dumps(record) + "\n")

    def write(self, record: dict) -> None:
        """Append one record as a JSON line."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics JSONL file (a torn last line, from a kill, is skipped)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError):
                continue
    return records


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
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=100)
    return png_path
