"""Stacks of N encoder or decoder layers, and the encoder-decoder body of the Transformer.

Shapes legend: B batch, S source length, L target length, D d_model.

Two defects of ``torch.nn.TransformerEncoder``/``Decoder`` are avoided on purpose:

- Each layer is constructed, and so initialised, on its own; torch.nn deep-copies one layer
  N times (only ``nn.Transformer`` re-initialises them afterwards).
- The final norm exists only where it belongs: after a pre-LN stack, whose residual stream is
  never normalised otherwise. A post-LN stack already ends in a norm, so a second one right
  after it (which ``nn.Transformer`` always adds) is only built on request
  (``final_norm=True``), to mirror torch.nn.

The padding / attend / causal masks are combined once per stack forward and shared by the
layers (polarity: ``padding_mask`` True = padding, ``attend_mask`` True = may attend).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from addnorm._checks import check_choice, check_int, check_tensor
from addnorm.attention import build_attention_mask
from addnorm.cache import DecodingCache, LayerCache
from addnorm.norms import make_norm
from addnorm.residual import POSITIONS
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer.layers import DecoderLayer, EncoderLayer, query_padding

__all__ = ["Decoder", "Encoder", "EncoderDecoder"]


def _final_norm(
    final_norm: bool | None, norm_position: str, norm: str, d_model: int, eps: float, bias: bool
) -> nn.Module:
    """The norm after the last layer: by default only for pre-LN (see the module docstring)."""
    check_choice("norm_position", norm_position, POSITIONS)
    if final_norm is None:
        final_norm = norm_position == "pre"
    if not isinstance(final_norm, bool):
        raise TypeError(f"final_norm must be a bool or None, got {type(final_norm).__name__}")
    if not final_norm:
        return nn.Identity()
    return make_norm(norm, d_model, eps=eps, bias=bias or norm != "layer")


def _layer_caches(cache: object, n_layers: int) -> list[LayerCache | None]:
    if cache is None:
        return [None] * n_layers
    if not isinstance(cache, DecodingCache):
        raise TypeError(f"cache must be a DecodingCache or None, got {type(cache).__name__}")
    if len(cache.layers) != n_layers:
        raise ValueError(f"cache has {len(cache.layers)} layer caches, the stack {n_layers}")
    return list(cache.layers)


def _cached_length(caches: list[LayerCache | None]) -> int:
    return 0 if caches[0] is None else caches[0].self_attn.length


def _apply_norm(norm: nn.Module, x: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
    """``norm(x, padding_mask=padding)``; ``nn.Identity`` takes no mask."""
    if padding is None or isinstance(norm, nn.Identity):
        return norm(x)
    return norm(x, padding_mask=padding)


class Encoder(nn.Module):
    """N independently initialised :class:`EncoderLayer` s, then ``norm``.

    Args:
        n_layers: N.
        d_model, n_heads, d_ff, dropout, activation, norm_position, norm, norm_eps, bias,
            rotary: passed to every :class:`EncoderLayer` (``rotary`` is shared).
        final_norm: norm after the last layer; None = only for pre-LN. True with post-LN
            mirrors ``nn.Transformer`` (two norms in a row).

    Submodules: ``layers`` (``nn.ModuleList``), ``norm`` (a norm or ``nn.Identity()``).
    """

    def __init__(
        self,
        n_layers: int,
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
        final_norm: bool | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.layers = nn.ModuleList(
            EncoderLayer(
                d_model, n_heads, d_ff, dropout=dropout, activation=activation,
                norm_position=norm_position, norm=norm, norm_eps=norm_eps, bias=bias,
                rotary=rotary,
            )
            for _ in range(check_int("n_layers", n_layers, min_value=1))
        )
        self.norm = _final_norm(final_norm, norm_position, norm, d_model, norm_eps, bias)

    def forward(
        self,
        x: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        attend_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: DecodingCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the layers in turn, then the final norm.

        Args:
            x: the input sequence.
            padding_mask: True = padding key; with a ``cache`` it covers the cached keys then
                x's (S = cached + L; see :meth:`DecodingCache.extend`), else S = L.
            attend_mask: True = may attend.
            causal: bottom-right aligned causal self-attention (decoder-only LM).
            cache: the model's :class:`DecodingCache`, for cached decoding.
            positions: x's positions, for rotary embeddings.

        Shapes:
            x: (B, L, D); padding_mask: (B, S); attend_mask: (L, S), (B, L, S) or (B, H, L, S)
            positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        check_tensor("x", x, ndim=3, last_dim=self.d_model, floating=True)
        layers = cast("Sequence[EncoderLayer]", self.layers)  # built from EncoderLayers only
        caches = _layer_caches(cache, len(layers))
        batch, length, _ = x.shape
        mask = build_attention_mask(
            batch=batch, n_heads=layers[0].self_attn.n_heads, query_len=length,
            key_len=_cached_length(caches) + length, device=x.device,
            padding_mask=padding_mask, attend_mask=attend_mask, causal=causal,
        )
        query_padding_mask = query_padding(padding_mask, length)
        for layer, layer_cache in zip(layers, caches, strict=True):
            x = layer.forward_with_mask(
                x, mask, query_padding_mask=query_padding_mask, cache=layer_cache,
                positions=positions,
            )
        return _apply_norm(self.norm, x, query_padding_mask)


class Decoder(nn.Module):
    """N independently initialised :class:`DecoderLayer` s, then ``norm``.

    Takes the arguments of :class:`Encoder`. Submodules: ``layers``, ``norm``.
    """

    def __init__(
        self,
        n_layers: int,
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
        final_norm: bool | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.layers = nn.ModuleList(
            DecoderLayer(
                d_model, n_heads, d_ff, dropout=dropout, activation=activation,
                norm_position=norm_position, norm=norm, norm_eps=norm_eps, bias=bias,
                rotary=rotary,
            )
            for _ in range(check_int("n_layers", n_layers, min_value=1))
        )
        self.norm = _final_norm(final_norm, norm_position, norm, d_model, norm_eps, bias)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        attend_mask: torch.Tensor | None = None,
        causal: bool = True,
        cache: DecodingCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the layers in turn over the target, each attending to ``memory``; final norm.

        Args:
            x: the target-side input.
            memory: the encoder output.
            padding_mask: True = padding target key (cached keys first with a ``cache``).
            memory_padding_mask: True = padding source token.
            attend_mask: True = may attend, for the self-attention.
            causal: bottom-right aligned causal self-attention (default True).
            cache: the model's :class:`DecodingCache`, for cached decoding.
            positions: x's positions, for rotary embeddings.

        Shapes:
            x: (B, L, D); memory: (B, S_mem, D); padding_mask: (B, S); memory_padding_mask:
            (B, S_mem); attend_mask: (L, S), (B, L, S) or (B, H, L, S); positions: (L,), (B, L)
            returns: (B, L, D)
        """
        check_tensor("x", x, ndim=3, last_dim=self.d_model, floating=True)
        check_tensor("memory", memory, ndim=3, last_dim=self.d_model, floating=True)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(
                f"memory batch size ({memory.shape[0]}) must equal x batch size ({x.shape[0]})"
            )
        layers = cast("Sequence[DecoderLayer]", self.layers)  # built from DecoderLayers only
        caches = _layer_caches(cache, len(layers))
        batch, length, _ = x.shape
        n_heads = layers[0].self_attn.n_heads
        self_mask = build_attention_mask(
            batch=batch, n_heads=n_heads, query_len=length,
            key_len=_cached_length(caches) + length, device=x.device,
            padding_mask=padding_mask, attend_mask=attend_mask, causal=causal,
        )
        cross_mask = build_attention_mask(
            batch=batch, n_heads=n_heads, query_len=length, key_len=memory.shape[1],
            device=x.device, padding_mask=memory_padding_mask,
        )
        query_padding_mask = query_padding(padding_mask, length)
        for layer, layer_cache in zip(layers, caches, strict=True):
            x = layer.forward_with_mask(
                x, memory, self_mask, cross_mask, query_padding_mask=query_padding_mask,
                cache=layer_cache, positions=positions,
            )
        return _apply_norm(self.norm, x, query_padding_mask)


