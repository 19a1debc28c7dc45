"""The encoder-decoder Transformer (Vaswani et al., 2017), and the parts both models share.

Shapes legend: B batch, S source length, L target / sequence length, D d_model, V vocab,
N generated tokens.

Both models (this one and :class:`addnorm.lm.TransformerLM`) embed tokens as
``E[ids] * sqrt(D)`` (section 3.4 of the paper), add a position code (sinusoidal by default;
learned; or none, with rotary embeddings inside attention), apply dropout, and project the
last hidden states to logits with a matrix tied to ``E`` by default.

Padding masks (True = padding) default to ``ids == cfg.pad_id``. A token's position counts
the real tokens before it in its row (``cumsum(~padding) - 1``), so left- or right-padded
rows get the positions they would have alone, and batched decoding of padded rows gives the
tokens each row gives alone. When no padding comes before a real token (unpadded or
right-padded batches, the training case) those positions are ``arange(L)``, and the models
pass ``positions=None`` so the position modules use their cached tables.

Host syncs: checking token ids costs one device-to-host sync per ids tensor (its min and max,
and whether any padding precedes a real token, fetched together): the price of a clear
out-of-vocabulary error instead of a device-side assert. The models add no other sync; only
when some padding precedes a real token (left padding) do they pass explicit per-row
positions, whose checks in the position modules may sync (the learned table's range check).

Decoding: ``start(...) -> (cache, logits (B, V))`` runs the prompt once and fills a
preallocated :class:`~addnorm.cache.DecodingCache`; ``step(tokens (B, 1), cache) -> logits
(B, V)`` feeds one token per row; ``generate`` drives them with
:func:`addnorm.generation.generate_tokens`, after setting the logits of the ids it must never
emit (``pad_id``, and ``bos_id`` for the encoder-decoder) to -inf: a generated pad would be
masked out when fed back, so cached decoding would no longer match recomputation.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import nn

from addnorm._checks import check_bool_mask, check_int, check_tensor
from addnorm.cache import DecodingCache
from addnorm.config import LMConfig, TransformerConfig
from addnorm.encodings import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from addnorm.generation import GenerationConfig, StepFn, generate_tokens
from addnorm.rotary import RotaryEmbedding
from addnorm.stacks import Decoder, Encoder

__all__ = ["Embedder", "Transformer", "positions_from_padding"]

EosOption = int | tuple[int, ...] | None | Literal["config"]


def positions_from_padding(padding_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position among its row's real tokens: ``cumsum(~padding) - 1``, >= 0.

    Shapes:
        padding_mask: (B, L) bool, True = padding
        returns: (B, L) long
    """
    return ((~padding_mask).long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L)


def _id_tensor(name: str, ids: object, max_len: int | None) -> torch.Tensor:
    """A non-empty (B, L) tensor of any integer dtype, as long; L <= max_len. No host sync."""
    ids = check_tensor(name, ids, ndim=2)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids, got dtype {ids.dtype}")
    if ids.numel() == 0:
        raise ValueError(
            f"{name} must have B >= 1 rows and L >= 1 tokens, got shape {tuple(ids.shape)}"
        )
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(
            f"{name} length ({ids.shape[1]}) exceeds max_len ({max_len}) of the learned "
            "position table"
        )
    return ids.long()


def _check_vocab(name: str, low: int, high: int, vocab_size: int) -> None:
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} contains id {bad} outside the vocabulary [0, {vocab_size})")


def _check_ids(name: str, ids: object, vocab_size: int, max_len: int | None) -> torch.Tensor:
    """Token ids as a long (B, L) tensor, every id in [0, V) (and L <= max_len); one sync."""
    ids = _id_tensor(name, ids, max_len)
    low, high = torch.stack(torch.aminmax(ids)).tolist()  # one sync
    _check_vocab(name, low, high, vocab_size)
    return ids


