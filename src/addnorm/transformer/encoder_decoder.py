"""The encoder-decoder Transformer (Vaswani et al., 2017).

Shapes legend: B batch, S source length, L target length, D d_model, V vocab,
N generated tokens.

Inputs and outputs (token checks, embeddings, positions, tied logits) are shared with the LM
in :mod:`addnorm.transformer.embedding`.

Decoding: ``start(...) -> (cache, logits (B, V))`` runs the source once and fills a
preallocated :class:`~addnorm.cache.DecodingCache` (the source's cross-attention keys, values
and mask included); ``step(tokens (B, 1), cache) -> logits (B, V)`` feeds one token per row;
``generate`` is the one :func:`~addnorm.generation.generate.generate` over them, which never
emits ``pad_id`` or ``bos_id``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim

from addnorm.cache import DecodingCache
from addnorm.cache_checks import check_cache_fits, check_decoding_step
from addnorm.family import DynamicShapes, ExportPart, GenerationSpec, padded_tokens
from addnorm.pretrained.mixin import PretrainedMixin
from addnorm.transformer.config import TransformerConfig
from addnorm.transformer.embedding import (
    Embedder,
    Tokens,
    id_tensor,
    learned_max_len,
    model_inputs,
    output_projection,
    rotary_for,
)
from addnorm.transformer.generate_entry import GenerateEntry, GenerateNames
from addnorm.transformer.layers import DecoderLayer, EncoderLayer
from addnorm.transformer.stacks import Decoder, Encoder
from addnorm.utils.checks import check_int

__all__ = ["Transformer"]


class Transformer(GenerateEntry, PretrainedMixin, nn.Module):
    """The encoder-decoder Transformer (Vaswani et al., 2017), configured by one config.

    Submodules: ``src_embed``, ``tgt_embed`` (:class:`Embedder`, sharing ``tokens`` when
    ``cfg.share_embeddings``), ``encoder`` (:class:`Encoder`), ``decoder``
    (:class:`Decoder`), ``to_logits`` (Linear D -> V_tgt, tied to the target table when
    ``cfg.tie_output``); ``rotary`` (shared by every self-attention) or None.

    Ties are shared modules and Parameters; ``to_empty`` and ``load_state_dict(...,
    assign=True)`` replace Parameters one by one and so break them: call :meth:`tie_weights`
    after them.
    """

    generate_names = GenerateNames("src_ids", "src_padding_mask", stop_fn=False)
    config_class = TransformerConfig  # save_pretrained / from_pretrained (addnorm.pretrained.mixin)

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(cfg, TransformerConfig):
            raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.rotary = rotary_for(cfg)
        self.src_embed = Embedder(cfg.src_vocab_size, cfg)
        shared = self.src_embed.tokens if cfg.share_embeddings else None
        self.tgt_embed = Embedder(cfg.tgt_vocab_size, cfg, tokens=shared)
        layer_cfg = cfg.layer_config()
        self.encoder = Encoder(
            layer_cfg, cfg.n_encoder_layers, rotary=self.rotary, final_norm=cfg.final_norm,
            unpad=cfg.unpad,
        )
        self.decoder = Decoder(
            layer_cfg, cfg.n_decoder_layers, rotary=self.rotary, final_norm=cfg.final_norm
        )
        tied = self.tgt_embed.tokens if cfg.tie_output else None
        self.to_logits = output_projection(cfg.d_model, cfg.tgt_vocab_size, tied)

    def tie_weights(self) -> None:
        """Restore the ties the config asks for: one table for source and target
        (``share_embeddings``) and the output projection on the target table
        (``tie_output``); needed after ``to_empty`` or ``load_state_dict(assign=True)``."""
        if self.cfg.share_embeddings:
            self.tgt_embed.tokens = self.src_embed.tokens
        if self.cfg.tie_output:
            self.to_logits.weight = self.tgt_embed.tokens.weight

    def _source(self, src_ids: object, src_padding_mask: object) -> Tokens:
        cfg = self.cfg
        return model_inputs(
            "src_ids", src_ids, "src_padding_mask", src_padding_mask,
            vocab_size=cfg.src_vocab_size, max_len=learned_max_len(cfg), pad_id=cfg.pad_id,
        )

    def encode(
        self, src_ids: torch.Tensor, *, src_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The encoder output (the memory the decoder attends to).

        Shapes:
            src_ids: (B, S); src_padding_mask: (B, S) bool, True = padding
            returns: (B, S, D)
        """
        return self._encode(self._source(src_ids, src_padding_mask))

    def _encode(self, src: Tokens) -> torch.Tensor:
        x = self.src_embed(src.ids, src.positions)  # (B, S, D)
        return self.encoder(x, padding_mask=src.padding_mask, positions=src.positions)

    def forward(
        self,
        src_ids: torch.Tensor,
        tgt_ids: torch.Tensor,
        *,
        src_padding_mask: torch.Tensor | None = None,
        tgt_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits for every target position (teacher forcing).

        Shapes:
            src_ids: (B, S); tgt_ids: (B, L); masks: like their ids, True = padding
            returns: (B, L, V)
        """
        cfg = self.cfg
        src = self._source(src_ids, src_padding_mask)
        tgt = model_inputs(
            "tgt_ids", tgt_ids, "tgt_padding_mask", tgt_padding_mask,
            vocab_size=cfg.tgt_vocab_size, max_len=learned_max_len(cfg), pad_id=cfg.pad_id,
        )
        if src.ids.shape[0] != tgt.ids.shape[0]:
            raise ValueError(
                f"src_ids batch size ({src.ids.shape[0]}) must equal tgt_ids batch size "
                f"({tgt.ids.shape[0]})"
            )
        memory = self._encode(src)  # (B, S, D)
        h = self.decoder(
            self.tgt_embed(tgt.ids, tgt.positions), memory, padding_mask=tgt.padding_mask,
            memory_padding_mask=src.padding_mask, causal=True, positions=tgt.positions,
        )  # (B, L, D)
        return self.to_logits(h)

    @torch.no_grad()
    def start(
        self,
        src_ids: torch.Tensor,
        src_padding_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int,
        static: bool = False,
    ) -> tuple[DecodingCache, torch.Tensor]:
        """Encode the source once, feed ``bos_id``; return the cache and the first logits.

        The cache holds ``max_new_tokens`` target positions and the memory's cross-attention
        keys/values and mask, built here once. ``static``: a cache in the static layout
        (:mod:`addnorm.cache`), whose steps all have the same shapes, as a compiled
        :meth:`step` needs.

        Shapes:
            src_ids: (B, S); src_padding_mask: (B, S)
            returns: cache, logits (B, V)
        """
        cfg = self.cfg
        check_int("max_new_tokens", max_new_tokens, min_value=1)
        if cfg.position_encoding == "learned" and max_new_tokens > cfg.max_len:
            raise ValueError(
                f"max_new_tokens ({max_new_tokens}) exceeds max_len ({cfg.max_len}) of the "
                "learned position table"
            )
        src = self._source(src_ids, src_padding_mask)
        batch = src.ids.shape[0]
        check_cache_fits(n_layers=cfg.n_decoder_layers, d_model=cfg.d_model, batch_size=batch,
                         prompt_len=0, max_new_tokens=max_new_tokens,
                         dtype=self.tgt_embed.tokens.weight.dtype, device=src.ids.device)
        memory = self._encode(src)  # (B, S, D)
        cache = DecodingCache.allocate(
            n_layers=cfg.n_decoder_layers, batch_size=batch, n_heads=cfg.n_heads,
            d_head=cfg.d_model // cfg.n_heads, max_len=max_new_tokens, dtype=memory.dtype,
            device=memory.device, memory=memory, memory_padding_mask=src.padding_mask,
            static=static,
        )  # its memory_mask: the cross-attention mask of every step, built once
        bos = torch.full((batch, 1), cfg.bos_id, dtype=torch.long, device=memory.device)
        return cache, self.step(bos, cache)

    def step(self, tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor:
        """Feed one target token per row; the cache grows by one position. No gradients.

        With a static cache it compiles with ``fullgraph=True`` into one graph for every step.

        Shapes:
            tokens: (B, 1)
            returns: logits (B, V) for the next token
        """
        with torch.no_grad():
            tokens = id_tensor("tokens", tokens, None)
            check_decoding_step(tokens, cache, needs_memory=True)
            # no new token is padding; positions None: the same for every row, after the cached
            key_padding, positions = cache.extend(None, 1)  # (B, S) | None, (B, 1) | None
            offset = cache.length - 1 if positions is None else 0
            h = self.decoder(
                self.tgt_embed(tokens, positions, offset=offset), cache.memory,
                padding_mask=key_padding, memory_mask=cache.memory_mask, causal=True,
                cache=cache, positions=positions,
            )  # (B, 1, D)
            return self.to_logits(h[:, -1])

    @property
    def generation_spec(self) -> GenerationSpec:
        """What :meth:`generate` reads of the model (an encoder-decoder: its decoder starts
        at ``bos_id``)."""
        cfg = self.cfg
        return GenerationSpec(
            vocab_size=cfg.tgt_vocab_size, eos_id=cfg.eos_id, pad_id=cfg.pad_id,
            start_id=cfg.bos_id, max_positions=learned_max_len(cfg),
            cached_layers=cfg.n_decoder_layers, d_model=cfg.d_model,
            device=self.tgt_embed.tokens.weight.device,
        )

    # What export, size estimates and distributed wrapping read (addnorm.family.ModelFamily).
    layer_classes = (EncoderLayer, DecoderLayer)
    export_parts = {
        "forward": ExportPart("forward", "logits"), "encoder": ExportPart("encode", "memory")
    }

    def example_inputs(
        self, part: str, *, batch: int, length: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """src_ids, src_padding_mask (B, S) and, for the forward, tgt_ids, tgt_padding_mask
        (B, S - 1): in each, an unpadded, a right- and a left-padded row."""
        cfg = self.cfg
        src, src_pad = padded_tokens(batch, length, cfg.src_vocab_size, cfg.pad_id, generator)
        if part == "encoder":
            return {"src_ids": src, "src_padding_mask": src_pad}
        tgt, tgt_pad = padded_tokens(batch, length - 1, cfg.tgt_vocab_size, cfg.pad_id, generator)
        return {"src_ids": src, "tgt_ids": tgt, "src_padding_mask": src_pad,
                "tgt_padding_mask": tgt_pad}

    def dynamic_shapes(self) -> DynamicShapes:
        """The batch, the source and the target lengths (each at most ``max_len`` with
        learned positions)."""
        batch, longest = Dim("batch", min=1), learned_max_len(self.cfg)
        src, tgt = Dim("src_length", min=1, max=longest), Dim("tgt_length", min=1, max=longest)
        return {"src_ids": {0: batch, 1: src}, "src_padding_mask": {0: batch, 1: src},
                "tgt_ids": {0: batch, 1: tgt}, "tgt_padding_mask": {0: batch, 1: tgt}}
