"""Tests for addnorm.timestep: the seed/DiT timestep embedding, its diffusers options, the MLP.

Oracles: line-by-line restatements of the seed's function (SPEC section 2) and of diffusers'
``get_timestep_embedding``, matched bit for bit (same float32 operations in the same order);
SPEC claim 9 (frequency span); torch built-ins for the MLP.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from tolerances import FLOAT32_MODEL, FLOAT64_EXACT

from addnorm import timestep as timestep_module
from addnorm.timestep import TimestepEmbedder, timestep_embedding


def seed_timestep_embedding(timesteps, dim, max_period=10000, repeat_only=False):
    """SPEC section 2 (seed 004 / guided-diffusion / DiT), restated line by line."""
    if repeat_only:
        return timesteps[:, None].repeat(1, dim)  # the seed's repeat(timesteps, 'b -> b d')
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half)
    args = timesteps[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def diffusers_timestep_embedding(
    timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1, scale=1,
    max_period=10000,
):
    """diffusers.models.embeddings.get_timestep_embedding, restated line by line."""
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half_dim, dtype=torch.float32)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].float() * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = F.pad(emb, (0, 1, 0, 0))
    return emb


TIMESTEPS = torch.tensor([0.0, 1.0, 2.5, 17.0, 250.25, 999.0])


@pytest.mark.parametrize("dim", range(2, 10))
@pytest.mark.parametrize("max_period", [10000, 100])
def test_defaults_equal_the_seed_function_bit_for_bit(dim, max_period):
    # Oracle: seed_timestep_embedding (the same float32 operations, so exactly equal).
    expected = seed_timestep_embedding(TIMESTEPS, dim, max_period)
    assert torch.equal(timestep_embedding(TIMESTEPS, dim, max_period), expected)


@pytest.mark.parametrize("dim", [1, 4, 7])
@pytest.mark.parametrize(
    "timesteps", [TIMESTEPS, torch.tensor([1, 999, 2**30 + 1]), torch.tensor([3, 7]).int()]
)
def test_repeat_only_repeats_the_timesteps_in_their_dtype(timesteps, dim):
    # Oracle: the seed's repeat_only branch, result[n, j] = t_n; integers stay integers (so
    # 2**30 + 1 is not rounded by float32).
    out = timestep_embedding(timesteps, dim, repeat_only=True)
    assert out.dtype == timesteps.dtype
    assert torch.equal(out, seed_timestep_embedding(timesteps, dim, repeat_only=True))


DIFFUSERS_CASES = list(
    itertools.product([False, True], [0, 1, 0.5], [1, 2.5], [10000, 1000], [4, 5, 6, 7, 8, 9, 32])
) + [(flip, 0, 1, 10000, dim) for flip in (False, True) for dim in (2, 3)]


@pytest.mark.parametrize(("flip", "shift", "scale", "max_period", "dim"), DIFFUSERS_CASES)
def test_keywords_reproduce_diffusers_bit_for_bit(flip, shift, scale, max_period, dim):
    # Oracle: diffusers_timestep_embedding with the same options (see the module docstring's
    # table); the same float32 operations in the same order, so exactly equal.
    expected = diffusers_timestep_embedding(
        TIMESTEPS, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift, scale=scale,
        max_period=max_period,
    )
    got = timestep_embedding(
        TIMESTEPS, dim, max_period, flip_sin_to_cos=flip, downscale_freq_shift=shift, scale=scale
    )
    assert torch.equal(got, expected)


def test_diffusers_defaults_map_to_flip_false_shift_one():
    # Docstring table row 1: diffusers' defaults (flip False, shift 1) are not ours.
    expected = diffusers_timestep_embedding(TIMESTEPS, 16)
    got = timestep_embedding(TIMESTEPS, 16, flip_sin_to_cos=False, downscale_freq_shift=1)
    assert torch.equal(got, expected)
    assert not torch.allclose(timestep_embedding(TIMESTEPS, 16), expected)  # O(1) apart


@pytest.mark.parametrize(("dim", "max_period"), [(256, 10000), (8, 10000), (64, 1000)])
def test_frequencies_span_one_down_to_one_over_max_period(dim, max_period):
    # SPEC claim 9: freq_0 = 1, freq_{half-1} = max_period^(-(half-1)/half). At t = 1 the angle
    # of (cos, sin) is the frequency itself (all lie in (0, 1], so atan2 is unambiguous).
    half = dim // 2
    emb = timestep_embedding(torch.tensor([1.0], dtype=torch.float64), dim, max_period)
    freqs = torch.atan2(emb[0, half:], emb[0, :half])
    # float64: freq_0 = exp(0) = 1 exactly; sin, cos and atan2 add a few u (1.1e-16) each.
    assert freqs[0].item() == pytest.approx(1.0, abs=1e-15)
    assert freqs[-1].item() == pytest.approx(max_period ** (-(half - 1) / half), rel=1e-12)
    assert bool((freqs[1:] < freqs[:-1]).all())


@pytest.mark.parametrize(
    "timesteps", [7, 7.0, [7], (7.0,), torch.tensor(7.0), torch.tensor(7), torch.tensor([7.0])]
)
def test_scalars_and_lists_become_one_row(timesteps):
    # Oracle: the seed function on the 1-D tensor [7.].
    expected = seed_timestep_embedding(torch.tensor([7.0]), 6)
    assert torch.equal(timestep_embedding(timesteps, 6), expected)


def test_float64_timesteps_stay_float64():
    # Oracle: the seed formula evaluated in float64 (exact up to float64 rounding).
    t = torch.tensor([3.0, 123.456], dtype=torch.float64)
    out = timestep_embedding(t, 8)
    half = 4
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float64) / half)
    args = t[:, None] * freqs
    assert out.dtype == torch.float64
    # The module's float64 ops in its order (equal on any machine); a reordering would cost
    # half an ulp of the angle 123.456 (7e-15), which 1e-14 still admits.
    torch.testing.assert_close(out, torch.cat([args.cos(), args.sin()], -1), atol=1e-14, rtol=0)


@pytest.fixture
def not_yet_warned(monkeypatch):
    """A process that has not issued the once-per-process unit-interval warning yet."""
    monkeypatch.setattr(timestep_module, "_warned_unit_timesteps", False)


def test_warns_when_timesteps_look_normalized_to_unit_interval(not_yet_warned):
    # Known pitfall: t in [0, 1] with max_period 10000 leaves most channels nearly constant.
    with pytest.warns(UserWarning, match=r"all timesteps lie in \[0, 1\].*max_period \(10000\)"):
        timestep_embedding(torch.tensor([0.0, 0.25, 1.0]), 16)


def test_the_unit_interval_warning_is_issued_once_per_process(not_yet_warned):
    # Documented: once per process whatever the warnings filter (a module-level flag).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        timestep_embedding(torch.tensor([0.5]), 16)
        timestep_embedding(torch.tensor([0.25, 0.75]), 16)
        TimestepEmbedder(8, d_freq=16)(torch.tensor([0.5]))
    assert len(caught) == 1 and "[0, 1]" in str(caught[0].message)
    assert timestep_module._warned_unit_timesteps


def test_values_are_not_checked_while_compiling(not_yet_warned, monkeypatch):
    # Documented: under torch.compile no host sync, so neither the warning nor the NaN check.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        timestep_embedding(torch.tensor([0.5]), 16)
        assert torch.isnan(timestep_embedding(torch.tensor([math.nan]), 4)).all()
    assert not timestep_module._warned_unit_timesteps


@pytest.mark.parametrize(
    ("timesteps", "max_period"),
    [([0.0, 0.25, 1.0], 100), ([0, 1, 0], 10000), ([0.5, 2.0], 10000), ([0], 10000)],
)
def test_does_not_warn_for_integer_steps_or_small_periods(timesteps, max_period, not_yet_warned):
    # Integer timesteps 0/1 are ordinary diffusion steps; small periods suit normalized t.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        timestep_embedding(torch.tensor(timesteps), 16, max_period)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((TIMESTEPS, 0), {}, ValueError, r"dim must be >= 1, got 0"),
        ((TIMESTEPS, -1), {}, ValueError, r"dim must be >= 1, got -1"),
        ((TIMESTEPS, 2.5), {}, TypeError, r"dim must be an int, got float \(2.5\)"),
        ((TIMESTEPS, True), {}, TypeError, r"dim must be an int, got bool"),
        ((TIMESTEPS, 1), {}, ValueError, r"dim \(1\) must be >= 2"),
        # diffusers returns NaN here (0/0 in the exponent); we raise instead.
        ((TIMESTEPS, 2), {"downscale_freq_shift": 1}, ValueError, r"dim // 2 \(1\) must exceed"),
        ((TIMESTEPS, 3), {"downscale_freq_shift": 1}, ValueError, r"divides by 0"),
        ((TIMESTEPS, 8, 0), {}, ValueError, r"max_period must be > 0.0, got 0.0"),
        ((TIMESTEPS, 8, -5), {}, ValueError, r"max_period must be > 0.0, got -5.0"),
        ((TIMESTEPS, 8, math.inf), {}, ValueError, r"max_period must be finite, got inf"),
        ((TIMESTEPS, 8), {"scale": 0.0}, ValueError, r"scale must be > 0.0, got 0.0"),
        ((TIMESTEPS, 8), {"flip_sin_to_cos": 1}, TypeError, r"flip_sin_to_cos must be a bool"),
        ((TIMESTEPS, 8, 10000, "no"), {}, TypeError, r"repeat_only must be a bool, got str"),
        ((torch.tensor([1.0, math.nan]), 8), {}, ValueError, r"timesteps must be finite, got nan"),
        ((torch.tensor([math.inf]), 8), {}, ValueError, r"timesteps must be finite, got inf"),
        ((torch.zeros(2, 3), 8), {}, ValueError, r"1 dim \(N,\), got shape \(2, 3\)"),
        ((torch.tensor([True]), 8), {}, TypeError, r"got dtype torch.bool"),
        ((True, 8), {}, TypeError, r"timesteps must be a tensor, a number .* got bool"),
        (("5", 8), {}, TypeError, r"timesteps must be a tensor, a number .* got str"),
        (([1, "a"], 8), {}, TypeError, r"timesteps must hold numbers, got str"),
    ],
)
def test_timestep_embedding_rejects_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        timestep_embedding(*args, **kwargs)


# ---------------------------------------------------------------- TimestepEmbedder


def test_embedder_is_linear_silu_linear_on_the_seed_embedding():
    # Oracle: F.linear / F.silu with the module's own weights on the seed function (DiT's MLP).
    torch.manual_seed(0)
    embedder = TimestepEmbedder(32, d_freq=16)
    for lin in (embedder.w1, embedder.w2):  # non-zero biases so they are exercised too
        torch.nn.init.normal_(lin.bias)
    t = torch.tensor([0.0, 10.0, 999.0])
    freq = seed_timestep_embedding(t, 16)
    hidden = F.silu(F.linear(freq, embedder.w1.weight, embedder.w1.bias))
    expected = F.linear(hidden, embedder.w2.weight, embedder.w2.bias)
    # float32 defaults: dot products of 16 and 32 terms (weights ~0.02, |h| ~ 1) round to
    # < 1e-6 worst case (sum_bound) in any order, inside atol 1e-5.
    torch.testing.assert_close(embedder(t), expected)
    torch.testing.assert_close(embedder(10.0), expected[1:2])


def test_embedder_init_follows_dit():
    # DiT initialize_weights: t_embedder weights ~ N(0, 0.02^2); biases 0 (its basic init).
    torch.manual_seed(0)
    embedder = TimestepEmbedder(256)
    for lin in (embedder.w1, embedder.w2):
        # 65536 seeded draws: the sample std's relative std is 1/sqrt(2n) = 0.28%: 11 sigma.
        assert lin.weight.std().item() == pytest.approx(0.02, rel=0.03)
        assert torch.equal(lin.bias, torch.zeros_like(lin.bias))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"d_model": 0}, ValueError, r"d_model must be >= 1, got 0"),
        ({"d_model": 3.0}, TypeError, r"d_model must be an int, got float"),
        ({"d_model": 8, "d_freq": 1}, ValueError, r"d_freq must be >= 2, got 1"),
        ({"d_model": 8, "max_period": 0}, ValueError, r"max_period must be > 0.0, got 0.0"),
    ],
)
def test_embedder_constructor_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        TimestepEmbedder(**kwargs)


def test_embedder_moves_timesteps_to_its_weights_device():
    # Documented: t is moved to the weights' device ('meta' stands in for an accelerator: it
    # checks devices and shapes without computing values; integer t needs no value check).
    embedder = TimestepEmbedder(8, d_freq=16).to("meta")
    out = embedder(torch.tensor([1, 500]))
    assert out.device.type == "meta" and out.shape == (2, 8)


def test_embedder_rejects_bad_timesteps():
    with pytest.raises(ValueError, match=r"timesteps must be a scalar or have 1 dim"):
        TimestepEmbedder(8)(torch.zeros(2, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_embedder_runs_on_cuda_with_python_scalars():
    # Oracle: the CPU module with the same weights.
    embedder = TimestepEmbedder(16)
    cpu = embedder(torch.tensor([5.0, 50.0]))
    gpu = embedder.cuda()
    # Two float32 implementations of one small model (CUDA's sin/cos and sums vs the CPU's).
    torch.testing.assert_close(gpu([5.0, 50.0]).cpu(), cpu, **FLOAT32_MODEL)
    torch.testing.assert_close(gpu(torch.tensor([5.0, 50.0])).cpu(), cpu, **FLOAT32_MODEL)


@pytest.mark.parametrize(("dim", "max_period", "shift"),
                         [(4, 10000, 0.0), (256, 10000, 0.0), (64, 1000, 1.0), (11, 50, 0.5)])
def test_the_documented_lowest_frequency_is_the_embeddings(dim, max_period, shift):
    # Oracle: the frequency measured from the output, the angle of the last [cos | sin] pair
    # at t = 1 (atan2 in float64, below pi since every frequency is <= 1), against the
    # expression timestep_embedding's docstring states, evaluated.
    doc = " ".join(timestep_embedding.__doc__.split())
    stated = re.search(r"sets the lowest frequency, ``([^`]+)``", doc)
    assert stated is not None, "the docstring states the lowest frequency as an expression"
    half = dim // 2
    emb = timestep_embedding(torch.tensor([1.0], dtype=torch.float64), dim, max_period,
                             downscale_freq_shift=shift)
    measured = math.atan2(emb[0, 2 * half - 1].item(), emb[0, half - 1].item())
    value = eval(stated.group(1), {"__builtins__": {}},
                 {"max_period": max_period, "half": half, "shift": shift})
    assert measured == pytest.approx(value, rel=FLOAT64_EXACT["rtol"], abs=FLOAT64_EXACT["atol"])
    # The figures quoted beside it: 7.5% above 1/max_period at dim 256, 100 times it at dim 4.
    assert f"{100 * (10000 ** (1 / 128) - 1):.1f}% above it at dim 256" in doc
    assert f"{10000 ** (-1 / 2) * 10000:.0f} times it at dim 4" in doc
