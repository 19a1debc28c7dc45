"""Which class judge can a run on a user's images trust? The held-out accuracy of the two
candidate spaces of ``addnorm.tasks.image_quality`` (an RBF SVC, C = 10, gamma "scale", on
the pixels on [0, 1] or on the standardised random-convolution features), each fitted on a
folder's train split and tested on its held-out split (``ImageCorpus``'s rule, the default
held-out fraction), beside the space the judge's cross-validation on the train split picks
and that judge's held-out accuracy (``ImageJudge.fit``).

Real folders that ship with the install (no download): scikit-learn's digits (1,797, ten
classes) at 8x8 and upscaled bilinearly to 16x16 (``benchmarks/dit_user_images.py`` writes
them), and ten-class crops of scikit-learn's two sample photos: each class a region of one
photo (five overlapping regions a photo, their centres 120 pixels apart), 60 random crops
around it (sides 24 to 64 pixels, centres up to 48 pixels off) resized to
16x16 and 32x32 RGB.

    PYTHONPATH=src python benchmarks/image_judges.py --work /tmp/judges \\
        --record docs/image-judges.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

CROP_SIDES = (24, 65)
JITTER = 48  # pixels a crop's centre strays from its region's, either way
CROPS_PER_CLASS = 60


def write_photo_regions(folder: Path, size: int, seed: int = 0) -> None:
    """Ten classes of crops of the two sample photos (see the module docstring)."""
    from PIL import Image, ImageOps
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    for p, photo in enumerate(load_sample_images().images):
        height, width = photo.shape[:2]
        centres = [(height // 2 + dy, width // 2 + dx)  # overlapping neighbours
                   for dy, dx in ((-60, -60), (-60, 60), (60, -60), (60, 60), (0, 0))]
        for r, (cy, cx) in enumerate(centres):
            out = folder / f"photo{p}-region{r}"
            out.mkdir(parents=True, exist_ok=True)
            for i in range(CROPS_PER_CLASS):
                side = int(rng.integers(*CROP_SIDES))
                top = int(np.clip(cy - side // 2 + rng.integers(-JITTER, JITTER + 1), 0,
                                  height - side))
                left = int(np.clip(cx - side // 2 + rng.integers(-JITTER, JITTER + 1), 0,
                                   width - side))
                crop = Image.fromarray(photo[top:top + side, left:left + side])
                ImageOps.fit(crop, (size, size), method=Image.Resampling.BICUBIC).save(
                    out / f"{i:03d}.png")


def measure(folder: Path, size: int) -> dict:
    """Both candidates' held-out accuracy on ``folder`` at ``size``, and the judge's pick."""
    from sklearn.svm import SVC

    from addnorm.data.images import ImageCorpus
    from addnorm.tasks.image_quality import ImageJudge

    corpus = ImageCorpus.build(str(folder))
    train, train_labels = corpus.split("train", size)
    held, held_labels = corpus.split("val", size)
    started = time.perf_counter()
    judge = ImageJudge.fit(train, train_labels, held, held_labels, corpus.classes)
    fit_s = time.perf_counter() - started
    spaces = {
        "pixels": (train.flatten(1).double().numpy() / 255, held.flatten(1).double().numpy()
                   / 255),
        "features": (judge.reference, judge.held),
    }
    row = {"folder": folder.name, "size": size, "classes": len(corpus.classes),
           "train": len(train_labels), "held_out": len(held_labels)}
    for name, (x_train, x_held) in spaces.items():
        svc = SVC(C=10.0, gamma="scale").fit(x_train, train_labels.numpy())
        row[f"{name}_held_out_accuracy"] = float((svc.predict(x_held)
                                                  == held_labels.numpy()).mean())
    row.update({"picked": judge.judge_space, "judge_test_accuracy": judge.test_accuracy,
                "trusted": judge.verdict is None, "fit_s": round(fit_s, 2)})
    return row


def main(argv: list[str] | None = None) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from dit_user_images import write_digits

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print("| folder | classes | train/held out | pixels SVC held-out | features SVC held-out "
          "| picked | judge held-out | trusted |")
    print("|---|---|---|---|---|---|---|---|")
    for name, size, write in (("digits8", 8, lambda f: write_digits(f, 8)),
                              ("digits16", 16, lambda f: write_digits(f, 16)),
                              ("photo-regions16", 16, lambda f: write_photo_regions(f, 16)),
                              ("photo-regions32", 32, lambda f: write_photo_regions(f, 32))):
        folder = args.work / name
        if not folder.exists():
            write(folder)
        rows.append(measure(folder, size))
        r = rows[-1]
        print(f"| {name} | {r['classes']} | {r['train']}/{r['held_out']} | "
              f"{r['pixels_held_out_accuracy']:.3f} | {r['features_held_out_accuracy']:.3f} | "
              f"{r['picked']} | {r['judge_test_accuracy']:.3f} | {r['trusted']} |", flush=True)
    if args.record is not None:
        args.record.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
