"""addnorm.tasks.model_size: the ladder of shapes each family takes and the rule that picks
one from the data and the budget.

Provenance: the shapes are checked against the configs' own fields and checks; the rule's
picks against the rule restated by brute force over the same ladder (targets per parameter,
the data's bound), with a step time proportional to ``step_cost`` (so the carried pace is
exact); ``step_cost`` against its formula on the config's ``activation_shape``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from sum_task import SumConfig

from addnorm.dit import DIT_PRESETS
from addnorm.tasks.model_size import LADDER, ladder, pick_size, shaped, step_cost
from addnorm.tasks.task import SizeRule
from addnorm.training.budget import fitting_steps
from addnorm.transformer.config import LM_PRESETS, TRANSFORMER_PRESETS


@pytest.mark.parametrize("cfg", [LM_PRESETS["lm-tiny"], TRANSFORMER_PRESETS["tiny"],
                                 DIT_PRESETS["DiT-digits"]], ids=["lm", "seq2seq", "dit"])
def test_each_family_takes_the_ladders_shapes_by_field_name(cfg):
    shapes = ladder(cfg)
    assert len(shapes) == len(LADDER)  # every rung valid for the three families
    counts = [s.count_parameters() for s in shapes]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    wide = shaped(cfg, 192, 4, 6)
    assert (wide.d_model, wide.n_heads) == (192, 6)
    for name in ("n_layers", "n_encoder_layers", "n_decoder_layers"):
        if hasattr(cfg, name):
            assert getattr(wide, name) == 4
    if hasattr(cfg, "d_ff"):
        assert wide.d_ff == 192 * cfg.d_ff // cfg.d_model  # the config's ratio, 4
    else:
        assert wide.mlp_ratio == cfg.mlp_ratio
    # Everything but the shape is kept (the dropout, the vocabulary, the positions ...).
    kept = {f.name for f in dataclasses.fields(cfg)} - {
        "d_model", "n_heads", "d_ff", "n_layers", "n_encoder_layers", "n_decoder_layers"}
    assert all(getattr(wide, n) == getattr(cfg, n) for n in kept)


def test_a_shape_the_family_refuses_is_skipped_and_a_config_without_width_has_none():
    assert shaped(LM_PRESETS["lm-tiny"], 96, 2, 5) is None  # 96 is not divisible by 5 heads
    assert shaped(DIT_PRESETS["DiT-digits"], 98, 2, 2) is None  # d_model % 4 != 0

    @dataclasses.dataclass(frozen=True)
    class NoWidth:
        n_layers: int = 1

    assert shaped(NoWidth(), 64, 2, 4) is None and ladder(NoWidth()) == []
    assert [s.d_model for s in ladder(SumConfig())] == [w for w, _, _ in LADDER]


def test_the_step_cost_is_the_parameters_and_attention_per_target():
    cfg = TRANSFORMER_PRESETS["tiny"]
    shape = cfg.activation_shape()
    assert step_cost(cfg, 30) == cfg.count_parameters() + 2 * shape.n_layers * 30 * shape.d_model


def brute_force(candidates, rule, *, ref_s, ref, length, per_step, unique, budget_s, epochs):
    """The rule restated: the largest candidate, in order, before the first whose parameters
    exceed the data's bound or its targets fall below r a parameter."""
    best = candidates[0]
    for cfg in candidates:
        n = cfg.count_parameters()
        step_s = ref_s * step_cost(cfg, length) / step_cost(ref, length)
        targets = math.inf if epochs is None else epochs * unique
        if budget_s is not None:
            targets = min(targets, fitting_steps(budget_s, step_s) * per_step)
        cap = math.inf if rule.max_epochs is None else unique * rule.max_epochs / \
            rule.targets_per_parameter
        if n > cap or targets < rule.targets_per_parameter * n:
            break
        best = cfg
    return best


@pytest.mark.parametrize("budget_s, epochs, unique, expected_bound", [
    (300.0, None, 1e9, "compute"),  # the budget binds: plenty of data
    (1e7, None, 2e5, "data"),  # a long budget, little data
    (0.01, None, 1e9, "smallest"),  # no shape fits: the smallest
    (1e12, None, 1e12, "largest"),  # everything fits
    (None, 2.0, 5e6, "compute"),  # epochs alone set the targets
])
def test_the_rule_picks_what_the_rule_restated_picks(budget_s, epochs, unique, expected_bound):
    ref = LM_PRESETS["lm-tiny"]
    candidates = ladder(ref)
    rule = SizeRule(20.0, 4.0)
    kwargs = dict(ref_s=0.05, ref=ref, length=128, per_step=32 * 128, unique=unique,
                  budget_s=budget_s, epochs=epochs)
    choice = pick_size(candidates, rule=rule, reference=ref, reference_step_s=0.05, length=128,
                       targets_per_step=32 * 128, unique_targets=unique, budget_s=budget_s,
                       epochs=epochs)
    assert choice.cfg == brute_force(candidates, rule, **kwargs)
    assert choice.bound == expected_bound
    assert choice.parameters == choice.cfg.count_parameters()
    if expected_bound in ("compute", "largest"):
        assert choice.targets >= rule.targets_per_parameter * choice.parameters


def test_a_rule_without_a_data_bound_sizes_by_the_budget_alone():
    ref = DIT_PRESETS["DiT-digits"]
    picks = [pick_size(ladder(ref), rule=SizeRule(0.04, max_epochs), reference=ref,
                       reference_step_s=0.05, length=16, targets_per_step=64,
                       unique_targets=1000, budget_s=300.0, epochs=None).cfg
             for max_epochs in (4.0, None)]
    assert picks[0].count_parameters() < picks[1].count_parameters()
    with pytest.raises(ValueError, match="a time budget or epochs"):
        pick_size(ladder(ref), rule=SizeRule(), reference=ref, reference_step_s=0.05,
                  length=16, targets_per_step=64, unique_targets=1000, budget_s=None,
                  epochs=None)
