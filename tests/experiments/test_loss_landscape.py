"""loss-landscape: seed 003's account of Santurkar et al., measured along training with their
Fig. 4 probes; the verdict can come out either way."""

from torch import nn

from addnorm.experiments import loss_landscape


def test_quick_run_measures_every_net_at_both_rates():
    outcome = loss_landscape.run(quick=True)
    measures = outcome.numbers["measures"]
    for name in ("no norm", "BatchNorm", "LayerNorm"):
        for m in loss_landscape.MEASURES:
            assert all(measures[name][m][f"{lr:g}"]["min"] > 0 for lr in loss_landscape.LRS)
    # In its first 40 steps the plain net sits on its initial plateau (test accuracy 0.10-0.26
    # over seeds and rates): nothing moves there, so no landscape of training to compare.
    assert outcome.verdict == "undecided"
    assert "initial plateau" in outcome.undecided_because


def test_against_a_rougher_net_batchnorm_is_smoother():
    # A world where the claim is true: the "plain" net is the LayerNorm one, whose loss varies
    # 1.1-1.7 along the gradient (quick run), against BatchNorm's 0.14-0.31.
    rough = {"no norm": loss_landscape.NORMS["LayerNorm"]}
    assert loss_landscape.run(quick=True, norms=rough).verdict == "supported"


def test_where_batchnorm_makes_no_difference_it_is_not_smoother():
    # A world where the claim is false: the net "without norm" is the BatchNorm net itself,
    # which leaves its plateau within the quick run (test accuracy 0.92-0.95): equal numbers,
    # never smaller beyond the spread.
    same = {"no norm": loss_landscape.NORMS["BatchNorm"]}
    assert loss_landscape.run(quick=True, norms=same).verdict == "not supported"


def test_a_net_that_never_trains_decides_nothing():
    # Identity in BatchNorm's place is the plain net, on its plateau at every rate.
    outcome = loss_landscape.run(quick=True, norms={"BatchNorm": lambda width: nn.Identity()})
    assert outcome.verdict == "undecided"
