"""A run's watch records drawn as one figure, ``watch.png``.

Six panels, each readable from 2 to a few dozen layers (one row per layer; at most about
twenty labelled ticks on an axis):

- the gradient norm of each layer at each watched step (layer x step heatmap, log colours);
- the update-to-weight ratio, the same way;
- the gradient norm over depth at the first and the last watched step (where post-LN's grows
  toward the output and pre-LN's stays flat);
- the residual stream's RMS over depth (entering the first layer, then leaving each) at the
  first and the last watched step;
- each attention head's entropy at the last watched step (attention module x head), against
  ``ln S`` of uniform attention;
- over the steps, what the norms do (BatchNorm: the gap between its batch statistics and its
  running estimates, and in its output the batch's own effect and the running statistics'
  lag; the per-token norms: the spread of the scales they divide out) and the share of FFN
  units whose output stays near zero (and of dead ReLU units), each as the mean over the
  model's norms or FFNs.

Drawn on a bare ``Figure`` with an Agg canvas, so no global matplotlib backend is set.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from addnorm.utils.publish import save_figure

__all__ = ["layer_label", "plot_watch"]

MAX_TICKS = 20


def layer_label(path: str, paths: Sequence[str]) -> str:
    """A short name of a layer among ``paths``: its number from 1 (``"3"``), after its
    stack's first letters when the layers belong to several stacks (``"enc 3"``)."""
    match = re.fullmatch(r"(.*?)\.?(\d+)", path)
    if match is None:
        return path
    stack, index = match.groups()
    stacks = {re.sub(r"\.?\d+$", "", p) for p in paths}
    number = str(int(index) + 1)
    if len(stacks) <= 1:
        return number
    return f"{stack.split('.')[0][:3]} {number}"


def _sublayer_label(path: str, layers: Sequence[str]) -> str:
    layer = next((p for p in layers if path.startswith(p + ".")), None)
    if layer is None:
        return path
    role = path[len(layer) + 1 :].replace("_attn", "")
    return f"{layer_label(layer, layers)} {role}"


def _ticks(n: int) -> list[int]:
    stride = max(1, math.ceil(n / MAX_TICKS))
    return list(range(0, n, stride))


def _heatmap(fig, ax, records: list[dict], section: str, title: str, label: str) -> None:
    from matplotlib.colors import LogNorm

    layers = records[-1]["layers"]
    steps = [r["step"] for r in records]
    grid = [[_positive(r.get(section, {}).get(layer)) for r in records] for layer in layers]
    values = [v for row in grid for v in row if v is not None]
    if not values:
        ax.set_axis_off()
        ax.set_title(f"{title}: not measured")
        return
    image = ax.imshow(
        [[math.nan if v is None else v for v in row] for row in grid],
        aspect="auto", origin="lower", interpolation="nearest", cmap="viridis",
        norm=LogNorm(vmin=min(values), vmax=max(values)),
    )
    fig.colorbar(image, ax=ax, label=label)
    ax.set_yticks(_ticks(len(layers)), [layer_label(layers[i], layers)
                                        for i in _ticks(len(layers))])
    ax.set_xticks(_ticks(len(steps)), [str(steps[i]) for i in _ticks(len(steps))],
                  rotation=90 if len(steps) > 8 else 0)
    ax.set(title=title, xlabel="watched step", ylabel="layer (1 = input side)")


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _profile(ax, records: list[dict]) -> None:
    layers = records[-1]["layers"]
    for record, style in _first_and_last(records):
        norms = [_positive(record["grad_norm"].get(layer)) for layer in layers]
        ax.plot(range(1, len(layers) + 1), [math.nan if v is None else v for v in norms],
                style, label=f"step {record['step']}")
    ax.set(title="gradient norm over depth", xlabel="layer (1 = input side)",
           ylabel="||grad|| of the layer", yscale="log")
    _depth_ticks(ax, layers)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")


def _depth_ticks(ax, layers: Sequence[str], *, with_input: bool = False) -> None:
    positions = [i + 1 for i in _ticks(len(layers))]
    labels = [layer_label(layers[i - 1], layers) for i in positions]
    if with_input:
        positions, labels = [0, *positions], ["in", *labels]
    ax.set_xticks(positions, labels, rotation=90 if len(layers) > 12 else 0)


def _first_and_last(records: list[dict]) -> list[tuple[dict, str]]:
    if len(records) == 1:
        return [(records[0], "o-")]
    return [(records[0], "o--"), (records[-1], "s-")]


