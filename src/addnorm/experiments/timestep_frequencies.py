"""Claim 9 (seed post 004): the diffusion timestep embedding's frequencies span 1 .. 1/max_period.

The frequencies are read back from the embedding itself: at t = 1 the sine half holds
sin(f) with every f <= 1 < pi/2, so asin recovers f. The second panel shows why the input
range matters: timesteps fed in [0, 1] instead of 0..999 leave most channels nearly constant.
"""

from __future__ import annotations

import warnings

import torch

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.timestep import timestep_embedding

NAME = "timestep-frequencies"
CLAIM = (
    "timestep_embedding's frequencies run from 1 down to about 1/max_period, so timesteps "
    "fed in [0, 1] instead of 0..999 leave most channels nearly constant."
)
SEEDS = ("004",)  # the seed posts the claim comes from
DIM, MAX_PERIOD = 256, 10000
CONSTANT = 0.05  # a channel whose range over all timesteps is below this barely moves


def frequencies(dim: int, max_period: float) -> torch.Tensor:
    """asin of the sine half at t = 1. Shapes: returns (dim // 2,)."""
    emb = timestep_embedding(torch.ones(1, dtype=torch.float64), dim, max_period=max_period)
    return torch.asin(emb[0, dim // 2 : 2 * (dim // 2)])  # [cos | sin] -> the sin half


def channel_ranges(t: torch.Tensor) -> torch.Tensor:
    """max - min of each channel over the timesteps t. Shapes: returns (DIM,)."""
    with warnings.catch_warnings():  # [0, 1] timesteps warn on purpose; that is the point
        warnings.simplefilter("ignore")
        emb = timestep_embedding(t, DIM, max_period=MAX_PERIOD)  # (N, DIM)
    return emb.amax(0) - emb.amin(0)


def run(*, quick: bool = False) -> Outcome:
    freqs = frequencies(DIM, MAX_PERIOD)
    half = DIM // 2
    expected_min = MAX_PERIOD ** (-(half - 1) / half)
    n_steps = 200 if quick else 1000
    integer_t = torch.linspace(0, 999, n_steps, dtype=torch.float64)
    unit_t = torch.linspace(0, 1, n_steps, dtype=torch.float64)
    ranges_int, ranges_unit = channel_ranges(integer_t), channel_ranges(unit_t)
    flat_int = int((ranges_int < CONSTANT).sum())
    flat_unit = int((ranges_unit < CONSTANT).sum())
    supported = (abs(freqs[0].item() - 1.0) < 1e-9 and abs(freqs[-1].item() - expected_min)
                 < 1e-9 and flat_unit > DIM // 2 > flat_int)

    fig = new_figure(13, 5)
    left, right = fig.subplots(1, 2)
    left.semilogy(freqs.numpy(), "o", markersize=3, label="frequency of channel k")
    left.axhline(1.0, color="tab:green", linestyle="--", label="1")
    left.axhline(1 / MAX_PERIOD, color="tab:red", linestyle="--", label="1 / max_period")
    left.set(title=f"Frequencies, dim = {DIM}, max_period = {MAX_PERIOD}",
             xlabel="channel index k in each half", ylabel="frequency (radians per timestep)")
    left.legend()
    left.grid(alpha=0.3, which="both")
    right.semilogy(ranges_int.clamp_min(1e-8).numpy(), ".", label="t = 0..999")
    right.semilogy(ranges_unit.clamp_min(1e-8).numpy(), ".", label="t in [0, 1]")
    right.axhline(CONSTANT, color="black", linestyle=":", label=f"nearly constant (< {CONSTANT})")
    right.axvline(half - 0.5, color="gray", linewidth=0.8)
    right.set(title="How far each channel moves over all timesteps",
              xlabel="channel (first half cos, second half sin)",
              ylabel="max - min over timesteps (unitless)")
    right.legend(loc="lower left")
    right.grid(alpha=0.3, which="both")
    headline = (
        f"frequencies {freqs[0].item():.4f} .. {freqs[-1].item():.3e} (1/max_period = "
        f"{1 / MAX_PERIOD:.0e}); nearly constant channels: {flat_int}/{DIM} for t = 0..999, "
        f"{flat_unit}/{DIM} for t in [0, 1]"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"timestep_embedding(t, {DIM}, max_period={MAX_PERIOD}) in float64; "
                f"frequencies read back at t = 1; channel ranges over {n_steps} timesteps "
                f"evenly spaced in 0..999 and in [0, 1]; 'nearly constant' = range < "
                f"{CONSTANT}."),
        numbers={"freq_max": freqs[0].item(), "freq_min": freqs[-1].item(),
                 "expected_freq_min": expected_min, "constant_channels_t_0_999": flat_int,
                 "constant_channels_t_0_1": flat_unit, "dim": DIM},
        figure=fig,
    )
