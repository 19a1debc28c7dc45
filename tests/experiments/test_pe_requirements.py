"""pe-requirements: seed 002's verdicts on the four codes (SPEC claim 3)."""

from addnorm.experiments import pe_requirements


def test_only_the_sinusoids_meet_all_five_requirements():
    outcome = pe_requirements.run(quick=True)
    assert outcome.supported
    failed = outcome.numbers["failed_requirements"]
    assert failed == {"raw index": [2, 3], "normalized index": [1], "binary": [4],
                      "sinusoidal": []}
    # Seed 002's point: p / (n - 1) depends on n; worst at p = 2: 2/2 vs 2/511.
    m = outcome.numbers["measurements"]
    assert abs(m["normalized index"]["length_dependence"] - (1 - 2 / 511)) < 1e-12  # float64
    # ||PE(p+k) - PE(p)|| depends on k only: float64 angles < 512, measured 4.4e-14.
    assert m["sinusoidal"]["distance_spread"] < 1e-9
