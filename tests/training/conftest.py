"""What the trainer's switch tests share: a tiny LM trained on seeded random token batches."""

from __future__ import annotations

import pytest
import torch
from toy_batches import IdBatches, lm_loss

import addnorm
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer


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
