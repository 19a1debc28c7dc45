"""The checks of a generation before it starts, beside its config's own: every id a config
names inside the vocabulary (:func:`check_token_ids`), the rows beam search or several return
sequences make against the device's memory before they are expanded (:func:`check_rows_fit`),
and the options beside the config (:func:`check_decoding_options`: ``stop_fn``, the
generator).
"""

from __future__ import annotations

import torch

from addnorm.generation.config import GenerationConfig
from addnorm.utils.memory import device_memory

__all__ = ["check_decoding_options", "check_rows_fit", "check_token_ids"]


def check_token_ids(config: GenerationConfig, vocab: int) -> None:
    """Every id a config names (``pad_id``, the stop ids, ``forced_eos_id``,
    ``suppress_tokens``, ``bad_words_ids``) must be in the vocabulary [0, V)."""
    named = [("pad_id", config.pad_id), ("eos_id", config.eos_id),
             ("forced_eos_id", config.forced_eos_id), ("suppress_tokens", config.suppress_tokens),
             ("bad_words_ids", config.bad_words_ids)]
    for name, value in named:
        outside = [token for token in _flat(value) if token >= vocab]
        if outside:
            where = f"{name} ({outside[0]})" if name in ("pad_id", "eos_id", "forced_eos_id") else (
                f"{name} ({value!r}) holds {outside[0]}, which")
            raise ValueError(f"{where} must be < the vocabulary size V ({vocab})")


def _flat(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [token for item in value for token in _flat(item)]  # type: ignore[attr-defined]


def check_rows_fit(
    config: GenerationConfig, batch: int, vocab: int, row_bytes: int,
    device: torch.device | str,
) -> None:
    """Refuse, before the B input rows become ``B * num_beams`` beams (beam search) or ``B *
    num_return_sequences`` rows (sampling), more rows than the memory of ``device`` holds.

    Each row needs at least ``row_bytes`` (its decoding cache: the caller's count; 0 when
    unknown) and a float32 row of V logits (beam search: twice the cache, which every step
    reorders to follow the beams' parents, ``index_select`` writing a copy of each tensor
    before the old one is freed; two rows of logits, its log-probs and their sums with the
    beam scores; and ``max_new_tokens`` long ids of finished hypotheses): a lower bound of
    what the rows allocate, as :func:`~addnorm.cache_checks.check_cache_fits` is of the cache, so
    what it refuses could not run.
    """
    beam = config.strategy == "beam"
    name, copies = ("num_beams", config.num_beams) if beam else (
        "num_return_sequences", config.num_return_sequences)
    if copies == 1 or torch.compiler.is_compiling():
        return
    per_row = (row_bytes + vocab * 4) * (2 if beam else 1) + (config.max_new_tokens * 8 if beam
                                                              else 0)
    rows = batch * copies
    limit = device_memory(device)
    if limit is not None and rows * per_row > limit:
        most = limit // (batch * per_row)
        raise ValueError(
            f"{name} ({copies}) with max_new_tokens ({config.max_new_tokens}) makes {batch} x "
            f"{copies} = {rows:,} rows of decoding state, at least {rows * per_row:,} bytes "
            f"({per_row:,} per row: its cache{' and its reordered copy' if beam else ''}, "
            f"float32 logits over {vocab} tokens{', its finished hypotheses' if beam else ''}),"
            f" more than the {limit:,} bytes of memory the device ({torch.device(device)}) "
            f"has: at most {most:,} fit {batch} input rows"
        )


def check_decoding_options(
    config: GenerationConfig,
    generator: object,
    stop_fn: object,
    device: torch.device,
) -> None:
    """The options of a generation beside its config, checked once before it starts."""
    if stop_fn is not None:
        if not callable(stop_fn):
            raise TypeError(f"stop_fn must be callable, got {type(stop_fn).__name__}")
        if config.strategy == "beam":
            raise ValueError("stop_fn is not supported by beam search; use greedy or sample")
        if config.fill_id is None:
            raise ValueError(
                "stop_fn needs an id for the positions after a row ends: set pad_id or eos_id"
            )
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if generator.device.type != device.type:
            raise ValueError(f"generator is on {generator.device} but the logits are on {device}")