def _residual(ax, records: list[dict]) -> None:
    layers = records[-1]["layers"]
    shown = False
    for record, style in _first_and_last(records):
        residual = record.get("residual", {})
        if not all(layer in residual for layer in layers) or not layers:
            continue
        rms = [residual[layers[0]]["in"], *(residual[layer]["out"] for layer in layers)]
        ax.plot(range(len(rms)), [math.nan if v is None else v for v in rms], style,
                label=f"step {record['step']}")
        shown = True
    if not shown:
        ax.set_axis_off()
        ax.set_title("residual stream RMS: not measured")
        return
    ax.set(title="residual stream RMS over depth", xlabel="after layer (in = entering layer 1)",
           ylabel="RMS of the stream", yscale="log")
    _depth_ticks(ax, layers, with_input=True)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")


def _entropy(fig, ax, records: list[dict]) -> None:
    record = records[-1]
    entropy = record.get("attention_entropy", {})
    rows = [(name, heads) for name, heads in entropy.items() if heads]
    if not rows:
        ax.set_axis_off()
        ax.set_title("attention entropy: not measured")
        return
    width = max(len(heads) for _, heads in rows)
    grid = [[math.nan if h is None else h for h in heads] + [math.nan] * (width - len(heads))
            for _, heads in rows]
    image = ax.imshow(grid, aspect="auto", origin="lower", interpolation="nearest",
                      cmap="magma")
    fig.colorbar(image, ax=ax, label="entropy (nats)")
    layers = record["layers"]
    ticks = _ticks(len(rows))
    ax.set_yticks(ticks, [_sublayer_label(rows[i][0], layers) for i in ticks], fontsize=7)
    ax.set_xticks(_ticks(width), [str(h + 1) for h in _ticks(width)])
    ax.set(title=f"attention entropy per head, step {record['step']}", xlabel="head",
           ylabel="attention module (layer 1 = input side)")


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return statistics.fmean(numbers) if numbers else None


def _over_steps(ax, records: list[dict]) -> None:
    steps = [r["step"] for r in records]
    series: dict[str, list[float | None]] = {}
    kinds = {n["kind"] for r in records for n in r.get("norms", {}).values()}
    names = {"mean_gap": "BatchNorm: batch mean's shift (running stds)",
             "var_log_ratio": "BatchNorm: |ln(batch var / running var)|",
             "batch_effect": "BatchNorm: the batch's own effect on its output",
             "running_lag": "BatchNorm: the running statistics' lag in its output",
             "batch_noise": "BatchNorm: train/eval gap in its output",  # records before both
             "scale_cv": "per-token norms: spread of the scales (std / mean)"}
    for stat, label in names.items():
        series[label] = [_mean([n.get(stat) for n in r.get("norms", {}).values()])
                         for r in records]
    for stat, label in (("near_zero", "FFN units with output near zero (share)"),
                        ("dead", "dead ReLU units (share)")):
        series[label] = [_mean([u.get(stat) for u in r.get("ffn_units", {}).values()])
                         for r in records]
    series["FFN units never positive (share)"] = [  # records before ffn_units
        _mean(list(r.get("dead_units", {}).values())) for r in records]
    drawn = False
    for label, values in series.items():
        if any(v is not None for v in values):
            ax.plot(steps, [math.nan if v is None else v for v in values], "o-", markersize=3,
                    label=label)
            drawn = True
    if not drawn:
        ax.set_axis_off()
        ax.set_title("norms and FFN units: not measured")
        return
    ax.set(title=f"norms ({', '.join(sorted(kinds)) or 'none'}) and FFN units, "
           "mean over the model", xlabel="step", ylabel="ratio")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def plot_watch(
    records: Sequence[dict], png_path: str | os.PathLike, *, title: str = ""
) -> Path:
    """Draw watch records (:meth:`addnorm.inspection.Watch.step`'s, each with its
    ``step``) into a PNG; returns its path. Raises ValueError for no records."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = sorted(records, key=lambda r: r["step"])
    if not records:
        raise ValueError("no watch records to draw")
    layers = records[-1]["layers"]
    height = 9 + max(0, len(layers) - 12) * 0.25
    fig = Figure(figsize=(19, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    _heatmap(fig, axes[0, 0], records, "grad_norm", "gradient norm per layer", "||grad||")
    _heatmap(fig, axes[0, 1], records, "update_ratio", "update ratio per layer",
             "||dw|| / ||w||")
    _profile(axes[0, 2], records)
    _residual(axes[1, 0], records)
    _entropy(fig, axes[1, 1], records)
    _over_steps(axes[1, 2], records)
    fig.suptitle(f"{title + ': ' if title else ''}inside the model, {len(layers)} layers, "
                 f"steps {records[0]['step']}-{records[-1]['step']}")
    return save_figure(fig, png_path, dpi=90)  # whole or not at all; a link replaced
