"""How a model family describes itself to the code that handles whole models.

Export (:mod:`addnorm.export`), memory estimates (:mod:`addnorm.training.sizes`) and
distributed wrapping (:mod:`addnorm.training.distributed`) ask a model what they need
through this protocol, so a new family plugs in by implementing it, with no edit there:

- :class:`ModelFamily`, implemented by the whole models (``Transformer``, ``TransformerLM``,
  ``EncoderModel``, ``DiT``): their layers, their exportable parts, example inputs and the
  dynamic axes of those inputs, and their config;
- :class:`FamilyConfig`, implemented by those models' configs: how big the model is,
  counted without building it;
- :class:`GenerativeModel`, implemented by the models that generate tokens (``Transformer``,
  ``TransformerLM``): ``start``, ``step`` and a :class:`GenerationSpec`, all that the one
  :func:`~addnorm.generation.generate.generate` drives; :class:`WindowedModel`, a
  decoder-only one (``TransformerLM``) that slides its window past its trained context.

:func:`padded_tokens` builds the token batches the token models' example inputs share.
This module imports no family: the families import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:
    from addnorm.cache import DecodingCache

__all__ = [
    "ActivationShape",
    "DynamicShapes",
    "ExportPart",
    "FamilyConfig",
    "GenerationSpec",
    "GenerativeModel",
    "ModelFamily",
    "WindowedModel",
    "padded_tokens",
]

# Per input name, its dynamic axes: axis -> ``torch.export.Dim`` (one Dim object per size,
# shared by the inputs that have that size: the batch, a sequence length).
DynamicShapes = dict[str, dict[int, Any]]


@dataclass(frozen=True)
class ActivationShape:
    """What a memory estimate reads of a model's activations (``addnorm.training.sizes``).

    Attributes:
        n_layers: the layers a token passes through, every stack counted.
        d_model, d_ff, n_heads: one layer's widths (D, F, H).
        d_output: floats per token at the output beyond the layers' (the logits' V; 0 for
            hidden states and images).
    """

    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    d_output: int


class FamilyConfig(Protocol):
    """A model config that says how big its model is, without building it."""

    def count_parameters(self) -> int:
        """The model's parameters (within 2% of the built model's)."""
        ...

    def count_buffers(self) -> int:
        """The numbers in the model's buffers (its computed position tables)."""
        ...

    def activation_shape(self) -> ActivationShape:
        """The layer count and widths its activations scale with."""
        ...


@dataclass(frozen=True)
class ExportPart:
    """One exportable part of a model: the ``method`` that is captured (``"forward"``: the
    model itself) and the name of its ``output`` (the ONNX output name)."""

    method: str
    output: str


