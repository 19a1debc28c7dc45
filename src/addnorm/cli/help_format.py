"""``--help`` output: every flag's help ends with its default, unless it states it already.

``addnorm``'s parsers use :class:`DefaultsFormatter` (``translate`` the raw-description one,
for its table of formats). A default is shown where there is one to show (:func:`has_default`):
not for switches (``store_true``), flags that are off unless given (default None), repeatable
flags that start empty, or flags derived from a config's fields, which state the config's
value in their own help.
"""

from __future__ import annotations

import argparse

__all__ = ["DefaultsFormatter", "RawDescriptionDefaultsFormatter", "has_default"]

_SWITCHES = (
    argparse._StoreConstAction,  # store_true / store_false subclass it
    argparse._AppendConstAction,
    argparse._CountAction,
    argparse._HelpAction,
    argparse._VersionAction,
    argparse.BooleanOptionalAction,  # argparse adds "(default: ...)" to these itself
)


def has_default(action: argparse.Action) -> bool:
    """Whether ``action`` has a default worth printing in its help."""
    default = action.default
    if isinstance(action, _SWITCHES) or default is None or default is argparse.SUPPRESS:
        return False
    return not (isinstance(default, (list, tuple)) and not default)


class DefaultsFormatter(argparse.HelpFormatter):
    """argparse's formatter, with `` (default: X)`` after each help that has a default and
    does not mention one yet."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if not text or not has_default(action) or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)"


class RawDescriptionDefaultsFormatter(argparse.RawDescriptionHelpFormatter, DefaultsFormatter):
    """:class:`DefaultsFormatter` that keeps the description's own line breaks."""
