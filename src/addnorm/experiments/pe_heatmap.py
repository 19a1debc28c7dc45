"""Claim 1 (seed post 002): the sinusoidal encoding as a heat map (positions by dimensions).

Panels for several d_model and bases; the first is seed 002's "The dog ran fast" example
(d_model = 4, base = 100), its four rows printed on the cells. Seed 002 also notes that the
smaller d_model is, the faster the values change along the positions: measured here as the
mean |PE(p + 1) - PE(p)| per column.
"""

from __future__ import annotations

import torch

from addnorm.encodings import sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, new_figure

NAME = "pe-heatmap"
CLAIM = (
    "The sinusoidal position code stays in [-1, 1] for every d_model and base, and the "
    "smaller d_model is, the faster it changes along the positions."
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


def mean_step(d_model: int, base: float, n_positions: int) -> float:
    """Mean |PE(p + 1) - PE(p)| over positions and columns."""
    pe = sinusoidal_encoding(n_positions, d_model, base=base, dtype=torch.float64)  # (P, D)
    return (pe[1:] - pe[:-1]).abs().mean().item()


def run(*, quick: bool = False) -> Outcome:
    n_positions = 64 if quick else 128
    seed_pe = sinusoidal_encoding(4, 4, base=100.0, dtype=torch.float64)  # (P, D)
    seed_error = (seed_pe - torch.tensor(SEED_EXAMPLE, dtype=torch.float64)).abs().max().item()
    tables = {(d, b): sinusoidal_encoding(n_positions, d, base=b) for d, b in PANELS}
    max_abs = max(t.abs().max().item() for t in tables.values())
    dims = (4, 16, 64, 128, 512)
    steps = {d: mean_step(d, 10000.0, n_positions) for d in dims}
    slower_with_d = all(steps[a] > steps[b] for a, b in zip(dims, dims[1:], strict=False))
    supported = max_abs <= 1.0 and seed_error < 5e-5 and slower_with_d

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
        f"max |PE| = {max_abs:.4f} over {len(PANELS)} tables; seed example (d=4, base=100) "
        f"matches seed 002's digits to {seed_error:.1e}; mean step per position "
        + ", ".join(f"d={d}: {s:.3f}" for d, s in steps.items())
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"sinusoidal_encoding for positions 0..{n_positions - 1}, d_model in "
                f"{sorted({d for d, _ in PANELS})}, base 10000 and 100, plus seed 002's "
                "\"The dog ran fast\" table (d=4, base=100) compared with the digits it prints: "
                + "; ".join(f"pos {p} {row}" for p, row in enumerate(SEED_EXAMPLE)) + "."),
        numbers={"max_abs_value": max_abs, "seed_example_max_error": seed_error,
                 "mean_step_by_d_model": {str(d): s for d, s in steps.items()},
                 "step_falls_as_d_model_grows": slower_with_d},
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
