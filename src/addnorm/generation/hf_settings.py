"""Hugging Face's generation settings, in its names: :class:`TransformersSettings` (those
addnorm implements, as a model's ``generate`` takes them by keyword), the names around them
(``SAMPLING_ONLY``, ``OUTPUT_NAMES``, the default length), and :func:`fields_from_transformers`,
how a set of them becomes :class:`~addnorm.generation.config.GenerationConfig`'s fields with
Hugging Face's meaning (``GenerationConfig.from_transformers`` is its entry; the mapping is in
its docstring). Settings addnorm lacks are refused unless switched off; sampling-only ones
outside sampling are ignored with a warning pointed at the caller (:func:`warn_caller`), as
transformers ignores them.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any, TypedDict

from addnorm.utils.checks import check_bool, check_int

__all__ = [
    "OUTPUT_NAMES",
    "SAMPLING_ONLY",
    "TRANSFORMERS_DEFAULT_NEW_TOKENS",
    "TRANSFORMERS_NAMES",
    "TransformersSettings",
    "fields_from_transformers",
    "warn_caller",
]


class TransformersSettings(TypedDict, total=False):
    """Hugging Face's generation settings that addnorm implements (``from_transformers``), as
    the models' ``generate`` takes them by keyword (``**settings``); None = not given."""

    max_new_tokens: int | None
    max_length: int | None
    min_new_tokens: int | None
    min_length: int | None
    do_sample: bool | None
    num_beams: int | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    repetition_penalty: float | None
    no_repeat_ngram_size: int | None
    length_penalty: float | None
    early_stopping: bool | str | None
    num_return_sequences: int | None
    eos_token_id: int | list[int] | None
    pad_token_id: int | None
    min_p: float | None
    bad_words_ids: list[list[int]] | None
    suppress_tokens: list[int] | None
    forced_eos_token_id: int | list[int] | None
    max_time: float | None
    output_scores: bool | None
    output_logits: bool | None


TRANSFORMERS_NAMES = tuple(TransformersSettings.__annotations__)
# Settings that shape the sampling distribution only: outside sampling transformers ignores
# them with a warning (GenerationConfig.validate), and so does a call in its terms.
SAMPLING_ONLY = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None, "typical_p": 1.0,
                 "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}
# What a call returns beside the tokens (return_dict_in_generate=True): the names of
# GenerateOutput's optional parts that these settings ask for.
OUTPUT_NAMES = ("output_scores", "output_logits")
# Hugging Face's length when none is set: 20 new tokens (transformers 5; a model's learned
# positions may cap it, see transformers_call).
TRANSFORMERS_DEFAULT_NEW_TOKENS = 20
# Keys that never change the tokens: metadata, the cache switch, and the first decoder token
# (fixed by the model: the encoder-decoder's generate checks it against its bos_id).
# What the call returns beside the tokens changes none of them either: transformers_call
# reads return_dict_in_generate and OUTPUT_NAMES.
_NO_EFFECT = frozenset({
    "transformers_version", "_from_model_config", "_commit_hash", "_original_object_hash",
    "use_cache", "bos_token_id", "decoder_start_token_id", "return_dict_in_generate",
    *OUTPUT_NAMES,
})
# Settings addnorm does not implement, accepted at the value that switches them off.
_OFF: dict[str, object] = {
    "output_attentions": False, "output_hidden_states": False, "remove_invalid_values": False,
    "renormalize_logits": False, "low_memory": False, "token_healing": False,
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0,
    "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0,
    "num_beam_groups": 1, "guidance_scale": 1.0,
}
_OFF_WHEN_EMPTY = frozenset({
    "force_words_ids", "begin_suppress_tokens", "sequence_bias", "stop_strings",
})


def fields_from_transformers(names: dict[str, Any], prompt_length: int | None) -> dict[str, Any]:
    """GenerationConfig's fields (but ``compile``) from Hugging Face's set names."""
    do_sample = check_bool("do_sample", names.get("do_sample", False))
    if not do_sample:
        names = _without_sampling_settings(names)
    _refuse_unimplemented(names)
    num_beams = check_int("num_beams", names.get("num_beams", 1), min_value=1)
    if do_sample and num_beams > 1:
        raise ValueError(
            f"do_sample=True with num_beams={num_beams} (beam sampling) is not supported; "
            "use do_sample=True with num_beams=1, or do_sample=False for beam search"
        )
    strategy = "beam" if num_beams > 1 else "sample" if do_sample else "greedy"
    beam_stop = _beam_stop(names.get("early_stopping", False))  # checked for every strategy
    eos = names.get("eos_token_id")
    fields = {
        "strategy": strategy,
        "max_new_tokens": _new_tokens(names, "max_new_tokens", "max_length", prompt_length),
        "min_new_tokens": _new_tokens(names, "min_new_tokens", "min_length", prompt_length),
        "repetition_penalty": names.get("repetition_penalty", 1.0),
        "no_repeat_ngram_size": names.get("no_repeat_ngram_size", 0),
        "length_penalty": names.get("length_penalty", 1.0),
        "num_return_sequences": names.get("num_return_sequences", 1),
        "eos_id": tuple(eos) if isinstance(eos, list) else eos,
        "pad_id": names.get("pad_token_id"),
        "bad_words_ids": names.get("bad_words_ids", ()),
        "suppress_tokens": names.get("suppress_tokens", ()),
        "forced_eos_id": names.get("forced_eos_token_id"),
        "max_time": names.get("max_time"),
        **_sampling_fields(names, strategy),
    }
    if strategy == "beam":
        fields.update(num_beams=num_beams, beam_stop=beam_stop)
    return fields


