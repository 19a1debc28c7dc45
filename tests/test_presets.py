"""Named configs: one typed dict per family, and each task starts from its own family's.

Provenance: the per-family dicts are the public ``PRESETS`` and ``DIT_PRESETS`` split by
config type (identities); a task's presets are the dict of its default config's family, and
each entry is of that config type (the task's hook returns the family's dict itself).
"""

from __future__ import annotations

import addnorm
from addnorm.dit.config import DIT_PRESETS
from addnorm.tasks.registry import TASKS
from addnorm.transformer.config import LM_PRESETS, PRESETS, TRANSFORMER_PRESETS


def test_each_family_dict_holds_configs_of_its_own_type_only():
    for presets in (TRANSFORMER_PRESETS, LM_PRESETS, DIT_PRESETS):
        assert presets and len({type(cfg) for cfg in presets.values()}) == 1


def test_presets_keeps_both_transformer_families_by_name():
    assert PRESETS == {**TRANSFORMER_PRESETS, **LM_PRESETS} and addnorm.PRESETS is PRESETS
    assert len(PRESETS) == len(TRANSFORMER_PRESETS) + len(LM_PRESETS)  # no name shadowed
    assert PRESETS["tiny"] is TRANSFORMER_PRESETS["tiny"]
    assert PRESETS["lm-tiny"] is LM_PRESETS["lm-tiny"]
    assert addnorm.DIT_PRESETS is DIT_PRESETS


def test_a_task_starts_from_the_presets_of_its_model_family():
    assert TASKS["lm"].presets() is LM_PRESETS
    assert TASKS["translate"].presets() is TRANSFORMER_PRESETS
    assert TASKS["dit"].presets() is DIT_PRESETS
    for task_cls in TASKS.values():  # every preset is a config of the task's own type
        default = type(task_cls.default_model_config())
        assert all(type(cfg) is default for cfg in task_cls.presets().values())
