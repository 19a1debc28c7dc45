"""bn-learning-rate: seed 000's BatchNorm pros (larger and less critical learning rates,
faster training) and LayerNorm con (slower). The quick run's 100 steps are too few for the
plain net at any rate, so its verdict is undecided; swapping the nets refutes it."""

from addnorm.experiments import bn_learning_rate


def test_quick_run_is_undecided_because_the_plain_net_never_trains():
    outcome = bn_learning_rate.run(quick=True)
    numbers = outcome.numbers
    # The plain net needs 260-290 steps at its best rate (full run), far past 100.
    assert numbers["training_lr_count"]["no norm"]["max"] == 0
    # BatchNorm reaches 90% at both rates within 30-40 steps (measured), LayerNorm at none.
    assert numbers["training_lr_count"]["BatchNorm"]["min"] == 2
    assert numbers["fastest_steps"]["BatchNorm"]["max"] <= 50
    assert outcome.verdict == "undecided"
    assert "no learning rate" in outcome.undecided_because


def test_swapping_batchnorm_and_the_plain_net_is_not_supported():
    norms = {"BatchNorm": bn_learning_rate.NORMS["no norm"],
             "no norm": bn_learning_rate.NORMS["BatchNorm"]}
    outcome = bn_learning_rate.run(quick=True, norms=norms)
    assert outcome.verdict == "not supported"
    assert not outcome.numbers["parts"]["BatchNorm reaches the target sooner"]
