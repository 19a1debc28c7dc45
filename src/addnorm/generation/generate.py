"""A model's ``generate``: one function for every model that implements
:class:`~addnorm.family.GenerativeModel` (``start``, ``step`` and a ``GenerationSpec``), which
``Transformer.generate`` and ``TransformerLM.generate`` call.

A call is read once (addnorm's ``config``, or Hugging Face's names:
:func:`~addnorm.generation.config.transformers_call`), its settings are checked against the
model once (:func:`check_generation_config`), the model's ``start`` runs its inputs (checking
their values: one host read), and the one decode loop, :func:`~addnorm.generation.loop.decode`,
drives the model's own ``step``, which is trusted: nothing is checked again per token.

The ids a model never emits (``pad_id``, and an encoder-decoder's start token) get -inf
logits at every step. A model whose ``pad_id`` is None (a vocabulary without padding,
GPT-2's) bans nothing as padding; rows that stopped are then filled with the stop id
(``GenerationConfig.fill_id``).

A decoder-only model continues its prompt: the prompt counts as seen for the repetition rules
(its padding excluded), Hugging Face's ``max_length`` counts it, and the output may start with
it. An encoder-decoder's decoder starts from its start token alone, which plays those parts.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from addnorm.cache import check_cache_room
from addnorm.generation.config import GenerationConfig, transformers_call
from addnorm.generation.loop import check_decoding_options, decode, prompt_history
from addnorm.generation.step import compiled_step, held_buffers
from addnorm.generation.stop_strings import StopFn

if TYPE_CHECKING:
    from collections.abc import Mapping

    from addnorm.family import GenerationSpec, GenerativeModel

__all__ = ["banned_ids", "check_generation_config", "default_config", "generate", "with_prompt"]


@torch.no_grad()
def generate(
    model: GenerativeModel,
    inputs: Tensor,
    config: GenerationConfig | None = None,
    *,
    padding_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    stop_fn: StopFn | None = None,
    return_prompt: bool | None = None,
    attention_mask: Tensor | None = None,
    generation_config: object = None,
    settings: Mapping[str, object] | None = None,
) -> Tensor:
    """Generate tokens with ``model`` as ``config`` says (default :func:`default_config`), or
    as Hugging Face's ``generate`` would (see ``TransformerLM.generate`` for the call).

    ``inputs`` have had their structure checked (a long (B, L) tensor): a decoder-only
    model's left-padded prompt, or an encoder-decoder's source; ``padding_mask`` or
    ``attention_mask`` is theirs. ``settings``: Hugging Face's settings by name, as given
    (None: not given).

    Shapes:
        inputs, padding_mask, attention_mask: (B, L)
        returns: (B * r, N), N <= max_new_tokens; (B * r, L + N) with a decoder-only model's
        prompt, (B * r, 1 + N) with an encoder-decoder's start token
    """
    spec = model.generation_spec
    continues_prompt = spec.start_id is None
    call = transformers_call(
        spec, config, generation_config=generation_config, names=settings or {},
        attention_mask=attention_mask, padding_mask=padding_mask, return_prompt=return_prompt,
        mask_shape=tuple(inputs.shape), prompt_length=inputs.shape[1] if continues_prompt else 1,
    )
    checked = check_generation_config(spec, call.config)
    check_decoding_options(checked, generator, stop_fn, spec.device)
    cache, logits = model.start(
        inputs, call.padding_mask, max_new_tokens=checked.max_new_tokens, static=checked.compile
    )  # the inputs' values checked (one host read)
    seen = prompt_history(None, None, logits)
    if continues_prompt and checked.reshapes_logits:  # the prompt counts as seen
        seen = (inputs, cache.padding_mask[:, : inputs.shape[1]])  # its padding, as start had it
    step = compiled_step(model.step) if checked.compile else model.step
    held = held_buffers(model, cache) if checked.compile else contextlib.nullcontext()
    with held:  # compiled: the cache's state in the model's buffers, at fixed addresses
        new = decode(step, logits, cache, checked, generator=generator, seen=seen,
                     stop_fn=stop_fn, banned=banned_ids(spec, logits.device))
    if not call.return_prompt:
        return new
    prompt = inputs if spec.start_id is None else torch.full_like(inputs[:, :1], spec.start_id)
    return with_prompt(prompt, new)


def default_config(spec: GenerationSpec) -> GenerationConfig:
    """A model's default :class:`GenerationConfig`: greedy, 64 tokens, the model's eos and pad.

    Variants come from ``dataclasses.replace(model.generation_config, ...)``.
    """
    return GenerationConfig(eos_id=spec.eos_id, pad_id=spec.pad_id)


def check_generation_config(spec: GenerationSpec, config: object) -> GenerationConfig:
    """The config of a model's ``generate`` call (None: :func:`default_config`), checked
    against the model's special ids and room.

    ``pad_id`` must be the model's (it fills rows that stopped, and is never generated), or,
    for a model without a pad id (GPT-2's), one of the stop ids (Hugging Face's usual
    ``pad_token_id=eos_token_id``: the filler ``pad_id=None`` would write anyway, when it is
    the first); a stop token may not be one that generation never emits (it could never stop
    a row). ``max_new_tokens`` must fit a learned position table, and a cache of the model
    in some memory of this machine (:func:`~addnorm.cache.check_cache_room`).
    """
    if config is None:
        return default_config(spec)
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig or None, got {type(config).__name__}")
    stop_as_pad = spec.pad_id is None and config.pad_id in config.stop_ids
    if config.pad_id != spec.pad_id and not stop_as_pad:
        raise ValueError(
            f"config.pad_id (Hugging Face's pad_token_id, {config.pad_id}) must be the model's "
            f"pad_id ({spec.pad_id}), or, for a model without one, a stop id; start from the "
            "model's own: dataclasses.replace(model.generation_config, ...)"
        )
    outside = [stop for stop in config.stop_ids if stop >= spec.vocab_size]
    if outside:
        raise ValueError(
            f"eos_id {config.eos_id!r} holds {outside[0]}, outside the vocabulary "
            f"[0, {spec.vocab_size})"
        )
    for name, token in _never_emitted(spec).items():
        if token is not None and token in config.stop_ids:
            raise ValueError(
                f"eos_id {config.eos_id!r} includes {name} ({token}), which generation never "
                "emits, so it could never stop a row"
            )
    if spec.max_positions is not None and config.max_new_tokens > spec.max_positions:
        raise ValueError(
            f"max_new_tokens ({config.max_new_tokens}) exceeds max_len ({spec.max_positions}) "
            "of the model's learned position table"
        )
    check_cache_room(config.max_new_tokens, n_layers=spec.cached_layers, d_model=spec.d_model)
    return config


def _never_emitted(spec: GenerationSpec) -> dict[str, int | None]:
    """The ids a model never emits, by the name the errors give them. A generated ``pad_id``
    would count as padding when fed back (so the cached steps would no longer match a
    recomputation, and "stopped" would be ambiguous); the start token (``bos_id``) is the
    decoder's start, never a continuation."""
    if spec.start_id is None:
        return {"pad_id": spec.pad_id}
    return {"pad_id": spec.pad_id, "bos_id": spec.start_id}


def banned_ids(spec: GenerationSpec, device: torch.device) -> Tensor | None:
    """The ids a model never emits, as the ``banned`` (n,) long tensor of
    :func:`~addnorm.generation.loop.decode`; None when there are none (None ids ban nothing).
    """
    ids = [token for token in _never_emitted(spec).values() if token is not None]
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def with_prompt(prompt: Tensor, new: Tensor) -> Tensor:
    """The prompt rows followed by their new tokens; each prompt row repeated for its
    ``num_return_sequences`` output rows, as Hugging Face's ``generate`` returns them.

    Shapes:
        prompt: (B, L0); new: (B * r, N); returns: (B * r, L0 + N)
    """
    rows = new.shape[0] // prompt.shape[0]
    return torch.cat([prompt.repeat_interleave(rows, dim=0), new], dim=1)
