"""scikit-learn's bundled handwritten digits (1,797 images of 8x8 pixels, 10 classes), for
the DiT task. They ship inside scikit-learn's wheel: nothing is downloaded.

Pixels are integers 0..16 (the digits' own scale). The DiT sees them as one channel scaled to
[-1, 1], ``x = pixels / 8 - 1`` (:func:`to_model_scale`, :func:`to_pixel_scale` back).

Splits are fixed: a seeded, class-stratified permutation puts 80% of each class in ``train``
and the rest in ``test`` (the quality classifier is checked on ``test``; generated samples
are compared with ``train`` to show memorisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from addnorm.utils.checks import check_choice

__all__ = [
    "IMAGE_SIZE",
    "MAX_PIXEL",
    "N_CLASSES",
    "Digits",
    "load_digits",
    "to_model_scale",
    "to_pixel_scale",
]

IMAGE_SIZE = 8
N_CLASSES = 10
MAX_PIXEL = 16.0
SPLITS = ("train", "test")
_SPLIT_SEED = 20261123
_TRAIN_FRACTION = 0.8


def to_model_scale(pixels: torch.Tensor) -> torch.Tensor:
    """0..16 pixels to the model's [-1, 1]."""
    return pixels / (MAX_PIXEL / 2) - 1.0


def to_pixel_scale(x: torch.Tensor) -> torch.Tensor:
    """The model's scale back to 0..16 pixels, clipped to that range."""
    return ((x + 1.0) * (MAX_PIXEL / 2)).clamp(0.0, MAX_PIXEL)


@dataclass(frozen=True)
class Digits:
    """One split: ``pixels`` (N, 8, 8) float32 on the 0..16 scale, ``labels`` (N,) long."""

    pixels: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]

    def images(self) -> torch.Tensor:
        """The split as model input: (N, 1, 8, 8) on the [-1, 1] scale."""
        return to_model_scale(self.pixels)[:, None]


@lru_cache(maxsize=2)
def load_digits(split: str) -> Digits:
    """The ``train`` or ``test`` split of scikit-learn's digits (see the module docstring)."""
    check_choice("split", split, SPLITS)
    from sklearn.datasets import load_digits as sklearn_digits  # a slow import: when needed

    data = sklearn_digits()
    pixels = np.asarray(data.images, dtype=np.float32)  # (1797, 8, 8), 0..16
    labels = np.asarray(data.target, dtype=np.int64)
    rng = np.random.default_rng(_SPLIT_SEED)
    train: list[int] = []
    test: list[int] = []
    for digit in range(N_CLASSES):
        members = rng.permutation(np.flatnonzero(labels == digit))
        cut = round(_TRAIN_FRACTION * len(members))
        train.extend(members[:cut].tolist())
        test.extend(members[cut:].tolist())
    index = np.sort(np.asarray(train if split == "train" else test))
    return Digits(torch.from_numpy(pixels[index]), torch.from_numpy(labels[index]))
