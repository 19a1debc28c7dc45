"""Seed post 002: drawn as a heat map, "the smaller d_model is, the more sensitively the
positional encoding values change with the position, because the periods of the sin and cos
functions get shorter" (d_model 이 작을 수록 Positional Encoding 값이 Position 변화에 민감하게
바뀌는 것을 알 수 있습니다), next to its worked example for d = 4, n = 100.

Panels for several d_model and bases; the first is seed 002's "The dog ran fast" example
(d_model = 4, base = 100), its four rows printed on the cells. The sensitivity is measured as
the mean |PE(p + 1) - PE(p)| over positions and columns (base 10000), for d_model = 4, 16,
64, 128, 512: it must fall at every step up in d_model (the numbers are exact up to float64
rounding, ~1e-16, so any decrease counts), and the example must match the printed digits to
half a unit of their last place (5e-5). That the values stay in [-1, 1] is shown but not
counted: sin and cos cannot leave it, so it could not fail.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from addnorm.encodings import sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, new_figure

NAME = "pe-heatmap"
CLAIM = (
    "The smaller d_model is, the more sensitively the sinusoidal position code changes with "
    "the position (its periods are shorter); for d = 4, base 100 its rows are seed 002's "
    "printed values."
)
SEEDS = ("002",)  # the seed posts the claim comes from
# Seed 002's "The dog ran fast": rows for positions 0..3 with d_model = 4 and base = 100.
SEED_EXAMPLE = [
    [0.0, 1.0, 0.0, 1.0],
    [0.8415, 0.5403, 0.0998, 0.9950],
    [0.9093, -0.4161, 0.1987, 0.9801],
    [0.1411, -0.9900, 0.2955, 0.9553],
]
PANELS = ((16, 10000.0), (64, 10000.0), (512, 10000.0), (64, 100.0), (512, 100.0))
DIMS = (4, 16, 64, 128, 512)
DIGITS = 5e-5  # half a unit of the last printed digit
# (n_positions, d_model, base) -> (P, D) float64 table; the tests pass a code whose periods
# do not depend on d_model, a world where the claim is false.
Encoding = Callable[[int, int, float], torch.Tensor]


def _sinusoids(n_positions: int, d_model: int, base: float) -> torch.Tensor:
    return sinusoidal_encoding(n_positions, d_model, base=base, dtype=torch.float64)


def mean_step(encoding: Encoding, d_model: int, base: float, n_positions: int) -> float:
    """Mean |PE(p + 1) - PE(p)| over positions and columns."""
    pe = encoding(n_positions, d_model, base)  # (P, D)
    return (pe[1:] - pe[:-1]).abs().mean().item()


def run(*, quick: bool = False, encoding: Encoding = _sinusoids) -> Outcome:
    """``encoding``: the code under test (default the library's sinusoids)."""
    n_positions = 64 if quick else 128
    seed_pe = encoding(4, 4, 100.0)  # (P, D)
    seed_error = (seed_pe - torch.tensor(SEED_EXAMPLE, dtype=torch.float64)).abs().max().item()
    tables = {(d, b): encoding(n_positions, d, b).float() for d, b in PANELS}
    max_abs = max(t.abs().max().item() for t in tables.values())
    steps = {d: mean_step(encoding, d, 10000.0, n_positions) for d in DIMS}
    slower_with_d = all(steps[a] > steps[b] for a, b in zip(DIMS, DIMS[1:], strict=False))
    supported = seed_error < DIGITS and slower_with_d

    fig = new_figure(15, 7.5)
    axes = fig.subplots(2, 3)
    _draw_seed_example(axes[0, 0], seed_pe)
    images = []
    for ax, (d_model, base) in zip(axes.flat[1:], PANELS, strict=True):
        images.append(ax.imshow(tables[d_model, base].numpy(), cmap="RdBu_r", vmin=-1, vmax=1,
                                aspect="auto", interpolation="nearest"))
        ax.set(title=f"d_model = {d_model}, base = {base:g}", xlabel="dimension (column index)",
               ylabel="position (token index)")
    fig.colorbar(images[-1], ax=axes, shrink=0.6, label="PE value (unitless, in [-1, 1])")
    fig.suptitle(f"Sinusoidal positional encoding, positions 0..{n_positions - 1} "
                 "(even columns sin, odd columns cos)", fontsize=14)
    headline = (
        "mean step per position (base 10000) "
        + ", ".join(f"d={d}: {s:.3f}" for d, s in steps.items())
        + f"; seed example (d=4, base=100) off seed 002's digits by {seed_error:.1e}; values "
        f"within [-1, 1] (max |PE| {max_abs:.4f})"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"sinusoidal_encoding for positions 0..{n_positions - 1}, d_model in "
                f"{sorted({d for d, _ in PANELS})}, base 10000 and 100, plus seed 002's "
                "\"The dog ran fast\" table (d=4, base=100) compared with the digits it prints: "
                + "; ".join(f"pos {p} {row}" for p, row in enumerate(SEED_EXAMPLE)) + "."),
        numbers={"max_abs_value": max_abs, "seed_example_max_error": seed_error,
                 "mean_step_by_d_model": {str(d): s for d, s in steps.items()},
                 "step_falls_as_d_model_grows": slower_with_d, "digits_tolerance": DIGITS},
        figure=fig,
    )


def _draw_seed_example(ax, pe: torch.Tensor) -> None:
    """Seed 002's table, each cell labelled with its value."""
    ax.imshow(pe.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    words = ["The", "dog", "ran", "fast"]
    for pos in range(4):
        for col in range(4):
            value = pe[pos, col].item()
            ax.text(col, pos, f"{value:.4f}", ha="center", va="center", fontsize=11,
                    color="white" if abs(value) > 0.6 else "black")
    ax.set_xticks(range(4), ["sin w0", "cos w0", "sin w1", "cos w1"])
    ax.set_yticks(range(4), [f"{p}: {w}" for p, w in enumerate(words)])
    ax.set(title="Seed 002 example: d_model = 4, base = 100", xlabel="dimension",
           ylabel="position: word")
    for side in ax.spines.values():
        side.set_edgecolor("black")
        side.set_linewidth(2.5)
