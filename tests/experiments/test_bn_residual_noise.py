"""bn-residual-noise: BatchNorm on the residual path of a pre-norm encoder makes a sequence's
output and gradient depend on its batch companions, more so in deep stacks."""

from addnorm.experiments import bn_residual_noise


def test_batchnorm_on_the_residual_path_injects_noise_that_grows_with_depth():
    outcome = bn_residual_noise.run(quick=True)
    assert outcome.supported
    measures = outcome.numbers["measures"]
    # LayerNorm normalizes each token alone: the probe's output and gradient do not depend on
    # the other sequences (exactly equal, measured 0.0).
    assert measures["layer"]["output noise"]["6"]["max"] < 1e-6
    assert measures["layer"]["gradient noise"]["6"]["max"] < 1e-6
    # BatchNorm: 19-26% output noise at 6 layers, gradient noise 0.33-0.38 at 2 layers and
    # 0.48-0.65 at 6 (3 seeds): the ranges do not overlap.
    assert measures["batch"]["output noise"]["6"]["min"] > 0.1
    assert (measures["batch"]["gradient noise"]["6"]["min"]
            > measures["batch"]["gradient noise"]["2"]["max"])


def test_blaming_layernorm_instead_is_not_supported():
    outcome = bn_residual_noise.run(quick=True, norms=("layer", "batch"))
    assert outcome.verdict == "not supported"
    assert not any(outcome.numbers["parts"].values())
