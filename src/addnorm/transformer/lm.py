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

from addnorm.cache import DecodingCache
from addnorm.cache_checks import check_cache_fits, check_decoding_step
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

    :attr:`context`: the positions the model was trained on, within which :meth:`generate`
    slides its window (:mod:`addnorm.generation.window`).
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
        self._context: int | None = None

    @property
    def context(self) -> int:
        """The positions the model was trained on (its run's ``seq_len``): generation sees
        at most this many tokens at once, sliding its window past them, unless its config
        asks for another ``window``. ``cfg.max_len`` until set: ``addnorm.load`` and the
        CLI set it from the run a model was trained in; a model built or read from a
        ``save_pretrained`` folder knows no run. Set it to None to go back to ``max_len``;
        with learned positions it may not exceed ``max_len``."""
        return self.cfg.max_len if self._context is None else self._context

    @context.setter
    def context(self, value: int | None) -> None:
        if value is not None:
            check_int("context", value, min_value=1)
            if self.cfg.position_encoding == "learned" and value > self.cfg.max_len:
                raise ValueError(f"context ({value}) exceeds max_len ({self.cfg.max_len}) of "
                                 "the learned position table")
        self._context = value

    def tie_weights(self) -> None:
        """Share the token table with the output projection again, when ``cfg.tie_output``
        (after ``to_empty`` or ``load_state_dict(assign=True)``, which untie them)."""
        if self.cfg.tie_output:
            self.to_logits.weight = self.embed.tokens.weight

    def _inputs(
        self, name: str, ids: object, padding_mask: object, *, for_generation: bool = False,
        any_length: bool = False,
    ) -> Tokens:
        cfg = self.cfg
        return model_inputs(
            name, ids, "padding_mask", padding_mask, vocab_size=cfg.vocab_size,
            max_len=None if any_length else learned_max_len(cfg), pad_id=cfg.pad_id,
            ends_real=for_generation,
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
        window: int | None = None,
    ) -> tuple[DecodingCache, torch.Tensor]:
        """Run the (left-padded) prompt once; return the cache and the next-token logits.

        ``static``: a cache in the static layout (:mod:`addnorm.cache`), whose steps all have
        the same shapes: what a compiled :meth:`step` needs.

        ``window``: the most positions the model sees at once (None: no limit but a learned
        position table's). The cache then holds at most ``window`` positions, and their ids,
        from which :meth:`slide` recomputes once it is full; a longer prompt is run from its
        last ``window`` tokens (positions from 0, as a window of training; all of it is
        checked, and counts as the prompt).

        Each row is continued after its last token, which must be real: padding may come
        before it (left padding) or between real tokens, whose positions count the real
        tokens only; a row may not be only padding (there would be nothing to continue).

        Shapes:
            prompt_ids: (B, L0); padding_mask: (B, L0), True = padding, ending each row real
            returns: cache (room for L0 + max_new_tokens positions, at most ``window``),
            logits (B, V)
        """
        cfg = self.cfg
        check_int("max_new_tokens", max_new_tokens, min_value=1)
        if window is not None:
            check_int("window", window, min_value=1)
            if cfg.position_encoding == "learned" and window > cfg.max_len:
                raise ValueError(f"window ({window}) exceeds max_len ({cfg.max_len}) of the "
                                 "learned position table")
        prompt = self._inputs("prompt_ids", prompt_ids, padding_mask, for_generation=True,
                              any_length=window is not None)
        ids, padding = prompt.ids, prompt.padding_mask
        batch, prompt_len = ids.shape
        if window is None:
            room = prompt_len + max_new_tokens
            if cfg.position_encoding == "learned" and room - 1 > cfg.max_len:
                raise ValueError(
                    f"prompt length ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 "
                    f"exceeds max_len ({cfg.max_len}) of the learned position table"
                )
        else:  # the prompt's last `window` positions, and room up to `window`
            ids, padding = ids[:, -window:], None if padding is None else padding[:, -window:]
            room = min(ids.shape[1] + max_new_tokens, window)
        dtype, device = self.embed.tokens.weight.dtype, ids.device
        check_cache_fits(n_layers=cfg.n_layers, d_model=cfg.d_model, batch_size=batch,
                         prompt_len=ids.shape[1], max_new_tokens=room - ids.shape[1],
                         dtype=dtype, device=device)
        cache = self._cache(batch, room, static=static, keep_ids=window is not None)
        cache.prompt_padding_mask = prompt.padding_mask if prompt.padding_mask is not None else (
            torch.zeros_like(prompt.ids, dtype=torch.bool))  # (B, L0)
        return cache, self._run(ids, padding, cache)

    def _cache(self, batch: int, room: int, *, static: bool, keep_ids: bool) -> DecodingCache:
        """An empty decoding cache of ``room`` positions for ``batch`` rows."""
        cfg = self.cfg
        return DecodingCache.allocate(
            n_layers=cfg.n_layers, batch_size=batch, n_heads=cfg.n_heads,
            d_head=cfg.d_model // cfg.n_heads, max_len=room,
            dtype=self.embed.tokens.weight.dtype, device=self.embed.tokens.weight.device,
            static=static, keep_ids=keep_ids,
        )

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

    def slide(self, tokens: torch.Tensor, cache: DecodingCache, keep: int) -> torch.Tensor:
        """Feed one token per row to a full cache (one that :meth:`start` gave a
        ``window``): the cache's last ``keep`` positions and the new token are run again
        from position 0, as a window of training is, and become all the cache holds. Reads
        nothing back, as :meth:`step`; not compiled (its shapes are not a step's).

        Shapes:
            tokens: (B, 1)
            returns: logits (B, V) for the next token
        """
        with torch.no_grad():
            tokens = id_tensor("tokens", tokens, None)
            check_decoding_step(tokens, cache, needs_memory=False)
            kept, padding = cache.last_positions(keep)  # (B, keep), (B, keep) | None
            ids = torch.cat([kept, tokens], dim=1)  # (B, keep + 1)
            if padding is not None:
                padding = torch.cat([padding, padding.new_zeros(tokens.shape)], dim=1)
            fresh = self._cache(tokens.shape[0], keep + 1, static=False, keep_ids=True)
            logits = self._run(ids, padding, fresh)
            cache.restart_from(fresh)
            return logits

    def _run(
        self, ids: torch.Tensor, padding: torch.Tensor | None, cache: DecodingCache
    ) -> torch.Tensor:
        # positions None: arange(L) after the cached ones, the same for every row
        kept = ids if cache.ids is not None else None
        key_padding, positions = cache.extend(padding, ids.shape[1], ids=kept)  # (B, S) | None
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
            d_model=cfg.d_model, device=self.embed.tokens.weight.device, context=self.context,
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
