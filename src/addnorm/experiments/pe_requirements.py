"""Seed post 002: the five requirements of a position code (``REQUIREMENTS``), and its
verdicts on four codes: the raw index breaks 2 and 3, the index divided by the length breaks
1 ("index 1 is 0.5 in a length-3 sequence, 0.14 in a length-8 one"), the binary code is
discrete (its steps are not a distance, 4), and the sinusoids meet all five.

Each requirement becomes one number with a pass threshold argued from the requirement, not
from the verdicts:

1. same value whatever the length: max |c(p) in a length-3 sequence - c(p) in a length-512
   one| over p < 3; "the same" = equal up to float64 rounding (``ROUNDING``);
2. not large next to the embeddings: max |entry| over 512 positions, at most ``LARGE`` = 3:
   the scaled token embeddings it is added to have N(0, 1) entries, so an entry beyond three
   of their standard deviations is large next to them;
3. not growing fast: max |entry| at 512 positions / at 64 positions, at most ``FAST`` =
   sqrt(8): a bounded code has 1, one growing like the position has 8 (the positions grew
   8x); sqrt(8) is the midpoint between the two on a log scale;
4. a difference of positions acts as a distance: how much ||c(p + k) - c(p)|| varies with p
   for fixed k = 1..8, relative to its mean: equal for every p up to rounding;
5. different for every position: min ||c(p) - c(q)|| over p != q < 512, above rounding.

result.json also reports, for requirements 2 and 3, the range of thresholds that gives the
same passes and failures, so a reader sees how far the verdict is from hinging on them.
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
ROUNDING = 1e-9  # float64 codes of positions < 512: rounding is ~1e-13
LARGE = 3.0
FAST = 8**0.5
REQUIREMENTS = (
    ("1. same value\nfor any length", "length_dependence", lambda v: v < ROUNDING),
    ("2. small next to\nembeddings", "max_abs_entry", lambda v: v <= LARGE),
    ("3. does not\ngrow fast", "growth_64_to_512", lambda v: v <= FAST),
    ("4. difference\nacts as distance", "distance_spread", lambda v: v < ROUNDING),
    ("5. distinct\npositions", "min_distance", lambda v: v > ROUNDING),
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


def same_verdict_range(values: list[float], threshold: float) -> tuple[float, float]:
    """The thresholds t (pass: value <= t) that pass and fail the same values as
    ``threshold``: from the largest passing value to the smallest failing one."""
    passing = [v for v in values if v <= threshold]
    failing = [v for v in values if v > threshold]
    return (max(passing, default=0.0), min(failing, default=float("inf")))


def run(*, quick: bool = False, codes: dict[str, Code] | None = None) -> Outcome:
    """``codes``: replaces any of :data:`CODES` (same names); the tests pass a code that
    breaks a requirement the seed says it meets, a world where the claim is false."""
    codes = CODES | (codes or {})
    numbers = {name: measure(code) for name, code in codes.items()}
    passes = {name: [bool(ok(numbers[name][key])) for _, key, ok in REQUIREMENTS]
              for name in codes}
    failures = {name: {i + 1 for i, ok in enumerate(p) if not ok} for name, p in passes.items()}
    supported = failures == EXPECTED_FAILURES
    ranges = {key: same_verdict_range([numbers[n][key] for n in codes], limit)
              for key, limit in (("max_abs_entry", LARGE), ("growth_64_to_512", FAST))}

    fig = new_figure(14, 5.5)
    left, right = fig.subplots(1, 2, width_ratios=[1.6, 1])
    grid = torch.tensor([[1.0 if ok else 0.0 for ok in passes[name]] for name in codes])
    left.imshow(grid.numpy(), cmap="RdYlGn", vmin=-0.3, vmax=1.3, aspect="auto")
    for row, name in enumerate(codes):
        for col, (_, key, _) in enumerate(REQUIREMENTS):
            mark = "pass" if passes[name][col] else "FAIL"
            left.text(col, row, f"{mark}\n{numbers[name][key]:.3g}", ha="center",
                      va="center", fontsize=11)
    left.set_xticks(range(len(REQUIREMENTS)), [label for label, _, _ in REQUIREMENTS])
    left.set_yticks(range(len(codes)), list(codes))
    left.set_title(f"Requirements of a position code ({N_POSITIONS} positions)")
    for name, code in codes.items():
        steps = (code(N_POSITIONS)[1:] - code(N_POSITIONS)[:-1]).norm(dim=-1)  # (P - 1,)
        right.plot(steps[:70].numpy(), label=name, linewidth=2)
    right.set(title="||c(p + 1) - c(p)||: one step apart, for each p",
              xlabel="position p (token index)", ylabel="distance (code units)", yscale="log")
    right.legend()
    right.grid(alpha=0.3, which="both")
    headline = "; ".join(
        f"{name}: " + (("fails " + ", ".join(str(r) for r in sorted(f))) if f else "passes all")
        for name, f in failures.items()
    ) + (
        "; thresholds 2 and 3 give the same verdicts anywhere in "
        + " and ".join(f"[{a:.3g}, {b:.3g})" for a, b in ranges.values())
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"Codes for {N_POSITIONS} positions: p, p / (n - 1), {N_BITS}-bit binary, "
                f"sinusoidal_encoding with d_model {D_MODEL}; each requirement measured as "
                f"described in addnorm.experiments.pe_requirements (thresholds: rounding "
                f"{ROUNDING:g} for 'the same' and 'distinct', entries at most {LARGE:g}, growth "
                f"at most {FAST:.3g}) and compared with seed 002's verdicts."),
        numbers={"measurements": numbers,
                 "failed_requirements": {n: sorted(f) for n, f in failures.items()},
                 "thresholds": {"rounding": ROUNDING, "large": LARGE, "fast": FAST},
                 "same_verdict_threshold_ranges": ranges},
        figure=fig,
    )
