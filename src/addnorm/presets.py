"""Every named model config, in one registry typed per family.

Each family keeps its presets in one dict of its own config type, so a lookup needs no
``isinstance``: ``TRANSFORMER_PRESETS["tiny"]`` is a ``TransformerConfig``,
``LM_PRESETS["lm-tiny"]`` an ``LMConfig``, ``DIT_PRESETS["DiT-XL/2"]`` a ``DiTConfig``
(``PRESETS`` holds the first two by name, as ``addnorm.PRESETS``). :func:`presets_of` finds a
family's dict from its config type, as a task does from its default config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar, cast

from addnorm.dit.config import DIT_PRESETS, DiTConfig
from addnorm.transformer.config import LM_PRESETS, TRANSFORMER_PRESETS, LMConfig, TransformerConfig

__all__ = ["FAMILY_PRESETS", "presets_of"]

_Config = TypeVar("_Config")

# Config type -> its family's presets (a family without presets is absent).
FAMILY_PRESETS: dict[type, Mapping[str, object]] = {
    TransformerConfig: TRANSFORMER_PRESETS,
    LMConfig: LM_PRESETS,
    DiTConfig: DIT_PRESETS,
}


def presets_of(config_type: type[_Config]) -> dict[str, _Config]:
    """The named configs of type ``config_type``, by name (empty if it has none)."""
    return dict(cast(Mapping[str, _Config], FAMILY_PRESETS.get(config_type, {})))
