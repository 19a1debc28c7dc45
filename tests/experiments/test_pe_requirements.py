"""pe-requirements: seed 002's verdicts on the four codes, with thresholds argued from the
requirements (rounding, the embeddings' scale, bounded vs linear growth)."""

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


def test_the_thresholds_do_not_decide_the_verdicts():
    ranges = pe_requirements.run(quick=True).numbers["same_verdict_threshold_ranges"]
    # Entries: every bounded code's largest entry is 1, the raw index's 511 (exact); growth:
    # 1 for the bounded codes, 511 / 63 for the raw index. Any threshold between would do.
    assert ranges["max_abs_entry"] == (1.0, 511.0)
    assert ranges["growth_64_to_512"] == (1.0, 511 / 63)


def test_a_code_too_large_for_the_embeddings_is_not_supported():
    # The false world: sinusoids scaled by 8 are 8 x larger than N(0, 1) embeddings' scale.
    big = {"sinusoidal": lambda n: 8 * pe_requirements.CODES["sinusoidal"](n)}
    outcome = pe_requirements.run(quick=True, codes=big)
    assert outcome.verdict == "not supported"
    assert outcome.numbers["failed_requirements"]["sinusoidal"] == [2]
