"""addnorm.presets: one registry of named configs, typed per family.

Provenance: the per-family dicts are the public ``PRESETS`` and ``DIT_PRESETS`` split by
config type (identities), and a task's presets are those of its default config's type.
"""

from __future__ import annotations

import addnorm
from addnorm.dit.config import DIT_PRESETS, DiTConfig
from addnorm.presets import FAMILY_PRESETS, presets_of
from addnorm.tasks.run import TASKS, presets_for
from addnorm.transformer.config import (
    LM_PRESETS,
    PRESETS,
    TRANSFORMER_PRESETS,
    LMConfig,
    TransformerConfig,
)
from addnorm.transformer.encoder_model import EncoderConfig


def test_each_family_dict_holds_configs_of_its_own_type_only():
    for config_type, presets in FAMILY_PRESETS.items():
        assert presets and all(type(cfg) is config_type for cfg in presets.values())
    assert presets_of(LMConfig) == LM_PRESETS and presets_of(DiTConfig) == DIT_PRESETS
    assert presets_of(TransformerConfig) == TRANSFORMER_PRESETS
    assert presets_of(EncoderConfig) == {}  # a family without presets


def test_presets_keeps_both_transformer_families_by_name():
    assert PRESETS == {**TRANSFORMER_PRESETS, **LM_PRESETS} and addnorm.PRESETS is PRESETS
    assert len(PRESETS) == len(TRANSFORMER_PRESETS) + len(LM_PRESETS)  # no name shadowed
    assert PRESETS["tiny"] is TRANSFORMER_PRESETS["tiny"]
    assert PRESETS["lm-tiny"] is LM_PRESETS["lm-tiny"]


def test_a_task_starts_from_the_presets_of_its_config_type():
    assert presets_for(TASKS["lm"]) == LM_PRESETS
    assert presets_for(TASKS["translate"]) == TRANSFORMER_PRESETS
    assert presets_for(TASKS["dit"]) == DIT_PRESETS
