"""Command-line flags from a config dataclass's fields.

Provenance: the dataclass itself. Each field gets one flag typed from its annotation and
documented by its ``Attributes:`` entry; a flag not typed leaves the default (argparse's
SUPPRESS), so parsing typed flags and replacing them into the defaults gives the config a
user asked for.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Literal

import pytest

from addnorm.training.config import TrainConfig
from addnorm.training.flags import add_dataclass_flags, field_docs
from addnorm.transformer.config import TransformerConfig


@dataclasses.dataclass(frozen=True)
class Toy:
    """A config of each annotation the flags know.

    Attributes:
        width: the layers' width, in
            features (100% of them).
        rate, floor: two floats.
        name: a string.
        fused: whether to fuse.
        limit: an optional cap; none is no cap.
        mode: one of two modes.
        keep: on, off, or none for the caller's choice.
    """

    width: int = 8
    rate: float = 0.5
    floor: float = 0.0
    name: str = "toy"
    fused: bool = True
    limit: int | None = None
    mode: Literal["fast", "slow"] = "fast"
    keep: bool | None = None


def parse(argv: list[str], defaults: object = Toy(), **kwargs) -> tuple[list[str], dict]:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    names = add_dataclass_flags(parser, defaults, **kwargs)
    return names, vars(parser.parse_args(argv))


def test_each_field_gets_a_flag_of_its_type_and_untyped_flags_leave_the_defaults():
    names, given = parse([])
    assert names == [f.name for f in dataclasses.fields(Toy)]
    assert given == {}  # nothing typed: nothing overrides
    _, given = parse(["--width", "16", "--rate", "0.25", "--name", "x", "--no-fused",
                      "--limit", "none", "--mode", "slow", "--keep"])
    assert given == {"width": 16, "rate": 0.25, "name": "x", "fused": False, "limit": None,
                     "mode": "slow", "keep": True}
    assert dataclasses.replace(Toy(), **given) == Toy(16, 0.25, 0.0, "x", False, None, "slow",
                                                       True)
    assert parse(["--limit", "3"])[1] == {"limit": 3}
    assert parse(["--no-keep"])[1] == {"keep": False}  # (bool | None: --x / --no-x as well)
    # ... and, as a bool | None flag took before (--final-norm true), a value of its own
    for value, expected in (("true", True), ("FALSE", False), ("none", None)):
        assert parse(["--keep", value])[1] == {"keep": expected}
    assert parse(["--keep", "--width", "2"])[1] == {"keep": True, "width": 2}


@pytest.mark.parametrize("argv", [["--width", "2.5"], ["--mode", "medium"],
                                  ["--limit", "many"], ["--keep", "maybe"],
                                  ["--no-keep", "true"]])
def test_a_value_of_the_wrong_type_or_choice_is_refused(argv):
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parse(argv)


def test_skipped_fields_get_no_flag_and_a_class_is_refused():
    names, _ = parse([], skip={"width", "mode"})
    assert "width" not in names and "mode" not in names and "rate" in names
    with pytest.raises(TypeError, match="must be a dataclass instance"):
        add_dataclass_flags(argparse.ArgumentParser(), Toy)


def test_help_is_the_attributes_entry_joined_on_one_line_then_the_default():
    docs = field_docs(Toy)
    assert docs["width"] == "the layers' width, in features (100% of them)."
    assert docs["rate"] == docs["floor"] == "two floats."  # "a, b: text" names both
    parser = argparse.ArgumentParser(prog="t")
    add_dataclass_flags(parser, Toy())
    text = " ".join(parser.format_help().split())
    assert "the layers' width, in features (100% of them). (default 8)" in text  # % escaped
    assert "an optional cap; none is no cap. (default none)" in text


def test_the_model_and_train_configs_string_options_are_choices():
    _, given = parse(["--norm-position", "pre"], TransformerConfig())
    assert given == {"norm_position": "pre"}
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parse(["--norm-position", "middle"], TransformerConfig())
    names, given = parse(["--lr", "0.001"], TrainConfig())
    assert given == {"lr": 0.001}
    assert set(names) == {f.name for f in dataclasses.fields(TrainConfig)}
