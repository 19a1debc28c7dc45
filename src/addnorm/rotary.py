"""Rotary position embedding (RoPE, Su et al. 2021), applied to queries and keys.

Shapes legend: B batch, H heads, L sequence length, Dh head dim.

Layout: *half-split* ("rotate_half", as in GPT-NeoX, HF LLaMA and x-transformers). Feature
``j < Dh/2`` is paired with feature ``j + Dh/2``; the pair ``(x_j, x_{j+Dh/2})``, read as the
complex number ``x_j + i x_{j+Dh/2}``, is multiplied by ``exp(i * pos * theta_j)`` with
``theta_j = base^(-2j/Dh)``. In real arithmetic::

    rope(x, pos) = x * cos(pos theta) + rotate_half(x) * sin(pos theta)
    rotate_half([x1 | x2]) = [-x2 | x1]

where ``cos``/``sin`` repeat the Dh/2 angles twice along the last dim. Because each pair is
rotated, ``<rope(q, p), rope(k, p + m)>`` depends on the offset ``m`` only, and norms are kept.
(The original RoFormer / Meta LLaMA checkpoints pair *adjacent* features instead; weights
trained with one layout need their q/k projections permuted to use the other.)

Angles are computed in float64 (float32 on ``mps``, which has no float64; see
:func:`addnorm.encodings.angle_dtype`). :class:`RotaryEmbedding` precomputes the ``cos``/``sin``
tables of positions ``0 .. max_len-1`` when it is built and never writes its state in forward:
positions outside the tables are computed per call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.encodings import angle_dtype, check_table_size
from addnorm.utils.checks import check_float, check_int, check_positions, check_tensor

__all__ = ["RotaryEmbedding", "rotate_half"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1 | x2] -> [-x2 | x1]`` on the last dim: multiplication by ``i`` for each pair.

    Shapes:
        x: (..., Dh), Dh even
        returns: (..., Dh)
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotate each (query or key) head vector by its position (half-split RoPE).

    ``cos``/``sin`` tables for positions ``0 .. max_len-1`` are computed once, when the module
    is built, into non-persistent buffers ``cos_cached`` / ``sin_cached`` (absent from
    ``state_dict``); forward slices them for ``offset .. offset + L - 1`` and never writes the
    module's state. Any other position (past the tables, and explicit ``positions``, which
    would have to be read back to know whether the tables hold them) is computed for that
    call with the same formula, on x's device, so the result does not depend on ``max_len``.
    :meth:`reserve` enlarges the tables ahead of
    time. Moving or casting the module (``.to()``, ``.double()``, ``.cuda()``, ``to_empty()``)
    recomputes the tables from the formula in the new dtype and device (``meta`` tables stay
    ``meta``). The rotation is done in the wider of x's dtype and the tables' dtype and the
    result is cast back to x's dtype.
    """

    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(self, d_head: int, *, base: float = 10000.0, max_len: int = 2048) -> None:
        super().__init__()
        self.d_head = check_int("d_head", d_head, min_value=2)
        if self.d_head % 2:
            raise ValueError(
                f"d_head ({self.d_head}) must be even for rotary embeddings: features are "
                "rotated in pairs (j, j + d_head/2)"
            )
        self.base = check_float("base", base, min_value=1.0, min_inclusive=False)
        max_len = check_int("max_len", max_len, min_value=1)
        check_table_size("max_len", max_len, self.d_head, torch.get_default_device())
        cos, sin = self._tables(torch.arange(max_len), torch.float32)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    @property
    def max_len(self) -> int:
        """Positions held by the precomputed tables (``0 .. max_len-1``)."""
        return self.cos_cached.shape[0]

    def _tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``/``sin`` of ``pos * theta``, repeated for both halves; angles in angle_dtype."""
        wide = angle_dtype(positions.device)
        two_j = torch.arange(0, self.d_head, 2, dtype=wide, device=positions.device)
        theta = self.base ** (-two_j / self.d_head)  # (Dh/2,)
        angles = positions.to(wide)[..., None] * theta  # (..., Dh/2)
        angles = torch.cat([angles, angles], dim=-1)  # (..., Dh)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def reserve(self, length: int) -> None:
        """Enlarge the tables to at least ``length`` positions (``max_len`` grows with them).

        The explicit way to hold more positions; forward never does it.
        """
        length = check_int("length", length, min_value=0)
        if length > self.cos_cached.shape[0]:
            check_table_size("length", length, self.d_head, self.cos_cached.device)
            positions = torch.arange(length, device=self.cos_cached.device)
            self.cos_cached, self.sin_cached = self._tables(positions, self.cos_cached.dtype)

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> RotaryEmbedding:
        """After ``.to()`` / ``.double()`` / ``to_empty()``..., recompute the moved tables.

        Values rounded to the old dtype and then converted would be less exact than the formula
        in the new dtype, and ``to_empty`` leaves no values at all. ``meta`` tables stay so.
        """
        before = self.cos_cached, self.sin_cached
        super()._apply(fn, recurse)
        cos = self.cos_cached
        moved = cos is not before[0] or self.sin_cached is not before[1]
        if moved and cos.is_floating_point() and not cos.is_meta:
            positions = torch.arange(cos.shape[0], device=cos.device)
            self.cos_cached, self.sin_cached = self._tables(positions, cos.dtype)
        return self

    def _cos_sin(
        self, length: int, offset: int, positions: torch.Tensor | None, below: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables broadcastable against (B, H, L, Dh): rows of the tables, or computed.

        Writes no state.
        """
        if positions is None:
            end = offset + length
            if end <= self.cos_cached.shape[0]:
                return self.cos_cached[offset:end], self.sin_cached[offset:end]  # (L, Dh)
            past_the_end = torch.arange(offset, end, device=self.cos_cached.device)  # (L,)
            return self._tables(past_the_end, self.cos_cached.dtype)  # (L, Dh)
        held = below is not None and below <= self.cos_cached.shape[0]
        if held and not positions.is_floating_point():  # in range, as the caller knows
            cos = F.embedding(positions, self.cos_cached)  # (L, Dh) or (B, L, Dh)
            sin = F.embedding(positions, self.sin_cached)
        else:  # computed: choosing rows of the tables would read the positions back
            cos, sin = self._tables(positions, self.cos_cached.dtype)  # (L, Dh) or (B, L, Dh)
        if positions.ndim == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, Dh)
        return cos, sin

    def forward(
        self,
        x: torch.Tensor,
        *,
        offset: int = 0,
        positions: torch.Tensor | None = None,
        positions_below: int | None = None,
    ) -> torch.Tensor:
        """Rotate queries or keys by their positions.

        Args:
            x: per-head queries or keys.
            offset: position of the first token (keys already in a decoding cache).
            positions: explicit positions, shared (L,) or per row (B, L), e.g. for left-padded
                batched decoding; when given, ``offset`` is ignored. They are moved to x's
                device if they live elsewhere.
            positions_below: a bound the caller knows without reading the positions (every
                one lies in ``[0, positions_below)``), like ``output_size`` in torch: integer
                positions within the tables are then read from them instead of computed.
                A wrong bound makes the lookup raise (CPU) or assert (CUDA).

        Shapes:
            x: (B, H, L, Dh)
            positions: (L,) or (B, L)
            returns: (B, H, L, Dh), same dtype as x
        """
        x = check_tensor("x", x, ndim=4, floating=True)
        if x.shape[-1] != self.d_head:
            got = tuple(x.shape)
            raise ValueError(f"x last dim must be d_head ({self.d_head}), got shape {got}")
        offset = check_int("offset", offset, min_value=0)
        batch, _, length, _ = x.shape
        if positions is not None:
            positions = check_positions(positions, batch, length).to(x.device)
        if positions_below is not None:
            check_int("positions_below", positions_below, min_value=0)
        cos, sin = self._cos_sin(length, offset, positions, positions_below)
        wide = torch.promote_types(x.dtype, cos.dtype)
        x_wide = x.to(wide)
        # rotate_half(x) * sin == roll(x, Dh/2) * [-sin | sin], exactly: the sign moves to the
        # small table, so x itself takes one op (roll) instead of three (chunk, neg, cat).
        half = self.d_head // 2
        signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).to(wide)
        rotated = x_wide * cos.to(wide) + x_wide.roll(half, dims=-1) * signed_sin
        return rotated.to(x.dtype)

