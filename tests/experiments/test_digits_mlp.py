"""The normalization experiments' MLP on the digits, its noise and its training loop.

Provenance: the module's definitions restated. The MLP is DEPTH blocks of Linear, the injected
norm (then ShiftNoise when asked) and ReLU, then 10 logits, seeded; ShiftNoise is a * x + b per
unit with a in [0.5, 1.5) in training and the identity in evaluation; ``train`` takes plain
SGD steps (the first step's loss is the cross-entropy of the untrained model on that batch),
stops at a NaN loss and at the first evaluation that reaches ``stop_at``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from addnorm.experiments.digits_mlp import (
    DEPTH,
    NORMS,
    WIDTH,
    Run,
    ShiftNoise,
    make_mlp,
    steps_to,
    train,
)
from addnorm.norms import BatchNorm


def test_the_mlp_is_depth_blocks_of_linear_norm_relu_then_ten_logits_from_its_seed():
    model = make_mlp(NORMS["BatchNorm"], seed=3)
    kinds = [type(layer) for layer in model]
    assert kinds == [nn.Linear, BatchNorm, nn.ReLU] * DEPTH + [nn.Linear]
    assert model[0].in_features == 64 and model[-1].out_features == 10
    assert all(layer.out_features == WIDTH for layer in model[:-1] if isinstance(layer, nn.Linear))
    again = make_mlp(NORMS["BatchNorm"], seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values(), strict=True))
    noisy = make_mlp(NORMS["no norm"], seed=3, noise=True)
    assert [type(layer) for layer in noisy][:4] == [nn.Linear, nn.Identity, ShiftNoise, nn.ReLU]


def test_shift_noise_is_a_per_unit_affine_map_in_training_and_the_identity_in_evaluation():
    noise = ShiftNoise(torch.Generator().manual_seed(0))
    x = torch.randn(5, 8)
    y = noise(x)
    scale = (y[1] - y[0]) / (x[1] - x[0])  # (D,) the same a for every row of the batch
    torch.testing.assert_close((y - x * scale)[1:], (y - x * scale)[:1].expand(4, 8),
                               rtol=1e-5, atol=1e-5)  # float32, a few roundings on values ~3
    assert bool(((scale >= 0.5 - 1e-5) & (scale < 1.5 + 1e-5)).all())
    assert not torch.equal(noise(x), y)  # redrawn each call
    noise.eval()
    assert noise(x) is x


def test_train_logs_each_steps_loss_evaluates_every_n_steps_and_stops_at_its_target():
    model = make_mlp(NORMS["no norm"], seed=0)
    run = train(model, lr=0.05, n_steps=6, eval_every=3, seed=0)
    assert len(run.losses) == 6 and [step for step, _ in run.accuracies] == [3, 6]
    assert all(0.0 <= acc <= 1.0 for _, acc in run.accuracies) and not run.diverged
    # the untrained model's logits are near 0: its first loss is near log(10)
    assert abs(run.losses[0] - math.log(10)) < 0.2
    stopped = train(make_mlp(NORMS["no norm"], seed=0), lr=0.05, n_steps=6, eval_every=3,
                    seed=0, stop_at=0.0)  # any accuracy reaches 0: stop at the first check
    assert len(stopped.losses) == 3 and steps_to(stopped, 0.0) == 3
    assert stopped.losses == run.losses[:3]  # the same seeded batches


def test_a_nan_loss_ends_the_run_and_marks_it_diverged():
    run = train(make_mlp(NORMS["no norm"], seed=0), lr=1e30, n_steps=50, eval_every=100,
                seed=0)
    assert run.diverged and len(run.losses) < 50
    assert steps_to(Run(accuracies=[(10, 0.5), (20, 0.9)]), 0.8) == 20
    assert steps_to(Run(accuracies=[(10, 0.5)]), 0.8) is None


def test_a_nudge_moves_every_initial_weight_by_exactly_one_ulp_either_way():
    # Reference: torch.nextafter toward +inf and -inf of the un-nudged weights, entry by entry;
    # the draw decides the direction (both occur), the same draw the same directions.
    plain = make_mlp(NORMS["LayerNorm"], seed=3)
    nudged = make_mlp(NORMS["LayerNorm"], seed=3, nudge=1)
    again = make_mlp(NORMS["LayerNorm"], seed=3, nudge=1)
    ups = downs = 0
    for p, q, r in zip(plain.parameters(), nudged.parameters(), again.parameters(), strict=True):
        up = torch.nextafter(p, torch.full_like(p, torch.inf))
        down = torch.nextafter(p, torch.full_like(p, -torch.inf))
        assert torch.all((q == up) | (q == down))
        assert torch.equal(q, r)
        ups += int((q == up).sum())
        downs += int((q == down).sum())
    assert ups > 0 and downs > 0
