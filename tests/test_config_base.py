"""ConfigBase: a config's JSON form, shared by the model families.

Provenance: identities (``from_dict(to_dict(cfg)) == cfg`` through ``json``; ``to_dict`` is
``dataclasses.asdict``) and the refusals the docstring promises, on a config defined here;
the families' own configs are checked in tests/transformer/test_config.py and
tests/dit/test_config.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from addnorm.config_base import ConfigBase
from addnorm.dit.config import DiTConfig
from addnorm.transformer.config import LayerConfig, LMConfig, TransformerConfig


@dataclass(frozen=True)
class Toy(ConfigBase):
    width: int = 4
    position_encoding: str = "rotary"
    note: str | None = None


def test_a_config_goes_through_json_and_back_unchanged():
    cfg = Toy(width=7, note="x")
    assert cfg.to_dict() == dataclasses.asdict(cfg) == {"width": 7, "position_encoding": "rotary",
                                                        "note": "x"}
    assert Toy.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_unknown_keys_and_a_non_dict_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown Toy keys \['depth'\]; known keys are"):
        Toy.from_dict({"width": 3, "depth": 2})
    with pytest.raises(TypeError, match="data must be a dict, got list"):
        Toy.from_dict([1, 2])  # type: ignore[arg-type]


def test_the_former_name_positions_is_read_as_position_encoding():
    assert Toy.from_dict({"positions": "learned"}) == Toy(position_encoding="learned")


def test_every_family_config_derives_from_it():
    for cls in (LayerConfig, TransformerConfig, LMConfig, DiTConfig):
        assert issubclass(cls, ConfigBase), cls
