"""Classifier-free guidance: one batched call, the guidance formula, learned variance.

Oracle: two separate calls of the conditional model, with the labels and with the null
class, combined by hand as ``uncond + s * (cond - uncond)`` (Ho & Salimans, 2022, eq. 6 in
noise form), which is what DiT's ``forward_with_cfg`` computes on the channels it guides.
"""

from __future__ import annotations

import pytest
import torch
from tolerances import FLOAT64_EXACT

from addnorm.diffusion import Diffusion, guided_eps_fn


class LabelledModel:
    """A conditional "model" whose output depends on x, t and the label, and which counts
    its calls; with ``learned_variance`` it returns 2C channels."""

    def __init__(self, learned_variance: bool = False):
        self.learned_variance = learned_variance
        self.batch_sizes: list[int] = []

    def __call__(self, x, t, y):
        self.batch_sizes.append(x.shape[0])
        shift = y.to(x.dtype).view(-1, 1, 1) / 7 + t.to(x.dtype).view(-1, 1, 1) / 1000
        eps = torch.sin(x * (1 + shift)) + shift
        if not self.learned_variance:
            return eps
        return torch.cat([eps, torch.tanh(x - shift)], dim=1)


@pytest.mark.parametrize("learned_variance", [False, True])
@pytest.mark.parametrize("scale", [0.0, 1.0, 4.0])
def test_guided_output_is_uncond_plus_scale_times_difference(learned_variance, scale):
    g = torch.Generator().manual_seed(0)
    x, t, y = (
        torch.randn(3, 2, 5, generator=g, dtype=torch.float64),  # float64: an exact formula
        torch.tensor([999, 500, 0]),
        torch.tensor([0, 4, 9]),
    )
    model = LabelledModel(learned_variance)
    guided = guided_eps_fn(model, y, guidance_scale=scale, null_class=10)(x, t)
    assert model.batch_sizes == [6]  # conditional and unconditional halves in one call
    cond, uncond = model(x, t, y), model(x, t, torch.full_like(y, 10))
    expected = uncond[:, :2] + scale * (cond[:, :2] - uncond[:, :2])
    torch.testing.assert_close(guided[:, :2], expected, **FLOAT64_EXACT)
    if learned_variance:
        assert torch.equal(guided[:, 2:], cond[:, 2:])  # the conditional variance, unguided
    else:
        assert guided.shape == x.shape


def test_guided_sampling_runs_the_guided_function():
    y = torch.tensor([1, 2])
    x_T = torch.randn(2, 2, 5, generator=torch.Generator().manual_seed(1))
    model = LabelledModel(learned_variance=True)
    guided = guided_eps_fn(model, y, guidance_scale=3.0, null_class=10)
    by_hand = Diffusion().sample(
        lambda x, t: guided(x, t), x_T, steps=10, generator=torch.Generator().manual_seed(2)
    )
    samples = Diffusion().sample(guided, x_T, steps=10, generator=torch.Generator().manual_seed(2))
    assert torch.equal(samples, by_hand)
    assert model.batch_sizes == [4] * 20


@pytest.mark.parametrize(
    "kwargs, call, error, message",
    [
        (dict(model=None), None, TypeError, "model must be callable, got NoneType"),
        (dict(y=torch.tensor([0.5])), None, TypeError, "y must be an integer tensor"),
        (dict(null_class=-1), None, ValueError, "null_class must be >= 0, got -1"),
        (
            dict(),
            (torch.zeros(3, 2, 5), torch.zeros(3, dtype=torch.long)),
            ValueError,
            r"must have the batch of y \(2\)",
        ),
    ],
)
def test_bad_guidance_arguments_are_refused(kwargs, call, error, message):
    args = dict(model=LabelledModel(), y=torch.tensor([1, 2]), guidance_scale=2.0, null_class=10)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        guided = guided_eps_fn(args.pop("model"), args.pop("y"), **args)
        guided(*call)