def _padding(name: str, padding_mask: object, ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The given padding mask (True = padding), checked against ids, or ``ids == pad_id``."""
    if padding_mask is None:
        return ids == pad_id
    return check_bool_mask(f"{name} (True = padding)", padding_mask, tuple(ids.shape))


class _Tokens(NamedTuple):
    """Checked model inputs: ids (B, L) long, padding (B, L) bool, positions (B, L) or None."""

    ids: torch.Tensor
    padding: torch.Tensor
    positions: torch.Tensor | None  # None: no padding precedes a real token, so arange(L)


def _tokens(
    name: str, ids: object, mask_name: str, padding_mask: object, *, vocab_size: int,
    max_len: int | None, pad_id: int,
) -> _Tokens:
    """Check ids and their padding mask with one host sync, and derive the positions.

    Positions are ``cumsum(~padding) - 1``; where no padding precedes a real token they equal
    ``arange(L)`` on every real token, so None is returned instead and the position modules
    take their cached tables (and skip a range check that would cost another sync).
    """
    ids = _id_tensor(name, ids, max_len)
    padding = _padding(mask_name, padding_mask, ids, pad_id)
    leading = (padding[:, :-1] & ~padding[:, 1:]).any()  # a padding token before a real one
    low, high, leading = torch.stack([*torch.aminmax(ids), leading.long()]).tolist()  # 1 sync
    _check_vocab(name, low, high, vocab_size)
    positions = positions_from_padding(padding) if leading else None  # (B, L) or None
    return _Tokens(ids, padding, positions)


def _learned_max_len(cfg: TransformerConfig | LMConfig) -> int | None:
    return cfg.max_len if cfg.positions == "learned" else None


def _generation_config(
    cfg: TransformerConfig | LMConfig,
    *,
    max_new_tokens: int,
    strategy: str,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    num_beams: int,
    length_penalty: float,
    eos_id: EosOption,
    never_emit: dict[str, int],
) -> GenerationConfig:
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, strategy=strategy, temperature=temperature,
        top_k=top_k, top_p=top_p, num_beams=num_beams, length_penalty=length_penalty,
        eos_id=cfg.eos_id if eos_id == "config" else eos_id, pad_id=cfg.pad_id,
    )
    for name, token in never_emit.items():
        if token in config.stop_ids:
            raise ValueError(
                f"eos_id {config.eos_id!r} includes {name} ({token}), which generation never "
                "emits, so it could never stop a row"
            )
    return config


def _generate(
    step: StepFn,
    first_logits: torch.Tensor,
    cache: DecodingCache,
    config: GenerationConfig,
    never_emit: dict[str, int],
    generator: torch.Generator | None,
) -> torch.Tensor:
    """:func:`generate_tokens`, with the logits of the ``never_emit`` ids set to -inf.

    A generated ``pad_id`` would count as padding when fed back (so the cached steps would no
    longer match a recomputation, and "stopped" would be ambiguous); ``bos_id`` is the
    decoder's start, never a continuation.

    Shapes:
        first_logits: (B, V); returns: (B, N) long
    """
    banned = torch.tensor(list(never_emit.values()), device=first_logits.device)  # (n,)

    def allowed(logits: torch.Tensor) -> torch.Tensor:
        return logits.index_fill(-1, banned, float("-inf"))  # (B', V)

    def step_allowed(tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor:
        return allowed(step(tokens, cache))

    return generate_tokens(
        step_allowed, allowed(first_logits), cache, config, generator=generator
    )


class Embedder(nn.Module):
    """The input layer: ``dropout(E[ids] * sqrt(D) + PE(positions))``.

    Args:
        vocab_size, d_model: the table's shape (V, D).
        positions: ``"sinusoidal"``, ``"learned"``, or ``"rotary"``/``"none"`` (no code added).
        max_len: rows of a learned position table.
        base: sinusoid base.
        dropout: on the sum (the paper's P_drop).
        tokens: an existing ``nn.Embedding`` to share (tied source / target tables).

    Submodules: ``tokens`` (``nn.Embedding``), ``pos_enc`` (or None), ``dropout``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        *,
        positions: str,
        max_len: int,
        base: float,
        dropout: float,
        tokens: nn.Embedding | None = None,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.scale = math.sqrt(d_model)
        self.tokens = nn.Embedding(vocab_size, d_model) if tokens is None else tokens
        self.pos_enc: nn.Module | None = None
        if positions == "sinusoidal":
            self.pos_enc = SinusoidalPositionalEncoding(d_model, base=base)
        elif positions == "learned":
            self.pos_enc = LearnedPositionalEmbedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        if tokens is None:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Token table ~ N(0, 1/D), so ``E[ids] * sqrt(D)`` has unit scale next to PE."""
        nn.init.normal_(self.tokens.weight, mean=0.0, std=self.d_model**-0.5)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """Embed ids at the given positions (None: ``arange(L)``, the tables' cached rows).

        Shapes:
            ids: (B, L); positions: (B, L) or None
            returns: (B, L, D)
        """
        x = self.tokens(ids) * self.scale  # (B, L, D)
        if self.pos_enc is not None:
            x = self.pos_enc(x, positions=positions)
        return self.dropout(x)


def _rotary(cfg: TransformerConfig | LMConfig) -> RotaryEmbedding | None:
    if cfg.positions != "rotary":
        return None
    return RotaryEmbedding(cfg.d_model // cfg.n_heads, base=cfg.position_base)


def _output_projection(d_model: int, vocab_size: int, tied: nn.Embedding | None) -> nn.Linear:
    """Logits = h W^T with W (V, D): the embedding table itself when tied (the paper)."""
    linear = nn.Linear(d_model, vocab_size, bias=False)
    if tied is not None:
        linear.weight = tied.weight
    else:
        nn.init.xavier_uniform_(linear.weight)
    return linear


def _check_step(tokens: torch.Tensor, cache: object, *, needs_memory: bool) -> None:
    if not isinstance(cache, DecodingCache):
        raise TypeError(f"cache must be the DecodingCache from start(), got {type(cache).__name__}")
    if needs_memory and cache.memory is None:
        raise ValueError(
            "cache has no encoder memory (a TransformerLM's cache?); Transformer.step needs "
            "the cache from Transformer.start()"
        )
    if not needs_memory and cache.memory is not None:
        raise ValueError(
            "cache holds encoder memory (a Transformer's cache); TransformerLM.step needs the "
            "cache from TransformerLM.start()"
        )
    if tokens.shape != (cache.padding_mask.shape[0], 1):
        raise ValueError(
            f"tokens must have shape (B, 1) = ({cache.padding_mask.shape[0]}, 1), "
            f"got {tuple(tokens.shape)}"
        )


class Transformer(nn.Module):
    """The encoder-decoder Transformer (Vaswani et al., 2017), configured by one config.

    Submodules: ``src_embed``, ``tgt_embed`` (:class:`Embedder`, sharing ``tokens`` when
    ``cfg.share_embeddings``), ``encoder`` (:class:`Encoder`), ``decoder``
    (:class:`Decoder`), ``to_logits`` (Linear D -> V_tgt, tied to the target table when
    ``cfg.tie_output``); ``rotary`` (shared by every self-attention) or None.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(cfg, TransformerConfig):
            raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.rotary = _rotary(cfg)

        def embedder(vocab_size: int, tokens: nn.Embedding | None) -> Embedder:
            return Embedder(
                vocab_size, cfg.d_model, positions=cfg.positions, max_len=cfg.max_len,
                base=cfg.position_base, dropout=cfg.dropout, tokens=tokens,
            )

        self.src_embed = embedder(cfg.src_vocab_size, None)
        shared = self.src_embed.tokens if cfg.share_embeddings else None
        self.tgt_embed = embedder(cfg.tgt_vocab_size, shared)
        layer_args = (cfg.d_model, cfg.n_heads, cfg.d_ff)
        self.encoder = Encoder(
            cfg.n_encoder_layers, *layer_args, dropout=cfg.dropout, activation=cfg.activation,
            norm_position=cfg.norm_position, norm=cfg.norm, norm_eps=cfg.norm_eps,
            bias=cfg.bias, rotary=self.rotary, final_norm=cfg.final_norm,
        )
        self.decoder = Decoder(
            cfg.n_decoder_layers, *layer_args, dropout=cfg.dropout, activation=cfg.activation,
            norm_position=cfg.norm_position, norm=cfg.norm, norm_eps=cfg.norm_eps,
            bias=cfg.bias, rotary=self.rotary, final_norm=cfg.final_norm,
        )
        tied = self.tgt_embed.tokens if cfg.tie_output else None
        self.to_logits = _output_projection(cfg.d_model, cfg.tgt_vocab_size, tied)

    def _source(self, src_ids: object, src_padding_mask: object) -> _Tokens:
        cfg = self.cfg
        return _tokens(
            "src_ids", src_ids, "src_padding_mask", src_padding_mask,
            vocab_size=cfg.src_vocab_size, max_len=_learned_max_len(cfg), pad_id=cfg.pad_id,
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

    def _encode(self, src: _Tokens) -> torch.Tensor:
        x = self.src_embed(src.ids, src.positions)  # (B, S, D)
        return self.encoder(x, padding_mask=src.padding, positions=src.positions)

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
        tgt = _tokens(
            "tgt_ids", tgt_ids, "tgt_padding_mask", tgt_padding_mask,
            vocab_size=cfg.tgt_vocab_size, max_len=_learned_max_len(cfg), pad_id=cfg.pad_id,
        )
        if src.ids.shape[0] != tgt.ids.shape[0]:
            raise ValueError(
                f"src_ids batch size ({src.ids.shape[0]}) must equal tgt_ids batch size "
                f"({tgt.ids.shape[0]})"
            )
        memory = self._encode(src)  # (B, S, D)
        h = self.decoder(
            self.tgt_embed(tgt.ids, tgt.positions), memory, padding_mask=tgt.padding,
            memory_padding_mask=src.padding, causal=True, positions=tgt.positions,
        )  # (B, L, D)
        return self.to_logits(h)

    @torch.no_grad()
    def start(
        self,
        src_ids: torch.Tensor,
        *,
        src_padding_mask: torch.Tensor | None = None,
        max_new_tokens: int,
    ) -> tuple[DecodingCache, torch.Tensor]:
        """Encode the source once, feed ``bos_id``; return the cache and the first logits.

        The cache holds ``max_new_tokens`` target positions and the memory's cross-attention
        keys/values, computed here once.

        Shapes:
            src_ids: (B, S); src_padding_mask: (B, S)
            returns: cache, logits (B, V)
        """
        cfg = self.cfg
        check_int("max_new_tokens", max_new_tokens, min_value=1)
        if cfg.positions == "learned" and max_new_tokens > cfg.max_len:
            raise ValueError(
                f"max_new_tokens ({max_new_tokens}) exceeds max_len ({cfg.max_len}) of the "
                "learned position table"
            )
        src = self._source(src_ids, src_padding_mask)
        memory = self._encode(src)  # (B, S, D)
        batch = src.ids.shape[0]
        cache = DecodingCache.allocate(
            n_layers=cfg.n_decoder_layers, batch_size=batch, n_heads=cfg.n_heads,
            d_head=cfg.d_model // cfg.n_heads, max_len=max_new_tokens, dtype=memory.dtype,
            device=memory.device, memory=memory, memory_padding_mask=src.padding,
        )
        bos = torch.full((batch, 1), cfg.bos_id, dtype=torch.long, device=memory.device)
        return cache, self.step(bos, cache)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor:
        """Feed one target token per row; the cache grows by one position.

        Shapes:
            tokens: (B, 1)
            returns: logits (B, V) for the next token
        """
        tokens = _check_ids("tokens", tokens, self.cfg.tgt_vocab_size, None)
        _check_step(tokens, cache, needs_memory=True)
        new_padding = torch.zeros_like(tokens, dtype=torch.bool)  # (B, 1), generated = real
        key_padding, positions = cache.extend(new_padding)  # (B, n + 1), (B, 1)
        h = self.decoder(
            self.tgt_embed(tokens, positions), cache.memory, padding_mask=key_padding,
            memory_padding_mask=cache.memory_padding_mask, causal=True, cache=cache,
            positions=positions,
        )  # (B, 1, D)
        return self.to_logits(h[:, -1])

    @torch.no_grad()
    def generate(
        self,
        src_ids: torch.Tensor,
        *,
        src_padding_mask: torch.Tensor | None = None,
        max_new_tokens: int = 64,
        strategy: str = "greedy",
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        num_beams: int = 4,
        length_penalty: float = 1.0,
        eos_id: EosOption = "config",
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Decode target tokens for each source row (see :class:`GenerationConfig`).

        ``eos_id="config"`` stops at ``cfg.eos_id``; None never stops early. The output omits
        ``bos_id``; after a row's stop token it holds ``cfg.pad_id``. ``pad_id`` and ``bos_id``
        are never generated (their logits are set to -inf), so neither may be a stop token.

        Shapes:
            src_ids: (B, S); src_padding_mask: (B, S)
            returns: (B, N) long, N <= max_new_tokens
        """
        never_emit = {"pad_id": self.cfg.pad_id, "bos_id": self.cfg.bos_id}
        config = _generation_config(
            self.cfg, max_new_tokens=max_new_tokens, strategy=strategy,
            temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams,
            length_penalty=length_penalty, eos_id=eos_id, never_emit=never_emit,
        )
        cache, logits = self.start(
            src_ids, src_padding_mask=src_padding_mask, max_new_tokens=max_new_tokens
        )
        return _generate(self.step, logits, cache, config, never_emit, generator)
