"""bn-speed: after 100 SGD steps the quick run already separates the variants (SPEC claim
10): both BatchNorm nets pass 90% test accuracy, the plain one does not."""

from addnorm.experiments import bn_speed


def test_batchnorm_trains_faster_with_and_without_injected_noise():
    outcome = bn_speed.run(quick=True)
    numbers = outcome.numbers
    assert outcome.supported
    reach = numbers["steps_to_target"]
    assert reach["no norm"] is None
    assert reach["BatchNorm"] is not None and reach["BatchNorm + noise"] is not None
    loss = numbers["mean_train_loss"]
    assert loss["BatchNorm + noise"] < loss["no norm"] and loss["BatchNorm"] < loss["no norm"]
