"""bn-speed: after 100 SGD steps the quick run already separates the variants at both of its
learning rates: both BatchNorm nets pass 90% test accuracy, the plain one does not."""

from torch import nn

from addnorm.experiments import bn_speed


def test_batchnorm_trains_faster_with_and_without_injected_noise():
    outcome = bn_speed.run(quick=True)
    assert outcome.supported
    steps = outcome.numbers["steps_to_target"]
    never = outcome.numbers["n_steps"] + bn_speed.EVAL_EVERY
    # Seeded float32 training: BatchNorm nets pass 0.9 at steps 30-40 (3 seeds, both rates);
    # the plain one needs 260+ (full run), so never within 100: margins far above rounding.
    for lr in ("0.1", "0.3"):
        assert steps["no norm"][lr]["min"] == never
        assert steps["BatchNorm"][lr]["max"] <= 50
        assert steps["BatchNorm + noise"][lr]["max"] <= 50
    assert outcome.numbers["faster_at_each_lr"] == [True, True]


def test_a_batchnorm_that_does_nothing_is_not_supported():
    norms = {"BatchNorm": lambda width: nn.Identity(), "no norm": bn_speed.NORMS["BatchNorm"]}
    outcome = bn_speed.run(quick=True, norms=norms)
    assert outcome.verdict == "not supported"
