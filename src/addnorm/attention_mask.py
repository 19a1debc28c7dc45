"""The attention mask: padding, attend and causal masks combined once, ready for SDPA.

Masks (the convention of the whole package, see ``docs/design.md``); polarity is in the name:

- ``padding_mask``: bool (B, S), **True = padding key** (torch.nn's ``key_padding_mask``).
- ``attend_mask``: bool (L, S), (B, L, S) or (B, H, L, S) (B and H may be 1),
  **True = may attend** (``F.scaled_dot_product_attention``'s convention, the *negation* of
  torch.nn's bool ``attn_mask``).
- ``causal=True``: bottom-right aligned, query i of L sees key j of S iff
  ``j <= i + (S - L)``; so one new query after n cached keys sees all n + 1 of them.

The three combine with AND. A query row that can see no key at all (every key padding, say)
is opened here (so no kernel produces NaN) and marked dead, so attention zeroes its output.

Shapes legend: B batch, L query length, S key length, D d_model, H heads.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from addnorm.packing import Packing
from addnorm.utils.checks import check_bool_mask, check_tensor, same_shape

__all__ = [
    "AttentionMask",
    "build_attention_mask",
    "causal_attend_mask",
    "cross_attention_mask",
    "packed_mask",
    "self_attention_mask",
]


class AttentionMask(NamedTuple):
    """A validated combination of padding, attend and causal masks, ready for SDPA.

    Built once per stack forward by :func:`self_attention_mask` / :func:`cross_attention_mask`
    and handed down to every layer as its one ``mask`` argument; an attention module that
    receives one trusts it and checks nothing again.

    Attributes:
        allowed: bool (B|1, H|1, L, S), True = may attend, with rows that see no key opened
            (all True) so no kernel produces NaN; None when nothing is masked (or only
            ``is_causal``).
        dead: bool (B|1, H|1, L, 1), True where a row sees no key; its head output is zeroed.
        dead_rows: bool (B|1, L, 1), True where a row sees no key in any head; the module's
            output row is zeroed (the out_proj bias is not added to an empty attention).
        is_causal: use SDPA's ``is_causal`` fast path (plain causal mask with L == S).
        query_padding: bool (B, L), True = padding query token (the norms of a layer leave it
            out of their statistics; attention keeps it out of the backward pass), or None.
            Self-attention: the last L keys; a Decoder's cross-attention mask carries the
            target's.
        packing: set when the queries arrive packed, (1, N, D) (see :mod:`addnorm.packing`),
            and ``query_padding`` is None. With ``allowed`` None the mask is the padding
            alone: each row attends to its own packed tokens (:attr:`variable_length`, see
            :mod:`addnorm.varlen_attention`). Otherwise the attention unpacks its projections
            for the padded kernel and packs its output back, and ``dead_rows`` is packed too,
            (1, N, 1).
    """

    allowed: torch.Tensor | None
    dead: torch.Tensor | None
    dead_rows: torch.Tensor | None
    is_causal: bool
    query_padding: torch.Tensor | None = None
    packing: Packing | None = None

    @property
    def variable_length(self) -> bool:
        """Whether the queries are packed and each row attends to its own tokens only."""
        return self.packing is not None and self.allowed is None


def _check_attend_mask(
    attend_mask: object, batch: int, n_heads: int, query_len: int, key_len: int
) -> torch.Tensor:
    """attend_mask as bool (B|1, H|1, L, S), or an error naming the accepted shapes."""
    mask = check_bool_mask("attend_mask (True = may attend)", attend_mask)
    shape = tuple(mask.shape)
    # Each dim is compared only with the dim it must equal, once the rank is known: a traced
    # shape compared across ranks would keep an accidental equality (L == B) as a guard.
    if mask.ndim == 2 and same_shape(shape, (query_len, key_len)):
        return mask[None, None]  # (1, 1, L, S)
    fits = mask.ndim in (3, 4) and same_shape(shape[-2:], (query_len, key_len))
    fits = fits and shape[0] in (1, batch)
    if mask.ndim == 3 and fits:
        return mask[:, None]  # (B, 1, L, S)
    if mask.ndim == 4 and fits and shape[1] in (1, n_heads):
        return mask
    raise ValueError(
        f"attend_mask must have shape (L, S) = {(query_len, key_len)}, "
        f"(B, L, S) = {(batch, query_len, key_len)} or "
        f"(B, H, L, S) = {(batch, n_heads, query_len, key_len)}; got {shape}"
    )


def causal_attend_mask(query_len: int, key_len: int, device: torch.device) -> torch.Tensor:
    """Bottom-right aligned causal mask, True = may attend: ``j <= i + (S - L)``.

    Shapes:
        returns: (L, S) bool
    """
    full = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    return full.tril(key_len - query_len)


def build_attention_mask(
    *,
    batch: int,
    n_heads: int,
    query_len: int,
    key_len: int,
    device: torch.device,
    padding_mask: torch.Tensor | None = None,
    attend_mask: torch.Tensor | None = None,
    causal: bool = False,
    self_attention: bool = True,
) -> AttentionMask:
    """Validate and AND together ``padding_mask``, ``attend_mask`` and ``causal``.

    For self-attention the queries are the last L of the S keys, so their padding (for the
    norms) is the last L columns of ``padding_mask``.

    Shapes:
        padding_mask: (B, S) bool, True = padding key
        attend_mask: (L, S), (B, L, S) or (B, H, L, S) bool, True = may attend
        returns: an :class:`AttentionMask` whose tensors broadcast against (B, H, L, S)
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} ({causal!r})")
    query_padding = None
    allowed = None
    if attend_mask is not None:
        allowed = _check_attend_mask(attend_mask, batch, n_heads, query_len, key_len)
    if padding_mask is not None:
        name = "padding_mask (True = padding)"
        padding_mask = check_bool_mask(name, padding_mask, (batch, key_len), device)
        if self_attention:
            query_padding = padding_mask[:, key_len - query_len :]  # (B, L): the new keys
        keep = ~padding_mask[:, None, None, :]  # (B, 1, 1, S)
        allowed = keep if allowed is None else allowed & keep  # (B, H|1, L|1, S)
    if causal and not (query_len == 1 and key_len >= 1):  # one last query sees every key
        if allowed is None and query_len == key_len:
            return AttentionMask(None, None, None, True, query_padding)
        tril = causal_attend_mask(query_len, key_len, device)  # (L, S)
        allowed = tril if allowed is None else allowed & tril
    if allowed is None:
        return AttentionMask(None, None, None, False, query_padding)
    allowed = allowed.reshape((1,) * (4 - allowed.ndim) + allowed.shape)  # (B|1, H|1, L|1, S)
    dead = ~allowed.any(dim=-1, keepdim=True)  # (B|1, H|1, L|1, 1)
    if _known_no_dead_row(dead):  # nothing to open or zero: every layer skips that work
        return AttentionMask(allowed, None, None, False, query_padding)
    return AttentionMask(allowed | dead, dead, dead.all(dim=1), False, query_padding)


