"""The seed documents' claims as runnable experiments, one module per claim.

Each module has ``NAME``, ``CLAIM`` (the claim as its seed post states it), ``SEEDS`` and
``run(*, quick=False) -> Outcome`` and uses only the public API, fixed seeds and data that
ship with the install; ``run`` also takes the parts under test as keyword arguments, so a
test can build a world where the claim is false. Training-based verdicts compare
``repeats.N_RUNS`` seeds (:mod:`addnorm.experiments.repeats`; loss-landscape's full run
48, as its docstring explains). ``EXPERIMENTS`` lists them in
the order ``addnorm explain all`` runs them; :func:`write_outcome` writes one experiment's
``figure.png`` and ``result.json``, :func:`write_index` the page that shows them all and
:func:`write_verdicts` their verdicts in one small file.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from addnorm.experiments import (
    bn_batch1,
    bn_learning_rate,
    bn_padding,
    bn_residual_noise,
    bn_speed,
    length_extrapolation,
    loss_landscape,
    norm_examples,
    pe_heatmap,
    pe_requirements,
    pe_shift,
    pe_sigmoid,
    per_head_norm,
    postln_vs_preln,
    timestep_frequencies,
)
from addnorm.experiments.outcome import Outcome, write_outcome
from addnorm.experiments.page import write_index
from addnorm.experiments.record import write_verdicts

__all__ = ["EXPERIMENTS", "Outcome", "write_index", "write_outcome", "write_verdicts"]

# By topic: position codes, then normalization, then Add & Norm.
_MODULES: tuple[ModuleType, ...] = (
    pe_heatmap,
    pe_shift,
    pe_requirements,
    pe_sigmoid,
    length_extrapolation,
    timestep_frequencies,
    norm_examples,
    bn_padding,
    bn_batch1,
    per_head_norm,
    bn_learning_rate,
    bn_speed,
    loss_landscape,
    bn_residual_noise,
    postln_vs_preln,
)

EXPERIMENTS: dict[str, Callable[..., Outcome]] = {m.NAME: m.run for m in _MODULES}
CLAIMS: dict[str, str] = {m.NAME: m.CLAIM for m in _MODULES}
