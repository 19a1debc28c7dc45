"""Seed post 004: the frequencies freqs[k] = exp(-ln(max_period) k / half), k = 0 ..
half - 1, "cover the range from about 1 to 1/max_period exponentially" (이 값들은 대략 (1)에서
(1/max_period) 사이를 지수적으로 커버하게 됩니다): freqs[0] = 1, freqs[half - 1] ~ 1/max_period.

The frequencies are read back from the embedding itself: at t = 1 the sine half holds
sin(f) with every f <= 1 < pi/2, so asin recovers f. Supported when the first is 1, the
ratio of neighbours is the same all along (exponential cover), and the last is the seed's
exp(-ln(max_period) (half - 1) / half), each to ``TOLERANCE`` (float64 rounding is ~1e-16).

A consequence the project adds, reported as its own reading: timesteps fed in [0, 1] instead
of 0..999 leave most channels nearly constant (their range over all timesteps below
``CONSTANT``, 2.5% of the [-1, 1] swing), while 0..999 moves most of them. The reading's
verdict is the same for every threshold in the range result.json reports.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from addnorm.experiments.outcome import Outcome, Reading, new_figure
from addnorm.timestep import timestep_embedding

NAME = "timestep-frequencies"
CLAIM = (
    "The timestep embedding's frequencies cover the range from 1 down to about 1/max_period "
    "exponentially."
)
UNIT_READING = (
    "A consequence the project adds: timesteps fed in [0, 1] instead of 0..999 leave most "
    "channels nearly constant."
)
SEEDS = ("004",)  # the seed posts the claim comes from
DIM, MAX_PERIOD = 256, 10000
CONSTANT = 0.05  # a channel whose range over all timesteps is below this barely moves
TOLERANCE = 1e-9
# (timesteps, dim, max_period) -> (N, dim); the tests pass a wrong one
Embedding = Callable[[torch.Tensor, int, float], torch.Tensor]


def _library(t: torch.Tensor, dim: int, max_period: float) -> torch.Tensor:
    return timestep_embedding(t, dim, max_period=max_period)


def frequencies(dim: int, max_period: float, embedding: Embedding = _library) -> torch.Tensor:
    """asin of the sine half at t = 1. Shapes: returns (dim // 2,)."""
    emb = embedding(torch.ones(1, dtype=torch.float64), dim, max_period)
    return torch.asin(emb[0, dim // 2 : 2 * (dim // 2)])  # [cos | sin] -> the sin half


def channel_ranges(t: torch.Tensor, embedding: Embedding = _library) -> torch.Tensor:
    """max - min of each channel over the timesteps t. Shapes: returns (DIM,)."""
    with warnings.catch_warnings():  # [0, 1] timesteps warn on purpose; that is the point
        warnings.simplefilter("ignore")
        emb = embedding(t, DIM, MAX_PERIOD)  # (N, DIM)
    return emb.amax(0) - emb.amin(0)


def run(*, quick: bool = False, embedding: Embedding = _library) -> Outcome:
    """``embedding``: the timestep embedding under test (default the library's)."""
    freqs = frequencies(DIM, MAX_PERIOD, embedding)
    half = DIM // 2
    expected_min = math.exp(-math.log(MAX_PERIOD) * (half - 1) / half)
    ratios = freqs[1:] / freqs[:-1]
    ratio_spread = (ratios.max() - ratios.min()).item() if half > 1 else 0.0
    supported = (abs(freqs[0].item() - 1.0) < TOLERANCE and ratio_spread < TOLERANCE
                 and abs(freqs[-1].item() - expected_min) < TOLERANCE)
    n_steps = 200 if quick else 1000
    integer_t = torch.linspace(0, 999, n_steps, dtype=torch.float64)
    unit_t = torch.linspace(0, 1, n_steps, dtype=torch.float64)
    ranges_int = channel_ranges(integer_t, embedding)
    ranges_unit = channel_ranges(unit_t, embedding)
    flat_int = int((ranges_int < CONSTANT).sum())
    flat_unit = int((ranges_unit < CONSTANT).sum())
    low, high = _same_verdict_range(ranges_int, ranges_unit)
    unit = Reading(
        claim=UNIT_READING, supported=flat_unit > DIM // 2 > flat_int,
        headline=(f"nearly constant channels (range < {CONSTANT}): {flat_int}/{DIM} for "
                  f"t = 0..999, {flat_unit}/{DIM} for t in [0, 1]; the verdict is the same for "
                  f"any threshold from {low:.3g} to {high:.3g}"),
    )

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
        f"{1 / MAX_PERIOD:.0e}; the seed's last one {expected_min:.3e}), neighbour ratio "
        f"{ratios.mean().item():.5f} everywhere to {ratio_spread:.1e}"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"timestep_embedding(t, {DIM}, max_period={MAX_PERIOD}) in float64; "
                f"frequencies read back at t = 1; channel ranges over {n_steps} timesteps "
                f"evenly spaced in 0..999 and in [0, 1]; 'nearly constant' = range < "
                f"{CONSTANT}."),
        numbers={"freq_max": freqs[0].item(), "freq_min": freqs[-1].item(),
                 "expected_freq_min": expected_min, "neighbour_ratio_spread": ratio_spread,
                 "constant_channels_t_0_999": flat_int, "constant_channels_t_0_1": flat_unit,
                 "constant_threshold": CONSTANT, "same_verdict_thresholds": [low, high],
                 "dim": DIM},
        figure=fig, also=(unit,),
    )


def _same_verdict_range(ranges_int: torch.Tensor, ranges_unit: torch.Tensor
                        ) -> tuple[float, float]:
    """The thresholds c around ``CONSTANT`` for which (channels with range < c) stays more
    than half for t in [0, 1] and less than half for t = 0..999: between the (DIM/2 + 1)-th
    smallest range in [0, 1] and the (DIM/2)-th smallest in 0..999."""
    unit_sorted, int_sorted = ranges_unit.sort().values, ranges_int.sort().values
    return unit_sorted[DIM // 2].item(), int_sorted[DIM // 2 - 1].item()
