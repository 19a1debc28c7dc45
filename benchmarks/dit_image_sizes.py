"""Training-step time of the default DiT on a user's RGB images at several image and patch
sizes: the measurement behind the default image size of ``addnorm train dit --data``
(``addnorm.tasks.dit_data.default_image_size``, at most 8 patches a side;
docs/task-defaults.md).

    python benchmarks/dit_image_sizes.py              # one thread, 5 timed steps per size
    python benchmarks/dit_image_sizes.py --threads 2 --steps 10

Each size builds the task's default model (``DiTTask.default_model_config()``: d_model 96,
4 layers) for 3 channels and 10 classes and times full AdamW steps (forward, backward,
update) on a batch of 64 random images after one warm-up step; it prints the median.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from addnorm.dit import DiT
from addnorm.tasks.dit import DiTTask

# (image side, patch side): the digits' 16 patches, the default cap's 64 two ways, and 256.
SIZES = ((8, 2), (16, 2), (32, 4), (32, 2))


def step_seconds(size: int, patch: int, steps: int, batch: int = 64) -> float:
    """The median time of one training step at ``size`` x ``size`` in patches of ``patch``."""
    cfg = dataclasses.replace(DiTTask.default_model_config(), input_size=size,
                              patch_size=patch, in_channels=3, n_classes=10)
    torch.manual_seed(0)
    model = DiT(cfg)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch, 3, size, size)  # (B, C, S, S)
    t = torch.randint(0, 1000, (batch,))
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = (model(x, t, y) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per size")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for size, patch in SIZES:
        seconds = step_seconds(size, patch, args.steps)
        print(f"{size}x{size} in patches of {patch} ({(size // patch) ** 2} an image): "
              f"{seconds:.3f} s a step", flush=True)


if __name__ == "__main__":
    main()
