"""Classifier-free guidance: the formula once, DiT's doubled batch, and the guided eps_fn
(one batched call, learned variance, labels checked once).

Oracles: identities of the formula (scale 1 gives the conditional prediction, 0 the
unconditional one) and the formula written out in float64; two separate calls of the
conditional model, with the labels and with the null class, combined by hand as
``uncond + s * (cond - uncond)`` (Ho & Salimans, 2022, eq. 6 in noise form), which is what
DiT's ``forward_with_cfg`` computes on the channels it guides; a DiT called with plain labels.
"""

from __future__ import annotations

import pytest
import torch
from tolerances import FLOAT64_EXACT

import addnorm.dit
from addnorm.diffusion import Diffusion, classifier_free_guidance, guidance, guided_eps_fn
from addnorm.diffusion.guidance import guided_prediction
from addnorm.dit import DIT_PRESETS, DiT

# ------------------------------------------------------------------------------ the formula


def test_scale_1_gives_the_conditional_and_0_the_unconditional_prediction():
    g = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64).unbind(0)
    # float64; scale 1 rounds uncond + (cond - uncond), a few u from cond: FLOAT64_EXACT.
    torch.testing.assert_close(guided_prediction(cond, uncond, 1.0), cond, **FLOAT64_EXACT)
    assert torch.equal(guided_prediction(cond, uncond, 0.0), uncond)  # uncond + 0 * (...)


@pytest.mark.parametrize("scale", [-1.0, 1.5, 4.0])
def test_guided_prediction_is_uncond_plus_scale_times_the_difference(scale):
    g = torch.Generator().manual_seed(1)
    cond, uncond = torch.randn(2, 5, 2, generator=g, dtype=torch.float64).unbind(0)
    expected = uncond + scale * (cond - uncond)  # the same operations: the same bits
    assert torch.equal(guided_prediction(cond, uncond, scale), expected)


def test_the_dit_and_the_sampler_guide_through_this_one_formula(monkeypatch):
    # Replaced here, the formula changes what DiT.forward_with_cfg and guided_eps_fn return.
    monkeypatch.setattr(guidance, "guided_prediction", lambda cond, uncond, scale: cond * 0 + 7)
    dit = DiT(DIT_PRESETS["DiT-digits-tiny"]).eval()
    x, t = torch.zeros(2, 1, 8, 8), torch.tensor([5, 5])
    assert torch.equal(dit.forward_with_cfg(x, t, torch.tensor([3, 10]), 2.0), x + 7)
    assert torch.equal(guided_eps_fn(dit, torch.tensor([3]), guidance_scale=2.0,
                                     null_class=10)(x[:1], t[:1]), x[:1] + 7)
    assert addnorm.dit.classifier_free_guidance is classifier_free_guidance  # one function


# ------------------------------------------------------------ DiT's doubled batch of 2B rows


def halves() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cond = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    uncond = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    return cond, uncond, torch.cat([cond, uncond])


def test_classifier_free_guidance_at_scale_1_and_0_gives_each_half():
    cond, uncond, out = halves()
    # float64; scale 1 rounds uncond + (cond - uncond), a few u from cond: FLOAT64_EXACT.
    guided = classifier_free_guidance(out, 1.0, n_guided=4)[:2]
    torch.testing.assert_close(guided, cond, **FLOAT64_EXACT)
    unguided = classifier_free_guidance(out, 0.0, n_guided=4)[:2]
    torch.testing.assert_close(unguided, uncond, **FLOAT64_EXACT)


def test_guided_channels_follow_the_formula_and_the_rest_pass_through():
    cond, uncond, out = halves()
    guided = classifier_free_guidance(out, 4.0, n_guided=2)
    expected = uncond[:, :2] + 4.0 * (cond[:, :2] - uncond[:, :2])
    torch.testing.assert_close(guided[:2, :2], expected, **FLOAT64_EXACT)  # float64
    torch.testing.assert_close(guided[2:, :2], expected, **FLOAT64_EXACT)  # both halves alike
    assert torch.equal(guided[:, 2:], out[:, 2:])  # each half keeps its own other channels


# -------------------------------------------------------------------- the guided eps_fn


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


class CheckingModel(LabelledModel):
    """A LabelledModel that checks its labels once (:class:`ChecksLabels`): it records what
    it checked and is then called with the checked labels."""

    def __init__(self):
        super().__init__()
        self.checked: list[torch.Tensor] = []
        self.given: list[object] = []

    def checked_labels(self, y):
        self.checked.append(y.clone())
        return ("checked", y)

    def __call__(self, x, t, y):
        self.given.append(y)
        return super().__call__(x, t, y[1])


def test_a_model_that_checks_labels_gets_them_checked_once_for_every_step():
    model = CheckingModel()
    y = torch.tensor([1, 2])
    guided = guided_eps_fn(model, y, guidance_scale=3.0, null_class=10)
    assert [c.tolist() for c in model.checked] == [[1, 2, 10, 10]]  # once, at construction
    Diffusion().sample(guided, torch.randn(2, 2, 5), steps=4)
    assert len(model.checked) == 1 and len(model.given) == 4
    assert all(given[0] == "checked" for given in model.given)


def test_a_dit_guided_with_checked_labels_samples_as_with_plain_labels():
    # Oracle: the same DiT wrapped so that it is called with plain tensors (checked per call).
    torch.manual_seed(0)
    dit = DiT(DIT_PRESETS["DiT-digits-tiny"]).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in dit.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    y = torch.tensor([3, 1, 4])
    noise = torch.randn(3, 1, 8, 8, generator=gen)
    plain = guided_eps_fn(lambda x, t, labels: dit(x, t, labels), y, guidance_scale=2.0,
                          null_class=10)
    checked = guided_eps_fn(dit, y, guidance_scale=2.0, null_class=10)
    expected = Diffusion().sample(plain, noise, steps=5, method="ddim")
    assert torch.equal(Diffusion().sample(checked, noise, steps=5, method="ddim"), expected)


def test_a_dit_refuses_a_label_it_has_no_row_for_when_guidance_is_set_up():
    dit = DiT(DIT_PRESETS["DiT-digits-tiny"])
    with pytest.raises(ValueError, match=r"y contains class id 11 outside \[0, 10\]"):
        guided_eps_fn(dit, torch.tensor([3, 11]), guidance_scale=2.0, null_class=10)
