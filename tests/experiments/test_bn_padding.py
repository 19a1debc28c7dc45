"""bn-padding: padding moves BatchNorm's output, not LayerNorm's or masked BatchNorm's."""

from addnorm.experiments import bn_padding


def test_batchnorm_drifts_with_padding_while_layernorm_and_the_mask_stay_put():
    outcome = bn_padding.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    drift = numbers["batchnorm_change"]
    assert drift[0] == 0.0  # no padding: the same batch
    assert drift[-1] > 0.5 and drift == sorted(drift)  # more padding, further off
    assert max(numbers["masked_batchnorm_change"]) < 1e-5  # invariant: padding left out
    assert max(numbers["layernorm_change"]) < 1e-6  # invariant: per-token statistics
