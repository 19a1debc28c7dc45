"""Encoder and decoder layers (Vaswani et al., 2017, section 3.1), post-LN or pre-LN.

    EncoderLayer:  x = AddNorm(x, SelfAttention)                 (padding; causal for an LM)
                   x = AddNorm(x, FFN)
    DecoderLayer:  x = AddNorm(x, MaskedSelfAttention)           (causal, bottom-right)
                   x = AddNorm(x, CrossAttention(., memory))
                   x = AddNorm(x, FFN)

with ``AddNorm(x, f) = norm(x + dropout(f(x)))`` (post) or ``x + dropout(f(norm(x)))`` (pre).
Shapes legend: B batch, L query length, S key length, D d_model, F d_ff.

A layer takes its masks prebuilt, as one :class:`~addnorm.attention.AttentionMask` per
attention (a stack builds them once for all its layers, see :mod:`addnorm.transformer.stacks`;
to call a layer alone, build one with :func:`~addnorm.attention.self_attention_mask`). The
mask also carries the queries' padding, which the norms leave out of their statistics.
A layer checks the types of its mask and cache (a prebuilt mask is trusted as it is); its
parts check the structure of the rest. Values were checked where they entered: the model or
the stack above.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from addnorm.attention import AttentionMask, MultiHeadAttention
from addnorm.cache import KVCache, LayerCache
from addnorm.feedforward import FeedForward, make_feedforward
from addnorm.norms import make_norm
from addnorm.residual import AddNorm
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer.config import LayerConfig

__all__ = ["DecoderLayer", "EncoderLayer", "norm_module", "xavier_init_"]


def xavier_init_(layer: nn.Module) -> None:
    """Paper / ``nn.Transformer._reset_parameters`` rule: Xavier-uniform weight matrices.

    Every ``nn.Linear`` weight inside ``layer`` gets Xavier-uniform (each of W_q, W_k, W_v on
    its own, see :meth:`MultiHeadAttention.reset_parameters`), every linear bias zero; norms
    keep weight 1 and bias 0.
    """
    done: set[int] = set()  # attention projections, initialised by their module
    for module in layer.modules():  # pre-order: an attention module comes before its children
        if isinstance(module, MultiHeadAttention):
            module.reset_parameters()
            done.update((id(module.in_proj), id(module.out_proj)))
        elif isinstance(module, nn.Linear) and id(module) not in done:
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


# Each part is built by its own constructor from the config's fields (docs/design.md,
# "Validation"): what a subclass or a later field adds in ``__init__`` is there too.


def norm_module(cfg: LayerConfig) -> nn.Module:
    """The norm of the kind ``cfg.norm`` names (layer, batch, RMS or group), of width
    ``cfg.d_model`` with ``cfg.norm_eps``; ``cfg.bias`` applies to LayerNorm only (the other
    kinds fix theirs); a GroupNorm has :func:`~addnorm.norms.make_norm`'s default group count."""
    bias = cfg.bias or cfg.norm != "layer"
    return make_norm(cfg.norm, cfg.d_model, eps=cfg.norm_eps, bias=bias)


def _add_norm(cfg: LayerConfig) -> AddNorm:
    return AddNorm(
        cfg.d_model, norm_position=cfg.norm_position, norm=norm_module(cfg), dropout=cfg.dropout
    )


def _attention(cfg: LayerConfig, rotary: RotaryEmbedding | None = None) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model, cfg.n_heads, dropout=cfg.dropout, bias=cfg.bias, rotary=rotary
    )


def _feedforward(cfg: LayerConfig) -> FeedForward:
    return make_feedforward(
        cfg.d_model, cfg.d_ff, activation=cfg.activation, dropout=cfg.dropout, bias=cfg.bias
    )


def _check_inputs(cache: object, *, cross: bool, **masks: object) -> None:
    """Type checks only (isinstance, no tensor work): the stack built and checked the masks
    and the cache."""
    for name, mask in masks.items():
        if mask is not None and not isinstance(mask, AttentionMask):
            raise TypeError(
                f"{name} must be an AttentionMask (see addnorm.attention.self_attention_mask) "
                f"or None, got {type(mask).__name__}"
            )
    if cache is None:
        return
    if not isinstance(cache, LayerCache):
        raise TypeError(f"cache must be a LayerCache or None, got {type(cache).__name__}")
    if cross and not isinstance(cache.cross_attn, KVCache):
        raise ValueError("a DecoderLayer cache needs a cross_attn KVCache, got None")