def _refuse_unimplemented(names: Mapping[str, object]) -> None:
    """Raise naming every setting that would change the tokens and that addnorm lacks."""
    refused = []
    for name, value in names.items():
        if name in TRANSFORMERS_NAMES or name in _NO_EFFECT:
            continue
        if name in _OFF_WHEN_EMPTY and isinstance(value, list | tuple | dict) and not value:
            continue
        if name in _OFF and _is_off(value, _OFF[name]):
            continue
        refused.append(f"{name}={value!r}")
    if refused:
        raise ValueError(
            "addnorm does not implement these Hugging Face generation settings: "
            f"{', '.join(refused)}; it implements {', '.join(TRANSFORMERS_NAMES)}"
        )


def _is_off(value: object, off: object) -> bool:
    if isinstance(off, bool):
        return value is off
    return not isinstance(value, bool) and value == off


def _beam_stop(early_stopping: object) -> str:
    """Hugging Face's ``early_stopping`` as addnorm's ``beam_stop``."""
    if early_stopping is True:
        return "k_finished"
    if early_stopping is False:
        return "heuristic"
    if early_stopping == "never":
        return "exact"
    raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")


def _new_tokens(
    names: Mapping[str, Any], new_name: str, total_name: str, prompt_length: int | None
) -> int:
    """``max_new_tokens`` (or ``min_new_tokens``), else from the total that counts the
    prompt (``max_length``, ``min_length``), else Hugging Face's default."""
    if new_name in names:
        return names[new_name]
    if total_name not in names:
        return TRANSFORMERS_DEFAULT_NEW_TOKENS if new_name == "max_new_tokens" else 0
    total = check_int(total_name, names[total_name], min_value=0)
    if prompt_length is None:
        raise ValueError(
            f"{total_name} counts the prompt's tokens: pass prompt_length (or {new_name}), or "
            "pass it to a model's generate, which knows its prompt"
        )
    if new_name == "min_new_tokens":
        return max(total - prompt_length, 0)
    if total <= prompt_length:
        raise ValueError(
            f"max_length ({total}) leaves no new token after a prompt of {prompt_length} "
            "tokens; set max_new_tokens instead"
        )
    return total - prompt_length


def _without_sampling_settings(names: Mapping[str, Any]) -> dict[str, Any]:
    """``names`` without the sampling-only settings, which a call that does not sample
    ignores, as transformers does; those set to a value other than their default are named
    in a warning (transformers' ``GenerationConfig.validate`` logs the same)."""
    ignored = [f"{name}={names[name]!r}" for name, default in SAMPLING_ONLY.items()
               if name in names and _differs(names[name], default)]
    if ignored:
        warn_caller(
            f"do_sample is not True, so these sampling settings are ignored, as transformers "
            f"ignores them: {', '.join(ignored)}; set do_sample=True to sample with them"
        )
    return {name: value for name, value in names.items() if name not in SAMPLING_ONLY}


def warn_caller(message: str) -> None:
    """A UserWarning pointing at the first line outside addnorm that led here."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and _inside(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NO_GRAD = os.path.join("torch", "utils", "_contextlib.py")  # torch.no_grad's wrapper


def _inside(filename: str) -> bool:
    """Whether a frame's file is addnorm's (or the torch.no_grad wrapper around its calls)."""
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE + os.sep) or path.endswith(_NO_GRAD)


def _sampling_fields(names: Mapping[str, Any], strategy: str) -> dict[str, Any]:
    """temperature, top_k, top_p and min_p of a sampling call (the others have none left:
    :func:`_without_sampling_settings`); the values that switch them off are left out."""
    fields = {}
    for name, off in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0), ("min_p", 0.0)):
        if name in names and _differs(names[name], off):
            fields[name] = names[name]
    if strategy == "sample" and "top_k" not in names:
        fields["top_k"] = 50  # Hugging Face's default
    return fields


def _differs(value: object, default: object) -> bool:
    """Whether a setting differs from its default (a bool always does: it is refused)."""
    return isinstance(value, bool) or value != default
