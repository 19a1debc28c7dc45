"""The seed documents' claims as runnable experiments, one module per claim.

Each module has ``NAME``, ``CLAIM`` and ``run(*, quick=False) -> Outcome`` and uses only the
public API, fixed seeds and data that ship with the install. ``EXPERIMENTS`` lists them in
the order ``addnorm explain all`` runs them; :func:`write_outcome` writes one experiment's
``figure.png`` and ``result.json``, :func:`write_index` the page that shows them all.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from addnorm.experiments import (
    bn_batch1,
    bn_padding,
    bn_speed,
    length_extrapolation,
    norm_examples,
    pe_heatmap,
    pe_requirements,
    pe_shift,
    postln_vs_preln,
    timestep_frequencies,
)
from addnorm.experiments.outcome import Outcome, write_outcome
from addnorm.experiments.page import write_index

__all__ = ["EXPERIMENTS", "Outcome", "write_index", "write_outcome"]

_MODULES: tuple[ModuleType, ...] = (
    pe_heatmap,
    pe_shift,
    norm_examples,
    bn_padding,
    bn_batch1,
    timestep_frequencies,
    postln_vs_preln,
    length_extrapolation,
    pe_requirements,
    bn_speed,
)

EXPERIMENTS: dict[str, Callable[..., Outcome]] = {m.NAME: m.run for m in _MODULES}
CLAIMS: dict[str, str] = {m.NAME: m.CLAIM for m in _MODULES}
