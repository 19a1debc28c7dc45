"""``Diffusion.sample``'s behaviour at its boundary: arguments, defaults, randomness, output.

Numerical agreement with DiT and diffusers is in test_sampling_reference.py, the analytic
oracle in test_oracle.py. Oracles here: the v <-> eps identity (a v-model and the eps-model it
implies sample the same chain), determinism of the generator, and the arguments' contracts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_host_reads import CountReads
from tolerances import FLOAT64_EXACT

from addnorm.diffusion import Diffusion, guided_eps_fn
from addnorm.dit import DIT_PRESETS, DiT

ABAR = torch.from_numpy(np.cumprod(1.0 - np.linspace(1e-4, 0.02, 1000)))


def eps_fn(x, t):
    return torch.tanh(x) * 0.5 + t.to(x.dtype).view(-1, 1) / 2000


def eps_fn_any_shape(x, t):
    return torch.tanh(x) * 0.5


def start(batch=4, channels=3, seed=0):
    return torch.randn(batch, channels, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", ["ddpm", "ddim", "dpm-solver++"])
def test_v_model_samples_as_the_eps_model_it_implies(method):
    # v = (eps - sqrt(1 - abar) x_t) / sqrt(abar), so eps = sqrt(abar) v + sqrt(1 - abar) x_t.
    def v_fn(x, t):
        abar = ABAR[t].to(x.dtype).view(-1, 1)
        return (eps_fn(x, t) - (1 - abar).sqrt() * x) / abar.sqrt()

    x_T = start().double()
    kwargs = dict(steps=20, method=method)
    if method == "ddpm":
        kwargs["generator"] = torch.Generator().manual_seed(1)
    eps_samples = Diffusion().sample(eps_fn, x_T, **kwargs)
    if method == "ddpm":
        kwargs["generator"] = torch.Generator().manual_seed(1)
    v_samples = Diffusion(prediction="v").sample(v_fn, x_T, **kwargs)
    # float64, 20 steps; v -> eps costs a few roundings of unit-scale values: FLOAT64_EXACT.
    torch.testing.assert_close(v_samples, eps_samples, **FLOAT64_EXACT)


def test_ddpm_is_reproducible_with_a_generator_and_ddim_needs_none():
    x_T = start()
    a = Diffusion().sample(eps_fn, x_T, steps=10, generator=torch.Generator().manual_seed(3))
    b = Diffusion().sample(eps_fn, x_T, steps=10, generator=torch.Generator().manual_seed(3))
    c = Diffusion().sample(eps_fn, x_T, steps=10, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    state = torch.get_rng_state()
    d = Diffusion().sample(eps_fn, x_T, steps=10, method="ddim")
    assert torch.equal(torch.get_rng_state(), state)  # eta 0 draws nothing
    assert torch.equal(d, Diffusion().sample(eps_fn, x_T, steps=10, method="ddim"))


def test_default_steps_is_the_full_chain_and_output_keeps_shape_and_dtype():
    x_T = start(2, 1, 5).reshape(2, 1, 1, 1).double()
    full = Diffusion(50, "cosine").sample(
        eps_fn_any_shape, x_T, generator=torch.Generator().manual_seed(0)
    )
    same = Diffusion(50, "cosine").sample(
        eps_fn_any_shape, x_T, steps=50, generator=torch.Generator().manual_seed(0)
    )
    assert full.shape == x_T.shape and full.dtype == torch.float64
    assert torch.equal(full, same)


def test_ddim_eta_one_over_all_steps_is_ddpm_with_the_posterior_variance():
    # sigma(eta=1)^2 = (1 - abar') / (1 - abar) * (1 - abar / abar') = the posterior variance;
    # a learned-variance output of -1 everywhere selects that variance in DDPM.
    def small_variance(x, t):
        return torch.cat([eps_fn(x, t), -torch.ones_like(x)], dim=1)

    x_T = start().double()
    ddim = Diffusion().sample(
        eps_fn,
        x_T,
        steps=25,
        method="ddim",
        eta=1.0,
        spacing="sections",
        generator=torch.Generator().manual_seed(5),
    )
    ddpm = Diffusion().sample(
        small_variance, x_T, steps=25, generator=torch.Generator().manual_seed(5)
    )
    # float64, 25 steps, sigma by two formulas (one through exp(log)): FLOAT64_EXACT.
    torch.testing.assert_close(ddim, ddpm, **FLOAT64_EXACT)


def test_progress_bar_only_when_asked(capsys):
    Diffusion().sample(eps_fn, start(), steps=3, method="ddim")
    assert capsys.readouterr() == ("", "")
    Diffusion().sample(eps_fn, start(), steps=3, method="ddim", progress=True)
    assert "3/3" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((None, start()), {}, TypeError, "eps_fn must be callable, got NoneType"),
        ((eps_fn, start()[0]), {}, ValueError, r"noise must have shape \(B, C, ...\), got \(3,\)"),
        ((eps_fn, start().long()), {}, TypeError, "noise must be a floating-point tensor"),
        (
            (eps_fn, start()),
            dict(method="euler"),
            ValueError,
            "method must be one of 'ddpm', 'ddim', 'dpm-solver\\+\\+'; got 'euler'",
        ),
        (
            (eps_fn, start()),
            dict(steps=1001),
            ValueError,
            r"steps \(1001\) must be <= n_steps \(1000\)",
        ),
        ((eps_fn, start()), dict(steps=0), ValueError, "steps must be >= 1, got 0"),
        ((eps_fn, start()), dict(spacing="uniform"), ValueError, "spacing must be one of"),
        ((eps_fn, start()), dict(eta=0.5), ValueError, "eta applies to method='ddim' only"),
        (
            (eps_fn, start()),
            dict(eta=0.5, method="dpm-solver++"),
            ValueError,
            r"eta applies to method='ddim' only, got eta=0.5 with 'dpm-solver\+\+'",
        ),
        ((eps_fn, start()), dict(eta=-1.0, method="ddim"), ValueError, "eta must be >= 0.0"),
        (
            (eps_fn, start()),
            dict(eta=1.5, method="ddim"),
            ValueError,
            "eta must be <= 1.0, got 1.5",
        ),
        ((eps_fn, start()), dict(generator=0), TypeError, "generator must be a torch.Generator"),
        ((eps_fn, start()), dict(clip_denoised=1), TypeError, "clip_denoised must be a bool"),
        (
            (lambda x, t: x[:, :2], start()),
            dict(steps=5),
            ValueError,
            r"eps_fn output at t=999 must have shape \(4, 3\) \(the data's\) or \(4, 6\) "
            r"\(with learned variance\), got \(4, 2\)",
        ),
        (
            (lambda x, t: None, start()),
            dict(steps=5),
            TypeError,
            "eps_fn output at t=999 must be a torch.Tensor, got NoneType",
        ),
    ],
)
def test_bad_sampling_arguments_are_refused_naming_the_values(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        Diffusion().sample(*args, **kwargs)


# ------------------------------------------------------------------- host reads per step


def dit_sampling_reads(conditioning: str, method: str, steps: int, checked: bool) -> int:
    """Values read back by one ``sample`` of a tiny DiT, counted as tests/test_host_reads.py
    counts them (an exact count of the reading calls, on the CPU, where the code takes the
    same path as on an accelerator)."""
    cfg = dataclasses.replace(DIT_PRESETS["DiT-digits-tiny"], conditioning=conditioning)
    dit = DiT(cfg).eval()
    y = torch.tensor([3, 1, 4])
    if checked:
        eps_fn = guided_eps_fn(dit, y, guidance_scale=2.0, null_class=cfg.n_classes)
    else:  # the model's top-level call with plain labels: it checks them at every call
        eps_fn = guided_eps_fn(lambda x, t, labels: dit(x, t, labels), y, guidance_scale=2.0,
                               null_class=cfg.n_classes)
    noise = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), CountReads() as counter:
        Diffusion().sample(eps_fn, noise, steps=steps, method=method,
                           generator=torch.Generator().manual_seed(1))
    return counter.total


@pytest.mark.parametrize("conditioning", ["shared", "per_block"])
@pytest.mark.parametrize("method", ["ddim", "ddpm", "dpm-solver++"])
def test_sampling_a_dit_reads_nothing_back_per_step(conditioning, method):
    # A sample call reads a fixed number of values (the noise's and the result's finiteness,
    # the schedule's CPU tables), whatever the number of steps; guided_eps_fn had the labels
    # checked once, when it was made.
    reads = {k: dit_sampling_reads(conditioning, method, k, checked=True) for k in (2, 9)}
    assert reads[9] == reads[2]
    # The count sees each read: called with plain labels, the DiT reads them at every step.
    assert dit_sampling_reads(conditioning, method, 9, checked=False) == reads[2] + 9
