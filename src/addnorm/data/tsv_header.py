"""Whether the first line of a pairs TSV file is a header row (``source<TAB>target``), not a
pair to train on.

``header`` (``addnorm train translate --header``) says what to do with each TSV file's first
line (its first non-empty one; JSON Lines files have no header):

- ``"auto"`` (the default): a line whose two fields are both column names is a header,
  skipped with a note: the roles (``source``, ``target``, ``src``, ``tgt``, ``input``,
  ``output``, ...) or languages (``en``, ``de``, ``english``, ``german``, ...), any case. A
  line with one role name and one other word (``source<TAB>ziel``, or a glossary's
  ``input<TAB>Eingabe``) might be either: it is refused with a hint to say which. Any other
  line is a pair.
- ``"yes"``: the first line is a header, skipped whatever it holds.
- ``"no"``: the first line is a pair, whatever it holds.
"""

from __future__ import annotations

import re

__all__ = ["HEADER_CHOICES", "header_verdict"]

HEADER_CHOICES = ("auto", "yes", "no")

_ROLES = frozenset({
    "source", "target", "src", "tgt", "input", "output", "inputs", "outputs", "source_text",
    "target_text", "src_text", "tgt_text", "source_sentence", "target_sentence", "prompt",
    "completion", "response",
})
_LANGUAGES = frozenset({
    "ar", "cs", "da", "de", "el", "en", "es", "fi", "fr", "he", "hi", "hu", "id", "it", "ja",
    "ko", "nl", "no", "pl", "pt", "ro", "ru", "sv", "th", "tr", "uk", "vi", "zh",
    "arabic", "chinese", "czech", "danish", "dutch", "english", "finnish", "french", "german",
    "greek", "hebrew", "hindi", "hungarian", "indonesian", "italian", "japanese", "korean",
    "norwegian", "polish", "portuguese", "romanian", "russian", "spanish", "swedish", "thai",
    "turkish", "ukrainian", "vietnamese",
})
_WORD = re.compile(r"[A-Za-z][A-Za-z_-]{0,30}")


def header_verdict(fields: list[str]) -> str | None:
    """``"header"`` when both of a line's fields are column names, ``"unclear"`` when one is
    a role name and the other a single word, else None (a pair)."""
    if len(fields) != 2:
        return None
    names = [f.strip().lower() for f in fields]
    if names[0] == names[1]:
        return None
    known = [n in _ROLES or n in _LANGUAGES for n in names]
    if all(known):
        return "header"
    roles = [n in _ROLES for n in names]
    if any(roles) and all(_WORD.fullmatch(n) for n in names):
        return "unclear"
    return None
