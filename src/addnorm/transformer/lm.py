"""The decoder-only language model: causal self-attention + FFN blocks.

Shapes legend: B batch, L sequence length, L0 prompt length, D d_model, V vocab,
N generated tokens. Embeddings, positions, padding and decoding work as for the
encoder-decoder (see :mod:`addnorm.transformer.embedding` and
:mod:`addnorm.transformer.decoding`); prompts for generation are left-padded and each row's
positions count its real tokens only.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim

from addnorm._checks import check_int
from addnorm.cache import DecodingCache
from addnorm.family import DynamicShapes, ExportPart, padded_tokens
from addnorm.pretrained import PretrainedMixin
from addnorm.transformer.config import LMConfig
from addnorm.transformer.decoding import (
    banned_ids,
    check_cache_fits,
    check_step,
    decoding_step,
    model_generation_config,
    start_generation,
)
from addnorm.transformer.embedding import (
    Embedder,
    Tokens,
    id_tensor,
    learned_max_len,
    model_inputs,
    output_projection,
    rotary_for,
)
from addnorm.transformer.generation import decode, prompt_history
from addnorm.transformer.generation_config import GenerationConfig
from addnorm.transformer.layers import EncoderLayer
from addnorm.transformer.stacks import Encoder
from addnorm.transformer.stop_strings import StopFn

__all__ = ["TransformerLM"]


class TransformerLM(PretrainedMixin, nn.Module):
    """A decoder-only language model: causal :class:`EncoderLayer` blocks (pre-LN default).

    Submodules: ``embed`` (:class:`Embedder`), ``blocks`` (:class:`Encoder`, run with
    ``causal=True``), ``to_logits`` (Linear D -> V, tied to ``embed.tokens`` when
    ``cfg.tie_output``); ``rotary`` or None.

    The tie is one shared Parameter. ``to_empty`` (after building on the meta device) and
    ``load_state_dict(..., assign=True)`` replace Parameters one by one and so break it; call
    :meth:`tie_weights` after them.
    """

    config_class = LMConfig  # save_pretrained / from_pretrained (addnorm.pretrained)

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
        self, name: str, ids: object, padding_mask: object, *, left_padding_only: bool = False
    ) -> Tokens:
        cfg = self.cfg
        return model_inputs(
            name, ids, "padding_mask", padding_mask, vocab_size=cfg.vocab_size,
            max_len=learned_max_len(cfg), pad_id=cfg.pad_id, left_padding_only=left_padding_only,
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
        *,
        padding_mask: torch.Tensor | None = None,
        max_new_tokens: int,
        static: bool = False,
    ) -> tuple[DecodingCache, torch.Tensor]:
        """Run the (left-padded) prompt once; return the cache and the next-token logits.

        ``static``: a cache in the static layout (:mod:`addnorm.cache`), whose steps all have
        the same shapes: what a compiled :meth:`step` needs.

        Shapes:
            prompt_ids: (B, L0); padding_mask: (B, L0), True = padding, left padding only
            returns: cache (room for L0 + max_new_tokens positions), logits (B, V)
        """
        cfg = self.cfg
        check_int("max_new_tokens", max_new_tokens, min_value=1)
        prompt_ids, _, padding, _ = self._inputs(  # padding: None when no token is padding
            "prompt_ids", prompt_ids, padding_mask, left_padding_only=True
        )
        batch, prompt_len = prompt_ids.shape
        if cfg.position_encoding == "learned" and prompt_len + max_new_tokens - 1 > cfg.max_len:
            raise ValueError(
                f"prompt length ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 exceeds "
                f"max_len ({cfg.max_len}) of the learned position table"
            )
        dtype = self.embed.tokens.weight.dtype
        check_cache_fits(cfg, batch_size=batch, prompt_len=prompt_len,
                         max_new_tokens=max_new_tokens, dtype=dtype, device=prompt_ids.device)
        cache = DecodingCache.allocate(
            n_layers=cfg.n_layers, batch_size=batch, n_heads=cfg.n_heads,
            d_head=cfg.d_model // cfg.n_heads, max_len=prompt_len + max_new_tokens,
            dtype=dtype, device=prompt_ids.device, static=static,
        )
        return cache, self._run(prompt_ids, padding, cache)

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
            check_step(tokens, cache, needs_memory=False)
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
    def generation_config(self) -> GenerationConfig:
        """The default of :meth:`generate`: greedy, 64 new tokens, stopping at ``cfg.eos_id``.

        Variants: ``dataclasses.replace(model.generation_config, strategy="beam")``.
        """
        return model_generation_config(self.cfg)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        config: GenerationConfig | None = None,
        *,
        padding_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        stop_fn: StopFn | None = None,
    ) -> torch.Tensor:
        """Continue each (left-padded) prompt as ``config`` says (default
        :attr:`generation_config`).

        The prompt counts as seen for ``config.repetition_penalty`` and
        ``config.no_repeat_ngram_size`` (padding excluded); ``stop_fn`` (greedy and sampling)
        ends rows early, e.g. at stop strings (``generation.stop_at_strings``).

        The output holds the new tokens only; after a row's stop token it holds ``cfg.pad_id``.
        ``pad_id`` is never generated (its logits are set to -inf), so it may not be a stop
        token. ``generator`` is used by sampling.

        Shapes:
            prompt_ids: (B, L0); padding_mask: (B, L0), True = padding (left)
            returns: (B, N) long, N <= config.max_new_tokens
        """
        never_emit = {"pad_id": self.cfg.pad_id}
        device = self.embed.tokens.weight.device
        config = start_generation(self.cfg, config, never_emit, generator=generator,
                                  stop_fn=stop_fn, device=device)
        cache, logits = self.start(
            prompt_ids, padding_mask=padding_mask, max_new_tokens=config.max_new_tokens,
            static=config.compile,
        )  # the prompt checked (values: one host sync)
        if config.reshapes_logits:  # the prompt counts as seen, its padding excluded
            ids = prompt_ids.long()
            if padding_mask is None and self.cfg.pad_id is not None:
                padding_mask = ids == self.cfg.pad_id  # the model's default
            seen = prompt_history(ids, padding_mask, logits)
        else:
            seen = prompt_history(None, None, logits)
        return decode(
            decoding_step(self.step, config), logits, cache, config, generator=generator,
            seen=seen, stop_fn=stop_fn, banned=banned_ids(never_emit, logits.device),
        )

    # What export, size estimates and distributed wrapping read (addnorm.family.ModelFamily).
    layer_classes = (EncoderLayer,)
    export_parts = {"forward": ExportPart("forward", "logits")}

    def example_inputs(
        self, part: str, *, batch: int, length: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """ids and padding_mask (B, L): an unpadded, a right- and a left-padded row."""
        cfg = self.cfg
        ids, padding = padded_tokens(batch, length, cfg.vocab_size, cfg.pad_id, generator)
        return {"ids": ids, "padding_mask": padding}

    def dynamic_shapes(self) -> DynamicShapes:
        """The batch and the length (at most ``max_len`` with learned positions)."""
        batch, length = Dim("batch", min=1), Dim("length", min=1, max=learned_max_len(self.cfg))
        return {"ids": {0: batch, 1: length}, "padding_mask": {0: batch, 1: length}}
