"""timestep-frequencies: seed 004's exponential cover of 1 .. ~1/max_period, and the
project's own reading about timesteps fed in [0, 1]."""

from addnorm.experiments import timestep_frequencies


def test_frequencies_cover_one_to_one_over_max_period_exponentially():
    outcome = timestep_frequencies.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    # SPEC section 2: freqs = exp(-ln(max_period) k / half), k = 0 .. half - 1, half = 128.
    # float64: exp(0) = 1 exactly, and freq_min = 1.07e-4 to a few u (measured 1.2e-19).
    assert abs(numbers["freq_max"] - 1.0) < 1e-9
    assert abs(numbers["freq_min"] - 10000 ** (-127 / 128)) < 1e-9
    assert numbers["neighbour_ratio_spread"] < 1e-12  # one ratio, 10000^(-1/128), throughout
    (unit,) = outcome.also
    # Channel counts, measured 198 and 16 of 256: far from 128 on either side.
    assert unit.supported
    assert numbers["constant_channels_t_0_1"] > 128 > numbers["constant_channels_t_0_999"]
    low, high = numbers["same_verdict_thresholds"]
    assert low < timestep_frequencies.CONSTANT < high


def test_an_embedding_with_another_max_period_is_not_supported():
    def wrong(t, dim, max_period):  # the seed's formula with max_period / 10
        return timestep_frequencies._library(t, dim, max_period / 10)

    outcome = timestep_frequencies.run(quick=True, embedding=wrong)
    assert outcome.verdict == "not supported"
    # its last frequency is 1000^(-127/128) = 1.05e-3, ten times the seed's 1.07e-4
    assert abs(outcome.numbers["freq_min"] - 1000 ** (-127 / 128)) < 1e-9
