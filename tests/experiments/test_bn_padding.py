"""bn-padding: padding moves BatchNorm's output, not LayerNorm's or masked BatchNorm's."""

from addnorm.experiments import bn_padding
from addnorm.norms import LayerNorm


def test_batchnorm_drifts_with_padding_while_layernorm_and_the_mask_stay_put():
    outcome = bn_padding.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    drift = numbers["batchnorm_change"]
    assert drift[0]["max"] == 0.0  # no padding: the same batch
    # one pad token already moves it (measured 0.29-0.38 over 3 seeds); 16 by 2.6-3.3
    assert drift[1]["min"] > 0.1 and drift[-1]["min"] > 1.0
    # invariant: padding left out. float32 statistics of 12 real tokens summed in another
    # order: sum_bound gives <= 12u(1 + |y|) ~ 3e-6 for |y| <= 3.5 (measured 2.4e-7).
    assert max(d["max"] for d in numbers["masked_batchnorm_change"]) < 1e-5
    # invariant: per-token statistics. F.layer_norm reduces each row alone, the same
    # arithmetic whatever the number of rows (CPU and CUDA kernels): equal, measured 0.0.
    assert max(d["max"] for d in numbers["layernorm_change"]) < 1e-6


def test_a_batchnorm_that_ignores_the_batch_is_not_supported():
    # The false world: LayerNorm in BatchNorm's place has per-token statistics, so padding
    # cannot move the sentence (exactly 0, as above).
    outcome = bn_padding.run(quick=True, batch_norm=LayerNorm)
    assert outcome.verdict == "not supported"
    assert max(d["max"] for d in outcome.numbers["batchnorm_change"]) < 1e-6
