"""Unpadding: a stack's position-wise work done on the real tokens only.

A padded batch (B, L, D) whose ``padding_mask`` marks N real tokens is *packed* into one row
(1, N, D): the real tokens in batch order, padding left out. Everything in an encoder layer
but attention treats each token on its own (projections, FFN, residual sums, LayerNorm and
RMSNorm; BatchNorm's statistics span the real tokens anyway), so it gives the same values on
the packed row and does (B L - N) / (B L) less work. Attention alone needs the padded layout:
it unpacks its projected queries, keys and values, runs the kernel with the padding mask, and
packs the heads' output back before ``out_proj``.

    packed = pack(x)           (B, L, D) -> (1, N, D)
    x      = unpack(packed)    (1, N, D) -> (B, L, D), zeros at padding

In the date translator's batches (dates padded to the longest of 64) about half of the
source tokens are padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    """

    index: torch.Tensor
    batch: int
    length: int

    @classmethod
    def from_padding(cls, padding_mask: torch.Tensor) -> Packing:
        """The packing of a batch whose padding is ``padding_mask`` (True = padding).

        Reads the count of real tokens back (``nonzero``): a host sync on an accelerator, and
        a shape that depends on the data, so a stack packs only in eager mode.

        Shapes: padding_mask: (B, L) bool.
        """
        batch, length = padding_mask.shape
        index = (~padding_mask).flatten().nonzero().squeeze(1)  # (N,)
        return cls(index, batch, length)

    @property
    def has_padding(self) -> bool:
        """Whether any token is padding (with none, packing would only copy)."""
        return self.index.numel() < self.batch * self.length

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
