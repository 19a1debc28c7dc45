"""Tiny image folders written for the image tests (no download): random pictures in the
ImageFolder convention (:func:`write_folder`), and beside them a small random VAE's folder
(:func:`pictures_and_vae`), what a run on latents reads.

Each picture's pixels come from its own seeded generator (:func:`pixels`), so a folder is the
same on every machine and its files can be compared with what was written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from small_pipeline import autoencoder


def pixels(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Random uint8 pixels of ``shape``, the same for the same ``seed``."""
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def write_folder(root: Path, classes: dict[str, int], *, size: int = 8, mode: str = "RGB",
                 suffix: str = "png", seed: int = 0) -> dict[str, np.ndarray]:
    """``classes``: name -> count of random images; returns each file's pixels by name."""
    written = {}
    for k, (name, count) in enumerate(classes.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            shape = (size, size) if mode == "L" else (size, size, 3)
            array = pixels(1000 * seed + 100 * k + i, shape)
            Image.fromarray(array).save(root / name / f"img{i}.{suffix}")
            written[f"{name}/img{i}.{suffix}"] = array
    return written


def pictures_and_vae(root: Path) -> tuple[Path, Path]:
    """``root/pics``: 20 16x16 RGB pictures in two class folders (ants, bees); ``root/vae``:
    the small random AutoencoderKL of ``small_pipeline`` (factor 2, 4 latent channels)."""
    write_folder(root / "pics", {"ants": 10, "bees": 10}, size=16)
    autoencoder().save_pretrained(root / "vae")
    return root / "pics", root / "vae"
