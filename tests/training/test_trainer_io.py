"""What a ``Trainer`` is given and returns (``addnorm.training.trainer_io``): a ``BatchSource``
whose state continues its data order, and the ``TrainResult`` of a fit.

Provenance: the same source drawn on uninterrupted (the continued order equals it), and the
run's own ``metrics.jsonl`` and checkpoints (the result names the last of each).
"""

from __future__ import annotations

import torch
from torch import nn
from toy_batches import SumBatches, mse_loss

from addnorm.training.checkpoint import list_checkpoints
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer
from addnorm.training.trainer_io import BatchSource, TrainResult


def test_a_batch_source_restored_from_its_state_continues_its_data_order():
    source: BatchSource = SumBatches(seed=3)
    source.next_batch()
    state = source.state_dict()
    ahead = [source.next_batch()["x"] for _ in range(3)]
    restored: BatchSource = SumBatches(seed=99)
    restored.load_state_dict(state)
    assert all(torch.equal(a, restored.next_batch()["x"]) for a in ahead)


def test_the_train_result_names_the_last_step_its_loss_and_the_last_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    config = TrainConfig(max_steps=4, lr=1e-2, warmup=1, log_every=1, checkpoint_every=2)
    schedule = ScheduleConfig("constant", config.lr, config.warmup, total_steps=4)
    result = Trainer(model, mse_loss, SumBatches(), config, run_dir=tmp_path,
                     schedule=schedule).fit()
    assert isinstance(result, TrainResult)
    last = read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert (result.step, result.loss, result.stopped_by) == (4, last["loss"], "max_steps")
    assert result.checkpoint == list_checkpoints(tmp_path)[-1]
    assert result.compile_s is None and result.replan is None and result.elapsed_s > 0
