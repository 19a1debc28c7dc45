"""``--help``'s defaults (``addnorm.cli.help_format``): a flag's help ends with
`` (default: X)`` where it has a default to show and does not mention one yet; switches, flags
off unless given (None), repeatable flags that start empty and suppressed defaults show none.

Provenance: the module's documented rules, on a parser built here with one flag of each kind
(argparse's own rendering of ``%(default)s``). Every flag of every addnorm subcommand is walked
in test_help.py.
"""

from __future__ import annotations

import argparse

import pytest

from addnorm.cli.help_format import (
    DefaultsFormatter,
    RawDescriptionDefaultsFormatter,
    has_default,
)


def parser(formatter=DefaultsFormatter, **kwargs) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tool", formatter_class=formatter, **kwargs)
    p.add_argument("--steps", type=int, default=6, help="how many steps.")
    p.add_argument("--rate", type=float, default=0.5, help="the rate (default: half of 1).")
    p.add_argument("--quiet", action="store_true", help="print less.")
    p.add_argument("--seed", type=int, default=None, help="a seed.")
    p.add_argument("--stop", action="append", default=[], help="a stop string.")
    p.add_argument("--hidden", default=argparse.SUPPRESS, help="a hidden default.")
    p.add_argument("--colour", action=argparse.BooleanOptionalAction, default=True,
                   help="colour the output.")
    return p


def helps(p: argparse.ArgumentParser) -> str:
    return " ".join(p.format_help().split())


def test_a_flag_with_a_default_ends_its_help_with_it_once():
    text = helps(parser())
    assert "how many steps. (default: 6)" in text
    assert "the rate (default: half of 1)." in text and "(default: 0.5)" not in text
    # BooleanOptionalAction is left to argparse (which adds its default itself in some Python
    # versions): never shown twice.
    assert text.count("(default: True)") <= 1


@pytest.mark.parametrize(("flag", "help_text"), [
    ("--quiet", "print less."), ("--seed", "a seed."), ("--stop", "a stop string."),
    ("--hidden", "a hidden default."), ("--colour", "colour the output."),
])
def test_flags_with_no_default_to_show_keep_their_help_as_written(flag, help_text):
    p = parser()
    action = next(a for a in p._actions if flag in a.option_strings)
    assert not has_default(action)
    assert f"{help_text} (default" not in helps(p) or flag == "--colour"


def test_the_raw_description_formatter_keeps_the_description_lines_and_adds_defaults():
    p = parser(RawDescriptionDefaultsFormatter, description="line one\n  line two")
    assert "line one\n  line two" in p.format_help()
    assert "how many steps. (default: 6)" in helps(p)
