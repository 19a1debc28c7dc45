"""Command-line flags derived from the fields of a config dataclass.

``add_dataclass_flags(parser, TransformerConfig)`` adds ``--d-model INT``,
``--norm-position {post,pre}``, ``--bias/--no-bias``, ... one flag per field, typed from the
field's annotation: int, float, str, bool (``--x/--no-x``; for ``bool | None`` as well, None
when neither is given, and ``--x true|false|none``), ``T | None`` ("none" = None),
``Literal[...]`` and the model configs' string options (choices). The flags default to "not
given", so only what a user types overrides the config's defaults. Each flag's help is the
field's entry in its class's ``Attributes:`` docstring section, then the default.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Collection

from addnorm.feedforward import ACTIVATIONS
from addnorm.norms import NORM_KINDS
from addnorm.residual import NORM_POSITIONS
from addnorm.transformer.config import POSITION_ENCODINGS

__all__ = ["add_dataclass_flags"]

# String fields of the model configs and their allowed values.
CHOICES = {
    "activation": tuple(ACTIVATIONS),
    "norm": tuple(NORM_KINDS),
    "norm_position": tuple(NORM_POSITIONS),
    "position_encoding": tuple(POSITION_ENCODINGS),
}


def _optional(parse):
    """A parser for ``T | None`` fields: "none" means None."""

    def parse_optional(text: str):
        return None if text.lower() == "none" else parse(text)

    parse_optional.__name__ = getattr(parse, "__name__", "value")
    return parse_optional


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return lowered == "true"


class _OptionalBool(argparse.BooleanOptionalAction):
    """A ``bool | None`` field's flag: ``--x`` / ``--no-x`` as a bool's, and, as before they
    were, ``--x true|false|none``."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.nargs = "?"
        self.metavar = "{true,false,none}"

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values is None:  # --x or --no-x
            super().__call__(parser, namespace, values, option_string)
        elif option_string is not None and option_string.startswith("--no-"):
            parser.error(f"argument {option_string}: takes no value (got {values!r})")
        else:
            try:
                setattr(namespace, self.dest, _optional(_parse_bool)(values))
            except argparse.ArgumentTypeError as err:
                parser.error(f"argument {option_string}: {err}")


def field_docs(cls: type) -> dict[str, str]:
    """Each field's description from the ``Attributes:`` sections of ``cls``'s docstring, its
    bases', and then those of the other dataclasses of its module (a config that documents its
    fields "as in" a sibling's), joined onto one line; ``"a, b: text"`` describes both."""
    module = sys.modules.get(cls.__module__)
    siblings = [
        value for value in vars(module).values()
        if isinstance(value, type) and dataclasses.is_dataclass(value)
        and value.__module__ == cls.__module__
    ] if module is not None else []
    docs: dict[str, str] = {}
    for source in [*cls.__mro__, *siblings]:
        for names, text in _attribute_entries(inspect.getdoc(source) or ""):
            for name in names:
                docs.setdefault(name, text)
    return docs


_ENTRY = re.compile(r"^(\w+(?:, \w+)*): (.*)$")


def _attribute_entries(doc: str) -> list[tuple[list[str], str]]:
    """``(names, text)`` for each entry of the ``Attributes:`` section of ``doc`` (entries
    indented by 4, continuation lines deeper), with reST markup (````x````) dropped."""
    entries: list[tuple[list[str], str]] = []
    inside = False
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the section ended
            break
        match = _ENTRY.match(line[4:]) if line.startswith("    ") else None
        if match and not line.startswith("     "):
            entries.append((match.group(1).split(", "), match.group(2).strip()))
        elif line.strip() and entries:
            names, text = entries[-1]
            entries[-1] = (names, f"{text} {line.strip()}")
    return [(names, text.replace("``", "")) for names, text in entries]


def add_dataclass_flags(
    parser: argparse.ArgumentParser, defaults: object, *, skip: Collection[str] = ()
) -> list[str]:
    """Add one ``--field-name`` flag per field of the dataclass instance ``defaults``, typed
    from the field's annotation; the help is the field's description (:func:`field_docs`)
    and the value in ``defaults``.

    Flags default to "not given" (``argparse.SUPPRESS``), so only the flags a user types
    override the defaults. Returns the field names that got a flag.
    """
    if not dataclasses.is_dataclass(defaults) or isinstance(defaults, type):
        raise TypeError(f"defaults must be a dataclass instance, got {defaults!r}")
    cls = type(defaults)
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    parsers: dict[object, Callable[[str], object]] = {
        bool: _parse_bool,
        int: int,
        float: float,
        str: str,
    }
    group = parser.add_argument_group(f"{cls.__name__} fields")
    names = []
    for field in dataclasses.fields(defaults):
        if field.name in skip:
            continue
        hint = hints[field.name]
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
        base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
        flag = "--" + field.name.replace("_", "-")
        kwargs: dict = {
            "dest": field.name,
            "default": argparse.SUPPRESS,
            "help": _help(docs.get(field.name), getattr(defaults, field.name)),
        }
        if base is bool:  # (``bool | None`` too: not giving the flag leaves it None)
            action = _OptionalBool if optional else argparse.BooleanOptionalAction
            group.add_argument(flag, action=action, **kwargs)
        elif typing.get_origin(base) is typing.Literal or field.name in CHOICES:
            choices = typing.get_args(base) or CHOICES[field.name]
            group.add_argument(flag, choices=choices, **kwargs)
        else:
            parse = parsers[base]
            group.add_argument(
                flag,
                type=_optional(parse) if optional else parse,
                metavar=base.__name__.upper(),
                **kwargs,
            )
        names.append(field.name)
    return names


def _help(description: str | None, default: object) -> str:
    """A flag's help: the field's description and its default (``%`` escaped for argparse)."""
    shown = "none" if default is None else repr(default)
    text = f"{description} (default {shown})" if description else f"default {shown}"
    return text.replace("%", "%%")
