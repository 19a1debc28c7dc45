"""Stacks of N encoder or decoder layers, and the encoder-decoder body of the Transformer.

Shapes legend: B batch, S source length, L target length, D d_model.

Two defects of ``torch.nn.TransformerEncoder``/``Decoder`` are avoided on purpose:

- Each layer is constructed, and so initialised, on its own; torch.nn deep-copies one layer
  N times (only ``nn.Transformer`` re-initialises them afterwards).
- The final norm exists only where it belongs: after a pre-LN stack, whose residual stream is
  never normalised otherwise. A post-LN stack already ends in a norm, so a second one right
  after it (which ``nn.Transformer`` always adds) is only built on request
  (``final_norm=True``), to mirror torch.nn.

The stacks are the public boundary of the layers: a stack checks its input and combines the
padding / attend / causal masks once per forward into an
:class:`~addnorm.attention.AttentionMask` that every layer receives through ``__call__``
(so module hooks, ``torch.utils.checkpoint`` wrappers and per-layer FSDP see each call).
Polarity: ``padding_mask`` True = padding, ``attend_mask`` True = may attend.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.attention import cross_attention_mask, self_attention_mask
from addnorm.attention_mask import AttentionMask, packed_mask
from addnorm.cache import DecodingCache, LayerCache
from addnorm.norms import NoNorm
from addnorm.packing import Packing, check_unpad
from addnorm.rotary import RotaryEmbedding
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.layers import DecoderLayer, EncoderLayer, norm_module
from addnorm.utils.checks import check_int, check_tensor

__all__ = ["Decoder", "Encoder", "EncoderDecoder"]


def _final_norm(final_norm: bool | None, cfg: LayerConfig) -> nn.Module:
    """The norm after the last layer: by default only for pre-LN (see the module docstring)."""
    if final_norm is None:
        final_norm = cfg.norm_position == "pre"
    if not isinstance(final_norm, bool):
        raise TypeError(f"final_norm must be a bool or None, got {type(final_norm).__name__}")
    return norm_module(cfg) if final_norm else NoNorm()


def _layer_caches(cache: object, n_layers: int) -> list[LayerCache] | list[None]:
    """One cache per layer (all None without a cache), after checking the cache fits."""
    if cache is None:
        return [None] * n_layers
    if not isinstance(cache, DecodingCache):
        raise TypeError(f"cache must be a DecodingCache or None, got {type(cache).__name__}")
    if len(cache.layers) != n_layers:
        raise ValueError(f"cache has {len(cache.layers)} layer caches, the stack {n_layers}")
    return cache.layers


def _cached_length(cache: DecodingCache | None, new: int) -> int:
    """Keys before the ``new`` ones: the cached count (every other slot, for a static cache
    being compiled)."""
    return 0 if cache is None else cache.layers[0].self_attn.cached_before(new)


def _packing(mask: AttentionMask) -> Packing | None:
    """The packing of an unpadded call, or None where it would not pack: compiled (the packed
    shape depends on the data) or with no padding to leave out."""
    if torch.compiler.is_compiling() or mask.query_padding is None:
        return None
    packing = Packing.from_padding(mask.query_padding)
    return packing if packing.has_padding else None


class Encoder(nn.Module):
    """N independently initialised :class:`EncoderLayer` s, then ``norm``.

    Args:
        cfg: the settings of every layer (:class:`~addnorm.transformer.config.LayerConfig`).
        n_layers: N.
        rotary: a :class:`RotaryEmbedding` shared by every layer's self-attention, or None.
        final_norm: norm after the last layer; None = only for pre-LN. True with post-LN
            mirrors ``nn.Transformer`` (two norms in a row).
        unpad: with a ``padding_mask`` (and no ``causal`` or ``cache``), run the layers on the
            real tokens only, packed into one row (see :mod:`addnorm.packing`); the output is
            zero at padding positions, and every layer and hook sees (1, N, D). Attention
            runs over each row's real tokens (:mod:`addnorm.varlen_attention`), or, with an
            ``attend_mask``, on its projections unpacked to the padded layout. Padding
            outputs are zeroed on every path, compiled ones included (which do not pack: the
            packed shape depends on the data). Not with ``norm="group"``, whose statistics
            span each sequence's positions.

    Submodules: ``layers`` (``nn.ModuleList``), ``norm`` (a norm, or
    :class:`~addnorm.norms.NoNorm` when there is none).
    """

    def __init__(
        self,
        cfg: LayerConfig,
        n_layers: int,
        *,
        rotary: RotaryEmbedding | None = None,
        final_norm: bool | None = None,
        unpad: bool = False,
    ) -> None:
        super().__init__()
        n_layers = check_int("n_layers", n_layers, min_value=1)
        self.unpad = check_unpad(unpad, cfg.norm)
        self.layers = nn.ModuleList(EncoderLayer(cfg, rotary=rotary) for _ in range(n_layers))
        self.cfg = cfg
        self.norm = _final_norm(final_norm, cfg)

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
        """Run the layers in turn, then the final norm; the mask is built once for all.

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
        check_tensor("x", x, ndim=3, last_dim=self.cfg.d_model, floating=True)
        caches = _layer_caches(cache, len(self.layers))
        mask = self_attention_mask(
            x, n_heads=self.cfg.n_heads, padding_mask=padding_mask, attend_mask=attend_mask,
            causal=causal, cached=_cached_length(cache, x.shape[1]),
        )
        unpadding = self.unpad and padding_mask is not None and not causal and cache is None
        packing = _packing(mask) if unpadding else None
        if packing is not None:
            padding_only = attend_mask is None  # each row attends to its own tokens
            x, mask = packing.pack(x), packed_mask(mask, packing, padding_only=padding_only)
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x = layer(x, mask, cache=layer_cache, positions=positions)
        x = self.norm(x, padding_mask=mask.query_padding)
        if packing is not None:
            return packing.unpack(x)  # (B, L, D), zeros at padding
        if unpadding and torch.compiler.is_compiling():  # padded path, the packed path's zeros
            return x.masked_fill(mask.query_padding[..., None], 0.0)  # type: ignore[index]
        return x  # not unpadding, or eager with no padding to zero


