"""Stop strings: end a row once its text holds one, and cut the text before it.

Token ids do not line up with text (a stop string may span several tokens, or end inside
one), so the rows' new tokens are decoded after every step and searched as text.
:func:`stop_at_strings` makes the ``stop_fn`` that :func:`~addnorm.generation.loop.
generate_tokens` and ``TransformerLM.generate`` accept; :func:`cut_at_stop` trims the decoded
output. The stop string itself is left out of the output (OpenAI's ``stop`` convention).

Text lives on the host, so the ids must come back to it: the decode loop reads each step's
new tokens in the one read of the step that it makes anyway (the stop check) and hands
:meth:`StopStrings.ends` the rows as Python lists, rather than calling the ``stop_fn`` on
the device's tokens, which would read them back a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["StopFn", "StopStrings", "cut_at_stop", "stop_at_strings"]

StopFn = Callable[[Tensor], Tensor]  # tokens generated so far (B, n) -> (B,) bool, True = end


class StopStrings:
    """A ``stop_fn`` that ends a row once the text of its new tokens contains a stop string
    (made by :func:`stop_at_strings`).

    Called on a tensor, as any ``stop_fn``, it reads the tokens back; the decode loop calls
    :meth:`ends` on the ids it has read already.

    Shapes:
        __call__: tokens (B, n) -> (B,) bool, True = the row holds a stop string
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...]) -> None:
        self.decode = decode
        self.stops = stops

    def ends(self, rows: Sequence[list[int]]) -> list[bool]:
        """Per row of token ids so far, whether its text holds a stop string."""
        texts = [self.decode(row) for row in rows]
        return [any(stop in text for stop in self.stops) for text in texts]

    def __call__(self, tokens: Tensor) -> Tensor:
        found = self.ends(tokens.tolist())
        return torch.tensor(found, dtype=torch.bool, device=tokens.device)  # (B,)


def stop_at_strings(decode: Callable[[list[int]], str], stops: Sequence[str]) -> StopStrings:
    """A ``stop_fn`` that ends a row once the text of its new tokens contains a stop string.

    ``decode`` turns one row's new token ids into text (a tokenizer's ``decode``). Every call
    decodes each row's tokens so far, so a stop string split across tokens is found.

    Shapes:
        the stop_fn: tokens (B, n) -> (B,) bool, True = the row holds a stop string
    """
    if not callable(decode):
        raise TypeError(f"decode must be callable, got {type(decode).__name__}")
    return StopStrings(decode, _check_stop_strings(stops))


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to (without) the earliest occurrence of any stop string; all of it if none
    occurs. Pair with :func:`stop_at_strings`, which stops generating once one appears."""
    cut = len(text)
    for stop in _check_stop_strings(stops):
        found = text.find(stop)
        if found >= 0:
            cut = min(cut, found)
    return text[:cut]


def _check_stop_strings(stops: object) -> tuple[str, ...]:
    """A sequence of non-empty strings (a bare string is refused: it is not a list of them)."""
    if isinstance(stops, str) or not isinstance(stops, Sequence):
        raise TypeError(f"stops must be a sequence of strings, got {stops!r}")
    for i, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            raise ValueError(f"stops[{i}] must be a non-empty string, got {stop!r}")
    return tuple(stops)
