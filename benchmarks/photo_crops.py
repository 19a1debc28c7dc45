"""Write a small image data set in the ImageFolder convention from real photos that ship with
scikit-image and scikit-learn (no download): one class per photo, each class a few dozen
random square crops of it (sides from 48 to 96 pixels, as PNG and JPEG files), for
``addnorm train dit --data``.

    python benchmarks/photo_crops.py crops/            # 6 classes x 64 crops = 384 images
    addnorm train dit --data crops/ --image-size 16 --out runs/crops
    addnorm sample --checkpoint runs/crops --class coffee --out coffee.png

Needs scikit-image (``pip install scikit-image``) for four of the photos: astronaut, coffee,
chelsea (a cat) and rocket; scikit-learn's sample images give china (a temple) and flower.
The crops are drawn by a seeded generator: the same files on every run of the script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def photos() -> dict[str, np.ndarray]:
    """The RGB photos, (H, W, 3) uint8, by class name."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    china, flower = load_sample_images().images
    return {
        "astronaut": skimage.data.astronaut(),
        "chelsea": skimage.data.chelsea(),
        "china": china,
        "coffee": skimage.data.coffee(),
        "flower": flower,
        "rocket": skimage.data.rocket(),
    }


def write_crops(out: Path, per_class: int, seed: int) -> int:
    """Write ``per_class`` crops of every photo into ``out/<class>/``; returns the count."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    count = 0
    for name, photo in photos().items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        height, width = photo.shape[:2]
        for i in range(per_class):
            side = int(rng.integers(48, 97))
            top, left = int(rng.integers(0, height - side)), int(rng.integers(0, width - side))
            crop = Image.fromarray(photo[top : top + side, left : left + side])
            suffix = "png" if i % 2 == 0 else "jpg"
            crop.save(folder / f"{name}-{i:03d}.{suffix}", **({"quality": 95}
                                                            if suffix == "jpg" else {}))
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (one subfolder per class)")
    parser.add_argument("--per-class", type=int, default=64, help="crops per photo (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the crops (default 0)")
    args = parser.parse_args()
    n = write_crops(args.out, args.per_class, args.seed)
    print(f"{n} images in {len(photos())} classes under {args.out}")


if __name__ == "__main__":
    main()