class EncoderDecoder(nn.Module):
    """The body of the paper's model without embeddings: the counterpart of ``nn.Transformer``.

    Submodules: ``encoder`` (:class:`Encoder`), ``decoder`` (:class:`Decoder`).
    """

    def __init__(self, encoder: Encoder, decoder: Decoder) -> None:
        super().__init__()
        if not isinstance(encoder, Encoder):
            raise TypeError(f"encoder must be an Encoder, got {type(encoder).__name__}")
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must be a Decoder, got {type(decoder).__name__}")
        if encoder.d_model != decoder.d_model:
            raise ValueError(
                f"encoder d_model ({encoder.d_model}) must equal decoder d_model "
                f"({decoder.d_model})"
            )
        self.encoder = encoder
        self.decoder = decoder

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        *,
        src_padding_mask: torch.Tensor | None = None,
        tgt_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encode ``src``, then decode ``tgt`` causally against it (teacher forcing).

        Shapes:
            src: (B, S, D); tgt: (B, L, D)
            src_padding_mask: (B, S); tgt_padding_mask: (B, L) (True = padding)
            returns: (B, L, D)
        """
        check_tensor("src", src, ndim=3, last_dim=self.encoder.d_model, floating=True)
        check_tensor("tgt", tgt, ndim=3, last_dim=self.decoder.d_model, floating=True)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"src batch size ({src.shape[0]}) must equal tgt batch size ({tgt.shape[0]})"
            )
        memory = self.encoder(src, padding_mask=src_padding_mask)
        return self.decoder(
            tgt, memory, padding_mask=tgt_padding_mask,
            memory_padding_mask=src_padding_mask, causal=True,
        )
