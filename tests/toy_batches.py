"""The training tests' toy data: batch sources whose data order is a seeded ``random.Random``
(its state JSON, as a checkpoint keeps it) and their losses, shared by tests/training."""

from __future__ import annotations

import random

import torch
from torch import nn


class _SeededBatches:
    """A batch source drawing from ``random.Random(seed)``; its state is the generator's."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class SumBatches(_SeededBatches):
    """Regression batches: y = sum(x), x uniform in [0, 1)^4, ``batch_size`` rows."""

    def __init__(self, seed: int = 0, batch_size: int = 8) -> None:
        super().__init__(seed)
        self.batch_size = batch_size

    def next_batch(self) -> dict[str, torch.Tensor]:
        x = torch.tensor([[self.rng.random() for _ in range(4)] for _ in range(self.batch_size)])
        return {"x": x, "y": x.sum(-1, keepdim=True)}


def mse_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The mean squared error of ``model(x)`` against ``y``, and the rows it covered."""
    return nn.functional.mse_loss(model(batch["x"]), batch["y"]), batch["x"].shape[0]


class IdBatches(_SeededBatches):
    """Random (batch, length) token batches in [3, vocab_size) with next-token targets."""

    def __init__(self, vocab_size: int, batch: int = 4, length: int = 8, seed: int = 0) -> None:
        super().__init__(seed)
        self.vocab_size, self.batch, self.length = vocab_size, batch, length

    def next_batch(self) -> dict[str, torch.Tensor]:
        ids = torch.tensor([[self.rng.randrange(3, self.vocab_size)
                             for _ in range(self.length + 1)] for _ in range(self.batch)])
        return {"ids": ids[:, :-1], "targets": ids[:, 1:]}


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Next-token cross-entropy over the batch, and the number of targets."""
    logits = model(batch["ids"])  # (B, L, V)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
    return loss, batch["targets"].numel()