def _check_config(cfg: object) -> LayerConfig:
    """A LayerConfig (its fields were validated when it was built)."""
    if not isinstance(cfg, LayerConfig):
        raise TypeError(f"cfg must be a LayerConfig, got {type(cfg).__name__}")
    return cfg


class EncoderLayer(nn.Module):
    """Self-attention and a position-wise FFN, each inside Add & Norm.

    Used causally (a causal mask, with a ``cache`` for decoding) it is the block of a
    decoder-only language model.

    Args:
        cfg: the layer's settings (:class:`~addnorm.transformer.config.LayerConfig`).
        rotary: a shared :class:`RotaryEmbedding` for the self-attention, or None.

    Submodules: ``self_attn``, ``ff``, ``attn_add_norm``, ``ff_add_norm``.
    """

    def __init__(self, cfg: LayerConfig, *, rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.cfg = _check_config(cfg)
        self.self_attn = _attention(cfg, rotary)
        self.ff = _feedforward(cfg)
        self.attn_add_norm = _add_norm(cfg)
        self.ff_add_norm = _add_norm(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weight matrices, zero biases (see :func:`xavier_init_`)."""
        xavier_init_(self)

    def forward(
        self,
        x: torch.Tensor,
        mask: AttentionMask | None = None,
        *,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x = AddNorm(x, SelfAttention)``, then ``AddNorm(x, FFN)``.

        Args:
            x: the layer input.
            mask: the self-attention mask (None: attend everywhere).
            cache: the layer's :class:`LayerCache` for cached decoding (``cross_attn`` unused).
            positions: x's positions, for rotary embeddings.

        Shapes:
            x: (B, L, D); positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        _check_inputs(cache, cross=False, mask=mask)
        padding = None if mask is None else mask.query_padding  # (B, L)
        kv = None if cache is None else cache.self_attn
        self_attn = partial(self.self_attn, mask=mask, cache=kv, positions=positions)
        x = self.attn_add_norm(x, self_attn, padding_mask=padding)
        return self.ff_add_norm(x, self.ff, padding_mask=padding)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, FFN; each inside Add & Norm.

    Takes the arguments of :class:`EncoderLayer`; ``rotary`` applies to the self-attention
    only. Submodules: ``self_attn``, ``cross_attn``, ``ff``, ``self_attn_add_norm``,
    ``cross_attn_add_norm``, ``ff_add_norm``.
    """

    def __init__(self, cfg: LayerConfig, *, rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.cfg = _check_config(cfg)
        self.self_attn = _attention(cfg, rotary)
        self.cross_attn = _attention(cfg)
        self.ff = _feedforward(cfg)
        self.self_attn_add_norm = _add_norm(cfg)
        self.cross_attn_add_norm = _add_norm(cfg)
        self.ff_add_norm = _add_norm(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weight matrices, zero biases (see :func:`xavier_init_`)."""
        xavier_init_(self)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        mask: AttentionMask | None = None,
        memory_mask: AttentionMask | None = None,
        *,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention, cross-attention over ``memory`` and FFN, each in Add & Norm.

        Args:
            x: the target-side input.
            memory: the encoder output (read once into ``cache.cross_attn`` when cached).
            mask: the self-attention mask (causal for a decoder; None: attend everywhere).
            memory_mask: the cross-attention mask (the source padding), or None.
            cache: the layer's :class:`LayerCache` (self and cross KV caches).
            positions: x's positions, for rotary embeddings.

        Shapes:
            x: (B, L, D); memory: (B, S_mem, D); positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        _check_inputs(cache, cross=True, mask=mask, memory_mask=memory_mask)
        padding = None if mask is None else mask.query_padding  # (B, L)
        self_kv = None if cache is None else cache.self_attn
        cross_kv = None if cache is None else cache.cross_attn
        self_attn = partial(self.self_attn, mask=mask, cache=self_kv, positions=positions)
        cross_attn = partial(self.cross_attn, memory=memory, mask=memory_mask, cache=cross_kv)
        x = self.self_attn_add_norm(x, self_attn, padding_mask=padding)
        x = self.cross_attn_add_norm(x, cross_attn, padding_mask=padding)
        return self.ff_add_norm(x, self.ff, padding_mask=padding)
