"""Repeated runs: when one set of runs beats another beyond their run-to-run spread.

A training-based verdict compares one number (a final loss, the steps to a target accuracy)
over ``N_RUNS`` runs per variant that differ only in their random seed (initialisation and
batches). "A is larger than B beyond the spread" is the exact one-sided Wilcoxon rank-sum
(Mann-Whitney) test at the 5% level: pooled and dealt into the two groups at random, the
values would put A's ranks at least this high with probability at most ``SIGNIFICANCE``.
With 3 runs a side the smallest such probability is 1/20 = 0.05, reached only when every run
of A beats every run of B: the two ranges over seeds do not overlap, so the difference of
the means exceeds the spread. The threshold comes from a null model (no difference between A
and B), not from the answer a claim expects; with more runs a side (12 initialisations in
postln-vs-preln) the same test tolerates some overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = ["N_RUNS", "SIGNIFICANCE", "draw_runs", "larger", "rank_sum_p", "smaller", "spread"]

N_RUNS = 3  # seeds per variant in every training-based experiment
SIGNIFICANCE = 0.05


def rank_sum_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Exact one-sided p-value that ``a`` ranks above ``b`` by chance (ties share ranks).

    NaN counts as larger than every number (a diverged loss is the worst loss); callers
    turn "never reached" into a value past the end of the run before calling.
    """
    if not a or not b:
        raise ValueError(f"both groups need runs, got {len(a)} and {len(b)}")
    pooled = sorted([*a, *b], key=_order)
    twice_rank: list[int] = []  # 2 x midrank, an integer even with ties
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and _order(pooled[j + 1]) == _order(pooled[i]):
            j += 1
        twice_rank += [i + j + 2] * (j - i + 1)
        i = j + 1
    rank_of = {}
    for value, rank in zip(pooled, twice_rank, strict=True):
        rank_of[_order(value)] = rank
    observed = sum(rank_of[_order(v)] for v in a)
    counts = _subset_sums(tuple(twice_rank), len(a))
    extreme = sum(n for total, n in counts.items() if total >= observed)
    return extreme / math.comb(len(pooled), len(a))


def larger(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether ``a``'s runs are larger than ``b``'s beyond their spread (module docstring)."""
    return rank_sum_p(a, b) <= SIGNIFICANCE


def smaller(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether ``a``'s runs are smaller than ``b``'s beyond their spread."""
    return rank_sum_p(b, a) <= SIGNIFICANCE


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, min, max and every run's value, for a result.json."""
    finite = [v for v in values if math.isfinite(v)]
    mean = sum(finite) / len(finite) if len(finite) == len(values) else math.nan
    return {"mean": mean, "min": min(values, key=_order), "max": max(values, key=_order),
            "runs": list(values)}


def draw_runs(ax, x: Sequence[float], runs: Sequence[Sequence[float]], *, label: str,
              color: str | None = None, marker: str = "o") -> None:
    """Each run as a faint point, the mean as a line, the min-max band over runs shaded.

    ``runs[i]`` holds the values of every seed at ``x[i]``.
    """
    means = [sum(r) / len(r) for r in runs]
    lows, highs = [min(r) for r in runs], [max(r) for r in runs]
    (line,) = ax.plot(x, means, marker + "-", color=color, linewidth=2,
                      label=f"{label} (mean of {len(runs[0])} seeds, band: min-max)")
    ax.fill_between(x, lows, highs, color=line.get_color(), alpha=0.2)
    for xi, r in zip(x, runs, strict=True):
        ax.plot([xi] * len(r), r, marker, color=line.get_color(), alpha=0.35, markersize=4)


def _order(value: float) -> float:
    return math.inf if math.isnan(value) else value


@lru_cache(maxsize=64)
def _subset_sums(weights: tuple[int, ...], size: int) -> dict[int, int]:
    """How many ``size``-element subsets of ``weights`` have each total."""
    table: list[dict[int, int]] = [dict() for _ in range(size + 1)]
    table[0][0] = 1
    for w in weights:
        for k in range(size, 0, -1):
            for total, n in table[k - 1].items():
                table[k][total + w] = table[k].get(total + w, 0) + n
    return table[size]