@runtime_checkable
class ModelFamily(Protocol):
    """A whole model, as export, size estimates and distributed wrapping see it."""

    @property
    def cfg(self) -> FamilyConfig:
        """The model's config: its size (``count_parameters``, ``activation_shape``)."""
        ...

    @property
    def layer_classes(self) -> tuple[type[nn.Module], ...]:
        """The layer classes checkpointed and sharded one by one."""
        ...

    @property
    def export_parts(self) -> Mapping[str, ExportPart]:
        """The parts that can be exported, by name (``"forward"`` first)."""
        ...

    def example_inputs(
        self, part: str, *, batch: int, length: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Random inputs of ``part`` on the CPU, by name, in the order of its arguments:
        ``batch`` rows (token batches with every kind of padding, see
        :func:`padded_tokens`), sequences of about ``length``."""
        ...

    def dynamic_shapes(self) -> DynamicShapes:
        """The dynamic axes (the batch, the lengths, as ``torch.export.Dim``) of every input
        of every part, by input name; lengths bounded by a learned position table."""
        ...


@dataclass(frozen=True)
class GenerationSpec:
    """What generation reads of a model beside its ``start`` and ``step``.

    Attributes:
        vocab_size: V, the ids the decoder emits (an encoder-decoder's target vocabulary).
        eos_id: the model's stop token (its default generation config's), or None.
        pad_id: the model's padding id: it fills the rows that ended and is never emitted;
            None for a vocabulary without one (GPT-2's).
        start_id: an encoder-decoder's first decoder token (its ``bos_id``, never emitted);
            None for a decoder-only model, which continues its prompt.
        max_positions: rows of a learned position table, which the new tokens must fit; None
            for position codes that compute any position.
        cached_layers: the self-attention layers whose keys and values the decoding cache
            holds.
        d_model: D, the width of each cached key and value.
        device: where the weights are (a sampling generator must be there too).
        context: the positions a decoder-only model was trained on (its run's window):
            generation slides its window within them by default, and the model is a
            :class:`WindowedModel`; None: no window (an encoder-decoder).
    """

    vocab_size: int
    eos_id: int | None
    pad_id: int | None
    start_id: int | None
    max_positions: int | None
    cached_layers: int
    d_model: int
    device: torch.device
    context: int | None = None


class GenerativeModel(Protocol):
    """A model that generates tokens one at a time, as :func:`addnorm.generation.generate.
    generate` drives it: ``start`` once, then ``step`` per token.

    A decoder-only model (``start_id`` None) starts from its prompt, which generation counts
    as seen and may put before the new tokens; an encoder-decoder starts its decoder at
    ``start_id`` after encoding the source.
    """

    @property
    def generation_spec(self) -> GenerationSpec:
        """The model's special ids and sizes, as generation reads them."""
        ...

    def start(
        self,
        inputs: torch.Tensor,
        padding_mask: torch.Tensor | None,
        /,
        *,
        max_new_tokens: int,
        static: bool = False,
    ) -> tuple[DecodingCache, torch.Tensor]:
        """Run the inputs once (a decoder-only model's left-padded prompt, an encoder-
        decoder's source); return a cache with room for ``max_new_tokens`` and the logits of
        the first new token. Checks the inputs' values (one host read). ``static``: a cache
        in the static layout, for a compiled ``step``.

        Shapes:
            inputs, padding_mask: (B, L), True = padding; returns: cache, logits (B, V)
        """
        ...

    def step(self, tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor:
        """Feed one token per row; the cache grows by one position. Reads nothing back.

        Shapes:
            tokens: (B, 1); returns: logits (B, V) for the next token
        """
        ...


class WindowedModel(GenerativeModel, Protocol):
    """A decoder-only :class:`GenerativeModel` that generates past its context by sliding its
    window (:mod:`addnorm.generation.window`): its ``start`` keeps at most ``window``
    positions (a longer prompt's last ones), and ``slide`` recomputes the window's end."""

    def start(
        self,
        inputs: torch.Tensor,
        padding_mask: torch.Tensor | None,
        /,
        *,
        max_new_tokens: int,
        static: bool = False,
        window: int | None = None,
    ) -> tuple[DecodingCache, torch.Tensor]:
        """:meth:`GenerativeModel.start`, with a cache of at most ``window`` positions that
        keeps its ids, holding the prompt's last ``window`` positions (None: no window)."""
        ...

    def slide(self, tokens: torch.Tensor, cache: DecodingCache, keep: int) -> torch.Tensor:
        """Feed one token per row to a full cache: recompute the cache's last ``keep``
        positions and the new token from position 0, as the cache's only positions; reads
        nothing back.

        Shapes:
            tokens: (B, 1); returns: logits (B, V) for the next token
        """
        ...


def padded_tokens(
    batch: int, length: int, vocab_size: int, pad_id: int | None, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random non-pad ids and their padding mask; row 1 right-padded, row 2 left-padded (a
    third of L each), so a capture or a check sees every kind of padding.

    A model without a padding token (``pad_id=None``, GPT-2) gets id 0 at the padded
    places: only the mask says they are padding.

    Shapes:
        returns: ids (B, L) int64, padding_mask (B, L) bool, True = padding
    """
    if pad_id is None:
        ids = torch.randint(0, vocab_size, (batch, length), generator=generator)  # (B, L)
    else:
        ids = torch.randint(0, vocab_size - 1, (batch, length), generator=generator)  # (B, L)
        ids = ids + (ids >= pad_id).long()  # never pad_id
    padding = torch.zeros(batch, length, dtype=torch.bool)  # (B, L)
    n_pad = max(1, length // 3)
    if batch > 1:
        padding[1, length - n_pad :] = True
    if batch > 2:
        padding[2, :n_pad] = True
    return ids.masked_fill(padding, 0 if pad_id is None else pad_id), padding
