"""A grid of generated digits as a PNG, for people: one tile per sample, its class above it."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from addnorm.data.digits import MAX_PIXEL

__all__ = ["save_digit_grid"]


def save_digit_grid(
    pixels: torch.Tensor, labels: torch.Tensor, path: str | Path, *, title: str = ""
) -> Path:
    """Draw (N, 8, 8) digits on the 0..16 scale, ``labels`` (N,) their classes, into ``path``.

    Tiles are 0.9 inch squares shown with nearest-neighbour pixels (white ink on black, as the
    data set stores them), up to 10 per row. Drawn on a bare Agg canvas: no global
    matplotlib backend is switched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = pixels.shape[0]
    cols = min(n, 10)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(0.9 * cols + 0.4, 1.0 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if i < n:
            ax.imshow(pixels[i].numpy(), cmap="gray", vmin=0.0, vmax=MAX_PIXEL,
                      interpolation="nearest")
            ax.set_title(f"class {int(labels[i])}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
