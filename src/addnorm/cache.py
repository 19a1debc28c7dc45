"""Key/value caches for autoregressive decoding.

Shapes legend: B batch, H heads, S key positions (cached), L new positions, Dh head dim,
D d_model.

Decoding one token at a time would recompute the keys and values of the whole prefix at
every step; a cache keeps them instead. Buffers are preallocated to the maximum length and
written in place (no ``torch.cat`` per step); attention reads the valid prefix as a view.

- :class:`KVCache`: the keys and values of one attention module.
- :class:`LayerCache`: one layer's self-attention cache and (decoder) cross-attention cache.
- :class:`DecodingCache`: a whole model's: one ``LayerCache`` per layer, the key padding mask
  of every cached position, each row's count of real tokens (its next position), and the
  encoder memory for encoder-decoder models.

Every cache has ``length`` (number of cached positions) and ``reorder(index)``, which
replaces the batch dimension of every stored tensor by ``tensor.index_select(0, index)``
(beam search uses it to expand B rows to B * K beams and to follow each beam's parent).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from addnorm._checks import check_bool_mask, check_int, check_tensor, must_check

__all__ = ["DecodingCache", "KVCache", "LayerCache"]


def _check_index(index: object) -> torch.Tensor:
    index = check_tensor("index", index, ndim=1)
    if index.dtype != torch.long:
        raise TypeError(f"index must be a LongTensor (torch.long), got dtype {index.dtype}")
    return index


class KVCache:
    """Keys and values of one attention module, preallocated to ``max_len`` positions.

    Args:
        batch_size, n_heads, max_len, d_head: the buffer shape (B, H, max_len, Dh).
        dtype, device: of the buffers (those of the keys written into them).
    """

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        max_len: int,
        d_head: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (
            check_int("batch_size", batch_size, min_value=1),
            check_int("n_heads", n_heads, min_value=1),
            check_int("max_len", max_len, min_value=1),
            check_int("d_head", d_head, min_value=1),
        )
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, Dh)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, Dh)
        self.length = 0

    @property
    def max_len(self) -> int:
        """Number of positions the buffers hold."""
        return self.keys.shape[2]

    def append(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write L new positions in place after the cached ones; return all valid positions.

        Shapes:
            keys, values: (B, H, L, Dh)
            returns: keys, values (B, H, length + L, Dh), views of the buffers
        """
        want = (*self.keys.shape[:2], keys.shape[2], self.keys.shape[3])
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor) or t.ndim != 4 or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must have shape (B, H, L, Dh) = {want}, got {got}")
        end = self.length + keys.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache overflow: length ({self.length}) + new positions ({keys.shape[2]}) "
                f"exceeds max_len ({self.max_len})"
            )
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.length = end
        return self.view()

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid prefix of the buffers.

        Shapes:
            returns: keys, values (B, H, length, Dh)
        """
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def reorder(self, index: torch.Tensor) -> None:
        """Replace the batch dimension by ``index_select(0, index)`` (B -> B')."""
        index = _check_index(index)
        self.keys = self.keys.index_select(0, index)
        self.values = self.values.index_select(0, index)


@dataclass
class LayerCache:
    """The caches of one layer: self-attention, and cross-attention for a decoder layer."""

    self_attn: KVCache
    cross_attn: KVCache | None = None

    def reorder(self, index: torch.Tensor) -> None:
        """Reorder both caches' batch dimension (see :meth:`KVCache.reorder`)."""
        self.self_attn.reorder(index)
        if self.cross_attn is not None:
            self.cross_attn.reorder(index)


class DecodingCache:
    """A model's decoding state: per-layer caches, key padding and each row's next position.

    Build it with :meth:`allocate`. Each model step first calls :meth:`extend` with the
    padding of its new tokens (which records it and returns the key padding mask and the new
    tokens' positions), then runs its layers, whose caches advance by the same count.

    Attributes:
        layers: one :class:`LayerCache` per layer.
        padding_mask: (B, max_len) bool buffer, True = padding; valid up to ``length``.
        n_tokens: (B,) long, real (non-padding) tokens seen per row, i.e. the next position.
        memory: (B, S, D) encoder output for an encoder-decoder model, else None.
        memory_padding_mask: (B, S) bool, True = padding source token, or None.
    """

    def __init__(
        self,
        layers: list[LayerCache],
        padding_mask: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
    ) -> None:
        self.layers = layers
        self.padding_mask = check_bool_mask("padding_mask", padding_mask)  # (B, max_len)
        self.n_tokens = torch.zeros(
            padding_mask.shape[0], dtype=torch.long, device=padding_mask.device
        )  # (B,)
        self.memory = memory
        self.memory_padding_mask = memory_padding_mask
        self.length = 0

    @classmethod
    def allocate(
        cls,
        *,
        n_layers: int,
        batch_size: int,
        n_heads: int,
        d_head: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
    ) -> DecodingCache:
        """Empty caches for ``max_len`` positions; cross-attention ones when ``memory`` given.

        Shapes:
            memory: (B, S, D); memory_padding_mask: (B, S)
        """

        def kv(length: int) -> KVCache:
            return KVCache(batch_size, n_heads, length, d_head, dtype=dtype, device=device)

        layers = [
            LayerCache(kv(max_len), None if memory is None else kv(memory.shape[1]))
            for _ in range(check_int("n_layers", n_layers, min_value=1))
        ]
        padding = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        return cls(layers, padding, memory=memory, memory_padding_mask=memory_padding_mask)

    @property
    def max_len(self) -> int:
        """Number of positions the caches hold."""
        return self.padding_mask.shape[1]

    def extend(self, padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the padding of L new tokens; return the key padding and their positions.

        A row's positions count its real tokens only (``cumsum(~padding) - 1`` continued from
        the cached ones, padding clamped to 0), so a left-padded row gets the positions it would
        have alone.

        Shapes:
            padding_mask: (B, L) bool, True = padding
            returns: key padding (B, length + L), positions (B, L) long
        """
        batch = self.padding_mask.shape[0]
        if must_check():  # skipped when a model extends its own cache with its own padding
            check_bool_mask("padding_mask (True = padding)", padding_mask)
            if padding_mask.ndim != 2 or padding_mask.shape[0] != batch:
                raise ValueError(
                    f"padding_mask must have shape (B, L) with B = {batch}, "
                    f"got {tuple(padding_mask.shape)}"
                )
        end = self.length + padding_mask.shape[1]
        if end > self.max_len:
            raise ValueError(
                f"cache overflow: length ({self.length}) + new tokens ({padding_mask.shape[1]}) "
                f"exceeds max_len ({self.max_len}); pass a larger max_new_tokens to start()"
            )
        self.padding_mask[:, self.length : end] = padding_mask
        real = (~padding_mask).long()  # (B, L)
        positions = (self.n_tokens[:, None] + real.cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
        self.n_tokens = self.n_tokens + real.sum(dim=1)
        self.length = end
        return self.padding_mask[:, :end], positions

    def reorder(self, index: torch.Tensor) -> None:
        """Replace the batch dimension of every stored tensor by ``index_select(0, index)``."""
        index = _check_index(index)
        for layer in self.layers:
            layer.reorder(index)
        self.padding_mask = self.padding_mask.index_select(0, index)
        self.n_tokens = self.n_tokens.index_select(0, index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
        if self.memory_padding_mask is not None:
            self.memory_padding_mask = self.memory_padding_mask.index_select(0, index)
