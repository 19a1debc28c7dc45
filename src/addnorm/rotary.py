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
:func:`addnorm.encodings.angle_dtype`).
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm._checks import check_float, check_int, check_positions, check_tensor
from addnorm.encodings import MAX_CACHED_POSITIONS, angle_dtype, cacheable_rows, gather_rows

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

    ``cos``/``sin`` tables for positions ``0 .. n-1`` are cached in non-persistent buffers
    (absent from ``state_dict``) that grow, to the next power of two, when a longer input
    arrives; :meth:`reserve` fills them ahead of time. The automatic growth stops at
    ``MAX_CACHED_POSITIONS`` (2**16) positions: positions past the cache (a huge ``offset``)
    are computed for each call, so the memory held stays bounded. Explicit integer
    ``positions`` (shared or per row) are gathered from the tables, which grow to
    ``max(positions) + 1`` rows under the same cap; fractional, negative or past-the-cap ones
    are computed directly, on x's device. The rotation is done in the wider of x's dtype and
    the tables' dtype and the result is cast back to x's dtype.
    """

    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(self, d_head: int, *, base: float = 10000.0) -> None:
        super().__init__()
        self.d_head = check_int("d_head", d_head, min_value=2)
        if self.d_head % 2:
            raise ValueError(
                f"d_head ({self.d_head}) must be even for rotary embeddings: features are "
                "rotated in pairs (j, j + d_head/2)"
            )
        self.base = check_float("base", base, min_value=1.0, min_inclusive=False)
        cos, sin = self._tables(torch.zeros(0), torch.float32)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

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
        """Make sure the cached tables hold at least ``length`` positions (a pure cache fill).

        The tables grow to the next power of two >= ``length``; no cap applies here.
        """
        length = check_int("length", length, min_value=0)
        if length <= self.cos_cached.shape[0]:
            return
        rows = 1 << (length - 1).bit_length()
        positions = torch.arange(rows, device=self.cos_cached.device)
        self.cos_cached, self.sin_cached = self._tables(positions, self.cos_cached.dtype)

    def _cos_sin(
        self, length: int, offset: int, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables broadcastable against (B, H, L, Dh): cached rows, or computed ones."""
        dtype = self.cos_cached.dtype
        if positions is None:
            end = offset + length
            if self.cos_cached.shape[0] < end <= MAX_CACHED_POSITIONS:
                self.reserve(end)
            if end <= self.cos_cached.shape[0]:
                return self.cos_cached[offset:end], self.sin_cached[offset:end]  # (L, Dh)
            past_the_cap = torch.arange(offset, end, device=self.cos_cached.device)  # (L,)
            return self._tables(past_the_cap, dtype)  # (L, Dh)
        rows = cacheable_rows(positions, self.cos_cached)
        if rows is None:
            cos, sin = self._tables(positions, dtype)  # (L, Dh) or (B, L, Dh)
        else:
            self.reserve(rows)
            cos = gather_rows(self.cos_cached, positions)  # (L, Dh) or (B, L, Dh)
            sin = gather_rows(self.sin_cached, positions)  # (L, Dh) or (B, L, Dh)
        if positions.ndim == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, Dh)
        return cos, sin

    def forward(
        self, x: torch.Tensor, *, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rotate queries or keys by their positions.

        Args:
            x: per-head queries or keys.
            offset: position of the first token (keys already in a decoding cache).
            positions: explicit positions, shared (L,) or per row (B, L), e.g. for left-padded
                batched decoding; when given, ``offset`` is ignored. They are moved to x's
                device if they live elsewhere.

        Shapes:
            x: (B, H, L, Dh)
            positions: (L,) or (B, L)
            returns: (B, H, L, Dh), same dtype as x
        """
        x = check_tensor("x", x, ndim=4, floating=True)
        if x.shape[-1] != self.d_head:
            raise ValueError(
                f"x last dim must be d_head ({self.d_head}), got shape {tuple(x.shape)}"
            )
        offset = check_int("offset", offset, min_value=0)
        batch, _, length, _ = x.shape
        if positions is not None:
            positions = check_positions(positions, batch, length).to(x.device)
        cos, sin = self._cos_sin(length, offset, positions)
        wide = torch.promote_types(x.dtype, cos.dtype)
        x_wide = x.to(wide)
        return (x_wide * cos.to(wide) + rotate_half(x_wide) * sin.to(wide)).to(x.dtype)

