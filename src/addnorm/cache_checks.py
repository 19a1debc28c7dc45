"""The checks around a decoding cache: its size against memory, before it is allocated, and a
model's ``step`` arguments against it.

- :func:`check_cache_fits`: a cache larger than the device's memory, refused before
  :meth:`~addnorm.cache.DecodingCache.allocate`.
- :func:`check_cache_room` / :func:`check_ids_room`: a ``max_new_tokens`` no cache (or, for a
  model that slides its window, no list of new ids) of the model could hold on this machine.
- :func:`check_decoding_step`: a model's ``step`` given the cache and the tokens it can take.
"""

from __future__ import annotations

import torch

from addnorm.cache import DecodingCache
from addnorm.utils.memory import check_fits, device_memory

__all__ = ["check_cache_fits", "check_cache_room", "check_decoding_step", "check_ids_room"]


def check_cache_fits(
    *,
    n_layers: int,
    d_model: int,
    batch_size: int,
    prompt_len: int,
    max_new_tokens: int,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Refuse, before allocating, a decoding cache larger than the memory ``device`` has.

    The cache of :meth:`DecodingCache.allocate` holds keys and values for ``prompt_len +
    max_new_tokens`` positions of ``n_layers`` self-attention layers: ``2 * n_layers * B *
    positions * d_model`` values of ``dtype`` (an encoder-decoder's cross-attention cache
    comes on top). The ValueError names ``max_new_tokens`` and the most that would fit. For a
    model's ``start``, called before :meth:`DecodingCache.allocate`.
    """
    if torch.compiler.is_compiling():
        return  # no host call while a graph is captured
    per_position = 2 * n_layers * batch_size * d_model * dtype.itemsize
    positions = prompt_len + max_new_tokens
    limit = device_memory(device)
    if limit is not None and positions * per_position > limit:
        most = max(limit // max(per_position, 1) - prompt_len, 0)
        raise ValueError(
            f"max_new_tokens ({max_new_tokens}) needs a decoding cache of "
            f"{positions * per_position:,} bytes ({batch_size} rows x {positions} positions x "
            f"{n_layers} layers of {dtype} keys and values), more than the "
            f"{limit:,} bytes of memory the device ({device}) has: at most {most} new tokens "
            f"fit a prompt of {prompt_len} at this batch size"
        )


def check_cache_room(max_new_tokens: int, *, n_layers: int, d_model: int) -> None:
    """Refuse a ``max_new_tokens`` no cache could hold, whatever the batch, prompt and dtype.

    The cache holds keys and values of ``n_layers`` self-attention layers for each new token,
    at least ``2 * n_layers * d_model`` bytes per token at batch 1 in a one-byte dtype; more
    than the memory of the CPU (or of the CUDA device in use, if larger) never fits.
    :func:`check_cache_fits` is the exact check, once the batch, prompt and dtype are known.
    """
    per_token = 2 * n_layers * d_model  # bytes at batch 1, 1-byte dtype
    _check_largest_memory(f"max_new_tokens ({max_new_tokens})", max_new_tokens * per_token)


def check_ids_room(max_new_tokens: int) -> None:
    """Refuse a ``max_new_tokens`` whose new ids alone (int64, at batch 1) fit no memory of
    this machine: what a model that slides its window keeps of every token, though its cache
    holds the window only."""
    _check_largest_memory(f"max_new_tokens ({max_new_tokens})", max_new_tokens * 8)


def _check_largest_memory(name: str, n_bytes: int) -> None:
    """``check_fits`` against the largest memory here: the CPU's, or the CUDA device's in use."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_initialized() else [])
    _limit, device = max((device_memory(d) or 0, d) for d in devices)
    check_fits(name, n_bytes, device)


def check_decoding_step(tokens: torch.Tensor, cache: object, *, needs_memory: bool) -> None:
    """A model's ``step`` arguments: the right model's :class:`DecodingCache` (with encoder
    memory for an encoder-decoder, ``needs_memory``) and one token per row (B, 1)."""
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
