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
  encoder memory for encoder-decoder models, with its cross-attention mask, built once; on
  request (``keep_ids``) the token ids of the cached positions, which a decoder-only model
  that slides its window recomputes from (:meth:`DecodingCache.last_positions`,
  :meth:`DecodingCache.restart_from`).

The checks of a cache's size and of a step's arguments live in :mod:`addnorm.cache_checks`.

Every cache has ``length`` (number of cached positions) and ``reorder(index)``, which
replaces the batch dimension of every stored tensor by ``tensor.index_select(0, index)``
(beam search uses it to expand B rows to B * K beams and to follow each beam's parent).

Static layout (``static=True``), for compiled decoding: every step sees the same shapes, so
one compiled graph serves every step. Slots fill from the front in order (the i-th position
ever written goes to slot i); each cache keeps its written count as a 0-d long tensor, and
the slots not yet written are padding (``DecodingCache.padding_mask`` True there).

- Eager, a static cache behaves exactly like the dynamic one: it reads its count back (a host
  sync), refuses overflow with the same ``ValueError``, writes ``[w, w + L)`` by slice
  assignment and returns the written prefix ``[:w + L]``, so both layouts give the same
  results.
- Being compiled (``torch.compiler.is_compiling()``), it writes in place with ``index_copy_``
  at slots ``written + arange(L)`` (a tensor index: no Python count that changes per step, so
  no graph break and no recompilation), and returns all ``max_len`` slots, whose padding
  hides the ones not yet written; ``cached_before(new)`` is then ``max_len - new``, so the
  bottom-right causal rule lets the new query see every slot. That is exact for one new
  token per row only (with L > 1 a new token would see the later ones of its block), so a
  compiled static write of L > 1 positions raises a ``ValueError`` while tracing (which a
  ``fullgraph`` compile reports as dynamo's ``Unsupported`` error, carrying its message),
  and overflow becomes an in-graph assert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from addnorm.attention_mask import AttentionMask, build_attention_mask
from addnorm.utils.checks import (
    assert_in_graph,
    check_bool,
    check_bool_mask,
    check_int,
    check_tensor,
)

__all__ = [
    "DecodingCache",
    "KVCache",
    "LayerCache",
    "memory_attention_mask",
]


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
        static: the static layout (see the module docstring): the written count is a 0-d
            tensor, and while compiled :meth:`append` writes at a tensor index and returns
            all ``max_len`` slots, whose key padding the owner (a :class:`DecodingCache`)
            keeps. Eager, it behaves as the dynamic cache.
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
        self._count = _Count(self.static, self.keys.device)

    @property
    def max_len(self) -> int:
        """Number of positions the buffers hold."""
        return self.keys.shape[2]

    @property
    def length(self) -> int:
        """Positions written so far (for a static cache, read from its count: a host sync)."""
        return self._count.value

    def cached_before(self, new: int) -> int:
        """How many key positions attention sees before ``new`` appended ones: ``length``, or
        every other slot of a static cache being compiled (``max_len - new``)."""
        if _in_graph(self.static):
            return self.max_len - new
        return self.length

    def append(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write L new positions in place after the cached ones; return all valid positions.

        A static cache being compiled writes them at its count's slots (L = 1 only) and
        returns every slot (see the module docstring).

        Shapes:
            keys, values: (B, H, L, Dh)
            returns: keys, values (B, H, length + L, Dh), views of the buffers; (B, H,
            max_len, Dh), the buffers, for a static cache being compiled
        """
        self._check_new(keys, values)
        if _in_graph(self.static):
            return self._write_in_graph(keys, values)
        start = self.length
        end = start + keys.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache overflow: length ({start}) + new positions ({keys.shape[2]}) "
                f"exceeds max_len ({self.max_len})"
            )
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        self._count.advance(keys.shape[2])
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _check_new(self, keys: object, values: object) -> None:
        """keys and values (B, H, L, Dh), with the buffers' B, H and Dh and one L."""
        length = keys.shape[2] if isinstance(keys, torch.Tensor) and keys.ndim == 4 else "L"
        want = (*self.keys.shape[:2], length, self.keys.shape[3])
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor) or t.ndim != 4 or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must have shape (B, H, L, Dh) = {want}, got {got}")

    def _write_in_graph(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A compiled static append: one position written in place at slot ``written``."""
        slots = self._count.claim_slots(keys.shape[2], self.max_len)  # (L,)
        self.keys.index_copy_(2, slots, keys)  # (B, H, max_len, Dh)
        self.values.index_copy_(2, slots, values)  # (B, H, max_len, Dh)
        return self.keys, self.values

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid prefix of the buffers (all of them for a static cache being compiled).

        Shapes:
            returns: keys, values (B, H, length, Dh)
        """
        if _in_graph(self.static):
            return self.keys, self.values
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def reorder(self, index: torch.Tensor) -> None:
        """Replace the batch dimension by ``index_select(0, index)`` (B -> B'); a static
        cache's count is shared by all rows and stays."""
        index = _check_index(index)
        self.keys = _rows(self.keys, index, in_place=self.static)
        self.values = _rows(self.values, index, in_place=self.static)


def _rows(t: torch.Tensor, index: torch.Tensor, *, in_place: bool) -> torch.Tensor:
    """``t.index_select(0, index)``; written back into ``t`` when ``in_place`` and the row
    count is unchanged, so a static cache's buffers keep their addresses (a compiled step's
    CUDA graphs replay against them) while beam search reorders its beams."""
    rows = t.index_select(0, index)
    if in_place and rows.shape == t.shape:
        return t.copy_(rows)
    return rows


def _in_graph(static: bool) -> bool:
    """Whether a cache of this layout is being compiled into a graph: a static one then writes
    at its count's slots and shows every slot (the module docstring)."""
    return static and torch.compiler.is_compiling()


class _Count:
    """Positions a cache has written: a Python int in the dynamic layout, a 0-d long tensor in
    the static one (a compiled graph holds no Python value that changes per step)."""

    def __init__(self, static: bool, device: torch.device | str | None) -> None:
        self.static = static
        self._int = 0
        self.tensor = torch.zeros((), dtype=torch.long, device=device)  # (), static's

    @property
    def value(self) -> int:
        """The count (a static one read back: a host sync)."""
        return int(self.tensor) if self.static else self._int

    def advance(self, new: int) -> None:
        if self.static:  # in place: a compiled step's state keeps its address (CUDA graphs)
            self.tensor.add_(new)
        else:
            self._int += new

    def set(self, value: int) -> None:
        """Set the count (in place for a static one: no read, the same address)."""
        if self.static:
            self.tensor.fill_(value)
        else:
            self._int = value

    def claim_slots(self, new: int, max_len: int) -> torch.Tensor:
        """The slots of a compiled static write, ``count + arange(new)``, and the count
        advanced past them, after refusing L > 1 (while tracing, L is static) and asserting
        in graph that they fit.

        Shapes:
            returns: (L,) long
        """
        if new != 1:
            raise ValueError(
                "a compiled step over a static cache takes one new token per row (L = 1), "
                f"got L = {new}"
            )
        assert_in_graph(self.tensor + new <= max_len,
                        f"cache overflow: more tokens than max_len ({max_len})")
        slots = self.tensor + torch.arange(new, device=self.tensor.device)  # (L,)
        self.advance(new)
        return slots


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
        padding_mask: (B, max_len) bool buffer, True = padding; valid up to ``length`` (a
            static cache's slots not yet written are True).
        n_tokens: (B,) long, real (non-padding) tokens seen per row, i.e. the next position;
            kept once the cache holds padding (or is static); before, every row has
            ``length``.
        memory: (B, S, D) encoder output for an encoder-decoder model, else None.
        memory_padding_mask: (B, S) bool, True = padding source token, or None.
        memory_mask: the cross-attention mask of every step (:func:`memory_attention_mask`
            of ``memory_padding_mask``), built here once: the source cannot change while
            decoding. None without ``memory``.
        ids: (B, max_len) long, the token ids of the cached positions (valid up to
            ``length``; :meth:`extend` records them), or None when the cache keeps none.
        prompt_padding_mask: (B, L0) bool, the whole prompt's padding as a decoder-only
            model's ``start`` read it (its window may hold the prompt's end only), or None;
            read once, before any :meth:`reorder` (which leaves it as it is).
    """

    def __init__(
        self,
        layers: list[LayerCache],
        padding_mask: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        static: bool = False,
        ids: torch.Tensor | None = None,
    ) -> None:
        self.layers = layers
        self.padding_mask = check_bool_mask("padding_mask", padding_mask)  # (B, max_len)
        device = padding_mask.device
        self.n_tokens = torch.zeros(padding_mask.shape[0], dtype=torch.long, device=device)
        self.memory = memory
        self.memory_padding_mask = memory_padding_mask
        self.memory_mask = None if memory is None else memory_attention_mask(
            memory, memory_padding_mask
        )
        self.static = check_bool("static", static)
        if static and not all(layer.self_attn.static for layer in layers):
            raise ValueError("a static DecodingCache needs static self-attention caches")
        self._count = _Count(self.static, device)
        self._padded = False  # whether any recorded token was padding (eager: None key padding)
        if ids is not None and (ids.dtype != torch.long or ids.shape != padding_mask.shape):
            raise ValueError(
                f"ids must be a long tensor shaped like padding_mask {tuple(padding_mask.shape)}"
                f", got {ids.dtype} {tuple(ids.shape)}"
            )
        self.ids = ids  # (B, max_len) long or None
        self.prompt_padding_mask: torch.Tensor | None = None  # (B, L0), a decoder's start's

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
        keep_ids: bool = False,
    ) -> DecodingCache:
        """Empty caches for ``max_len`` positions; cross-attention ones when ``memory`` given.

        ``static``: the static layout (module docstring), for compiled decoding.
        ``keep_ids``: keep the token ids of the cached positions too (:attr:`ids`), which a
        model that slides its window recomputes from.

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
        ids = torch.zeros_like(padding, dtype=torch.long) if check_bool(
            "keep_ids", keep_ids) else None
        return cls(
            layers, padding, memory=memory, memory_padding_mask=memory_padding_mask,
            static=static, ids=ids,
        )

    @property
    def max_len(self) -> int:
        """Number of positions the caches hold."""
        return self.padding_mask.shape[1]

    @property
    def length(self) -> int:
        """Positions written so far (for a static cache, read from its count: a host sync)."""
        return self._count.value

    def extend(
        self, padding_mask: torch.Tensor | None, new: int | None = None, *,
        ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Record the padding of L new tokens (and their ``ids``, which a cache that keeps
        ids needs); return the key padding and their positions.

        A row's positions count its real tokens only (``cumsum(~padding) - 1`` continued from
        the cached ones, padding clamped to 0), so a left-padded row gets the positions it would
        have alone. ``padding_mask=None`` says no new token is padding (then give their count
        ``new``); a dynamic cache that has never held padding then returns no key padding and
        no positions (None, None): every row's new tokens sit at ``length - L + arange(L)``
        (``length`` after the call), so attention needs no mask and the position codes are
        rows of their tables, without a tensor of positions. A static cache being compiled
        records one token per row (L = 1) in place and returns its whole padding buffer.

        Shapes:
            padding_mask: (B, L) bool, True = padding, or None; ids: (B, L) long
            returns: key padding (B, length + L), (B, max_len) for a static cache being
            compiled, or None; positions (B, L) long, or None
        """
        batch = self.padding_mask.shape[0]
        if (ids is None) != (self.ids is None):
            raise ValueError("give the new tokens' ids exactly when the cache keeps ids "
                             "(allocate(keep_ids=True))")
        if padding_mask is not None:
            check_bool_mask("padding_mask (True = padding)", padding_mask)
            if padding_mask.ndim != 2 or padding_mask.shape[0] != batch:
                raise ValueError(
                    f"padding_mask must have shape (B, L) with B = {batch}, "
                    f"got {tuple(padding_mask.shape)}"
                )
        was_padded = self._padded
        if padding_mask is None:
            new = check_int("new", new, min_value=1)
        else:
            new = padding_mask.shape[1]
            self._padded = True
        if _in_graph(self.static):
            return self._extend_in_graph(padding_mask, new, ids)
        start = self.length  # a static cache's count read back: a host sync
        end = start + new
        if end > self.max_len:
            raise ValueError(
                f"cache overflow: length ({start}) + new tokens ({new}) exceeds max_len "
                f"({self.max_len}); pass a larger max_new_tokens to start()"
            )
        if self.ids is not None and ids is not None:  # both or neither (checked above)
            self.ids[:, start:end] = ids
        if padding_mask is not None:  # a dynamic cache's slots not written stay False
            self.padding_mask[:, start:end] = padding_mask
        elif self.static:  # a static cache's slots not written are True (padding)
            self.padding_mask[:, start:end] = False
        self._count.advance(new)
        if not (self.static or self._padded):  # every row's positions: start + arange(L)
            return None, None
        if not (self.static or was_padded):  # the first padding: every row has `start` tokens
            self.n_tokens = torch.full_like(self.n_tokens, start)
        positions = self._positions(padding_mask, new)  # (B, L)
        return self.padding_mask[:, :end], positions

    def _extend_in_graph(
        self, padding_mask: torch.Tensor | None, new: int, ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A compiled static extend: the new token's padding (and id) written at slot
        ``written``."""
        slots = self._count.claim_slots(new, self.max_len)  # (L,)
        if self.ids is not None and ids is not None:  # both or neither (checked by extend)
            self.ids.index_copy_(1, slots, ids)  # (B, max_len)
        new_padding = padding_mask
        if new_padding is None:  # no new token is padding
            new_padding = self.padding_mask.new_zeros(self.padding_mask.shape[0], new)  # (B, L)
        self.padding_mask.index_copy_(1, slots, new_padding)  # (B, max_len)
        return self.padding_mask, self._positions(padding_mask, new)

    def _positions(self, padding_mask: torch.Tensor | None, new: int) -> torch.Tensor:
        """The new tokens' positions, advancing each row's count of real tokens."""
        if padding_mask is None:
            steps = torch.arange(new, device=self.n_tokens.device)  # (L,)
            positions = self.n_tokens[:, None] + steps  # (B, L)
            self.n_tokens.add_(new)  # in place: the address a compiled step was recorded with
            return positions
        real = (~padding_mask).long()  # (B, L)
        positions = (self.n_tokens[:, None] + real.cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
        self.n_tokens.add_(real.sum(dim=1))
        return positions

    def last_positions(self, keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The ids and padding of a full cache's last ``keep`` positions: what a model that
        slides its window recomputes (:meth:`restart_from`). Reads nothing back: the cache must
        be full (``length == max_len``), which a dynamic one checks and a static one is trusted
        with (its count would have to be read).

        Shapes:
            returns: ids (B, keep) long; padding (B, keep) bool, or None when the cache has
            never held padding
        """
        if self.ids is None:
            raise ValueError("the cache keeps no ids (allocate(keep_ids=True)) to recompute from")
        if check_int("keep", keep, min_value=0) > self.max_len:
            raise ValueError(f"keep ({keep}) exceeds the cache's max_len ({self.max_len})")
        if not self.static and self.length != self.max_len:
            raise ValueError(f"the cache holds {self.length} of its {self.max_len} positions; "
                             "a window slides once it is full")
        start = self.max_len - keep
        padding = self.padding_mask[:, start:] if self._padded else None
        return self.ids[:, start:], padding

    def restart_from(self, fresh: DecodingCache) -> None:
        """Hold what ``fresh`` holds (a dynamic cache of the same rows, layers and widths,
        and no more positions, into which the window's positions were recomputed): copied in
        place, so a static cache's tensors keep their addresses (CUDA graphs replay against
        them), its counts set without a read."""
        n = fresh.length  # a dynamic cache's count: a Python int
        if fresh.static or len(fresh.layers) != len(self.layers) or n > self.max_len:
            raise ValueError("restart_from takes a dynamic cache of the same layers that fits")
        for mine, theirs in zip(self.layers, fresh.layers, strict=True):
            kv, new = mine.self_attn, theirs.self_attn
            kv.keys[:, :, :n] = new.keys[:, :, :n]
            kv.values[:, :, :n] = new.values[:, :, :n]
            kv._count.set(n)
        self.padding_mask[:, :n] = fresh.padding_mask[:, :n]
        self.padding_mask[:, n:] = self.static  # the slots not written, as allocate left them
        if fresh._padded:
            self.n_tokens.copy_(fresh.n_tokens)
        else:  # every row holds n real tokens
            self.n_tokens.fill_(n)
        if self.ids is not None and fresh.ids is not None:
            self.ids[:, :n] = fresh.ids[:, :n]
        self._padded = fresh._padded
        self._count.set(n)

    def step_state(self) -> list[tuple[object, str]]:
        """Where the tensors a compiled step writes in place live, as (holder, attribute)
        pairs: each self-attention cache's keys, values and count, the key padding, the rows'
        token counts and the written count. A static cache keeps each at one address from
        step to step (and :func:`~addnorm.generation.step.held_buffers` across ``generate``
        calls), which is what CUDA graphs replay against."""
        state: list[tuple[object, str]] = []
        for layer in self.layers:
            kv = layer.self_attn
            state += [(kv, "keys"), (kv, "values"), (kv._count, "tensor")]
        ids = [(self, "ids")] if self.ids is not None else []
        return [*state, (self, "padding_mask"), (self, "n_tokens"), (self._count, "tensor"), *ids]

    def reorder(self, index: torch.Tensor) -> None:
        """Replace the batch dimension of every stored tensor by ``index_select(0, index)``."""
        index = _check_index(index)
        for layer in self.layers:
            layer.reorder(index)
        self.padding_mask = _rows(self.padding_mask, index, in_place=self.static)
        self.n_tokens = _rows(self.n_tokens, index, in_place=self.static)
        if self.ids is not None:
            self.ids = _rows(self.ids, index, in_place=self.static)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
        if self.memory_padding_mask is not None:
            self.memory_padding_mask = self.memory_padding_mask.index_select(0, index)
        if self.memory_mask is not None:
            self.memory_mask = _reordered_mask(self.memory_mask, index)


def memory_attention_mask(
    memory: torch.Tensor, padding_mask: torch.Tensor | None
) -> AttentionMask:
    """The cross-attention mask of a decoder's queries over ``memory``: its padding only, so
    the same for every step's query and every head (the tensors broadcast over both).

    Shapes:
        memory: (B, S, D); padding_mask: (B, S) bool, True = padding, or None
        returns: an :class:`AttentionMask` whose tensors broadcast against (B, H, 1, S)
    """
    memory = check_tensor("memory", memory, ndim=3, floating=True)
    batch, length, _ = memory.shape
    return build_attention_mask(
        batch=batch, n_heads=1, query_len=1, key_len=length, device=memory.device,
        padding_mask=padding_mask, self_attention=False,
    )


def _reordered_mask(mask: AttentionMask, index: torch.Tensor) -> AttentionMask:
    """``mask`` with its batch dimension replaced by ``index_select(0, index)`` (a dimension
    of 1 broadcasts over the rows and stays)."""

    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or t.shape[0] == 1 else t.index_select(0, index)

    return mask._replace(allowed=rows(mask.allowed), dead=rows(mask.dead),
                         dead_rows=rows(mask.dead_rows))

