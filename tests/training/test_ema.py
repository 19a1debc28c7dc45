"""The exponential moving average of the weights: torch's AveragedModel with the update rule
restated, buffers averaged, float32 averages of low-precision models, and the optional warm-up
of the decay."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from tolerances import FLOAT32_ROUNDED
from torch import nn

from addnorm.training.ema import ema_decay, make_ema, saved_n_averaged


def test_ema_follows_its_update_rule():
    model = nn.Linear(2, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ema = make_ema(model, decay=0.75)
    assert isinstance(ema, torch.optim.swa_utils.AveragedModel) and int(ema.n_averaged) == 1
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update_parameters(model)
    expected = 0.75 * before["weight"] + 0.25 * model.weight
    # float32, the rule's few roundings (or a lerp's) on values <= 2: FLOAT32_ROUNDED.
    torch.testing.assert_close(ema.module.weight, expected, **FLOAT32_ROUNDED)
    assert sorted(ema.module.state_dict()) == sorted(model.state_dict())  # the model's keys


def test_ema_averages_batchnorm_statistics_and_copies_its_step_counter():
    # AveragedModel(use_buffers=True): running statistics are averaged like the weights; the
    # integer num_batches_tracked is copied (get_ema_multi_avg_fn would scale and round it).
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ema = make_ema(model, decay=0.5)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        model(torch.randn(8, 3))
    ema.update_parameters(model)
    now = model.state_dict()
    averaged = ema.module.state_dict()
    for name in ("1.running_mean", "1.running_var"):
        # float32 lerp of values <= 2: FLOAT32_ROUNDED
        torch.testing.assert_close(averaged[name], 0.5 * start[name] + 0.5 * now[name],
                                   **FLOAT32_ROUNDED)
    assert averaged["1.num_batches_tracked"].item() == 3


def test_a_bfloat16_model_is_averaged_in_float32():
    model = nn.Linear(4, 4).to(torch.bfloat16)
    ema = make_ema(model, decay=0.999)
    assert ema.module.weight.dtype == torch.float32
    before = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update_parameters(model)
    expected = before.float() + 1e-3 * (model.weight.float() - before.float())
    # float32, a lerp's few roundings on values <= 2: FLOAT32_ROUNDED
    torch.testing.assert_close(ema.module.weight, expected, **FLOAT32_ROUNDED)


@examples(20)
@given(decay=st.floats(0.0, 0.9999), n=st.integers(0, 10**6))
def test_ema_warmup_decays_by_the_smaller_of_its_decay_and_1_plus_n_over_10_plus_n(decay, n):
    # The rule restated (TensorFlow's num_updates), and its two ends: 0.1 at update 0, so
    # the first average is 90% the trained weights; the set decay once (1+n)/(10+n) passes it.
    assert ema_decay(decay, n, warmup=True) == min(decay, (1 + n) / (10 + n))
    assert ema_decay(decay, n, warmup=False) == decay  # no warm-up: constant
    assert ema_decay(decay, 0, warmup=True) == min(decay, 0.1)


def test_the_averaged_model_applies_the_warmup_decay_of_each_update():
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema = make_ema(model, decay=0.99, warmup=True)
    expected = 0.0
    for n in range(4):  # update n moves the average by 1 - min(0.99, (1 + n) / (10 + n))
        with torch.no_grad():
            model.weight.fill_(float(n + 1))
        ema.update_parameters(model)
        decay = min(0.99, (1 + n) / (10 + n))
        expected = decay * expected + (1 - decay) * (n + 1)
        # float32 lerps of values <= 4: FLOAT32_ROUNDED
        assert ema.module.weight.item() == pytest.approx(expected, rel=1e-6)


def test_saved_n_averaged_reads_the_state_or_counts_one_update_a_step_for_older_checkpoints():
    assert saved_n_averaged({"ema": {"n_averaged": 7}}, step=40) == 7
    # before the EMA was AveragedModel: its initial weights, then one update a step
    assert saved_n_averaged({}, step=40) == 41


@pytest.mark.parametrize("saved", [{"n_averaged": 0}, {"n_averaged": True}, {"n_averaged": 2.0},
                                   {}, [3], "3"])
def test_saved_n_averaged_refuses_what_no_averaged_model_saved(saved):
    with pytest.raises(ValueError, match="ema.n_averaged must be an int >= 1"):
        saved_n_averaged({"ema": saved}, step=5)
