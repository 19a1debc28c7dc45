"""Generating past a model's context: its window slides, recomputed.

A decoder-only model trained on windows of ``context`` tokens has never seen a position past
``context - 1``: run there, it scores worse than letter frequencies (docs/measurements.md has the
measurement). So generation sees at most ``window`` tokens at once (the model's
``GenerationSpec.context`` unless ``GenerationConfig.window`` says otherwise), as nanoGPT's
``generate`` crops its input to ``block_size``: a longer prompt is run from its last
``window`` tokens, and once the cache holds ``window`` positions, the next token is fed by
the model's ``slide``, which runs the cache's last ``window - stride`` tokens and the new one
again from position 0 (a window of training) and keeps them as the whole cache. The
``stride - 1`` tokens after it are ordinary cached steps, so every ``stride`` tokens cost one
recomputation of ``window - stride + 1`` positions, and each token is predicted from between
``window - stride + 1`` and ``window`` tokens. ``stride=1`` recomputes the whole window for
every token (nanoGPT's ``generate``).

Keys and values are recomputed, not rolled. With absolute positions (sinusoidal, learned) a
rolled cache would hold keys at positions that no longer match; with rotary ones its
relative offsets stay right, but the kept keys of every layer past the first were computed
from the tokens the window dropped, so it is not what the model saw in training (a window
that starts at its first token) and differs from the recomputation.

The slide is decided on the host, from a count of the cache's positions kept here (the cache
is full after the same number of steps in every row), so it reads nothing back; a compiled
step keeps its graph, and ``slide`` runs eagerly beside it, writing the static cache in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from addnorm.generation.config import GenerationConfig
from addnorm.generation.step import StepFn

if TYPE_CHECKING:
    from addnorm.family import GenerationSpec, WindowedModel

__all__ = ["Window", "default_stride", "sliding_step", "window_of"]


class Window:
    """A generation's window: at most ``size`` positions, slid by ``stride`` tokens."""

    def __init__(self, size: int, stride: int) -> None:
        self.size = size
        self.stride = stride

    @property
    def keep(self) -> int:
        """The cache positions a slide runs again before the new token."""
        return self.size - self.stride

    def __repr__(self) -> str:
        return f"Window(size={self.size}, stride={self.stride})"


def default_stride(window: int) -> int:
    """The stride of a window of ``window`` tokens when the config names none: a quarter of
    it (at least 1), so every token is predicted from at least three quarters of a window,
    for a recomputation every ``window / 4`` tokens (docs/measurements.md measures the choice
    against stride 1 and 1/2)."""
    return max(window // 4, 1)


def window_of(spec: GenerationSpec, config: GenerationConfig) -> Window | None:
    """The window a model generates within, as ``config`` asks (None: no window, a model
    without a ``context``), checked against the model: ``window`` at most a learned position
    table's rows, ``window_stride`` at most ``window``."""
    if spec.context is None:
        if config.window is not None or config.window_stride is not None:
            raise ValueError(
                f"window ({config.window}) and window_stride ({config.window_stride}) apply to a "
                "decoder-only model with a context (its generation_spec.context); this model "
                "has none"
            )
        return None
    size = spec.context if config.window is None else config.window
    if spec.max_positions is not None and size > spec.max_positions:
        raise ValueError(
            f"window ({size}) exceeds max_len ({spec.max_positions}) of the model's learned "
            "position table"
        )
    stride = default_stride(size) if config.window_stride is None else config.window_stride
    if stride > size:
        raise ValueError(f"window_stride ({stride}) exceeds the window ({size})")
    return Window(size, stride)


def sliding_step(step: StepFn, model: WindowedModel, window: Window, filled: int) -> StepFn:
    """``step`` (the model's, or its compiled one) until the cache holds ``window.size``
    positions, then the model's ``slide`` for the next token, keeping ``window.keep``
    positions before it; ``filled``: the positions the cache holds after ``start``.

    Shapes:
        tokens: (B, 1); returns: logits (B, V)
    """
    count = filled

    def windowed(tokens: Tensor, cache: Any) -> Tensor:
        nonlocal count
        if count < window.size:
            count += 1
            return step(tokens, cache)
        count = window.keep + 1
        return model.slide(tokens, cache, window.keep)

    return windowed