class Decoder(nn.Module):
    """N independently initialised :class:`DecoderLayer` s, then ``norm``.

    Takes the arguments of :class:`Encoder`. Submodules: ``layers``, ``norm``.
    """

    def __init__(
        self,
        cfg: LayerConfig,
        n_layers: int,
        *,
        rotary: RotaryEmbedding | None = None,
        final_norm: bool | None = None,
    ) -> None:
        super().__init__()
        n_layers = check_int("n_layers", n_layers, min_value=1)
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotary=rotary) for _ in range(n_layers))
        self.cfg = cfg
        self.norm = _final_norm(final_norm, cfg)

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
        memory_mask: AttentionMask | None = None,
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
            memory_mask: the cross-attention mask, built already (a decoding cache's
                ``memory_mask``, built once for every step); instead of
                ``memory_padding_mask``.

        Shapes:
            x: (B, L, D); memory: (B, S_mem, D); padding_mask: (B, S); memory_padding_mask:
            (B, S_mem); attend_mask: (L, S), (B, L, S) or (B, H, L, S); positions: (L,), (B, L)
            returns: (B, L, D)
        """
        d_model, n_heads = self.cfg.d_model, self.cfg.n_heads
        check_tensor("x", x, ndim=3, last_dim=d_model, floating=True)
        check_tensor("memory", memory, ndim=3, last_dim=d_model, floating=True)
        caches = _layer_caches(cache, len(self.layers))
        mask = self_attention_mask(
            x, n_heads=n_heads, padding_mask=padding_mask, attend_mask=attend_mask,
            causal=causal, cached=_cached_length(cache, x.shape[1]),
        )
        if memory_mask is None:
            memory_mask = cross_attention_mask(
                x, memory, n_heads=n_heads, padding_mask=memory_padding_mask
            )
        elif memory_padding_mask is not None:
            raise ValueError("give memory_padding_mask or a built memory_mask, not both")
        # the target's padding queries are kept out of the cross-attention's backward pass
        memory_mask = memory_mask._replace(query_padding=mask.query_padding)
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x = layer(x, memory, mask, memory_mask, cache=layer_cache, positions=positions)
        return self.norm(x, padding_mask=mask.query_padding)


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
        if encoder.cfg.d_model != decoder.cfg.d_model:
            raise ValueError(
                f"encoder d_model ({encoder.cfg.d_model}) must equal decoder d_model "
                f"({decoder.cfg.d_model})"
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
        d_model = self.encoder.cfg.d_model
        check_tensor("src", src, ndim=3, last_dim=d_model, floating=True)
        check_tensor("tgt", tgt, ndim=3, last_dim=d_model, floating=True)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"src batch size ({src.shape[0]}) must equal tgt batch size ({tgt.shape[0]})"
            )
        memory = self.encoder(src, padding_mask=src_padding_mask)
        return self.decoder(
            tgt, memory, padding_mask=tgt_padding_mask,
            memory_padding_mask=src_padding_mask, causal=True,
        )
