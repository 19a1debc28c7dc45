"""The decoder-only language model: causal self-attention + FFN blocks.

Shapes legend: B batch, L sequence length, L0 prompt length, D d_model, V vocab,
N generated tokens. Embeddings, positions, padding and decoding work as for the
encoder-decoder (see :mod:`addnorm.transformer.embedding` and
:mod:`addnorm.generation.generate`); prompts for generation are left-padded (padding may also lie
between real tokens, never after the last) and each row's
positions count its real tokens only.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.cache import DecodingCache, check_cache_fits, check_decoding_step
from addnorm.family import DynamicShapes, ExportPart, GenerationSpec
from addnorm.pretrained.mixin import PretrainedMixin
from addnorm.transformer.config import LMConfig
from addnorm.transformer.embedding import (
    Embedder,
    Tokens,
    id_tensor,
    ids_dynamic_shapes,
    ids_example_inputs,
    learned_max_len,
    model_inputs,
    output_projection,
    rotary_for,
)
from addnorm.transformer.generate_entry import GenerateEntry, GenerateNames
from addnorm.transformer.layers import EncoderLayer
from addnorm.transformer.stacks import Encoder
from addnorm.utils.checks import check_int

__all__ = ["TransformerLM"]


class TransformerLM(GenerateEntry, PretrainedMixin, nn.Module):
    """A decoder-only language model: causal :class:`EncoderLayer` blocks (pre-LN default).

    Submodules: ``embed`` (:class:`Embedder`), ``blocks`` (:class:`Encoder`, run with
    ``causal=True``), ``to_logits`` (Linear D -> V, tied to ``embed.tokens`` when
    ``cfg.tie_output``); ``rotary`` or None.

    The tie is one shared Parameter. ``to_empty`` (after building on the meta device) and
    ``load_state_dict(..., assign=True)`` replace Parameters one by one and so break it; call
    :meth:`tie_weights` after them.
    """

    generate_names = GenerateNames("prompt_ids", "padding_mask", stop_fn=True)
    config_class = LMConfig  # save_pretrained / from_pretrained (addnorm.pretrained.mixin)

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        if not isinstance(cfg, LMConfig):
            raise TypeError(f"cfg must be an LMConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.rotary = rotary_for(cfg)
        self.embed = Embedder(cfg.vocab_size, cfg)
        self.blocks = Encoder(
            cfg.layer_config(), cfg.n_layers, rotary=self.rotary, final_norm=cfg.final_norm
        )
        tied = self.embed.tokens if cfg.tie_output else None
        self.to_logits = output_projection(cfg.d_model, cfg.vocab_size, tied)

    def tie_weights(self) -> None:
        """Share the token table with the output projection again, when ``cfg.tie_output``
        (after ``to_empty`` or ``load_state_dict(assign=True)``, which untie them)."""
        if self.cfg.tie_output:
            self.to_logits.weight = self.embed.tokens.weight

    def _inputs(
        self, name: str, ids: object, padding_mask: object, *, for_generation: bool = False
    ) -> Tokens:
        cfg = self.cfg
        return model_inputs(
            name, ids, "padding_mask", padding_mask, vocab_size=cfg.vocab_size,
            max_len=learned_max_len(cfg), pad_id=cfg.pad_id, ends_real=for_generation,
        )

    def forward(
        self, ids: torch.Tensor, *, padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Next-token logits at every position (causal).

        Shapes:
            ids: (B, L); padding_mask: (B, L) bool, True = padding (default ids == pad_id)
            returns: (B, L, V)
        """
        tokens = self._inputs("ids", ids, padding_mask)
        x = self.embed(tokens.ids, tokens.positions)  # (B, L, D)
        h = self.blocks(
            x, padding_mask=tokens.padding_mask, causal=True, positions=tokens.positions
        )  # (B, L, D)
        return self.to_logits(h)

    @torch.no_grad()
    def start(
        self,
        prompt_ids: torch.Tensor,
        padding_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int,
        static: bool = False,
    ) -> tuple[DecodingCache, torch.Tensor]:
        """Run the (left-padded) prompt once; return the cache and the next-token logits.

        ``static``: a cache in the static layout (:mod:`addnorm.cache`), whose steps all have
        the same shapes: what a compiled :meth:`step` needs.

        Each row is continued after its last token, which must be real: padding may come
        before it (left padding) or between real tokens, whose positions count the real
        tokens only; a row may not be only padding (there would be nothing to continue).

        Shapes:
            prompt_ids: (B, L0); padding_mask: (B, L0), True = padding, ending each row real
            returns: cache (room for L0 + max_new_tokens positions), logits (B, V)
        """
        cfg = self.cfg
        check_int("max_new_tokens", max_new_tokens, min_value=1)
        prompt = self._inputs("prompt_ids", prompt_ids, padding_mask, for_generation=True)
        batch, prompt_len = prompt.ids.shape
        if cfg.position_encoding == "learned" and prompt_len + max_new_tokens - 1 > cfg.max_len:
            raise ValueError(
                f"prompt length ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 exceeds "
                f"max_len ({cfg.max_len}) of the learned position table"
            )
        dtype, device = self.embed.tokens.weight.dtype, prompt.ids.device
        check_cache_fits(n_layers=cfg.n_layers, d_model=cfg.d_model, batch_size=batch,
                         prompt_len=prompt_len, max_new_tokens=max_new_tokens, dtype=dtype,
                         device=device)
        cache = DecodingCache.allocate(
            n_layers=cfg.n_layers, batch_size=batch, n_heads=cfg.n_heads,
            d_head=cfg.d_model // cfg.n_heads, max_len=prompt_len + max_new_tokens,
            dtype=dtype, device=device, static=static,
        )
        return cache, self._run(prompt.ids, prompt.padding_mask, cache)

    def step(self, tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor:
        """Feed one token per row; the cache grows by one position. No gradients.

        With a static cache it compiles with ``fullgraph=True`` into one graph for every step.
        The tokens' structure is checked, not their values (reading them back would stall an
        accelerator at every token): an id outside the vocabulary makes the embedding raise.
        ``start`` checks the prompt's values.

        Shapes:
            tokens: (B, 1)
            returns: logits (B, V) for the next token
        """
        with torch.no_grad():
            tokens = id_tensor("tokens", tokens, None)
            check_decoding_step(tokens, cache, needs_memory=False)
            return self._run(tokens, None, cache)  # None: no new token is padding

    def _run(
        self, ids: torch.Tensor, padding: torch.Tensor | None, cache: DecodingCache
    ) -> torch.Tensor:
        # positions None: arange(L) after the cached ones, the same for every row
        key_padding, positions = cache.extend(padding, ids.shape[1])  # (B, S) | None, (B, L)
        offset = cache.length - ids.shape[1] if positions is None else 0
        h = self.blocks(
            self.embed(ids, positions, offset=offset), padding_mask=key_padding, causal=True,
            cache=cache, positions=positions,
        )  # (B, L, D)
        return self.to_logits(h[:, -1])  # (B, V)

    @property
    def generation_spec(self) -> GenerationSpec:
        """What :meth:`generate` reads of the model (a decoder-only one: it continues its
        prompt)."""
        cfg = self.cfg
        return GenerationSpec(
            vocab_size=cfg.vocab_size, eos_id=cfg.eos_id, pad_id=cfg.pad_id, start_id=None,
            max_positions=learned_max_len(cfg), cached_layers=cfg.n_layers,
            d_model=cfg.d_model, device=self.embed.tokens.weight.device,
        )

    # What export, size estimates and distributed wrapping read (addnorm.family.ModelFamily).
    layer_classes = (EncoderLayer,)
    export_parts = {"forward": ExportPart("forward", "logits")}

    def example_inputs(
        self, part: str, *, batch: int, length: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """ids and padding_mask (B, L): an unpadded, a right- and a left-padded row."""
        return ids_example_inputs(self.cfg.vocab_size, self.cfg.pad_id, batch=batch,
                                  length=length, generator=generator)

    def dynamic_shapes(self) -> DynamicShapes:
        """The batch and the length (at most ``max_len`` with learned positions)."""
        return ids_dynamic_shapes(self.cfg)
