"""Claim 3 (seed post 002): the five requirements of a position code (``REQUIREMENTS``),
checked for the raw index, the length-normalized index, a binary code and the sinusoids.

Each requirement becomes one number with a pass threshold:

1. same value whatever the length: max |c(p) in a length-3 sequence - c(p) in a length-512
   one| over p < 3 (must be 0);
2. not large next to the embeddings (entries of scale ~1): max |entry| over 512 positions
   (must be <= 1);
3. not growing fast: max |entry| at 512 positions / at 64 positions (must be <= 1.5);
4. a difference of positions acts as a distance: how much ||c(p + k) - c(p)|| varies with p
   for fixed k = 1..8, relative to its mean (must be < 1e-6; a smooth code keeps it 0);
5. different for every position: min ||c(p) - c(q)|| over p != q < 512 (must be > 0).

Seed 002 rejects the raw index (2, 3), the normalized index (1) and the binary code (discrete,
so 4); the sinusoids meet all five.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from addnorm.encodings import sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, new_figure

NAME = "pe-requirements"
CLAIM = (
    "Of the raw index, the length-normalized index, a binary code and the sinusoids, only "
    "the sinusoids meet all five requirements of a position code."
)
SEEDS = ("002",)  # the seed posts the claim comes from
N_POSITIONS, D_MODEL, N_BITS = 512, 64, 10
Code = Callable[[int], torch.Tensor]  # sequence length -> (P, width) codes of its positions

CODES: dict[str, Code] = {
    "raw index": lambda n: torch.arange(n, dtype=torch.float64)[:, None],
    "normalized index": lambda n: (torch.arange(n, dtype=torch.float64) / (n - 1))[:, None],
    "binary": lambda n: ((torch.arange(n)[:, None] >> torch.arange(N_BITS)) & 1).double(),
    "sinusoidal": lambda n: sinusoidal_encoding(n, D_MODEL, dtype=torch.float64),
}
REQUIREMENTS = (
    ("1. same value\nfor any length", "length_dependence", lambda v: v == 0),
    ("2. small next to\nembeddings", "max_abs_entry", lambda v: v <= 1),
    ("3. does not\ngrow fast", "growth_64_to_512", lambda v: v <= 1.5),
    ("4. difference\nacts as distance", "distance_spread", lambda v: v < 1e-6),
    ("5. distinct\npositions", "min_distance", lambda v: v > 0),
)
# Seed 002's verdicts: which requirements each code breaks.
EXPECTED_FAILURES = {"raw index": {2, 3}, "normalized index": {1}, "binary": {4},
                     "sinusoidal": set()}


def measure(code: Code) -> dict[str, float]:
    """The five numbers of the module docstring for one code."""
    long, short = code(N_POSITIONS), code(3)  # (P, W)
    spreads = []
    for k in range(1, 9):
        dist = (long[k:] - long[:-k]).norm(dim=-1)  # (P - k,)
        spreads.append(((dist.max() - dist.min()) / dist.mean()).item())
    pairwise = torch.cdist(long, long)  # (P, P)
    pairwise.fill_diagonal_(float("inf"))
    return {
        "length_dependence": (short - long[:3]).abs().max().item(),
        "max_abs_entry": long.abs().max().item(),
        "growth_64_to_512": long.abs().max().item() / code(64).abs().max().item(),
        "distance_spread": max(spreads),
        "min_distance": pairwise.min().item(),
    }


def run(*, quick: bool = False) -> Outcome:
    numbers = {name: measure(code) for name, code in CODES.items()}
    passes = {name: [bool(ok(numbers[name][key])) for _, key, ok in REQUIREMENTS]
              for name in CODES}
    failures = {name: {i + 1 for i, ok in enumerate(p) if not ok} for name, p in passes.items()}
    supported = failures == EXPECTED_FAILURES

    fig = new_figure(14, 5.5)
    left, right = fig.subplots(1, 2, width_ratios=[1.6, 1])
    grid = torch.tensor([[1.0 if ok else 0.0 for ok in passes[name]] for name in CODES])
    left.imshow(grid.numpy(), cmap="RdYlGn", vmin=-0.3, vmax=1.3, aspect="auto")
    for row, name in enumerate(CODES):
        for col, (_, key, _) in enumerate(REQUIREMENTS):
            mark = "pass" if passes[name][col] else "FAIL"
            left.text(col, row, f"{mark}\n{numbers[name][key]:.3g}", ha="center",
                      va="center", fontsize=11)
    left.set_xticks(range(len(REQUIREMENTS)), [label for label, _, _ in REQUIREMENTS])
    left.set_yticks(range(len(CODES)), list(CODES))
    left.set_title(f"Requirements of a position code ({N_POSITIONS} positions)")
    for name, code in CODES.items():
        steps = (code(N_POSITIONS)[1:] - code(N_POSITIONS)[:-1]).norm(dim=-1)  # (P - 1,)
        right.plot(steps[:70].numpy(), label=name, linewidth=2)
    right.set(title="||c(p + 1) - c(p)||: one step apart, for each p",
              xlabel="position p (token index)", ylabel="distance (code units)", yscale="log")
    right.legend()
    right.grid(alpha=0.3, which="both")
    headline = "; ".join(
        f"{name}: " + (("fails " + ", ".join(str(r) for r in sorted(f))) if f else "passes all")
        for name, f in failures.items()
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"Codes for {N_POSITIONS} positions: p, p / (n - 1), {N_BITS}-bit binary, "
                f"sinusoidal_encoding with d_model {D_MODEL}; each requirement measured as "
                "described in addnorm.experiments.pe_requirements and compared with seed 002's "
                "verdicts."),
        numbers={"measurements": numbers,
                 "failed_requirements": {n: sorted(f) for n, f in failures.items()}},
        figure=fig,
    )
