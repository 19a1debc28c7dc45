"""The PNG grid of generated images (``addnorm.cli.grid``): its size follows from the layout
(0.9-inch tiles, up to 10 per row, at 100 dpi), it takes grayscale and colour images, and it
leaves matplotlib's global backend alone.

Provenance: the documented layout (figure inches times dpi, an identity), and the pixels drawn
(a white tile on black shows white ink).
"""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image

from addnorm.cli.grid import save_digit_grid, save_image_grid
from addnorm.data.digits import MAX_PIXEL


@pytest.mark.parametrize(("n", "cols", "rows"), [(1, 1, 1), (10, 10, 1), (12, 10, 2)])
def test_the_png_size_follows_from_the_tiles_per_row(n, cols, rows, tmp_path):
    path = save_digit_grid(torch.zeros(n, 8, 8), torch.arange(n) % 10, tmp_path / "g.png",
                           title="digits")
    with Image.open(path) as image:
        assert image.size == (round(100 * (0.9 * cols + 0.4)), round(100 * (1.0 * rows + 0.6)))


@pytest.mark.parametrize("shape", [(2, 1, 6, 6), (2, 3, 6, 6), (2, 6, 6)])
def test_grayscale_and_colour_images_are_drawn(shape, tmp_path):
    pixels = torch.full(shape, 255.0)  # all at vmax: white tiles on the white page
    pixels[0] = 0.0  # one black tile
    path = save_image_grid(pixels, ["a", "b"], tmp_path / "g.png", vmax=255.0)
    with Image.open(path) as image:
        rgb = np.asarray(image.convert("RGB"))
    assert (rgb.sum(axis=-1) == 0).sum() > 100  # the black tile's pixels


def test_digits_are_white_ink_on_black_and_the_backend_is_left_alone(tmp_path):
    backend = matplotlib.get_backend()
    digit = torch.zeros(1, 8, 8)
    digit[0, 2:6, 2:6] = MAX_PIXEL
    with Image.open(save_digit_grid(digit, torch.tensor([3]), tmp_path / "g.png")) as image:
        gray = np.asarray(image.convert("L"))
    rows, cols = np.nonzero(gray == 0)  # the tile's black background
    tile = gray[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    assert (tile == 0).sum() > 100 and (tile == 255).sum() > 100  # and white ink inside it
    assert matplotlib.get_backend() == backend
