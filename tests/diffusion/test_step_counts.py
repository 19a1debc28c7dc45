"""Every step count 1 .. n_steps works with every spacing and every sampler.

Provenance: each spacing is compared with its reference's formula restated here from the
source (DiT's ``respace.space_timesteps``, diffusers' ``DDIMScheduler.set_timesteps`` and
``DPMSolverMultistepScheduler.set_timesteps``), and
checked for the properties the module promises (K strictly increasing steps in [0, n - 1],
where each convention starts and ends). Samples: a fresh DiT outputs exactly zero
(adaLN-Zero), and with eps = 0 every DDIM step scales x by sqrt(abar' / abar), so the
sample is x_T / sqrt(abar) at the first step walked (the largest); a DiT with redrawn (unit-scale)
weights must give finite samples of the noise's shape.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from properties import examples
from tolerances import u

from addnorm.diffusion import Diffusion, guided_eps_fn
from addnorm.diffusion.spacing import SPACINGS, sampling_timesteps
from addnorm.dit import DIT_PRESETS, DiT, classifier_free_guidance

# ----------------------------------------------------------------- the references, restated


def dit_ddim_steps(n: int, k: int) -> list[int] | None:
    """respace.py's ``space_timesteps(n, f"ddim{k}")``; None where it raises."""
    for stride in range(1, n):
        if len(range(0, n, stride)) == k:
            return list(range(0, n, stride))
    return None


def dit_one_section(n: int, k: int) -> list[int]:
    """respace.py's ``space_timesteps(n, [k])``: one section, a fractional stride summed."""
    frac_stride = 1 if k <= 1 else (n - 1) / (k - 1)
    cur, taken = 0.0, []
    for _ in range(k):
        taken.append(round(cur))
        cur += frac_stride
    return taken


