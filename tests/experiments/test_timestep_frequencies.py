"""timestep-frequencies: the span 1 .. 1/max_period (SPEC claim 9)."""

from addnorm.experiments import timestep_frequencies


def test_frequencies_span_one_to_one_over_max_period_and_unit_timesteps_flatten_channels():
    outcome = timestep_frequencies.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    # SPEC section 2: freqs = exp(-ln(max_period) k / half), k = 0 .. half - 1, half = 128.
    # float64: exp(0) = 1 exactly, and freq_min = 1.07e-4 to a few u (measured 1.2e-19).
    assert abs(numbers["freq_max"] - 1.0) < 1e-9
    assert abs(numbers["freq_min"] - 10000 ** (-127 / 128)) < 1e-9
    # Channel counts, measured 198 and 16 of 256: far from 128 on either side.
    assert numbers["constant_channels_t_0_1"] > 128 > numbers["constant_channels_t_0_999"]
