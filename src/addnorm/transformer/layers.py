"""Encoder and decoder layers (Vaswani et al., 2017, section 3.1), post-LN or pre-LN.

    EncoderLayer:  x = AddNorm(x, SelfAttention)                 (padding; causal for an LM)
                   x = AddNorm(x, FFN)
    DecoderLayer:  x = AddNorm(x, MaskedSelfAttention)           (causal, bottom-right)
                   x = AddNorm(x, CrossAttention(., memory))
                   x = AddNorm(x, FFN)

with ``AddNorm(x, f) = norm(x + dropout(f(x)))`` (post) or ``x + dropout(f(norm(x)))`` (pre).
Shapes legend: B batch, L query length, S key length, D d_model, F d_ff. Mask polarity:
``padding_mask`` True = padding, ``attend_mask`` True = may attend (see ``attention.py``).

A single ``dropout`` probability is applied where torch.nn applies it: on the attention
weights, on each sublayer's output (inside Add & Norm) and inside the FFN.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm._checks import check_choice, check_int, check_tensor
from addnorm.attention import AttentionMask, MultiHeadAttention, build_attention_mask
from addnorm.cache import KVCache, LayerCache
from addnorm.feedforward import FeedForward
from addnorm.norms import NORM_KINDS, make_norm
from addnorm.residual import AddNorm
from addnorm.rotary import RotaryEmbedding

__all__ = ["DecoderLayer", "EncoderLayer", "xavier_init_"]


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


def _add_norm(
    d_model: int, position: str, norm: str, eps: float, bias: bool, dropout: float
) -> AddNorm:
    """An AddNorm whose norm has ``bias`` when it is a LayerNorm (the other kinds fix it)."""
    check_choice("norm", norm, NORM_KINDS)
    module = make_norm(norm, d_model, eps=eps, bias=bias or norm != "layer")
    return AddNorm(d_model, position=position, norm=module, dropout=dropout)


def query_padding(padding_mask: torch.Tensor | None, query_len: int) -> torch.Tensor | None:
    """The padding of the queries: the last L keys of self-attention (cache first)."""
    return None if padding_mask is None else padding_mask[:, -query_len:]


def _check_layer_cache(cache: object, *, cross: bool) -> LayerCache | None:
    if cache is None:
        return None
    if not isinstance(cache, LayerCache):
        raise TypeError(f"cache must be a LayerCache or None, got {type(cache).__name__}")
    if cross and not isinstance(cache.cross_attn, KVCache):
        raise ValueError("a DecoderLayer cache needs a cross_attn KVCache, got None")
    return cache


def _cached_length(cache: LayerCache | None) -> int:
    return 0 if cache is None else cache.self_attn.length


class EncoderLayer(nn.Module):
    """Self-attention and a position-wise FFN, each inside Add & Norm.

    Used causally (``causal=True``, with a ``cache`` for decoding) it is the block of a
    decoder-only language model.

    Args:
        d_model, n_heads, d_ff: widths D, H and F.
        dropout: the paper's P_drop (attention weights, sublayer outputs, inside the FFN).
        activation: the FFN's (``"relu"``, ``"gelu"``, ``"gelu_tanh"``, ``"swiglu"``).
        norm_position: ``"post"`` (the paper) or ``"pre"``.
        norm: norm kind (``"layer"``, ``"batch"``, ``"rms"``, ``"group"``).
        norm_eps: the norm's epsilon.
        bias: biases of the linear layers and of LayerNorm (as in torch.nn).
        rotary: a shared :class:`RotaryEmbedding` for the self-attention, or None.

    Submodules: ``self_attn``, ``ff``, ``attn_add_norm``, ``ff_add_norm``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_position: str = "post",
        norm: str = "layer",
        norm_eps: float = 1e-5,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=dropout, bias=bias, rotary=rotary
        )
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        args = (d_model, norm_position, norm, norm_eps, bias, dropout)
        self.attn_add_norm = _add_norm(*args)
        self.ff_add_norm = _add_norm(*args)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weight matrices, zero biases (see :func:`xavier_init_`)."""
        xavier_init_(self)

    def forward(
        self,
        x: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        attend_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One encoder layer.

        Args:
            x: the layer input.
            padding_mask: True = padding key; with a ``cache`` it covers the cached keys
                followed by x's (S = cache length + L), else S = L.
            attend_mask: True = may attend.
            causal: bottom-right aligned causal self-attention (decoder-only use).
            cache: the layer's :class:`LayerCache` for cached decoding (``cross_attn`` unused).
            positions: x's positions, for rotary embeddings.

        Shapes:
            x: (B, L, D); padding_mask: (B, S); attend_mask: (L, S), (B, L, S), (B, H, L, S)
            positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        check_tensor("x", x, ndim=3, last_dim=self.d_model, floating=True)
        cache = _check_layer_cache(cache, cross=False)
        batch, length, _ = x.shape
        mask = build_attention_mask(
            batch=batch, n_heads=self.self_attn.n_heads, query_len=length,
            key_len=_cached_length(cache) + length, device=x.device,
            padding_mask=padding_mask, attend_mask=attend_mask, causal=causal,
        )
        return self.forward_with_mask(
            x, mask, query_padding_mask=query_padding(padding_mask, length),
            cache=cache, positions=positions,
        )

    def forward_with_mask(
        self,
        x: torch.Tensor,
        mask: AttentionMask,
        *,
        query_padding_mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` with a prebuilt self-attention mask (stacks build it once).

        Shapes:
            x: (B, L, D); query_padding_mask: (B, L); positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        kv = None if cache is None else cache.self_attn

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            q, k, v = self.self_attn.project(h, cache=kv, positions=positions)
            return self.self_attn.attend(q, k, v, mask)

        x = self.attn_add_norm(x, self_attention, padding_mask=query_padding_mask)
        return self.ff_add_norm(x, self.ff, padding_mask=query_padding_mask)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, FFN; each inside Add & Norm.

    Takes the arguments of :class:`EncoderLayer`; ``rotary`` applies to the self-attention
    only. Submodules: ``self_attn``, ``cross_attn``, ``ff``, ``self_attn_add_norm``,
    ``cross_attn_add_norm``, ``ff_add_norm``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_position: str = "post",
        norm: str = "layer",
        norm_eps: float = 1e-5,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=dropout, bias=bias, rotary=rotary
        )
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias)
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        args = (d_model, norm_position, norm, norm_eps, bias, dropout)
        self.self_attn_add_norm = _add_norm(*args)
        self.cross_attn_add_norm = _add_norm(*args)
        self.ff_add_norm = _add_norm(*args)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weight matrices, zero biases (see :func:`xavier_init_`)."""
        xavier_init_(self)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        attend_mask: torch.Tensor | None = None,
        causal: bool = True,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One decoder layer.

        Args:
            x: the target-side input.
            memory: the encoder output.
            padding_mask: True = padding target key (cached keys first when ``cache``).
            memory_padding_mask: True = padding source token.
            attend_mask: True = may attend, for the self-attention.
            causal: bottom-right aligned causal self-attention (default True).
            cache: the layer's :class:`LayerCache` (self and cross KV caches).
            positions: x's positions, for rotary embeddings.

        Shapes:
            x: (B, L, D); memory: (B, S_mem, D); padding_mask: (B, S); memory_padding_mask:
            (B, S_mem); attend_mask: (L, S), (B, L, S) or (B, H, L, S); positions: (L,), (B, L)
            returns: (B, L, D)
        """
        check_tensor("x", x, ndim=3, last_dim=self.d_model, floating=True)
        check_tensor("memory", memory, ndim=3, last_dim=self.d_model, floating=True)
        cache = _check_layer_cache(cache, cross=True)
        batch, length, _ = x.shape
        n_heads = self.self_attn.n_heads
        self_mask = build_attention_mask(
            batch=batch, n_heads=n_heads, query_len=length,
            key_len=_cached_length(cache) + length, device=x.device,
            padding_mask=padding_mask, attend_mask=attend_mask, causal=causal,
        )
        cross_mask = build_attention_mask(
            batch=batch, n_heads=n_heads, query_len=length, key_len=memory.shape[1],
            device=x.device, padding_mask=memory_padding_mask,
        )
        return self.forward_with_mask(
            x, memory, self_mask, cross_mask,
            query_padding_mask=query_padding(padding_mask, length),
            cache=cache, positions=positions,
        )

    def forward_with_mask(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        self_mask: AttentionMask,
        cross_mask: AttentionMask,
        *,
        query_padding_mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` with prebuilt masks (stacks build them once for all layers).

        Shapes:
            x: (B, L, D); memory: (B, S_mem, D); query_padding_mask: (B, L)
            positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        self_kv = None if cache is None else cache.self_attn
        cross_kv = None if cache is None else cache.cross_attn

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            q, k, v = self.self_attn.project(h, cache=self_kv, positions=positions)
            return self.self_attn.attend(q, k, v, self_mask)

        def cross_attention(h: torch.Tensor) -> torch.Tensor:
            q, k, v = self.cross_attn.project(h, memory, cache=cross_kv)
            return self.cross_attn.attend(q, k, v, cross_mask)

        pad = query_padding_mask
        x = self.self_attn_add_norm(x, self_attention, padding_mask=pad)
        x = self.cross_attn_add_norm(x, cross_attention, padding_mask=pad)
        return self.ff_add_norm(x, self.ff, padding_mask=pad)
