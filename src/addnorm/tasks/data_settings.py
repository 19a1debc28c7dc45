"""The settings by which a task's config names a user's data, checked alike in every such task.
A text task's (:func:`check_data_settings`): ``data`` (a path), ``tokenizer`` (``char``,
``bpe`` or a ``tokenizer.json`` path), ``vocab_size`` (the BPE's), ``val_fraction`` (what is
held out), and where a task has them ``valid`` (a held-out file), ``shared_vocab``,
``cache_dir``, ``follow_links`` (a folder's links leading outside it read) and ``header`` (a
TSV file's first line). An image task's (:func:`check_image_settings`): ``data``,
``image_size``, ``val_fraction`` and ``follow_links``.

Paths are made absolute when the config is built, so a run resumed from another folder names
the same files (and a ``--data`` given again on resume compares equal).
"""

from __future__ import annotations

from typing import Any

from addnorm.data.fingerprint import absolute_path
from addnorm.data.hf_tokenizer import MAX_VOCAB_SIZE, MIN_BPE_VOCAB_SIZE
from addnorm.data.images import DEFAULT_VAL_FRACTION, MAX_IMAGE_SIZE
from addnorm.data.token_corpus import TOKENIZER_KINDS
from addnorm.data.tsv_header import HEADER_CHOICES
from addnorm.utils.checks import check_bool, check_choice, check_float, check_int

__all__ = ["check_data_settings", "check_image_settings"]

_PATHS = ("data", "valid", "cache_dir")


def check_data_settings(cfg: Any, *, max_val_fraction: float = 0.5) -> None:
    """Check (and make absolute) the data settings of the frozen config ``cfg`` (see the
    module docstring); ValueError or TypeError naming the field."""
    for name in _PATHS:
        value = getattr(cfg, name, None)
        if value is not None:
            if not isinstance(value, str) or not value:
                raise TypeError(f"{name} must be a non-empty str or None, got {value!r}")
            object.__setattr__(cfg, name, absolute_path(value))
    data, tokenizer = cfg.data, cfg.tokenizer
    vocab_size = cfg.vocab_size
    if not isinstance(tokenizer, str) or not tokenizer:
        raise TypeError(f"tokenizer must be char, bpe or a file path, got {tokenizer!r}")
    if tokenizer not in TOKENIZER_KINDS:
        object.__setattr__(cfg, "tokenizer", absolute_path(tokenizer))
    if vocab_size is not None:
        check_int("vocab_size", vocab_size, min_value=1)
        if tokenizer != "bpe":
            raise ValueError(f"vocab_size ({vocab_size}) applies to tokenizer bpe only")
        if not MIN_BPE_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size ({vocab_size}) must be from {MIN_BPE_VOCAB_SIZE} (the 256 bytes "
                f"and {MIN_BPE_VOCAB_SIZE - 256} special tokens) to {MAX_VOCAB_SIZE}"
            )
    check_float("val_fraction", cfg.val_fraction, min_value=0.0,
                min_inclusive=False, max_value=max_val_fraction)
    for flag in ("shared_vocab", "follow_links"):
        if hasattr(cfg, flag):
            check_bool(flag, getattr(cfg, flag))
    if hasattr(cfg, "header"):
        check_choice("header", cfg.header, HEADER_CHOICES)
    if data is None:
        needs = [n for n in ("valid", "cache_dir") if getattr(cfg, n, None) is not None]
        needs += [n for n, default in (("follow_links", False), ("header", "auto"))
                  if getattr(cfg, n, default) != default]
        if tokenizer != "char":
            needs.insert(0, f"tokenizer {tokenizer}")
        if getattr(cfg, "shared_vocab", False):
            needs.append("shared_vocab")
        if needs:
            raise ValueError(
                f"{', '.join(needs)} {'needs' if len(needs) == 1 else 'need'} data, your files "
                "to train on (--data); without it the task trains on its bundled text, read "
                "character by character"
            )


def check_image_settings(cfg: Any) -> None:
    """Check (and make absolute) the image data settings of the frozen config ``cfg``:
    ``data`` a non-empty path or None, ``val_fraction`` in (0, 0.5], ``image_size`` from 1
    to ``MAX_IMAGE_SIZE`` or None, ``follow_links``; the last three only with data (the digits
    are 8x8 with a fixed split). ValueError or TypeError naming the field."""
    if cfg.data is not None:
        if not isinstance(cfg.data, str) or not cfg.data:
            raise TypeError(f"data must be a non-empty str or None, got {cfg.data!r}")
        object.__setattr__(cfg, "data", absolute_path(cfg.data))
    check_float("val_fraction", cfg.val_fraction, min_value=0.0, min_inclusive=False,
                max_value=0.5)
    if cfg.image_size is not None:
        check_int("image_size", cfg.image_size, min_value=1)
        if cfg.image_size > MAX_IMAGE_SIZE:
            raise ValueError(f"image_size ({cfg.image_size}) must be <= {MAX_IMAGE_SIZE}")
    if cfg.data is None:
        given = [name for name, default in (("image_size", None),
                                            ("val_fraction", DEFAULT_VAL_FRACTION),
                                            ("follow_links", False))
                 if getattr(cfg, name) != default]
        if given:
            raise ValueError(f"{' and '.join(given)} need data (your images); the digits "
                             "are 8x8 with a fixed split")
