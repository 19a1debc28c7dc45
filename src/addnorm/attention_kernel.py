"""Which kernel computes ``softmax(Q K^T / sqrt(Dh)) V`` for the attention modules.

``F.scaled_dot_product_attention`` everywhere, but for one case where it is the slow one:
bfloat16 on the CPU without gradients (inference under bf16 autocast, say). There SDPA's
flash kernel keeps its scores in float32, and the explicit product with bfloat16 matrix
multiplications, what torch.nn's fast path (``_transformer_encoder_layer_fwd``) computes, is
faster; it rounds the scores to bfloat16 before the softmax, which changes a layer's error
little (the times and errors: ``docs/measurements.md``, ``benchmarks/PERF_NOTES.md``).

Not for float16 (its scores overflow at 65504 where a float32 accumulator does not), not
with gradients (the product keeps a (B, H, L, S) tensor for the backward where SDPA keeps
none), and not past ``EXPLICIT_MAX_SCORES`` scores (their memory grows as L S).

:func:`product_with_weights` is the explicit product that also returns the attention weights,
in float32 or wider, for ``MultiHeadAttention.forward_with_weights`` (inspection).

Shapes legend: B batch, H heads, L queries, S keys, Dh head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "EXPLICIT_DTYPE",
    "EXPLICIT_MAX_SCORES",
    "explicit_product_pays",
    "product_with_weights",
    "scaled_dot_product",
]

EXPLICIT_MAX_SCORES = 2**24  # 32 MiB of bfloat16 scores
EXPLICIT_DTYPE = torch.bfloat16  # the one dtype the explicit product may take


def explicit_product_pays(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
                          ) -> bool:
    """Whether the explicit bfloat16 product takes this call (see the module docstring)."""
    if q.device.type != "cpu" or q.dtype != EXPLICIT_DTYPE or dropout_p != 0.0:
        return False  # decided before any size is looked at: no guard on a traced batch size
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    return math.prod(q.shape[:-1]) * k.shape[-2] <= EXPLICIT_MAX_SCORES


def scaled_dot_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    allowed: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, ...)``, through the
    explicit product where that is faster (:func:`explicit_product_pays`).

    Args:
        allowed: True = may attend, broadcasting against (B, H, L, S); every row must see a
            key (an :class:`~addnorm.attention_mask.AttentionMask` opens rows that see none).
        is_causal: SDPA's ``is_causal`` (top-left aligned; used with L == S).

    Shapes:
        q: (B, H, L, Dh); k, v: (B, H, S, Dh); returns: (B, H, L, Dh)
    """
    if not explicit_product_pays(q, k, v, dropout_p):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=dropout_p, is_causal=is_causal
        )
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, L, S)
    if is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        allowed = causal if allowed is None else allowed & causal
    if allowed is not None:
        scores = scores.masked_fill_(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, H, L, Dh)


def product_with_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    allowed: torch.Tensor | None,
    dead: torch.Tensor | None,
    dropout_p: float,
    training: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit ``softmax(Q K^T / sqrt(Dh)) V`` and its weights (before dropout; rows in
    ``dead``, which see no key, are zeros). Computed in float32 (or wider) and rounded once to
    v's dtype, as SDPA's CPU and flash kernels accumulate: float16 scores overflow where the
    kernel's do not.

    Shapes:
        q: (B, H, L, Dh); k, v: (B, H, S, Dh); allowed, dead: broadcasting against (B, H, L, S)
        returns: heads (B, H, L, Dh), weights (B, H, L, S)
    """
    wide = torch.promote_types(q.dtype, torch.float32)  # float16 scores overflow at 65504
    q, k = q.to(wide) / math.sqrt(q.shape[-1]), k.to(wide)
    scores = q @ k.transpose(-2, -1)  # (B, H, L, S)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    heads = F.dropout(weights, p=dropout_p, training=training) @ v.to(wide)  # (B, H, L, Dh)
    return heads.to(v.dtype), weights.to(v.dtype)
