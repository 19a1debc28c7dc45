"""DiT's fixed 2-D sin-cos position code of the patch tokens (from MAE).

For a patch in grid row i (vertical, top = 0) and grid column j (horizontal, left = 0),
token ``n = i * w + j``, with Q = D / 4 frequencies ``omega_k = 10000^(-k / Q)``, k < Q::

    pos[n] = [ sin(j omega) | cos(j omega) | sin(i omega) | cos(i omega) ]    # Q each

So the FIRST half of the channels encodes the COLUMN (x, the width axis) and the second half
the ROW (y, the height axis); inside each half the layout is ``[sin | cos]`` halves, not
interleaved. This is what the reference code computes, although it names the first half
``emb_h``: its grid comes from ``meshgrid(grid_w, grid_h)`` with NumPy's default ``xy``
indexing, whose first array varies along the columns. (For square images the two halves
differ only in which axis they encode; the order matters for loading DiT checkpoints.)
Note also the exponent ``k / Q`` with ``Q = D/4``, and ``[sin | cos]`` where the timestep
embedding uses ``[cos | sin]``.

Shapes legend: h x w patch grid, N = h * w tokens, D d_model.
"""

from __future__ import annotations

import torch

from addnorm.utils.checks import check_int

__all__ = ["sincos_1d", "sincos_2d_positions"]


def sincos_1d(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """``[sin(pos omega) | cos(pos omega)]`` with ``omega_k = 10000^(-k / (dim/2))``.

    Shapes:
        positions: (M,)
        returns: (M, dim)
    """
    half = dim // 2
    k = torch.arange(half, dtype=positions.dtype, device=positions.device)
    omega = 1.0 / 10000 ** (k / half)  # (dim/2,)
    angles = positions[:, None] * omega[None]  # (M, dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (M, dim)


def sincos_2d_positions(
    d_model: int, grid_size: int | tuple[int, int], *, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The position code of every patch of an h x w grid (layout in the module docstring).

    Computed in float64 (as the reference, in NumPy) and returned in ``dtype``.

    Shapes:
        returns: (N, D), N = h * w, rows in row-major token order
    """
    d_model = check_int("d_model", d_model, min_value=4)
    if d_model % 4:
        raise ValueError(
            f"d_model ({d_model}) must be divisible by 4 (D / 4 frequencies per axis)"
        )
    h, w = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
    h, w = check_int("grid height", h, min_value=1), check_int("grid width", w, min_value=1)
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)  # (N,) i of token n
    cols = torch.arange(w, dtype=torch.float64).repeat(h)  # (N,) j of token n
    pos = torch.cat([sincos_1d(cols, d_model // 2), sincos_1d(rows, d_model // 2)], dim=-1)
    return pos.to(dtype)  # (N, D)
