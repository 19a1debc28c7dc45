"""norm-examples: seed 003's worked example (SPEC section 3, claim 4)."""

from addnorm.experiments import norm_examples


def test_batchnorm_and_layernorm_match_the_seed_digits():
    outcome = norm_examples.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    assert numbers["batch_mean"] == [2.0, 4.0]  # SPEC: mu = [2, 4]
    # sigma^2 = [2/3, 8/3], computed in float64: a few u (1.1e-16) of 8/3.
    assert abs(numbers["batch_var"][0] - 2 / 3) < 1e-12
    assert abs(numbers["batch_var"][1] - 8 / 3) < 1e-12
    # -1.2247449 lies 5e-6 from the rounding boundary -1.22475, far beyond any rounding.
    assert [round(v, 4) for v in numbers["batch_norm"][0]] == [-1.2247, -1.2247]
    assert all(row == [-1.0, 1.0] for row in numbers["layer_norm"])
