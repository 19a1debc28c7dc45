"""A ``generate`` call in Hugging Face's terms, read once before decoding starts:
:func:`transformers_call` turns its names (``input_ids``, ``attention_mask``,
``generation_config``, ``return_dict_in_generate``, the settings of
:class:`~addnorm.generation.hf_settings.TransformersSettings`) into a :class:`GenerationCall`.

A call is in Hugging Face's terms when it passes no addnorm ``config`` but one of those
names. Its settings are then Hugging Face's: its defaults (20 new tokens, greedy,
``early_stopping=False``, ``top_k=50`` when sampling), under the model's eos and pad ids,
under ``generation_config``, under the keywords (transformers' order of precedence),
translated by :meth:`GenerationConfig.from_transformers`; without an ``attention_mask``, its
padding is read from ``pad_token_id`` by transformers' rule (:func:`padding_from_pad_id`);
and it returns the prompt followed by the new tokens, as transformers does (``return_prompt``
chooses either way), or, with ``return_dict_in_generate=True``, a
:class:`~addnorm.generation.output.GenerateOutput` holding them (and the scores or logits
asked for). An addnorm ``config`` together with Hugging Face's settings is refused: one call,
one vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from addnorm.generation.config import GenerationConfig, transformers_settings
from addnorm.generation.hf_settings import (
    OUTPUT_NAMES,
    TRANSFORMERS_DEFAULT_NEW_TOKENS,
    warn_caller,
)
from addnorm.utils.checks import check_bool

if TYPE_CHECKING:
    from addnorm.family import GenerationSpec

__all__ = [
    "GenerationCall",
    "padding_from_attention_mask",
    "padding_from_pad_id",
    "transformers_call",
]


@dataclass(frozen=True)
class GenerationCall:
    """A ``generate`` call's settings, read once before it starts (:func:`transformers_call`).

    Attributes:
        config: the config to run (checked against the model by
            :func:`~addnorm.generation.generate.generate`); None: the model's default.
        padding_mask: (B, L0) bool, True = padding (addnorm's polarity), or None.
        return_prompt: whether the output starts with the prompt (the decoder's: the start
            token for an encoder-decoder).
        return_dict: whether the call returns a
            :class:`~addnorm.generation.output.GenerateOutput` (Hugging Face's
            ``return_dict_in_generate``) rather than the tokens alone.
        output_scores, output_logits: what that output holds beside the tokens.
    """

    config: object
    padding_mask: torch.Tensor | None
    return_prompt: bool
    return_dict: bool = False
    output_scores: bool = False
    output_logits: bool = False


def transformers_call(
    spec: GenerationSpec,
    config: object,
    *,
    generation_config: object,
    names: Mapping[str, object],
    attention_mask: object,
    padding_mask: object,
    return_prompt: object,
    inputs: torch.Tensor,
    prompt_length: int,
    inputs_by_name: bool = False,
) -> GenerationCall:
    """Read a ``generate`` call that may use Hugging Face's names (the module docstring).

    A ``transformers.GenerationConfig`` passed as ``config`` (transformers' second positional
    argument) is read as ``generation_config``. ``names``: the call's Hugging Face settings
    (``TRANSFORMERS_NAMES``, ``return_dict_in_generate`` and any other it was given; None =
    not given); ``inputs``: the prompt (or the source), whose shape ``attention_mask`` must
    have; ``prompt_length``: the decoder's prompt, which ``max_length`` and ``min_length``
    count (a decoder-only model's L0, padding included; an encoder-decoder's 1: its start
    token); ``inputs_by_name``: the inputs came as Hugging Face's ``input_ids=``, which makes
    the call one in its terms too.

    Without ``attention_mask`` (and ``padding_mask``), a call in Hugging Face's terms reads
    the padding as transformers does: where ``pad_token_id`` is set and is no stop id, every
    occurrence of it in ``inputs`` is padding; otherwise nothing is
    (:func:`padding_from_pad_id`).
    """
    if not isinstance(config, GenerationConfig) and callable(getattr(config, "to_diff_dict", None)):
        if generation_config is not None:  # transformers' generate(inputs, generation_config)
            raise ValueError("two generation configs: config and generation_config")
        config, generation_config = None, config
    given = {name: value for name, value in names.items() if value is not None}
    padding = padding_from_attention_mask(attention_mask, padding_mask, tuple(inputs.shape))
    prompt = None if return_prompt is None else check_bool("return_prompt", return_prompt)
    settings_given = bool(given) or generation_config is not None
    if config is not None and settings_given:
        listed = sorted(given) + (["generation_config"] if generation_config is not None else [])
        raise ValueError(
            "config (addnorm's GenerationConfig) and Hugging Face's settings "
            f"({', '.join(listed)}) were both given: pass one of them (vary config with "
            "dataclasses.replace)"
        )
    if config is not None or not (settings_given or attention_mask is not None or inputs_by_name):
        return GenerationCall(config, padding, bool(prompt))
    settings: dict[str, Any] = {"eos_token_id": spec.eos_id, "pad_token_id": spec.pad_id}
    settings.update(transformers_settings(generation_config))
    settings.update(given)
    _check_start_token(spec, settings)
    if "max_new_tokens" not in settings and "max_length" not in settings:
        settings["max_new_tokens"] = _default_new_tokens(spec, prompt_length)
    hf_config = GenerationConfig.from_transformers(settings, prompt_length=prompt_length)
    if attention_mask is None and padding_mask is None:
        padding = padding_from_pad_id(inputs, hf_config, spec.pad_id)
    return GenerationCall(hf_config, padding, True if prompt is None else prompt,
                          *_outputs(settings))


def padding_from_pad_id(
    inputs: torch.Tensor, config: GenerationConfig, model_pad_id: int | None
) -> torch.Tensor | None:
    """The padding of inputs given without a mask, by transformers' rule
    (``_prepare_attention_mask_for_generation``): every occurrence of ``config.pad_id`` when
    it is set and is not one of the stop ids; else no padding at all (None when the model,
    without a pad id of its own, reads it so too). No value is read: where the id does not
    occur, the mask is all False, as transformers' all-ones attention mask.

    Shapes:
        inputs: (B, L); returns: (B, L) bool, True = padding, or None
    """
    pad = config.pad_id
    if pad is not None and pad not in config.stop_ids:
        return inputs == pad
    if model_pad_id is None:
        return None  # the model's default: no padding
    return torch.zeros_like(inputs, dtype=torch.bool)


def _outputs(settings: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """``return_dict_in_generate``, ``output_scores`` and ``output_logits`` of a call in
    Hugging Face's terms; without the first, the others are ignored with a warning, as
    transformers ignores them."""
    return_dict = check_bool("return_dict_in_generate",
                             settings.get("return_dict_in_generate", False))
    wanted = [check_bool(name, settings.get(name, False)) for name in OUTPUT_NAMES]
    if not return_dict and any(wanted):
        named = [name for name, want in zip(OUTPUT_NAMES, wanted, strict=True) if want]
        warn_caller(
            f"{' and '.join(named)} {'ask' if len(named) > 1 else 'asks'} for what only "
            "return_dict_in_generate=True returns; without it they are ignored, as transformers "
            "ignores them"
        )
        return False, False, False
    scores, logits = wanted
    return return_dict, scores, logits


def padding_from_attention_mask(
    attention_mask: object, padding_mask: object, shape: tuple[int, ...]
) -> torch.Tensor | None:
    """``padding_mask``, or Hugging Face's ``attention_mask`` (1 = real token) negated.

    ``attention_mask``: bool, or integers or floats that are 0 and 1 (read back once to
    check them: a tokenizer's output, or one cast to float, as transformers accepts).

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
    if attention_mask.is_complex():
        raise TypeError(
            f"attention_mask must be bool, or integer or float 0/1, got dtype "
            f"{attention_mask.dtype}"
        )
    if bool(((attention_mask != 0) & (attention_mask != 1)).any()):  # one read, at the start
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
    return attention_mask == 0


def _check_start_token(spec: GenerationSpec, settings: Mapping[str, Any]) -> None:
    """An encoder-decoder's first decoder token is its ``bos_id``: Hugging Face's
    ``decoder_start_token_id`` (else ``bos_token_id``) must name it. A decoder-only model
    starts from its prompt, which makes both irrelevant, as in transformers."""
    if spec.start_id is None:
        return
    for name in ("decoder_start_token_id", "bos_token_id"):
        if name in settings:
            if settings[name] != spec.start_id:
                raise ValueError(
                    f"{name} ({settings[name]!r}) must be the model's bos_id ({spec.start_id}), "
                    "the decoder's first token"
                )
            return


def _default_new_tokens(spec: GenerationSpec, prompt_length: int) -> int:
    """Hugging Face's length when none is set: 20 new tokens, capped so that the prompt and
    the new tokens fit a learned position table (transformers caps at
    ``max_position_embeddings``), even for a model that could slide its window past it: a
    call in transformers' names gives transformers' tokens; an explicit ``max_new_tokens``
    slides the window."""
    if spec.max_positions is None:
        return TRANSFORMERS_DEFAULT_NEW_TOKENS
    room = spec.max_positions - prompt_length
    if room < 1:
        raise ValueError(
            f"the prompt ({prompt_length} tokens) leaves no room for a new token in the learned "
            f"position table (max_len {spec.max_positions})"
        )
    return min(TRANSFORMERS_DEFAULT_NEW_TOKENS, room)
