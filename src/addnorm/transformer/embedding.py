"""The input and output layers both models share: token ids in, logits out.

Shapes legend: B batch, L sequence length, D d_model, V vocab.

Both models (:class:`~addnorm.transformer.Transformer` and
:class:`~addnorm.transformer.TransformerLM`) embed tokens as ``E[ids] * sqrt(D)`` (section 3.4
of the paper), add a position code (sinusoidal by default; learned; or none, with rotary
embeddings inside attention), apply dropout, and project the last hidden states to logits with
a matrix tied to ``E`` by default.

The factor is the config's ``embed_scale``: the paper's ``sqrt(D)``, or none (GPT-2, BERT).

Padding masks (True = padding) default to ``ids == cfg.pad_id``, or to no padding when
``pad_id`` is None (a vocabulary without a padding token, GPT-2's). A token's position counts
the real tokens before it in its row (``cumsum(~padding) - 1``), so left- or right-padded
rows get the positions they would have alone (see :func:`positions_from_padding`). When no
padding comes before a real token (unpadded or right-padded batches, the training case)
those positions are ``arange(L)``, and eager models pass ``positions=None`` so the position
modules slice their precomputed tables.

Host syncs: checking token ids costs one device-to-host sync per ids tensor (its min and max,
and whether any padding precedes a real token, fetched together): the price of a clear
out-of-vocabulary error instead of a device-side assert.

Compiled and exported: while ``torch.compile`` or ``torch.export`` captures a graph, nothing
is read back. The inputs take the general path (per-row positions from the padding, and the
padding mask, always), which gives the eager results on any batch, and the id range becomes
an in-graph assert (:func:`~addnorm.utils.checks.assert_in_graph`). A model without a padding
token called without a padding mask (GPT-2 in training) has no padding to read: no mask and
no per-row positions there either. ``torch.jit.trace`` (which
would freeze one batch's choice) is refused.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import torch
from torch import nn
from torch.export import Dim

from addnorm.encodings import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from addnorm.family import DynamicShapes, padded_tokens
from addnorm.rotary import RotaryEmbedding
from addnorm.utils.checks import assert_in_graph, check_bool_mask, check_tensor, refuse_tracing

__all__ = [
    "EmbeddingSettings",
    "Embedder",
    "Tokens",
    "check_ids",
    "learned_max_len",
    "model_inputs",
    "output_projection",
    "position_module",
    "positions_from_padding",
    "rotary_for",
]


class EmbeddingSettings(Protocol):
    """The fields of a model config the input layer reads (``TransformerConfig``,
    ``LMConfig``, ``EncoderConfig``)."""

    @property
    def d_model(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def dropout(self) -> float: ...
    @property
    def position_encoding(self) -> str: ...
    @property
    def position_base(self) -> float: ...
    @property
    def max_len(self) -> int: ...
    @property
    def embed_scale(self) -> str: ...


def positions_from_padding(padding_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position among its row's real tokens: ``cumsum(~padding) - 1``, >= 0.

    A real token's position counts the real tokens before it; padding before a real token
    gets the position of the last real token before it (0 for left padding). Padding after a
    row's last real token keeps counting as if it were real, so a row with no padding before
    a real token gets exactly ``arange(L)``: the positions eager models use for such batches
    without computing them (``positions=None``), whatever else the batch holds.

    Shapes:
        padding_mask: (B, L) bool, True = padding
        returns: (B, L) long
    """
    seen = (~padding_mask).long().cumsum(dim=1)  # (B, L) real tokens up to each one
    before_real = padding_mask & (seen < seen[:, -1:])  # (B, L) padding a real token follows
    index = torch.arange(padding_mask.shape[1], device=padding_mask.device)  # (L,)
    return (index - before_real.long().cumsum(dim=1)).clamp(min=0)  # (B, L)


def id_tensor(name: str, ids: object, max_len: int | None) -> torch.Tensor:
    """A non-empty (B, L) tensor of any integer dtype, as long; L <= max_len. No host sync."""
    ids = check_tensor(name, ids, ndim=2)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids, got dtype {ids.dtype}")
    if ids.numel() == 0:
        raise ValueError(
            f"{name} must have B >= 1 rows and L >= 1 tokens, got shape {tuple(ids.shape)}"
        )
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(
            f"{name} length ({ids.shape[1]}) exceeds max_len ({max_len}) of the learned "
            "position table"
        )
    return ids.long()


def check_vocab(name: str, low: int, high: int, vocab_size: int) -> None:
    """Raise naming the first id outside [0, V), given the ids' min and max."""
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} contains id {bad} outside the vocabulary [0, {vocab_size})")


