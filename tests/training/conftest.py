"""What the trainer's switch tests share: a tiny LM trained on seeded random token batches."""

from __future__ import annotations

import random

import pytest
import torch

import addnorm
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer


class IdBatches:
    """Random (4, 9) token batches in [3, vocab_size) from a seeded ``random.Random``."""

    def __init__(self, vocab_size: int) -> None:
        self.rng, self.vocab_size = random.Random(0), vocab_size

    def next_batch(self):
        ids = torch.tensor(
            [[self.rng.randrange(3, self.vocab_size) for _ in range(9)] for _ in range(4)]
        )
        return {"ids": ids[:, :-1], "targets": ids[:, 1:]}

    def state_dict(self):
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state):
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def lm_loss(model, batch):
    logits = model(batch["ids"])  # (B, L, V)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
    return loss, batch["targets"].numel()


@pytest.fixture
def train_tiny_lm(tmp_path):
    """``train(cfg, name, steps=, **train_fields) -> (model, trainer, result, checkpoint)``:
    ``steps`` steps at a constant lr 1e-2 (warm-up 1), seed 0, no periodic checkpoints, the
    run in ``tmp_path / name``; ``train_fields`` set the switch under test; ``dtype`` the
    model's."""

    def train(cfg, name: str, *, steps: int, dtype: torch.dtype = torch.float32,
              **train_fields):
        train_cfg = TrainConfig(
            max_steps=steps, lr=1e-2, warmup=1, checkpoint_every=0, **train_fields
        )
        torch.manual_seed(0)
        model = addnorm.TransformerLM(cfg).to(dtype)
        trainer = Trainer(
            model, lm_loss, IdBatches(cfg.vocab_size), train_cfg, run_dir=tmp_path / name,
            schedule=ScheduleConfig("constant", 1e-2, 1, total_steps=steps),
        )
        result = trainer.fit()
        return model, trainer, result, load_checkpoint(tmp_path / name)

    return train