def _known_no_dead_row(dead: torch.Tensor) -> bool:
    """Whether it is known that no row is dead: read back where that is free, eager on the
    CPU; elsewhere False, unread (a CUDA read would sync; a captured graph keeps the general
    path, which gives the same results)."""
    if dead.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    return not bool(dead.any())


def self_attention_mask(
    x: torch.Tensor,
    *,
    n_heads: int,
    padding_mask: torch.Tensor | None = None,
    attend_mask: torch.Tensor | None = None,
    causal: bool = False,
    cached: int = 0,
) -> AttentionMask:
    """The mask of a self-attention over ``cached`` earlier keys followed by x's L tokens.

    Shapes:
        x: (B, L, D); padding_mask: (B, S) with S = cached + L (True = padding)
        attend_mask: (L, S), (B, L, S) or (B, H, L, S) (True = may attend)
    """
    x = check_tensor("x", x, ndim=3, floating=True)
    batch, length, _ = x.shape
    return build_attention_mask(
        batch=batch, n_heads=n_heads, query_len=length, key_len=cached + length,
        device=x.device, padding_mask=padding_mask, attend_mask=attend_mask, causal=causal,
    )


def cross_attention_mask(
    x: torch.Tensor, memory: torch.Tensor, *, n_heads: int, padding_mask: torch.Tensor | None = None
) -> AttentionMask:
    """The mask of x's queries over the memory's keys (``padding_mask``: the memory's).

    Shapes:
        x: (B, L, D); memory: (B, S, D); padding_mask: (B, S) (True = padding)
    """
    x = check_tensor("x", x, ndim=3, floating=True)
    memory = check_tensor("memory", memory, ndim=3, floating=True)
    if memory.shape[0] != x.shape[0]:
        raise ValueError(
            f"memory batch size ({memory.shape[0]}) must equal x batch size ({x.shape[0]})"
        )
    return build_attention_mask(
        batch=x.shape[0], n_heads=n_heads, query_len=x.shape[1], key_len=memory.shape[1],
        device=x.device, padding_mask=padding_mask, self_attention=False,
    )


def packed_mask(
    mask: AttentionMask, packing: Packing, *, padding_only: bool = False
) -> AttentionMask:
    """``mask`` for a self-attention whose queries arrive packed by ``packing``.

    ``padding_only``: ``mask`` was built from ``packing``'s padding alone (no attend mask, not
    causal), so every packed query sees exactly the tokens of its row, which include itself:
    the result has no ``allowed``, ``dead`` or ``dead_rows``
    (:attr:`AttentionMask.variable_length`).
    Otherwise the kernel still sees the padded layout, so ``allowed`` and ``dead`` are
    unchanged; the output rows are packed, and so is ``dead_rows``. No packed token is padding.
    """
    if padding_only:
        return AttentionMask(None, None, None, False, None, packing)
    dead_rows = mask.dead_rows
    if dead_rows is not None:  # (B|1, L, 1) -> (1, N, 1)
        dead_rows = packing.pack(dead_rows.expand(packing.batch, packing.length, 1))
    return mask._replace(dead_rows=dead_rows, query_padding=None, packing=packing)
