"""pe-heatmap: the quick run's numbers bear out SPEC claim 1."""

from addnorm.experiments import pe_heatmap


def test_values_stay_in_unit_range_and_change_faster_for_small_d_model():
    outcome = pe_heatmap.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    assert numbers["max_abs_value"] <= 1.0  # sin and cos
    # SPEC section 1 worked example, printed to 4 digits.
    assert numbers["seed_example_max_error"] < 5e-5
    steps = numbers["mean_step_by_d_model"]
    assert steps["4"] > steps["16"] > steps["64"] > steps["512"]  # seed 002's remark
