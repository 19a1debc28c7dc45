"""A grid of generated images as a PNG, for people: one tile per sample, its class above it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from addnorm.data.digits import MAX_PIXEL
from addnorm.utils.publish import save_figure

__all__ = ["save_digit_grid", "save_image_grid"]


def save_digit_grid(
    pixels: torch.Tensor, labels: torch.Tensor, path: str | Path, *, title: str = ""
) -> Path:
    """Draw (N, 8, 8) digits on the 0..16 scale, ``labels`` (N,) their classes, into ``path``
    (:func:`save_image_grid`: white ink on black, as the data set stores them)."""
    return save_image_grid(pixels, [str(int(c)) for c in labels], path, vmax=MAX_PIXEL,
                           title=title)


def save_image_grid(
    pixels: torch.Tensor, classes: Sequence[str], path: str | Path, *, vmax: float,
    title: str = "",
) -> Path:
    """Draw images on the 0..``vmax`` scale, each titled ``class NAME`` by ``classes`` (one
    name per image), into ``path``.

    Tiles are 0.9 inch squares shown with nearest-neighbour pixels (grayscale images in gray
    levels), up to 10 per row. Drawn on a bare Agg canvas: no global matplotlib backend is
    switched.

    Shapes:
        pixels: (N, H, W) grayscale, or (N, C, H, W) with C = 1 or 3
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if pixels.ndim == 4:  # (N, C, H, W) -> (N, H, W) or (N, H, W, 3)
        pixels = pixels[:, 0] if pixels.shape[1] == 1 else pixels.permute(0, 2, 3, 1)
    n = pixels.shape[0]
    cols = min(n, 10)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(0.9 * cols + 0.4, 1.0 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if i < n:
            image = pixels[i].float().numpy()
            if image.ndim == 3:  # colour: imshow takes floats on [0, 1]
                ax.imshow(image / vmax, interpolation="nearest")
            else:
                ax.imshow(image, cmap="gray", vmin=0.0, vmax=vmax, interpolation="nearest")
            ax.set_title(f"class {classes[i]}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi=100)  # whole or not at all; a link replaced
