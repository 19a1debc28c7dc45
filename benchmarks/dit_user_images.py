"""Does ``addnorm train dit --data`` learn a folder of a few thousand small pictures in ten
classes within a time budget? scikit-learn's digits (1,797 images, 10 classes, real
handwriting that ships with the install) written as PNG class folders, trained by the CLI
with its defaults for ``--data`` and a budget, then scored by an INDEPENDENT judge: an RBF
support-vector machine (scikit-learn, C = 10, gamma "scale") on the pixels, fitted here on the
folder's train split, shown competent first by its accuracy on the held-out real images, and
a 3-nearest-neighbour vote beside it. The run's own judge's held-out accuracy and class
agreement come from its metrics.json.

    PYTHONPATH=src python benchmarks/dit_user_images.py --side 16 --minutes 10 \\
        --work /tmp/dit-user --record docs/dit-user-images.json

writes the folder (``--side`` 8: the digits as they are; 16: upscaled, bilinear, a less
trivial size: 64 patches at the default patch size 2 against 16), runs
``addnorm train dit --data FOLDER --max-minutes M --out RUN``, draws ``--per-class`` samples
of each class from the run's best checkpoint (EMA weights, DDIM 50 steps, guidance 3, seed
0), prints a table row and appends a record (with the machine's load average before and
after, and the run's plan lines) to ``--record``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

SVC_C = 10.0
KNN_K = 3


def write_digits(folder: Path, side: int) -> int:
    """scikit-learn's digits as ``folder/<digit>/<index>.png`` (grayscale, 0..16 scaled to
    0..255, resized to ``side`` bilinearly when not 8); returns the count."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray(np.round(image * 255 / 16).astype(np.uint8), "L")
        if side != 8:
            picture = picture.resize((side, side), Image.Resampling.BILINEAR)
        picture.save(folder / str(label) / f"{i:04d}.png")
    return len(digits.target)


def independent_judges(folder: Path, side: int):
    """The SVC and 3-NN fitted on the folder's train split (the run's split: the same rule,
    ``ImageCorpus.build``'s default held-out fraction), with their held-out accuracies."""
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.svm import SVC

    from addnorm.data.images import ImageCorpus

    corpus = ImageCorpus.build(str(folder))
    train, train_labels = corpus.split("train", side)
    held, held_labels = corpus.split("val", side)
    x_train, x_held = flat(train), flat(held)
    svc = SVC(C=SVC_C, gamma="scale").fit(x_train, train_labels.numpy())
    knn = KNeighborsClassifier(KNN_K).fit(x_train, train_labels.numpy())
    accuracy = {name: float((judge.predict(x_held) == held_labels.numpy()).mean())
                for name, judge in (("svc", svc), ("knn", knn))}
    return corpus, svc, knn, accuracy, (len(train_labels), len(held_labels))


def flat(pixels: torch.Tensor) -> np.ndarray:
    """uint8 images (N, C, S, S) as (N, C*S*S) on [0, 1]."""
    return pixels.flatten(1).double().numpy() / 255.0


def sample_run(run: Path, corpus, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` samples of every class from the run's best checkpoint (EMA weights)."""
    import addnorm
    from addnorm.tasks.dit import DiTTask

    model = addnorm.load(run)
    task = DiTTask(data=corpus, image_size=model.cfg.input_size)
    labels = torch.arange(len(task.class_names)).repeat_interleave(per_class)
    generator = torch.Generator().manual_seed(0)
    return task.sample(model, labels, task.sample_settings, generator=generator), labels


HEADER = ("| side | images | budget | wall | load | steps | SVC held-out | agreement (SVC) "
          "| agreement (3-NN) | run's judge held-out | run's agreement |")


def table_row(record: dict) -> str:
    """A record as a row under ``HEADER`` (the README quotes such rows)."""
    agreement = record["run_class_agreement"]
    return (f"| {record['side']}x{record['side']} | {record['images']} | "
            f"{record['budget_minutes']:g} min | {record['wall_s']:.0f} s | "
            f"{record['load_before'][0]}-{record['load_after'][0]} | {record['steps']} | "
            f"{record['independent_svc_held_out_accuracy']:.3f} | "
            f"{record['class_agreement_independent_svc']:.3f} | "
            f"{record['class_agreement_independent_knn']:.3f} | "
            f"{record['run_judge_test_accuracy']:.3f} | "
            + ("not judged" if agreement is None else f"{agreement:.3f}") + " |")


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(v, 2) for v in os.getloadavg()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=16, choices=(8, 16))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--record", type=Path, default=None)
    parser.add_argument("--train-args", default="", help="more flags for addnorm train dit")
    args = parser.parse_args(argv)

    folder, run = args.work / f"digits{args.side}", args.work / f"run{args.side}"
    if not folder.exists():
        write_digits(folder, args.side)
    corpus, svc, knn, accuracy, (n_train, n_held) = independent_judges(folder, args.side)
    command = ["addnorm", "train", "dit", "--data", str(folder), "--max-minutes",
               f"{args.minutes:g}", "--out", str(run), *args.train_args.split()]
    load_before, started = load_average(), time.time()
    done = subprocess.run([sys.executable, "-m", "addnorm", *command[1:]], check=True,
                          capture_output=True, text=True)
    wall_s, load_after = time.time() - started, load_average()
    sys.stderr.write(done.stderr + done.stdout)
    pixels, labels = sample_run(run, corpus, args.per_class)
    x = flat(pixels)
    agreement = {name: float((judge.predict(x) == labels.numpy()).mean())
                 for name, judge in (("svc", svc), ("knn", knn))}
    metrics = json.loads((run / "metrics.json").read_text())
    record = {
        "side": args.side, "images": n_train + n_held, "train": n_train, "held_out": n_held,
        "command": " ".join(command), "budget_minutes": args.minutes,
        "wall_s": round(wall_s, 1), "load_before": load_before, "load_after": load_after,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "plan": [line for line in (done.stderr + done.stdout).splitlines()
                 if line.startswith(("training dit", "  ", "trained "))],
        "steps": metrics.get("step"), "checkpoint": metrics.get("checkpoint"),
        "independent_svc_held_out_accuracy": accuracy["svc"],
        "independent_knn_held_out_accuracy": accuracy["knn"],
        "samples": len(labels),
        "class_agreement_independent_svc": agreement["svc"],
        "class_agreement_independent_knn": agreement["knn"],
        "run_class_agreement": metrics.get("class_agreement"),
        "run_judge_test_accuracy": metrics.get("judge_test_accuracy"),
        "run_judge_trusted": metrics.get("judge_trusted"),
        "run_metric": metrics.get("metric"),
    }
    print(HEADER)
    print(table_row(record))
    if args.record is not None:
        records = json.loads(args.record.read_text()) if args.record.exists() else []
        args.record.write_text(json.dumps([*records, record], indent=1) + "\n")


if __name__ == "__main__":
    main()
