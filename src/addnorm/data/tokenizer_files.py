"""A tokenizer's files read without trusting them: a user's ``tokenizer.json`` and a pretrained
model's folder.

- :func:`read_tokenizer_json`: a user's file as text (a regular file of at most
  ``MAX_TOKENIZER_BYTES``, UTF-8); every failure is one :class:`DataError` naming the file.
- :func:`read_pretrained_tokenizer`: a pretrained model's ``tokenizer.json`` (the file, or
  its folder's, Hugging Face's layout) as ``tokenizers`` reads it, and its padding token: the
  one asked for, else the folder's ``special_tokens_map.json``'s, else the file's padding
  setting's.

``tokenizers`` is imported when a pretrained file is read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from addnorm.data.data_errors import DataError
from addnorm.utils.files import MAX_JSON_BYTES, UnsafeFileError, read_text

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["MAX_TOKENIZER_BYTES", "read_pretrained_tokenizer", "read_tokenizer_json"]

# A user's tokenizer.json is read if it is a regular file of at most this size.
MAX_TOKENIZER_BYTES = MAX_JSON_BYTES


def read_tokenizer_json(path: str | os.PathLike, what: str) -> str:
    """The text of a user's ``tokenizer.json``; :class:`DataError` starting with ``what`` and
    the path if it is missing, not a regular file, too large or not UTF-8."""
    where = f"{what} {os.fspath(path)}"
    try:
        return read_text(path, max_bytes=MAX_TOKENIZER_BYTES, what=what)
    except FileNotFoundError:
        raise DataError(f"{where}: no such file (name char, bpe or a tokenizer.json file)"
                        ) from None
    except UnsafeFileError as err:
        raise DataError(str(err)) from None
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DataError(f"{where}: {err.strerror or err}") from None


def read_pretrained_tokenizer(
    path: str | os.PathLike, pad_token: str | None
) -> tuple[Tokenizer, Path, str | None]:
    """``(tokenizer, its file, its padding token or None)`` of a model's folder or file.

    Raises:
        FileNotFoundError: there is no ``tokenizer.json``.
        ValueError: ``tokenizers`` cannot read it.
    """
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        pad_token = pad_token or _pad_token_of(path / "special_tokens_map.json")
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for a malformed file
        raise ValueError(f"cannot read {path} as a tokenizer.json: {err}") from None
    if pad_token is None and tokenizer.padding is not None:
        pad_token = tokenizer.padding.get("pad_token")
    return tokenizer, path, pad_token


def _pad_token_of(specials: Path) -> str | None:
    """The padding token's text in a ``special_tokens_map.json`` (a str or
    ``{"content": ...}``), None without the file or the entry."""
    if not specials.is_file():
        return None
    names = json.loads(specials.read_text(encoding="utf-8"))
    entry = names.get("pad_token") if isinstance(names, dict) else None
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None
