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

Static layout (``static=True``), for compiled decoding: every step sees the same shapes, so
one compiled graph serves every step. Attention always reads all ``max_len`` slots; each
write shifts the slots left by L and puts the L new positions last, and the slots not yet
written count as padding, at the front. To the layers this is a left-padded batch with the
new tokens last, the case the eager layout already decodes exactly, so the two layouts give
the same results; the static one pays a copy of the cache per step and attends over empty
slots, and holds no Python count that changes per step (its written count is a tensor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from addnorm._checks import (
    assert_in_graph,
    check_bool,
    check_bool_mask,
    check_int,
    check_tensor,
    must_check,
)

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
        static: the static layout (see the module docstring): ``length`` is ``max_len``
            from the start, and :meth:`append` shifts the slots and writes the new positions
            last; a window of the newest ``max_len`` positions, whose key padding the owner
            (a :class:`DecodingCache`) keeps.
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
        static: bool = False,
    ) -> None:
        shape = (
            check_int("batch_size", batch_size, min_value=1),
            check_int("n_heads", n_heads, min_value=1),
            check_int("max_len", max_len, min_value=1),
            check_int("d_head", d_head, min_value=1),
        )
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, Dh)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, Dh)
        self.static = check_bool("static", static)
        self.length = self.max_len if static else 0

    @property
    def max_len(self) -> int:
        """Number of positions the buffers hold."""
        return self.keys.shape[2]

    def cached_before(self, new: int) -> int:
        """How many key positions attention sees before ``new`` appended ones: ``length``, or
        every other slot of a static cache."""
        return self.max_len - new if self.static else self.length

    def append(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write L new positions in place after the cached ones; return all valid positions.

        A static cache instead shifts its slots left by L and writes the new ones last.

        Shapes:
            keys, values: (B, H, L, Dh)
            returns: keys, values (B, H, length + L, Dh), views of the buffers; (B, H,
            max_len, Dh) for a static cache
        """
        if must_check():  # skipped inside a model, whose attention made keys and values
            self._check_new(keys, values)
        if self.static:
            return self._shift_in(keys, values)
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

    def _check_new(self, keys: object, values: object) -> None:
        """keys and values (B, H, L, Dh), with the buffers' B, H and Dh and one L."""
        length = keys.shape[2] if isinstance(keys, torch.Tensor) and keys.ndim == 4 else "L"
        want = (*self.keys.shape[:2], length, self.keys.shape[3])
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor) or t.ndim != 4 or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must have shape (B, H, L, Dh) = {want}, got {got}")

    def _shift_in(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        new = keys.shape[2]
        if new > self.max_len:
            raise ValueError(
                f"KV cache overflow: {new} new positions exceed max_len ({self.max_len})"
            )
        self.keys = torch.cat([self.keys[:, :, new:], keys], dim=2)  # (B, H, max_len, Dh)
        self.values = torch.cat([self.values[:, :, new:], values], dim=2)  # (B, H, max_len, Dh)
        return self.keys, self.values

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
    ``static=True`` gives the static layout of the module docstring to every self-attention
    cache (cross-attention caches are written once, at the start, and never change shape).

    Attributes:
        layers: one :class:`LayerCache` per layer.
        padding_mask: (B, max_len) bool buffer, True = padding; valid up to ``length`` (all
            of it for a static cache, whose slots not yet written are True).
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
        static: bool = False,
    ) -> None:
        self.layers = layers
        self.padding_mask = check_bool_mask("padding_mask", padding_mask)  # (B, max_len)
        device = padding_mask.device
        self.n_tokens = torch.zeros(padding_mask.shape[0], dtype=torch.long, device=device)
        self.memory = memory
        self.memory_padding_mask = memory_padding_mask
        self.static = check_bool("static", static)
        if static and not all(layer.self_attn.static for layer in layers):
            raise ValueError("a static DecodingCache needs static self-attention caches")
        self._length = 0
        self._padded = False  # whether any recorded token was padding (eager: None key padding)
        self._written = torch.zeros((), dtype=torch.long, device=device)  # static: the count

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
        static: bool = False,
    ) -> DecodingCache:
        """Empty caches for ``max_len`` positions; cross-attention ones when ``memory`` given.

        ``static``: the static layout (module docstring), for compiled decoding.

        Shapes:
            memory: (B, S, D); memory_padding_mask: (B, S)
        """
        static = check_bool("static", static)

        def kv(length: int, static: bool) -> KVCache:
            return KVCache(
                batch_size, n_heads, length, d_head, dtype=dtype, device=device, static=static
            )

        layers = [
            LayerCache(kv(max_len, static), None if memory is None else kv(memory.shape[1], False))
            for _ in range(check_int("n_layers", n_layers, min_value=1))
        ]
        padding = torch.full((batch_size, max_len), static, dtype=torch.bool, device=device)
        return cls(
            layers, padding, memory=memory, memory_padding_mask=memory_padding_mask,
            static=static,
        )

    @property
    def max_len(self) -> int:
        """Number of positions the caches hold."""
        return self.padding_mask.shape[1]

    @property
    def length(self) -> int:
        """Positions written so far (for a static cache, read from its count: a host sync)."""
        return int(self._written) if self.static else self._length

    def extend(
        self, padding_mask: torch.Tensor | None, new: int | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Record the padding of L new tokens; return the key padding and their positions.

        A row's positions count its real tokens only (``cumsum(~padding) - 1`` continued from
        the cached ones, padding clamped to 0), so a left-padded row gets the positions it would
        have alone. ``padding_mask=None`` says no new token is padding (then give their count
        ``new``); an eager cache that has never held padding then returns no key padding
        (None), so attention needs no mask at all.

        Shapes:
            padding_mask: (B, L) bool, True = padding, or None
            returns: key padding (B, length + L), (B, max_len) for a static cache, or None;
            positions (B, L) long
        """
        batch = self.padding_mask.shape[0]
        if padding_mask is not None and must_check():  # skipped for a model's own padding
            check_bool_mask("padding_mask (True = padding)", padding_mask)
            if padding_mask.ndim != 2 or padding_mask.shape[0] != batch:
                raise ValueError(
                    f"padding_mask must have shape (B, L) with B = {batch}, "
                    f"got {tuple(padding_mask.shape)}"
                )
        if padding_mask is None:
            new = check_int("new", new, min_value=1)
        else:
            new = padding_mask.shape[1]
            self._padded = True
        if self.static:
            self._count_static(new)
            if padding_mask is None:
                padding_mask = self.padding_mask.new_zeros(batch, new)  # (B, L)
            self.padding_mask = torch.cat([self.padding_mask[:, new:], padding_mask], dim=1)
        else:
            end = self._length + new
            if end > self.max_len:
                raise ValueError(_overflow(self._length, new, self.max_len))
            if padding_mask is not None:  # slots not written stay False (no padding)
                self.padding_mask[:, self._length : end] = padding_mask
            self._length = end
        positions = self._positions(padding_mask, new)  # (B, L)
        if self.static:
            return self.padding_mask, positions
        return (self.padding_mask[:, : self._length] if self._padded else None), positions

    def _positions(self, padding_mask: torch.Tensor | None, new: int) -> torch.Tensor:
        """The new tokens' positions, advancing each row's count of real tokens."""
        if padding_mask is None:
            steps = torch.arange(new, device=self.n_tokens.device)  # (L,)
            positions = self.n_tokens[:, None] + steps  # (B, L)
            self.n_tokens = self.n_tokens + new
            return positions
        real = (~padding_mask).long()  # (B, L)
        positions = (self.n_tokens[:, None] + real.cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
        self.n_tokens = self.n_tokens + real.sum(dim=1)
        return positions

    def _count_static(self, new: int) -> None:
        """Advance a static cache's written count, refusing to push written slots out."""
        written = self._written + new
        if torch.compiler.is_compiling():
            message = f"cache overflow: more tokens than max_len ({self.max_len})"
            assert_in_graph(written <= self.max_len, message)
        elif int(written) > self.max_len:  # a host sync: eager use of a static cache only
            raise ValueError(_overflow(int(self._written), new, self.max_len))
        self._written = written

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


def _overflow(length: int, new: int, max_len: int) -> str:
    return (
        f"cache overflow: length ({length}) + new tokens ({new}) exceeds max_len ({max_len}); "
        "pass a larger max_new_tokens to start()"
    )
