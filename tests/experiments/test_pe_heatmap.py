"""pe-heatmap: seed 002's remark that a smaller d_model changes faster along the positions,
and its d = 4, base 100 table."""

import torch

from addnorm.experiments import pe_heatmap


def test_smaller_d_model_changes_faster_and_the_seed_table_matches():
    outcome = pe_heatmap.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    # SPEC section 1 worked example, printed to 4 digits: half a unit of the last is 5e-5;
    # the exact-math gap is 4.68e-5 (cos 2 = -0.416147, printed -0.4161), 3e-6 below the bound,
    # which float64 rounding of values <= 1 (1e-16) cannot cross.
    assert numbers["seed_example_max_error"] < 5e-5
    steps = numbers["mean_step_by_d_model"]
    # seed 002's remark; measured 0.31 > 0.11 > 0.078 > 0.069, gaps far above rounding.
    assert steps["4"] > steps["16"] > steps["64"] > steps["512"]


def test_a_code_whose_periods_ignore_d_model_is_not_supported():
    # The false world: every d_model repeats the d = 4 columns, so the mean step is the same
    # for every d_model (identical columns, identical float64 arithmetic).
    def same_periods(n_positions: int, d_model: int, base: float) -> torch.Tensor:
        return pe_heatmap._sinusoids(n_positions, 4, base).repeat(1, d_model // 4)

    outcome = pe_heatmap.run(quick=True, encoding=same_periods)
    assert outcome.verdict == "not supported"
    assert not outcome.numbers["step_falls_as_d_model_grows"]
