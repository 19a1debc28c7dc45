"""A model's ``generate``: one function for every model that implements
:class:`~addnorm.family.GenerativeModel` (``start``, ``step`` and a ``GenerationSpec``), which
``Transformer.generate`` and ``TransformerLM.generate`` call.

A call is read once (addnorm's ``config``, or Hugging Face's names:
:func:`~addnorm.generation.transformers_call.transformers_call`), its settings are checked
against the model once (:func:`check_generation_config`), the model's ``start`` runs its
inputs (checking their values: one host read), and the one decode loop,
:func:`~addnorm.generation.loop.decode`, drives the model's own ``step``, which is trusted:
nothing is checked again per token.

The ids a model never emits (its ``pad_id``, and an encoder-decoder's start token) get -inf
logits at every step. A model whose ``pad_id`` is None (a vocabulary without padding,
GPT-2's) bans nothing as padding. Rows that stopped are filled with the config's ``pad_id``
(Hugging Face's ``pad_token_id``: any id of the vocabulary), else with the first stop id
(``GenerationConfig.fill_id``).

Before the rows are expanded to beams or return sequences, their number is held to the
memory of the device, as ``max_new_tokens`` is (:func:`~addnorm.generation.decode_checks.
check_rows_fit`, given the bytes of each row's cache).

A decoder-only model continues its prompt: the prompt counts as seen for the repetition rules
(its padding excluded), Hugging Face's ``max_length`` counts it, and the output may start with
it. An encoder-decoder's decoder starts from its start token alone, which plays those parts.

A decoder-only model with a ``context`` (``GenerationSpec.context``) sees at most a window
of tokens (its context, or ``GenerationConfig.window``), sliding past it
(:mod:`addnorm.generation.window`): any ``max_new_tokens`` is produced within the positions
the model was trained on, and its cache holds at most the window.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from addnorm.cache_checks import check_cache_room, check_ids_room
from addnorm.generation.config import GenerationConfig
from addnorm.generation.deadline import Deadline
from addnorm.generation.decode_checks import (
    check_decoding_options,
    check_rows_fit,
    check_token_ids,
)
from addnorm.generation.loop import decode, prompt_history
from addnorm.generation.output import GenerateOutput, Recorder
from addnorm.generation.step import compiled_step, held_buffers
from addnorm.generation.stop_strings import StopFn
from addnorm.generation.transformers_call import transformers_call
from addnorm.generation.window import Window, sliding_step, window_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from addnorm.family import GenerationSpec, GenerativeModel, WindowedModel

__all__ = [
    "banned_ids", "cache_bytes_per_row", "check_generation_config", "default_config", "generate",
    "inputs_of", "with_prompt",
]


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
    inputs_by_name: bool = False,
) -> Tensor | GenerateOutput:
    """Generate tokens with ``model`` as ``config`` says (default :func:`default_config`), or
    as Hugging Face's ``generate`` would (see ``TransformerLM.generate`` for the call).

    ``inputs`` have had their structure checked (a long (B, L) tensor): a decoder-only
    model's left-padded prompt, or an encoder-decoder's source; ``padding_mask`` or
    ``attention_mask`` is theirs. ``settings``: Hugging Face's settings by name, as given
    (None: not given), ``return_dict_in_generate`` among them; ``inputs_by_name``: the inputs
    came as Hugging Face's ``input_ids=`` (:func:`inputs_of`).

    Shapes:
        inputs, padding_mask, attention_mask: (B, L)
        returns: (B * r, N), N <= max_new_tokens; (B * r, L + N) with a decoder-only model's
        prompt, (B * r, 1 + N) with an encoder-decoder's start token; with
        ``return_dict_in_generate=True`` a :class:`GenerateOutput` holding them
    """
    spec = model.generation_spec
    continues_prompt = spec.start_id is None
    call = transformers_call(
        spec, config, generation_config=generation_config, names=settings or {},
        attention_mask=attention_mask, padding_mask=padding_mask, return_prompt=return_prompt,
        inputs=inputs, prompt_length=inputs.shape[1] if continues_prompt else 1,
        inputs_by_name=inputs_by_name,
    )
    checked = check_generation_config(spec, call.config)
    window = window_of(spec, checked)
    deadline = Deadline(checked.max_time)  # max_time counts from the call, as transformers'
    check_decoding_options(checked, generator, stop_fn, spec.device)
    if window is None:
        cache, logits = model.start(inputs, call.padding_mask,
                                    max_new_tokens=checked.max_new_tokens, static=checked.compile)
    else:
        cache, logits = cast("WindowedModel", model).start(
            inputs, call.padding_mask, max_new_tokens=checked.max_new_tokens,
            static=checked.compile, window=window.size,
        )  # the inputs' values checked (one host read)
    check_rows_fit(checked, inputs.shape[0], spec.vocab_size,
                   cache_bytes_per_row(spec, checked, inputs.shape[1], logits.dtype, window),
                   logits.device)
    seen = prompt_history(None, None, logits)
    if continues_prompt and checked.reshapes_logits:  # the prompt counts as seen
        seen = (inputs, _prompt_padding(cache, inputs.shape[1]))
    step = compiled_step(model.step) if checked.compile else model.step
    if window is not None:  # the cache holds min(L0, window) positions after start
        step = sliding_step(step, cast("WindowedModel", model), window,
                            min(inputs.shape[1], window.size))
    record = Recorder(scores=call.output_scores, logits=call.output_logits) if (
        call.return_dict) else None
    held = held_buffers(model, cache) if checked.compile else contextlib.nullcontext()
    with held:  # compiled: the cache's state in the model's buffers, at fixed addresses
        new = decode(step, logits, cache, checked, generator=generator, seen=seen,
                     stop_fn=stop_fn, banned=banned_ids(spec, logits.device), deadline=deadline,
                     record=record)
    if call.return_prompt:
        prompt = inputs if spec.start_id is None else torch.full_like(inputs[:, :1], spec.start_id)
        new = with_prompt(prompt, new)
    return new if record is None else record.output(new)


def _prompt_padding(cache: Any, length: int) -> Tensor:
    """The whole prompt's padding (B, L0), as the model's ``start`` read it: recorded apart
    by a model whose window may hold the prompt's end only, else the cache's first
    positions."""
    recorded = getattr(cache, "prompt_padding_mask", None)
    return recorded if recorded is not None else cache.padding_mask[:, :length]


def inputs_of(name: str, inputs: Tensor | None, input_ids: Tensor | None) -> tuple[Tensor, bool]:
    """A model's ``generate`` inputs, given by position (``name``) or as Hugging Face's
    ``input_ids=`` (one of them); and whether they came by that name, which makes the call
    one in Hugging Face's terms
    (:func:`~addnorm.generation.transformers_call.transformers_call`)."""
    if input_ids is None:
        if inputs is None:
            raise TypeError(f"generate needs {name} (or Hugging Face's input_ids=)")
        return inputs, False
    if inputs is not None:
        raise TypeError(f"give {name} or input_ids, not both")
    return input_ids, True


def cache_bytes_per_row(
    spec: GenerationSpec, config: GenerationConfig, input_length: int, dtype: torch.dtype,
    window: Window | None = None,
) -> int:
    """The bytes of one row of a model's decoding cache: keys and values of the cached layers
    for the prompt and ``max_new_tokens`` (a decoder-only model; at most the ``window``'s
    size), or for ``max_new_tokens`` and, once per layer, the source, beside the encoder's
    output (an encoder-decoder)."""
    width = spec.d_model * dtype.itemsize  # bytes of one position of one tensor
    if spec.start_id is None:
        positions = input_length + config.max_new_tokens
        if window is not None:
            positions = min(positions, window.size)
        return 2 * spec.cached_layers * positions * width
    cross = (2 * spec.cached_layers + 1) * input_length * width  # cross keys, values, memory
    return 2 * spec.cached_layers * config.max_new_tokens * width + cross


def default_config(spec: GenerationSpec) -> GenerationConfig:
    """A model's default :class:`GenerationConfig`: greedy, 64 tokens, the model's eos and pad.

    Variants come from ``dataclasses.replace(model.generation_config, ...)``.
    """
    return GenerationConfig(eos_id=spec.eos_id, pad_id=spec.pad_id)


def check_generation_config(spec: GenerationSpec, config: object) -> GenerationConfig:
    """The config of a model's ``generate`` call (None: :func:`default_config`), checked
    against the model's special ids and room.

    Every id it names must be in the vocabulary; ``pad_id`` may be any of them (it fills the
    rows that stopped, as Hugging Face's ``pad_token_id``). A stop token may not be one that
    generation never emits (it could never stop a row), nor may ``forced_eos_id`` (it could
    never be forced). ``max_new_tokens`` must fit a learned position table, and a cache of
    the model in some memory of this machine (:func:`~addnorm.cache_checks.check_cache_room`),
    unless the model slides a window (``spec.context``), whose cache holds the window: then
    its new ids must fit (:func:`~addnorm.cache_checks.check_ids_room`).
    """
    if config is None:
        return default_config(spec)
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig or None, got {type(config).__name__}")
    check_token_ids(config, spec.vocab_size)
    for name, token in _never_emitted(spec).items():
        for field, ids, why in (("eos_id", config.stop_ids, "it could never stop a row"),
                                ("forced_eos_id", config.forced_ids, "it cannot be forced")):
            if token is not None and token in ids:
                raise ValueError(
                    f"{field} {getattr(config, field)!r} includes {name} ({token}), which "
                    f"generation never emits, so {why}"
                )
    if spec.context is not None:  # a window: a cache of the window, but every new id is kept
        check_ids_room(config.max_new_tokens)
        return config
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