def check_ids(name: str, ids: object, vocab_size: int, max_len: int | None) -> torch.Tensor:
    """Token ids as a long (B, L) tensor, every id in [0, V) (and L <= max_len); one sync
    (an in-graph assert instead while a graph is captured)."""
    ids = id_tensor(name, ids, max_len)
    if torch.compiler.is_compiling():
        assert_in_graph(_in_vocab(ids, vocab_size), _vocab_message(name, vocab_size))
        return ids
    low, high = torch.stack(torch.aminmax(ids)).tolist()  # one sync
    check_vocab(name, low, high, vocab_size)
    return ids


def _in_vocab(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return ((ids >= 0) & (ids < vocab_size)).all()  # ()


def _vocab_message(name: str, vocab_size: int) -> str:
    return f"{name} contains an id outside the vocabulary [0, {vocab_size})"


def padding_from(
    name: str, padding_mask: object, ids: torch.Tensor, pad_id: int | None
) -> torch.Tensor:
    """The given padding mask (True = padding), checked against ids, or ``ids == pad_id``
    (no padding at all when ``pad_id`` is None)."""
    if padding_mask is None:
        return ids == pad_id if pad_id is not None else torch.zeros_like(ids, dtype=torch.bool)
    return check_bool_mask(f"{name} (True = padding)", padding_mask, tuple(ids.shape))


class Tokens(NamedTuple):
    """Checked model inputs.

    Attributes:
        ids: (B, L) long.
        padding_mask: (B, L) bool, True = padding; None when no token is padding, so
            attention can skip the mask and take SDPA's ``is_causal`` fast path.
        positions: (B, L) long, or None when no padding precedes a real token (then the
            positions are ``arange(L)`` and the position modules slice their tables).
    """

    ids: torch.Tensor
    padding_mask: torch.Tensor | None
    positions: torch.Tensor | None


def model_inputs(
    name: str, ids: object, mask_name: str, padding_mask: object, *, vocab_size: int,
    max_len: int | None, pad_id: int | None, ends_real: bool = False,
) -> Tokens:
    """Check ids and their padding mask with one host sync, and derive the positions.

    Positions are :func:`positions_from_padding`; where no padding precedes a real token they
    equal ``arange(L)``, so None is returned instead and the position modules slice their
    precomputed tables (and skip a range check that would cost another sync). Where no token
    is padding at all, the mask for attention is None too (see :class:`Tokens`).
    ``ends_real`` (prompts for generation, continued after their last token) refuses a row
    that ends in padding (padding before or between real tokens is fine), a row of padding
    only among them, in the same sync.

    While ``torch.compile`` / ``torch.export`` captures a graph nothing is read back: the
    positions and the mask are always given (the same results: the general path), and the
    value checks become in-graph asserts. ``torch.jit.trace`` is refused. Without a padding
    token (``pad_id`` None) and without a ``padding_mask`` no token is padding, which needs
    no read: the mask and the positions are None on every path, so a captured graph keeps
    SDPA's ``is_causal`` (flash) path and the sliced position tables too.
    """
    refuse_tracing("addnorm's Transformer models")
    if padding_mask is None and pad_id is None:  # no padding, known without reading anything
        return Tokens(check_ids(name, ids, vocab_size, max_len), None, None)
    ids = id_tensor(name, ids, max_len)
    padding = padding_from(mask_name, padding_mask, ids, pad_id)
    seen = (~padding).long().cumsum(dim=1)  # (B, L) real tokens up to each one
    if torch.compiler.is_compiling():
        assert_in_graph(_in_vocab(ids, vocab_size), _vocab_message(name, vocab_size))
        if ends_real:
            assert_in_graph(~padding[:, -1].any(), _ENDS_IN_PADDING)
        return Tokens(ids, padding, positions_from_padding(padding))
    leading = (padding & (seen < seen[:, -1:])).any()  # a padding token before a real one
    facts = [*torch.aminmax(ids), leading.long(), padding.any().long()]
    if ends_real:  # the first row of padding only, and the first ending in padding, or -1
        facts += [_first_row(seen[:, -1] == 0), _first_row(padding[:, -1])]
    low, high, leading, any_padding, *bad_rows = torch.stack(facts).tolist()  # the one sync
    check_vocab(name, low, high, vocab_size)
    if ends_real and bad_rows[0] >= 0:
        raise ValueError(
            f"row {bad_rows[0]} of {name} is only padding ({mask_name} all True, or an "
            "attention_mask of zeros): there is nothing to continue"
        )
    if ends_real and bad_rows[1] >= 0:
        raise ValueError(f"{_ENDS_IN_PADDING}: row {bad_rows[1]} of {name} does")
    positions = positions_from_padding(padding) if leading else None  # (B, L) or None
    return Tokens(ids, padding if any_padding else None, positions)


_ENDS_IN_PADDING = (
    "padding_mask must be left padding for generation: new tokens follow a row's last token, "
    "which must be real (padding, True in padding_mask, 0 in Hugging Face's attention_mask, "
    "or pad_token_id without an attention_mask, may come before or between real tokens, "
    "not after the last)"
)


def _first_row(rows: torch.Tensor) -> torch.Tensor:
    """The index of the first True of a (B,) bool, or -1: a 0-d long tensor, no sync."""
    return torch.where(rows.any(), rows.long().argmax(), -1)


def learned_max_len(cfg: EmbeddingSettings) -> int | None:
    """The learned position table's length, which bounds L; None for the other kinds."""
    return cfg.max_len if cfg.position_encoding == "learned" else None


def ids_example_inputs(
    vocab_size: int, pad_id: int | None, *, batch: int, length: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """The example inputs of a model called as ``model(ids, padding_mask=...)`` (the LM, the
    encoder model): ``ids`` and ``padding_mask`` (B, L), an unpadded, a right- and a
    left-padded row (:func:`~addnorm.family.padded_tokens`)."""
    ids, padding = padded_tokens(batch, length, vocab_size, pad_id, generator)
    return {"ids": ids, "padding_mask": padding}


def ids_dynamic_shapes(cfg: EmbeddingSettings) -> DynamicShapes:
    """Their dynamic axes: the batch and the length (at most ``max_len`` with learned
    positions)."""
    batch, length = Dim("batch", min=1), Dim("length", min=1, max=learned_max_len(cfg))
    return {"ids": {0: batch, 1: length}, "padding_mask": {0: batch, 1: length}}


def position_module(cfg: EmbeddingSettings) -> nn.Module | None:
    """The position code added to the embeddings: sinusoidal, learned, or None (rotary and
    ``"none"`` add nothing)."""
    if cfg.position_encoding == "sinusoidal":
        return SinusoidalPositionalEncoding(
            cfg.d_model, base=cfg.position_base, max_len=cfg.max_len
        )
    if cfg.position_encoding == "learned":
        return LearnedPositionalEmbedding(cfg.max_len, cfg.d_model)
    return None


def init_token_table_(table: nn.Embedding, embed_scale: str) -> None:
    """With the paper's ``sqrt(D)`` factor, entries ~ N(0, 1/D), so ``E[ids] * sqrt(D)`` has
    unit scale next to PE; without it, GPT-2's rule, N(0, 0.02^2)."""
    std = table.embedding_dim**-0.5 if embed_scale == "sqrt_d_model" else 0.02
    nn.init.normal_(table.weight, mean=0.0, std=std)


class Embedder(nn.Module):
    """The input layer: ``dropout(E[ids] * scale + PE(positions))``, scale ``sqrt(D)`` or 1.

    Args:
        vocab_size: V, the table has shape (V, D).
        cfg: the model's config: ``d_model``, ``embed_scale`` (``"sqrt_d_model"`` or
            ``"none"``), ``position_encoding`` (``"sinusoidal"``, ``"learned"``, or
            ``"rotary"``/``"none"``: no code added), ``max_len`` (rows of the position table),
            ``position_base`` and ``dropout`` (the paper's P_drop, on the sum).
        tokens: an existing ``nn.Embedding`` to share (tied source / target tables).

    Submodules: ``tokens`` (``nn.Embedding``), ``pos_enc`` (or None), ``dropout``.
    """

    def __init__(
        self,
        vocab_size: int,
        cfg: EmbeddingSettings,
        *,
        tokens: nn.Embedding | None = None,
    ) -> None:
        super().__init__()
        self.d_model = d_model = cfg.d_model
        self.embed_scale = cfg.embed_scale
        self.scale = math.sqrt(d_model) if cfg.embed_scale == "sqrt_d_model" else 1.0
        self.tokens = nn.Embedding(vocab_size, d_model) if tokens is None else tokens
        self.pos_enc = position_module(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        if tokens is None:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Token table ~ N(0, 1/D) with the ``sqrt(D)`` factor, else N(0, 0.02^2)
        (:func:`init_token_table_`)."""
        init_token_table_(self.tokens, self.embed_scale)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor | None, *, offset: int = 0
    ) -> torch.Tensor:
        """Embed ids at the given positions (None: ``offset + arange(L)`` for every row, the
        tables' own rows).

        Shapes:
            ids: (B, L); positions: (B, L) or None
            returns: (B, L, D)
        """
        x = self.tokens(ids) * self.scale  # (B, L, D)
        if self.pos_enc is not None:
            x = self.pos_enc(x, offset=offset, positions=positions)
        return self.dropout(x)


def rotary_for(cfg: EmbeddingSettings) -> RotaryEmbedding | None:
    if cfg.position_encoding != "rotary":
        return None
    d_head = cfg.d_model // cfg.n_heads
    return RotaryEmbedding(d_head, base=cfg.position_base, max_len=cfg.max_len)


def output_projection(d_model: int, vocab_size: int, tied: nn.Embedding | None) -> nn.Linear:
    """Logits = h W^T with W (V, D): the embedding table itself when tied (the paper)."""
    linear = nn.Linear(d_model, vocab_size, bias=False)
    if tied is not None:
        linear.weight = tied.weight
    else:
        nn.init.xavier_uniform_(linear.weight)
    return linear
