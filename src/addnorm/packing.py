"""Unpadding: a stack's position-wise work done on the real tokens only.

A padded batch (B, L, D) whose ``padding_mask`` marks N real tokens is *packed* into one row
(1, N, D): the real tokens in batch order, padding left out. Everything in an encoder layer
but attention treats each token on its own (projections, FFN, residual sums, LayerNorm and
RMSNorm; BatchNorm's statistics span the real tokens anyway), so it gives the same values on
the packed row and does (B L - N) / (B L) less work. Attention works on the packed row too:
each row's tokens are contiguous in it (row b holds ``cu_lengths[b] .. cu_lengths[b + 1] - 1``),
so a variable-length kernel attends within each row (see :mod:`addnorm.varlen_attention`).
Only an attention whose mask says more than the padding (an ``attend_mask``) unpacks its
projections for the padded kernel.

    packed = pack(x)           (B, L, D) -> (1, N, D)
    x      = unpack(packed)    (1, N, D) -> (B, L, D), zeros at padding

In the date translator's batches (dates padded to the longest of 64) about half of the
source tokens are padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from addnorm.utils.checks import check_bool

__all__ = ["Packing", "check_unpad"]


def check_unpad(unpad: object, norm: str) -> bool:
    """``unpad`` as a bool, refused with ``norm="group"``: GroupNorm's statistics span each
    sequence's positions, which packing merges into one row."""
    if check_bool("unpad", unpad) and norm == "group":
        raise ValueError(
            "unpad=True cannot be used with norm='group': GroupNorm's statistics span each "
            "sequence's positions, which packing merges into one row"
        )
    return bool(unpad)


@dataclass(frozen=True, eq=False)
class Packing:
    """Where the real tokens of a padded batch sit in its packed row.

    Attributes:
        index: (N,) int64, the flat positions ``b * L + i`` of the real tokens, ascending.
        batch, length: B and L of the padded batch.
        lengths: (B,) int64, the real tokens of each row (0 for a row of padding only).
        padding: (B, L) bool, the padding mask it was made from (True = padding).
    """

    index: torch.Tensor
    batch: int
    length: int
    lengths: torch.Tensor
    padding: torch.Tensor

    @classmethod
    def from_padding(cls, padding_mask: torch.Tensor) -> Packing:
        """The packing of a batch whose padding is ``padding_mask`` (True = padding).

        Reads the count of real tokens back (``nonzero``): a host sync on an accelerator, and
        a shape that depends on the data, so a stack packs only in eager mode.

        Shapes: padding_mask: (B, L) bool.
        """
        batch, length = padding_mask.shape
        real = ~padding_mask  # (B, L)
        index = real.flatten().nonzero().squeeze(1)  # (N,)
        return cls(index, batch, length, real.sum(dim=1), padding_mask)

    @property
    def has_padding(self) -> bool:
        """Whether any token is padding (with none, packing would only copy)."""
        return self.index.numel() < self.batch * self.length

    @cached_property
    def cu_lengths(self) -> torch.Tensor:
        """Where each row starts in the packed row, and N at the end: ``[0, l_0, l_0 + l_1,
        ...]``, int32 on the tokens' device (a variable-length kernel's ``cu_seqlens``).

        Shapes: (B + 1,)
        """
        return F.pad(self.lengths.cumsum(0), (1, 0)).to(torch.int32)

    @cached_property
    def attend_keys(self) -> torch.Tensor:
        """The keys each padded row may attend (True = may attend): its real tokens, or every
        key for a row with none (its outputs are never packed, and so never read).

        Shapes: (B, 1, 1, L) bool
        """
        empty = (self.lengths == 0)[:, None]  # (B, 1)
        return (~self.padding | empty)[:, None, None, :]

    @cached_property
    def row_lengths(self) -> tuple[int, ...]:
        """``lengths`` read back once (a host sync on an accelerator) and kept."""
        return tuple(self.lengths.tolist())

    @cached_property
    def rows_by_length(self) -> tuple[torch.Tensor | None, tuple[tuple[int, int], ...]]:
        """The packed tokens reordered so that rows of one length sit together, shortest first.

        Returns ``(order, groups)``: ``packed.index_select(1, order)`` holds ``groups[0][1]``
        rows of ``groups[0][0]`` tokens each, then the next group's; ``order`` is None when
        the packed row is in that order already. Rows of padding only hold no token and are
        in no group. Each group is a dense (rows, length) block: attention over it needs no
        mask and sees no padding.

        Shapes: order: (N,) int64
        """
        lengths = self.row_lengths
        counts: dict[int, int] = {}
        for n in sorted(n for n in lengths if n):
            counts[n] = counts.get(n, 0) + 1
        groups = tuple(counts.items())
        real = [n for n in lengths if n]
        if real == sorted(real):
            return None, groups
        row = self.index // self.length  # (N,) each token's row
        key = self.lengths.index_select(0, row) * self.batch + row  # by length, then row
        return torch.sort(key, stable=True).indices, groups  # a row's tokens stay in order

    def positions(self, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The positions of the packed tokens: ``positions`` (shared or per row) packed, or by
        default each token's index in its padded row.

        Shapes: positions: (L,) or (B, L) -> (1, N)
        """
        if positions is None:
            return (self.index % self.length)[None]  # (1, N)
        grid = positions.to(self.index.device).expand(self.batch, self.length)  # (B, L)
        return grid.reshape(-1).index_select(0, self.index)[None]  # (1, N)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """The real tokens of ``x`` as one row.

        Shapes: x: (B, L, *F) -> (1, N, *F)
        """
        return x.flatten(0, 1).index_select(0, self.index)[None]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """The padded batch of a packed row, zeros at padding.

        Shapes: packed: (1, N, *F) -> (B, L, *F)
        """
        rows = packed[0]  # (N, *F)
        features = rows.shape[1:]
        padded = rows.new_zeros(self.batch * self.length, *features)
        padded.index_copy_(0, self.index, rows)  # a fresh tensor: in place saves a copy
        return padded.view(self.batch, self.length, *features)