def diffusers_steps(n: int, k: int, spacing: str) -> list[int]:
    """DDIMScheduler.set_timesteps (steps_offset=0), increasing; trailing for i < k only (its
    ``np.arange(n, 0, -n / k)`` yields k + 1 steps for some k, see spacing.py)."""
    if spacing == "leading":
        steps = (np.arange(0, k) * (n // k)).round()
    elif spacing == "trailing":
        steps = np.round(n - np.arange(k) * (n / k)) - 1
    else:
        steps = np.linspace(0, n - 1, k).round()
    return sorted(int(s) for s in steps)


def diffusers_dpm_steps(n: int, k: int, spacing: str) -> list[int]:
    """DPMSolverMultistepScheduler.set_timesteps (steps_offset=0, no lambda clipping): its
    "linspace" and "leading" rules over k + 1 points with the lowest (0) left out, increasing;
    for k = n, where those points repeat steps, every step (spacing.py)."""
    if k == n:
        return list(range(n))
    if spacing == "dpm-linspace":
        steps = np.linspace(0, n - 1, k + 1).round()[1:]
    else:
        steps = np.arange(1, k + 1) * (n // (k + 1))
    return sorted(int(s) for s in steps)


def reference(n: int, k: int, spacing: str) -> list[int]:
    if spacing.startswith("dpm-"):
        return diffusers_dpm_steps(n, k, spacing)
    if spacing == "strided":
        dit = dit_ddim_steps(n, k)
        return dit if dit is not None else diffusers_steps(n, k, "leading")
    if spacing == "sections":
        return dit_one_section(n, k)
    return diffusers_steps(n, k, spacing)


def check_promises(n: int, k: int, spacing: str, steps: list[int]) -> None:
    """What spacing.py promises of every spacing, and where each one starts and ends."""
    assert len(steps) == k
    assert all(type(s) is int for s in steps)
    assert all(b > a for a, b in zip(steps, steps[1:], strict=False)), steps
    assert 0 <= steps[0] and steps[-1] <= n - 1
    if spacing in ("strided", "leading", "sections", "linspace"):
        assert steps[0] == 0
    if spacing in ("sections", "linspace") and k > 1 or spacing == "trailing":
        assert steps[-1] == n - 1
    if spacing == "dpm-linspace":
        assert steps[-1] == n - 1 and (steps[0] > 0 or k == n)
    if spacing == "trailing":
        assert steps[0] == round(n / k) - 1
    if spacing in ("strided", "leading") and k > 1:
        strides = {b - a for a, b in zip(steps, steps[1:], strict=False)}
        allowed = {n // k} if spacing == "leading" else {n // k, -(-n // k)}
        assert len(strides) == 1 and strides <= allowed, (strides, allowed)


# --------------------------------------------------------------------------------- spacing


@pytest.mark.parametrize("spacing", SPACINGS)
def test_every_count_of_1000_steps_has_its_steps(spacing):
    # Exhaustive for DiT's n = 1000 (all 1000 counts, a second in all): 938 of them have no
    # DiT "ddimK" stride and raised before.
    for k in range(1, 1001):
        steps = sampling_timesteps(1000, k, spacing)
        check_promises(1000, k, spacing, steps)
        assert steps == reference(1000, k, spacing), k


@examples(200)
@given(
    n=st.integers(1, 3000),
    fraction=st.floats(0, 1),
    spacing=st.sampled_from(SPACINGS),
)
@example(n=1, fraction=0.0, spacing="strided")  # K = n = 1: DiT's loop has no stride at all
@example(n=15, fraction=0.9, spacing="trailing")  # K = 13: diffusers' arange gives 14
def test_any_count_of_any_chain_has_its_steps(n, fraction, spacing):
    k = 1 + round(fraction * (n - 1))  # 1 .. n
    steps = sampling_timesteps(n, k, spacing)
    check_promises(n, k, spacing, steps)
    assert steps == reference(n, k, spacing)


@pytest.mark.parametrize("steps", [0, -1, 1001, 2**70])
@pytest.mark.parametrize("spacing", SPACINGS)
def test_counts_outside_1_to_n_steps_are_refused_by_name(steps, spacing):
    with pytest.raises(ValueError, match=rf"steps.* must be .*got {steps}|steps \({steps}\)"):
        sampling_timesteps(1000, steps, spacing)


# -------------------------------------------------------------------------------- sampling


def bounded_eps(x, t):
    """A stand-in for a trained model: unit-scale output whatever x (as a net ending in a
    norm), depending on t."""
    return torch.tanh(x + t.to(x.dtype).view(-1, *[1] * (x.ndim - 1)) / 1000)


@examples(20)
@given(
    steps=st.integers(1, 1000),
    method=st.sampled_from(["ddim", "ddpm", "dpm-solver++"]),
    spacing=st.sampled_from([None, *SPACINGS]),
)
@example(steps=37, method="ddim", spacing=None)  # the CLI's crash: DDIM's default, strided
@example(steps=1, method="ddim", spacing=None)
@example(steps=1, method="ddpm", spacing=None)
def test_any_count_samples_finite_values_of_the_noise_shape(steps, method, spacing):
    noise = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(steps))
    out = Diffusion().sample(
        bounded_eps, noise, steps=steps, method=method, spacing=spacing,
        generator=torch.Generator().manual_seed(0),
    )
    assert out.shape == noise.shape and out.dtype == noise.dtype
    assert torch.isfinite(out).all()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny DiT forwards run ~50x slower when the suite's threads oversubscribe the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY = DIT_PRESETS["DiT-digits-tiny"]


def fresh_dit() -> DiT:
    torch.manual_seed(0)
    return DiT(TINY).eval()


def unit_scale_dit() -> DiT:
    """A DiT whose outputs are unit-scale and differ by class: every weight matrix redrawn
    (adaLN-Zero's zeros included), so guidance has something to amplify."""
    model = fresh_dit()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 / math.sqrt(p.shape[-1]))
    return model


def digits_noise(batch: int, seed: int) -> torch.Tensor:
    shape = (batch, TINY.in_channels, TINY.input_size, TINY.input_size)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


N_STEPS = st.sampled_from([30, 100, 1000])


@examples(8)
@given(n_steps=N_STEPS, fraction=st.floats(0, 1), spacing=st.sampled_from([None, *SPACINGS]))
@example(n_steps=1000, fraction=36 / 999, spacing=None)  # 37 of 1000, DDIM's default strided
def test_ddim_of_a_fresh_dit_scales_the_noise_by_its_first_steps_abar(
    one_thread, n_steps, fraction, spacing
):
    k = 1 + round(fraction * (min(n_steps, 60) - 1))  # 1 .. 60: 60 DiT forwards at most
    diffusion = Diffusion(n_steps, "linear" if n_steps > 20 else "cosine")
    labels = torch.tensor([0, 3, 9])
    eps_fn = guided_eps_fn(fresh_dit(), labels, guidance_scale=4.0, null_class=TINY.n_classes)
    noise = digits_noise(3, k)
    out = diffusion.sample(eps_fn, noise, steps=k, method="ddim", spacing=spacing)
    visited = sampling_timesteps(n_steps, k, spacing or "strided")
    abar = diffusion.noise_schedule.alphas_cumprod[visited[-1]]  # the walk's first, float64
    expected = (noise.double() / abar.sqrt()).float()
    # Each step multiplies x by float32 casts of two float64 coefficients (2 roundings) in two
    # products (2 more), eps re-derived as exactly 0: at most 4 u per step, one u for the
    # reference's own rounding (first order, u = 2**-24).
    rtol = (4 * k + 1) * u(torch.float32)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=0)


@examples(6)
@given(
    n_steps=N_STEPS,
    fraction=st.floats(0, 1),
    method=st.sampled_from(["ddim", "ddpm", "dpm-solver++"]),
    spacing=st.sampled_from([None, *SPACINGS]),
)
@example(n_steps=1000, fraction=0.0, method="ddim", spacing=None)  # 1 step: crashed before
def test_a_unit_scale_dit_samples_finite_digits_at_any_count(
    one_thread, n_steps, fraction, method, spacing
):
    k = 1 + round(fraction * (min(n_steps, 60) - 1))
    model = unit_scale_dit()
    labels = torch.tensor([1, 7])
    eps_fn = guided_eps_fn(model, labels, guidance_scale=4.0, null_class=TINY.n_classes)
    with torch.no_grad():
        probe = model(digits_noise(2, 0), torch.tensor([5, 5]), labels)
    assert 0.1 < probe.abs().max() < 10  # the premise: unit-scale outputs
    noise = digits_noise(2, k)
    out = Diffusion(n_steps).sample(
        eps_fn, noise, steps=k, method=method, spacing=spacing,
        generator=torch.Generator().manual_seed(0),
    )
    assert out.shape == noise.shape and torch.isfinite(out).all()


# -------------------------------------------------------------------------------- finiteness


def test_a_guidance_scale_that_overflows_raises_instead_of_returning_nan(one_thread):
    # The unit-scale DiT's halves differ by up to 0.05: s = 1e30 drives x_t far past 1.8e19,
    # where its LayerNorm's squares overflow float32 (measured: finite at s = 1e20, not 1e22).
    eps_fn = guided_eps_fn(
        unit_scale_dit(), torch.tensor([1, 7]), guidance_scale=1e30, null_class=TINY.n_classes
    )
    with pytest.raises(FloatingPointError, match=r"sampling \(ddim, 5 of 1000 steps, strided\) "
                       r"ended with \d+ non-finite of 128 values in torch.float32"):
        Diffusion().sample(eps_fn, digits_noise(2, 0), steps=5, method="ddim")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_noise_is_refused_before_sampling(bad):
    noise = torch.zeros(2, 1, 3)
    noise[1, 0, 2] = bad
    calls = []
    with pytest.raises(ValueError, match="noise must be finite, got 1 non-finite of 6 values"):
        Diffusion().sample(lambda x, t: calls.append(t) or x, noise, steps=3)
    assert calls == []


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_guidance_scales_are_refused_by_name(scale):
    with pytest.raises(ValueError, match=f"guidance_scale must be finite, got {scale}"):
        guided_eps_fn(fresh_dit(), torch.tensor([1]), guidance_scale=scale, null_class=10)
    with pytest.raises(ValueError, match=f"guidance_scale must be finite, got {scale}"):
        classifier_free_guidance(torch.zeros(2, 4, 8, 8), scale, n_guided=2)
    with pytest.raises(ValueError, match=f"guidance_scale must be finite, got {scale}"):
        fresh_dit().forward_with_cfg(
            torch.zeros(2, 1, 8, 8), torch.tensor([3, 3]), torch.tensor([1, 10]), scale
        )
