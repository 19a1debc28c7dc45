"""bn-padding: padding moves BatchNorm's output, not LayerNorm's or masked BatchNorm's."""

from addnorm.experiments import bn_padding


def test_batchnorm_drifts_with_padding_while_layernorm_and_the_mask_stay_put():
    outcome = bn_padding.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    drift = numbers["batchnorm_change"]
    assert drift[0] == 0.0  # no padding: the same batch
    assert drift[-1] > 0.5 and drift == sorted(drift)  # more padding, further off (2.6 here)
    # invariant: padding left out. float32 statistics of 12 real tokens summed in another
    # order: sum_bound gives <= 12u(1 + |y|) ~ 3e-6 for |y| <= 3.5 (measured 2.4e-7).
    assert max(numbers["masked_batchnorm_change"]) < 1e-5
    # invariant: per-token statistics. F.layer_norm reduces each row alone, the same
    # arithmetic whatever the number of rows (CPU and CUDA kernels): equal, measured 0.0.
    assert max(numbers["layernorm_change"]) < 1e-6
