"""What the models' ``generate`` shares before the decode loop of
:mod:`addnorm.transformer.generation` runs: the default generation config, every setting
checked once (:func:`start_generation`), the ids never emitted (:func:`banned_ids`), cache
checks and the compiled step.

A model's ``generate`` checks its settings, runs ``start`` (the prompt, once), then calls
:func:`~addnorm.transformer.generation.decode` with its own ``step``, which is trusted:
nothing is checked again per token. The ids a model must never emit (``pad_id``, and
``bos_id`` for the encoder-decoder) get -inf logits at every step. A model whose ``pad_id``
is None (a vocabulary without padding, GPT-2's) bans nothing as padding; rows that stopped
are then filled with the stop id (``GenerationConfig.fill_id``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from addnorm._memory import check_fits, device_memory
from addnorm.cache import DecodingCache
from addnorm.transformer.config import LMConfig, TransformerConfig
from addnorm.transformer.decode_step import StepFn
from addnorm.transformer.generation import check_decoding_options
from addnorm.transformer.generation_config import GenerationConfig

__all__ = [
    "check_cache_fits",
    "check_generation_config",
    "banned_ids",
    "check_step",
    "compiled_step",
    "decoding_step",
    "model_generation_config",
    "start_generation",
]


def model_generation_config(cfg: TransformerConfig | LMConfig) -> GenerationConfig:
    """A model's default :class:`GenerationConfig`: greedy, 64 tokens, the model's eos and pad.

    Variants come from ``dataclasses.replace(model.generation_config, ...)``.
    """
    return GenerationConfig(eos_id=cfg.eos_id, pad_id=cfg.pad_id)


def check_generation_config(
    cfg: TransformerConfig | LMConfig, config: object, never_emit: Mapping[str, int | None]
) -> GenerationConfig:
    """The config of a model's ``generate`` call, checked against the model's special ids.

    ``pad_id`` must be the model's (it fills rows that stopped, and is never generated); a
    stop token may not be one that generation never emits (it could never stop a row).
    """
    if config is None:
        return model_generation_config(cfg)
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig or None, got {type(config).__name__}")
    if config.pad_id != cfg.pad_id:
        raise ValueError(
            f"config.pad_id ({config.pad_id}) must be the model's pad_id ({cfg.pad_id}); start "
            "from the model's own: dataclasses.replace(model.generation_config, ...)"
        )
    for name, token in never_emit.items():
        if token is not None and token in config.stop_ids:
            raise ValueError(
                f"eos_id {config.eos_id!r} includes {name} ({token}), which generation never "
                "emits, so it could never stop a row"
            )
    _check_room(cfg, config.max_new_tokens)
    return config


def _self_attention_layers(cfg: TransformerConfig | LMConfig) -> int:
    return cfg.n_decoder_layers if isinstance(cfg, TransformerConfig) else cfg.n_layers


def _check_room(cfg: TransformerConfig | LMConfig, max_new_tokens: int) -> None:
    """Refuse a ``max_new_tokens`` no call could hold, whatever its batch, prompt and dtype.

    Positions: a learned table has ``max_len`` rows, and a prompt (at least one token for a
    decoder-only model) comes first, so more new tokens can never fit (sinusoidal and rotary
    codes compute any position). Memory: the cache holds keys and values of every
    self-attention layer for each new token, at least ``2 * n_layers * d_model`` bytes per
    token at batch 1 in a one-byte dtype; more than the memory of the CPU (or of the CUDA
    device in use, if larger) never fits. :func:`check_cache_fits` is the exact check.
    """
    if cfg.position_encoding == "learned" and max_new_tokens > cfg.max_len:
        raise ValueError(
            f"max_new_tokens ({max_new_tokens}) exceeds max_len ({cfg.max_len}) of the model's "
            "learned position table"
        )
    per_token = 2 * _self_attention_layers(cfg) * cfg.d_model  # bytes at batch 1, 1-byte dtype
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_initialized() else [])
    limits = [(device_memory(d) or 0, d) for d in devices]
    _limit, device = max(limits)
    check_fits(f"max_new_tokens ({max_new_tokens})", max_new_tokens * per_token, device)


def check_cache_fits(
    cfg: TransformerConfig | LMConfig,
    *,
    batch_size: int,
    prompt_len: int,
    max_new_tokens: int,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Refuse, before allocating, a decoding cache larger than the memory ``device`` has.

    The cache of :meth:`DecodingCache.allocate` holds keys and values for ``prompt_len +
    max_new_tokens`` positions of every self-attention layer: ``2 * n_layers * B * positions
    * d_model`` values of ``dtype`` (an encoder-decoder's cross-attention cache comes on
    top). The ValueError names ``max_new_tokens`` and the most that would fit. For a model's
    ``start``, called before :meth:`DecodingCache.allocate`.
    """
    if torch.compiler.is_compiling():
        return  # no host call while a graph is captured
    per_position = 2 * _self_attention_layers(cfg) * batch_size * cfg.d_model * dtype.itemsize
    positions = prompt_len + max_new_tokens
    limit = device_memory(device)
    if limit is not None and positions * per_position > limit:
        most = max(limit // max(per_position, 1) - prompt_len, 0)
        raise ValueError(
            f"max_new_tokens ({max_new_tokens}) needs a decoding cache of "
            f"{positions * per_position:,} bytes ({batch_size} rows x {positions} positions x "
            f"{_self_attention_layers(cfg)} layers of {dtype} keys and values), more than the "
            f"{limit:,} bytes of memory the device ({device}) has: at most {most} new tokens "
            f"fit a prompt of {prompt_len} at this batch size"
        )


def start_generation(
    cfg: TransformerConfig | LMConfig,
    config: object,
    never_emit: Mapping[str, int | None],
    *,
    generator: object,
    stop_fn: object,
    device: torch.device,
) -> GenerationConfig:
    """Every setting of a model's ``generate`` call, checked once before it starts: the
    config against the model (:func:`check_generation_config`), the generator and
    ``stop_fn`` (:func:`~addnorm.transformer.generation.check_decoding_options`)."""
    checked = check_generation_config(cfg, config, never_emit)
    check_decoding_options(checked, generator, stop_fn, device)
    return checked


def banned_ids(never_emit: Mapping[str, int | None], device: torch.device) -> torch.Tensor | None:
    """The ids a model never emits, as the ``banned`` (n,) long tensor of
    :func:`~addnorm.transformer.generation.decode`; None when there are none.

    A generated ``pad_id`` would count as padding when fed back (so the cached steps would no
    longer match a recomputation, and "stopped" would be ambiguous); ``bos_id`` is the
    decoder's start, never a continuation. None (no such id) bans nothing.
    """
    ids = [token for token in never_emit.values() if token is not None]
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def decoding_step(step: StepFn, config: GenerationConfig) -> StepFn:
    """The model's ``step``, compiled (:func:`compiled_step`) when ``config.compile``."""
    return compiled_step(step) if config.compile else step


def check_step(tokens: torch.Tensor, cache: object, *, needs_memory: bool) -> None:
    """``step``'s arguments: the right model's DecodingCache and one token per row (B, 1)."""
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


# Inductor settings of a decode step compiled for the CPU (on other devices: the defaults).
# - decompose_mm_pass: a one-row matmul (batch 1) becomes a fused multiply-and-sum kernel,
#   which streams the weights at memory speed; torch's own matrix-vector product falls well
#   short of it at a small model's widths. The projections are most of a decode step's
#   work, so this is most of what compiling gains (``addnorm bench --only decoding
#   --compile`` and benchmarks/compiled_decoding.py time the step both ways).
# - cpp_wrapper: the code that calls the step's kernels is C++ rather than Python.
CPU_STEP_OPTIONS: dict[str, Any] = {
    "post_grad_fusion_options": {"decompose_mm_pass": {}},
    "cpp_wrapper": True,
}


def compiled_step(step: StepFn) -> StepFn:
    """A model's ``step`` compiled with ``fullgraph=True``, for a cache in the static layout.

    Every step of a static cache has the same shapes and reads no Python count that changes,
    so the first call compiles one graph and every later step (and every later ``generate``
    with the same shapes) reuses it. ``torch.compile`` keeps its compiled code with the
    function, so building this wrapper per call costs nothing. The tokens are made
    contiguous first: beam search feeds views whose strides change, and a graph is
    specialised to its inputs' strides.

    Build one wrapper per ``generate`` call: its first call checks all of dynamo's guards
    (and compiles on a miss); its later calls, the same model, cache and shapes one step on,
    skip the guards that every cached graph shares (``skip_guard_eval_unsafe``): checked in
    Python at every call, they are a large share of a small model's compiled step, whose
    kernels are short. CPU steps compile with
    :data:`CPU_STEP_OPTIONS`.

    Shapes:
        tokens: (B, 1); returns: logits (B, V)
    """
    compiled: Callable[..., torch.Tensor] | None = None  # built at the first call

    def contiguous_step(tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor:
        nonlocal compiled
        tokens = tokens.contiguous()
        if compiled is None:  # the first step: every guard checked, compiling on a miss
            options = CPU_STEP_OPTIONS if tokens.device.type == "cpu" else None
            compiled = torch.compile(step, fullgraph=True, options=options)
            return compiled(tokens, cache)
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            return compiled(tokens, cache)

    return contiguous_step
