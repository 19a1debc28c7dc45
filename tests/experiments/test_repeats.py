"""repeats: the rank-sum rule that decides when runs differ beyond their spread."""

import math

import pytest

from addnorm.experiments.repeats import N_RUNS, SIGNIFICANCE, larger, rank_sum_p, smaller


def test_three_runs_a_side_differ_only_when_their_ranges_do_not_overlap():
    # Exact null probability of the most extreme split: 1 / C(6, 3) = 1/20.
    assert rank_sum_p([4, 5, 6], [1, 2, 3]) == pytest.approx(1 / math.comb(6, 3))
    assert larger([4, 5, 6], [1, 2, 3]) and smaller([1, 2, 3], [4, 5, 6])
    # One swap of ranks: 2 of the 20 splits are at least as extreme -> 0.1 > 0.05.
    assert rank_sum_p([3, 5, 6], [1, 2, 4]) == pytest.approx(2 / 20)
    assert not larger([3, 5, 6], [1, 2, 4])
    assert N_RUNS == 3 and SIGNIFICANCE == 0.05


def test_ties_share_ranks_and_identical_runs_never_differ():
    assert rank_sum_p([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == 1.0
    # a tie across the groups counts half: (3, 5, 6) vs (1, 2, 3) is no longer separated
    assert not larger([3, 5, 6], [1, 2, 3])


def test_nan_counts_as_the_largest_value():
    assert larger([math.nan, 5, 6], [1, 2, 3])  # a diverged loss is the worst loss


def test_more_runs_tolerate_some_overlap():
    # 12 vs 12 with one overlapping pair: scipy.stats.mannwhitneyu(..., 'greater', 'exact')
    # gives the same 1 / C(24, 12) * (count of splits with U >= 143) = 2 / 2704156.
    a = [float(v) for v in range(12, 24)]
    b = [float(v) for v in range(12)]
    a[0], b[-1] = b[-1], a[0]  # swap one pair: U = 143 of 144
    assert rank_sum_p(a, b) == pytest.approx(2 / math.comb(24, 12))
    assert larger(a, b)


def test_empty_groups_are_refused():
    with pytest.raises(ValueError, match="runs"):
        rank_sum_p([], [1.0])
