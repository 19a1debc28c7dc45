"""Whether a checkpoint fits the run that would continue it, checked before anything loads.

Provenance: identities. The run's own checkpoint fits the model that wrote it (on the meta
device too, where the CLI checks it); a checkpoint of another width, or one missing the EMA
the config asks for, is refused with one CheckpointError naming the file and the tensor.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.resume import check_checkpoint_fits, refusing
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer
from addnorm.utils.files import CheckpointError


class Ones:
    """The batch x = ones(2, 3), y = 0: nothing here depends on the data."""

    def next_batch(self):
        return {"x": torch.ones(2, 3), "y": torch.zeros(2, 1)}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def mse(model, batch):
    return nn.functional.mse_loss(model(batch["x"]), batch["y"]), 2


def train(run_dir, width: int, config: TrainConfig):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, width), nn.Linear(width, 1))
    schedule = ScheduleConfig("constant", config.lr, config.warmup, total_steps=config.max_steps)
    Trainer(model, mse, Ones(), config, run_dir=run_dir, schedule=schedule).fit()
    return model, load_checkpoint(run_dir)


CONFIG = TrainConfig(max_steps=2, lr=1e-2, warmup=1, checkpoint_every=0, ema_decay=0.9)


def test_a_runs_own_checkpoint_fits_its_model_also_on_the_meta_device(tmp_path):
    model, checkpoint = train(tmp_path, 4, CONFIG)
    check_checkpoint_fits(model, CONFIG, checkpoint)
    with torch.device("meta"):
        skeleton = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    check_checkpoint_fits(skeleton, CONFIG, checkpoint)


def test_a_checkpoint_of_another_width_is_refused_naming_the_file_and_the_tensor(tmp_path):
    _, checkpoint = train(tmp_path, 4, CONFIG)
    wider = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 1))
    with pytest.raises(CheckpointError) as err:
        check_checkpoint_fits(wider, CONFIG, checkpoint)
    message = str(err.value)
    assert "model.safetensors does not fit this run" in message
    # the first tensor of the file that differs: 0.bias (4,) or 0.weight (4, 3)
    assert ("model tensor '0.bias' has shape (4,), expected (5,)" in message
            or "model tensor '0.weight' has shape (4, 3), expected (5, 3)" in message)
    assert len(message.splitlines()) == 1


def test_a_checkpoint_without_the_ema_the_config_asks_for_is_refused(tmp_path):
    no_ema = TrainConfig(max_steps=2, lr=1e-2, warmup=1, checkpoint_every=0, ema_decay=0.0)
    model, checkpoint = train(tmp_path, 4, no_ema)
    check_checkpoint_fits(model, no_ema, checkpoint)
    with pytest.raises(CheckpointError, match="has no ema.safetensors"):
        check_checkpoint_fits(model, CONFIG, checkpoint)


def test_refusing_turns_a_load_error_into_one_line_naming_the_file(tmp_path):
    path = tmp_path / "optimizer.safetensors"
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors does not fit this run: "
                                              r"no entry 'exp_avg'"):
        with refusing(path):
            raise KeyError("exp_avg")
    with pytest.raises(CheckpointError, match="does not fit this run: first line$"):
        with refusing(path):
            raise ValueError("first line\nsecond line")
    with pytest.raises(OSError):  # not a fit error: passes through
        with refusing(path):
            raise OSError("disk")
