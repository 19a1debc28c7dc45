"""What the models' ``generate`` shares before the decode loop of
:mod:`addnorm.generation.loop` runs: the default generation config, a call in Hugging
Face's terms read once (:func:`transformers_call`), every setting checked once
(:func:`start_generation`), the ids never emitted (:func:`banned_ids`), cache checks and the
compiled step.

A ``generate`` call is in Hugging Face's terms when it passes no addnorm ``config`` but one of
Hugging Face's names: ``attention_mask``, ``generation_config`` or a setting
(``max_new_tokens``, ``do_sample``, ...: ``TRANSFORMERS_NAMES`` of
:mod:`~addnorm.generation.config`). Its settings are then Hugging Face's: its
defaults (20 new tokens, greedy, ``early_stopping=False``, ``top_k=50`` when sampling), under
the model's eos and pad ids, under ``generation_config``, under the keywords (transformers'
order of precedence), translated by :meth:`GenerationConfig.from_transformers`; and it
returns the prompt followed by the new tokens, as transformers does (``return_prompt``
chooses either way). An addnorm ``config`` together with Hugging Face's settings is refused:
one call, one vocabulary.

A model's ``generate`` checks its settings, runs ``start`` (the prompt, once), then calls
:func:`~addnorm.generation.loop.decode` with its own ``step``, which is trusted:
nothing is checked again per token. The ids a model must never emit (``pad_id``, and
``bos_id`` for the encoder-decoder) get -inf logits at every step. A model whose ``pad_id``
is None (a vocabulary without padding, GPT-2's) bans nothing as padding; rows that stopped
are then filled with the stop id (``GenerationConfig.fill_id``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from addnorm.cache import DecodingCache
from addnorm.generation.config import (
    TRANSFORMERS_DEFAULT_NEW_TOKENS,
    GenerationConfig,
    transformers_settings,
)
from addnorm.generation.loop import check_decoding_options
from addnorm.generation.step import StepFn
from addnorm.transformer.config import LMConfig, TransformerConfig
from addnorm.utils.checks import check_bool
from addnorm.utils.memory import check_fits, device_memory

__all__ = [
    "GenerationCall",
    "check_cache_fits",
    "check_generation_config",
    "banned_ids",
    "check_step",
    "compiled_step",
    "decoding_step",
    "model_generation_config",
    "padding_from_attention_mask",
    "start_generation",
    "transformers_call",
    "with_prompt",
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

    ``pad_id`` must be the model's (it fills rows that stopped, and is never generated), or,
    for a model without a pad id (GPT-2's), one of the stop ids (Hugging Face's usual
    ``pad_token_id=eos_token_id``: the filler ``pad_id=None`` would write anyway, when it is
    the first); a stop token may not be one that generation never emits (it could never stop
    a row).
    """
    if config is None:
        return model_generation_config(cfg)
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig or None, got {type(config).__name__}")
    stop_as_pad = cfg.pad_id is None and config.pad_id in config.stop_ids
    if config.pad_id != cfg.pad_id and not stop_as_pad:
        raise ValueError(
            f"config.pad_id (Hugging Face's pad_token_id, {config.pad_id}) must be the model's "
            f"pad_id ({cfg.pad_id}), or, for a model without one, a stop id; start from the "
            "model's own: dataclasses.replace(model.generation_config, ...)"
        )
    vocab = cfg.tgt_vocab_size if isinstance(cfg, TransformerConfig) else cfg.vocab_size
    outside = [stop for stop in config.stop_ids if stop >= vocab]
    if outside:
        raise ValueError(
            f"eos_id {config.eos_id!r} holds {outside[0]}, outside the vocabulary [0, {vocab})"
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
    ``stop_fn`` (:func:`~addnorm.generation.loop.check_decoding_options`)."""
    checked = check_generation_config(cfg, config, never_emit)
    check_decoding_options(checked, generator, stop_fn, device)
    return checked


@dataclass(frozen=True)
class GenerationCall:
    """A ``generate`` call's settings, read once before it starts.

    Attributes:
        config: the config to run (checked by :func:`start_generation`); None: the model's
            default.
        padding_mask: (B, L0) bool, True = padding (addnorm's polarity), or None.
        return_prompt: whether the output starts with the prompt (the decoder's: the start
            token for an encoder-decoder).
    """

    config: object
    padding_mask: torch.Tensor | None
    return_prompt: bool


def transformers_call(
    cfg: TransformerConfig | LMConfig,
    config: object,
    *,
    generation_config: object,
    names: Mapping[str, object],
    attention_mask: object,
    padding_mask: object,
    return_prompt: object,
    mask_shape: tuple[int, ...],
    prompt_length: int,
) -> GenerationCall:
    """Read a ``generate`` call that may use Hugging Face's names (the module docstring).

    A ``transformers.GenerationConfig`` passed as ``config`` (transformers' second positional
    argument) is read as ``generation_config``. ``names``: the call's Hugging Face settings
    (``TRANSFORMERS_NAMES`` and any other it was given; None = not given);
    ``mask_shape``: the shape ``attention_mask`` must have (the prompt's, or the source's);
    ``prompt_length``: the decoder's prompt, which ``max_length`` and ``min_length`` count
    (a decoder-only model's L0, padding included; an encoder-decoder's 1: its start token).
    """
    if not isinstance(config, GenerationConfig) and callable(getattr(config, "to_diff_dict", None)):
        if generation_config is not None:  # transformers' generate(inputs, generation_config)
            raise ValueError("two generation configs: config and generation_config")
        config, generation_config = None, config
    given = {name: value for name, value in names.items() if value is not None}
    padding = padding_from_attention_mask(attention_mask, padding_mask, mask_shape)
    prompt = None if return_prompt is None else check_bool("return_prompt", return_prompt)
    settings_given = bool(given) or generation_config is not None
    if config is not None and settings_given:
        listed = sorted(given) + (["generation_config"] if generation_config is not None else [])
        raise ValueError(
            "config (addnorm's GenerationConfig) and Hugging Face's settings "
            f"({', '.join(listed)}) were both given: pass one of them (vary config with "
            "dataclasses.replace)"
        )
    if config is not None or not (settings_given or attention_mask is not None):
        return GenerationCall(config, padding, bool(prompt))
    settings: dict[str, Any] = {"eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id}
    settings.update(transformers_settings(generation_config))
    settings.update(given)
    _check_start_token(cfg, settings)
    if "max_new_tokens" not in settings and "max_length" not in settings:
        settings["max_new_tokens"] = _default_new_tokens(cfg, prompt_length)
    hf_config = GenerationConfig.from_transformers(settings, prompt_length=prompt_length)
    return GenerationCall(hf_config, padding, True if prompt is None else prompt)


def padding_from_attention_mask(
    attention_mask: object, padding_mask: object, shape: tuple[int, ...]
) -> torch.Tensor | None:
    """``padding_mask``, or Hugging Face's ``attention_mask`` (1 = real token) negated.

    ``attention_mask``: bool, or integers 0 and 1 (read back once to check them: a
    tokenizer's output); float masks are refused, as everywhere in addnorm.

    Shapes:
        attention_mask: (B, L) = ``shape``; returns: (B, L) bool, True = padding
    """
    if attention_mask is None:
        return padding_mask  # type: ignore[return-value]  # checked by the model
    if padding_mask is not None:
        raise ValueError(
            "give padding_mask (True = padding) or attention_mask (Hugging Face's: 1 = real "
            "token), not both"
        )
    if not isinstance(attention_mask, torch.Tensor):
        got = type(attention_mask).__name__
        raise TypeError(f"attention_mask must be a torch.Tensor, got {got}")
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(
            f"attention_mask must have the prompt's shape {tuple(shape)}, got "
            f"{tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        return ~attention_mask
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(
            f"attention_mask must be bool or integer 0/1, got dtype {attention_mask.dtype}"
        )
    if bool(((attention_mask != 0) & (attention_mask != 1)).any()):  # one read, at the start
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
    return attention_mask == 0


def _check_start_token(cfg: TransformerConfig | LMConfig, settings: Mapping[str, Any]) -> None:
    """An encoder-decoder's first decoder token is its ``bos_id``: Hugging Face's
    ``decoder_start_token_id`` (else ``bos_token_id``) must name it. A decoder-only model
    starts from its prompt, which makes both irrelevant, as in transformers."""
    if not isinstance(cfg, TransformerConfig):
        return
    for name in ("decoder_start_token_id", "bos_token_id"):
        if name in settings:
            if settings[name] != cfg.bos_id:
                raise ValueError(
                    f"{name} ({settings[name]!r}) must be the model's bos_id ({cfg.bos_id}), "
                    "the decoder's first token"
                )
            return


def _default_new_tokens(cfg: TransformerConfig | LMConfig, prompt_length: int) -> int:
    """Hugging Face's length when none is set: 20 new tokens, capped so that the prompt and
    the new tokens fit a learned position table (transformers caps at
    ``max_position_embeddings``)."""
    if cfg.position_encoding != "learned":
        return TRANSFORMERS_DEFAULT_NEW_TOKENS
    room = cfg.max_len - prompt_length
    if room < 1:
        raise ValueError(
            f"the prompt ({prompt_length} tokens) leaves no room for a new token in the learned "
            f"position table (max_len {cfg.max_len})"
        )
    return min(TRANSFORMERS_DEFAULT_NEW_TOKENS, room)


def with_prompt(prompt: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The prompt rows followed by their new tokens; each prompt row repeated for its
    ``num_return_sequences`` output rows, as Hugging Face's ``generate`` returns them.

    Shapes:
        prompt: (B, L0); new: (B * r, N); returns: (B * r, L0 + N)
    """
    rows = new.shape[0] // prompt.shape[0]
    return torch.cat([prompt.repeat_interleave(rows, dim=0), new], dim=1)


def banned_ids(never_emit: Mapping[str, int | None], device: torch.device) -> torch.Tensor | None:
    """The ids a model never emits, as the ``banned`` (n,) long tensor of
    :func:`~addnorm.generation.loop.decode`; None when there are none.

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
