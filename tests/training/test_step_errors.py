"""addnorm.training.step_errors: the one line a failed step says.

Provenance: the messages' own rules (the module docstring): after updates the lr is named; on
a first step the weights are, the worst one by name (found here by planting it), and a resumed
run's checkpoint; an allocation names the step and the newest checkpoint kept. The whole
command's lines are checked in tests/cli/test_broken_runs.py.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.training.checkpoint import save_checkpoint
from addnorm.training.step_errors import non_finite_loss, out_of_memory

OOM = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                   "536870912 bytes. Error code 12")


def _model(planted: float) -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    with torch.no_grad():
        model[1].weight.fill_(0.5)
        model[1].weight[0, 1] = planted
    return model


def test_after_updates_a_non_finite_loss_points_at_the_lr(tmp_path):
    line = non_finite_loss(float("nan"), 0.25, step=7, updated=True, model=_model(1.0),
                           resumed_from=None, run_dir=tmp_path)
    assert line == "training loss is nan at step 7; try a lower lr (0.25)"


def test_before_any_update_it_names_the_worst_weight_not_the_lr(tmp_path):
    fresh = non_finite_loss(float("inf"), 0.1, step=1, updated=False, model=_model(1e30),
                            resumed_from=None, run_dir=tmp_path)
    assert fresh.startswith("training loss is inf at step 1, before any update: the initial")
    assert "largest |weight| 1e+30, in 1.weight" in fresh and "not the lr" in fresh
    resumed = non_finite_loss(float("nan"), 0.1, step=13, updated=False,
                              model=_model(float("nan")), resumed_from=12, run_dir=tmp_path)
    assert "the weights of its checkpoint step-00000012" in resumed
    assert f"(in {tmp_path / 'checkpoints'})" in resumed and "NaN in 1.weight" in resumed


def test_out_of_memory_names_the_step_the_size_and_the_checkpoint_kept(tmp_path):
    assert out_of_memory(OOM, step=3, run_dir=tmp_path) == (
        "out of memory at step 3 (could not allocate 537 MB); no checkpoint was written yet: "
        "train with a smaller batch_size or model, or free memory")
    save_checkpoint(tmp_path, 2, {"model": {"w": torch.zeros(1)}}, {"step": 2})
    assert f"{tmp_path / 'checkpoints' / 'step-00000002'} is kept" in out_of_memory(
        OOM, step=3, run_dir=tmp_path)
