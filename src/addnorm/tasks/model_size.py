"""The model a run on a user's data trains, sized from the data and the time budget.

The rule (docs/run-plans.md; ``addnorm train --help``): the model is the largest of
:data:`LADDER`'s widths and depths whose parameters ``N`` the run can train on at least
``r`` targets each (the loss's targets: a text's tokens, an answer's tokens, an image) in the
steps the plan holds (those of ``--epochs``, or those that fit the budget at the model's
pace), and, for a task whose data can run out, no more than the data can feed: ``N <= U *
max_epochs / r`` for ``U`` targets in the training data. ``r`` and ``max_epochs`` are the
task's :class:`~addnorm.tasks.task.SizeRule` (language: 20 tokens a parameter, Hoffmann et
al. 2022's compute-optimal ratio, and 4 epochs, up to which Muennighoff et al. 2023 found
repeated tokens worth nearly as much as new ones). None fitting: the smallest.

A step's time is measured on one model (a short warm-up, :mod:`addnorm.tasks.budget`) and
carried to the others in proportion to :func:`step_cost`, the multiply-adds a target costs
(``6 N`` plus attention's ``12 L S d``, Kaplan et al. 2020's estimate, over 6). The shapes
are the family's own config with its widths, heads and layer counts replaced by name
(``d_model``, ``n_heads``, ``d_ff`` in the config's ratio, ``n_layers`` or each stack's),
so any family whose config has those fields is sized the same way; one whose checks refuse a
shape skips it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from addnorm.tasks.task import SizeRule
from addnorm.training.budget import fitting_steps

__all__ = ["LADDER", "MODEL_SIZE_FIELDS", "SizeChoice", "ladder", "pick_size", "step_cost"]

# (width d_model, layers per stack, heads): about 1.5-3x the parameters of the rung below.
LADDER: tuple[tuple[int, int, int], ...] = (
    (32, 1, 2), (48, 2, 4), (64, 2, 4), (96, 3, 4), (128, 4, 4), (160, 4, 4), (192, 4, 6),
    (256, 6, 8), (320, 6, 8), (384, 6, 8), (512, 8, 8), (768, 12, 12),
)
# The model fields a shape sets: a user who gives one of them (or a preset, or a config's
# model) keeps the model given.
MODEL_SIZE_FIELDS = ("d_model", "n_heads", "d_ff", "mlp_ratio", "n_layers", "n_encoder_layers",
                     "n_decoder_layers")
_LAYER_FIELDS = ("n_layers", "n_encoder_layers", "n_decoder_layers")


def shaped(cfg: Any, width: int, depth: int, heads: int) -> Any | None:
    """``cfg`` at ``width``, ``depth`` layers per stack and ``heads`` heads (``d_ff`` kept at
    its ratio to ``d_model``), or None if the family's checks refuse that shape or the config
    has no ``d_model``."""
    names = {f.name for f in dataclasses.fields(cfg)}
    if "d_model" not in names:
        return None
    changes: dict[str, int] = {"d_model": width}
    if "n_heads" in names:
        changes["n_heads"] = heads
    if "d_ff" in names:
        changes["d_ff"] = max(1, round(width * cfg.d_ff / cfg.d_model))
    changes.update({name: depth for name in _LAYER_FIELDS if name in names})
    try:
        return dataclasses.replace(cfg, **changes)
    except (ValueError, TypeError):
        return None


def ladder(cfg: Any) -> list[Any]:
    """``cfg`` at each of ``LADDER``'s shapes its family takes, smallest first."""
    shapes = (shaped(cfg, *rung) for rung in LADDER)
    return sorted((s for s in shapes if s is not None), key=lambda s: s.count_parameters())


def step_cost(cfg: Any, length: int) -> float:
    """The multiply-adds of a forward and backward pass per target, over 6: the parameters
    plus attention's ``2 L S d`` (every layer of every stack, sequences of ``length``)."""
    shape = cfg.activation_shape()
    return cfg.count_parameters() + 2 * shape.n_layers * length * shape.d_model


@dataclass(frozen=True)
class SizeChoice:
    """The shape :func:`pick_size` chose and why.

    Attributes:
        cfg: the model config.
        parameters: its parameters.
        targets: the targets the plan trains it on (at the pace its cost predicts).
        bound: what limited it: "compute" (a larger one would see fewer than ``r`` targets a
            parameter), "data" (a larger one would need more than ``max_epochs`` of the
            data), "largest" (the ladder's top) or "smallest" (none fits: the ladder's bottom).
    """

    cfg: Any
    parameters: int
    targets: float
    bound: str


def pick_size(
    candidates: Sequence[Any],
    *,
    rule: SizeRule,
    reference: Any,
    reference_step_s: float,
    length: int,
    targets_per_step: float,
    unique_targets: float,
    budget_s: float | None,
    epochs: float | None,
) -> SizeChoice:
    """The largest of ``candidates`` (smallest first) the rule allows (see the module
    docstring), given a measured ``reference_step_s`` of the ``reference`` model, the
    ``targets_per_step`` a step trains on, the ``unique_targets`` of the data, the budget in
    seconds and ``--epochs`` (either may be None, not both)."""
    if budget_s is None and epochs is None:
        raise ValueError("sizing a model needs a time budget or epochs")
    reference_cost = step_cost(reference, length)

    def trained_targets(cfg: Any) -> float:  # what the plan trains ``cfg`` on
        targets = math.inf if epochs is None else epochs * unique_targets
        if budget_s is not None:
            step_s = reference_step_s * step_cost(cfg, length) / reference_cost
            targets = min(targets, fitting_steps(budget_s, step_s) * targets_per_step)
        return targets

    data_cap = (math.inf if rule.max_epochs is None
                else unique_targets * rule.max_epochs / rule.targets_per_parameter)
    choice = SizeChoice(candidates[0], candidates[0].count_parameters(),
                        trained_targets(candidates[0]), "smallest")
    for i, cfg in enumerate(candidates):
        n, targets = cfg.count_parameters(), trained_targets(cfg)
        if n > data_cap or targets < rule.targets_per_parameter * n:
            bound = "data" if n > data_cap else "compute"
            return choice if i == 0 else dataclasses.replace(choice, bound=bound)
        choice = SizeChoice(cfg, n, targets, "largest")
    return choice
