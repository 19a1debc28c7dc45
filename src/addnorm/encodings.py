"""Absolute position codes: the sinusoidal encoding (SPEC section 1); the learned table,
:class:`~addnorm.learned_positions.LearnedPositionalEmbedding`, is re-exported here.

Shapes legend: B batch, L sequence length, D d_model, P number of positions.

Three sinusoidal layouts are in use in real systems; they are chosen by name:

``"interleaved"`` (Vaswani et al. 2017, the seed blogs, SPEC section 1)
    ``PE[p, 2i] = sin(p * w_i)``, ``PE[p, 2i+1] = cos(p * w_i)``, ``w_i = base^(-2i/D)``.
    Odd D: the last column is the sine of frequency ``i = (D-1)/2`` (it has no cosine partner).
``"halves"`` (HF ``MarianSinusoidalPositionalEmbedding``; x-transformers' sinusoidal embeddings)
    ``[sin(p w_0) .. sin(p w_{m-1}) | cos(p w_0) .. cos(p w_{n-1})]`` with the same ``w_i`` as
    above, ``m = ceil(D/2)`` sines and ``n = floor(D/2)`` cosines, so for every D (odd
    included, Marian's ``sentinel`` rule) it is a column permutation of ``"interleaved"``.
``"whisper"`` (OpenAI Whisper's ``sinusoids``)
    ``[sin(p v_0) .. sin(p v_{h-1}) | cos(p v_0) .. cos(p v_{h-1})]`` with ``h = D/2`` and
    ``v_j = base^(-j/(h-1))``: the frequencies run exactly from 1 down to ``1/base``. Because
    the denominator is ``h - 1`` rather than ``h``, it is *not* a permutation of the other two.
    Needs an even D >= 4 (for D = 2 the denominator is 0).

The relative-position property ``PE(p + k) = T(k) PE(p)`` (:func:`relative_shift_matrix`) is
stated for the interleaved layout, as in SPEC section 1.

Angles ``p * w_i`` are computed in float64 and rounded once to the result dtype, except on
Apple's ``mps`` device, which has no float64: there they are computed in float32
(:func:`angle_dtype`), so an angle's rounding error grows to about 6e-8 times the position.

:class:`SinusoidalPositionalEncoding` precomputes rows ``0 .. max_len-1`` when it is built
and never writes its state in forward: positions outside that table are computed per call.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from addnorm.learned_positions import LearnedPositionalEmbedding
from addnorm.utils.checks import (
    check_choice,
    check_dtype,
    check_float,
    check_int,
    check_positions,
    check_probability,
    check_tensor,
)
from addnorm.utils.memory import check_fits

__all__ = [
    "LAYOUTS",
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "relative_shift_matrix",
    "sinusoidal_encoding",
]

LAYOUTS = ("interleaved", "halves", "whisper")


def angle_dtype(device: torch.device) -> torch.dtype:
    """float64 for position angles, or float32 on ``mps``, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def _frequencies(d_model: int, base: float, layout: str, device: torch.device) -> torch.Tensor:
    """Angular frequencies in ``angle_dtype``: ``ceil(D/2)`` of them (``D/2`` for whisper)."""
    dtype = angle_dtype(device)
    if layout == "whisper":
        if d_model % 2 or d_model < 4:
            raise ValueError(
                f"layout='whisper' needs an even d_model >= 4 (its exponent divides by "
                f"d_model/2 - 1), got d_model ({d_model})"
            )
        half = d_model // 2
        j = torch.arange(half, dtype=dtype, device=device)
        return torch.exp(-math.log(base) / (half - 1) * j)
    two_i = torch.arange(0, d_model, 2, dtype=dtype, device=device)
    return base ** (-two_i / d_model)


def check_table_size(name: str, rows: int, width: int, device: torch.device) -> None:
    """Refuse, before allocating, a table of ``rows`` x ``width`` angles that cannot fit.

    Its sines and cosines alone take ``rows * width`` values in :func:`angle_dtype`, and its
    frequencies ``ceil(width / 2)`` more: when that exceeds the memory the device has in all
    (:func:`addnorm.utils.memory.device_memory`), no computation of it can succeed, and the
    ValueError names ``name``'s value and the bound. Skipped while a graph is captured (no
    host call there; such rows are a call's own, for tokens already in memory).
    """
    if torch.compiler.is_compiling():
        return
    n_bytes = (rows * width + (width + 1) // 2) * angle_dtype(device).itemsize
    check_fits(f"{name} ({rows}) x width ({width}) of a sinusoid table", n_bytes, device)


def _check_positions_1d(positions: object) -> torch.Tensor:
    """A 1-D real tensor of finite positions."""
    pos = check_tensor("positions", positions, ndim=1)
    if pos.dtype == torch.bool or pos.is_complex():
        raise TypeError(f"positions must be an integer or float tensor, got dtype {pos.dtype}")
    if pos.is_floating_point() and not bool(torch.isfinite(pos).all()):
        raise ValueError(f"positions must be finite, got {pos[~torch.isfinite(pos)][0].item()}")
    return pos


def sinusoidal_encoding(
    positions: int | torch.Tensor,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The sinusoidal position table ``PE`` of SPEC section 1, one row per position.

    Args:
        positions: an int count ``P`` (positions ``0 .. P-1``) or a 1-D tensor of positions,
            which may be fractional, negative or offset.
        d_model: width D of a row; odd D is allowed for ``"interleaved"`` and ``"halves"``.
        base: the constant in ``w_i = base^(-2i/D)`` (10000 in the paper); must be > 1.
        layout: ``"interleaved"``, ``"halves"`` or ``"whisper"`` (see the module docstring).
        dtype: result dtype; default float64 for float64 positions, float32 otherwise.
            The angles are computed in float64 (float32 on ``mps``) and rounded once at the end.
        device: device of the result; default the positions' device (CPU for an int count).

    Shapes:
        positions: (P,) or an int P
        returns: (P, D)
    """
    d_model = check_int("d_model", d_model, min_value=1)
    base = check_float("base", base, min_value=1.0, min_inclusive=False)
    layout = check_choice("layout", layout, LAYOUTS)
    dtype = check_dtype("dtype", dtype, floating=True)
    if isinstance(positions, torch.Tensor):
        pos = _check_positions_1d(positions)
        default_dtype = torch.float64 if pos.dtype == torch.float64 else torch.float32
        device = pos.device if device is None else torch.device(device)
        check_table_size("positions", pos.shape[0], d_model, device)
    else:
        count = check_int("positions", positions, min_value=0)
        default_dtype = torch.float32
        device = torch.device("cpu" if device is None else device)
        check_table_size("positions", count, d_model, device)
        pos = torch.arange(count, device=device)
    return _sinusoids(pos.to(device), d_model, base, layout).to(dtype or default_dtype)


def _sinusoids(positions: torch.Tensor, d_model: int, base: float, layout: str) -> torch.Tensor:
    """:func:`sinusoidal_encoding`'s formula on checked arguments, in the angles' dtype.

    Shapes:
        positions: (P,); returns: (P, D)
    """
    pos = positions.to(angle_dtype(positions.device))  # (P,)
    freqs = _frequencies(d_model, base, layout, pos.device)
    angles = pos[:, None] * freqs[None, :]  # (P, ceil(D/2))
    if layout == "interleaved":
        pairs = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (P, ceil(D/2), 2)
        return pairs.flatten(1)[:, :d_model]  # (P, D)
    n_cos = d_model // 2
    return torch.cat([angles.sin(), angles[:, :n_cos].cos()], dim=-1)  # (P, D)


def relative_shift_matrix(
    k: float,
    d_model: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The matrix ``T(k)`` with ``PE(p + k) = T(k) @ PE(p)`` for every p (interleaved layout).

    ``T(k)`` is block diagonal with one rotation per frequency acting on the column pair
    ``(sin w p, cos w p)``: ``[[cos wk, sin wk], [-sin wk, cos wk]]`` (SPEC section 1). With
    PE rows stored as a (P, D) table the same identity reads ``PE(p + k) = PE(p) @ T(k).T``.
    ``k`` may be fractional or negative. An odd ``d_model`` raises: its last (sine) column has
    no cosine partner, and ``sin(w(p + k))`` needs ``cos(w p)``, so no matrix can shift it.

    Shapes:
        returns: (D, D), float32 unless ``dtype`` is given
    """
    k = check_float("k", k)
    d_model = check_int("d_model", d_model, min_value=2)
    base = check_float("base", base, min_value=1.0, min_inclusive=False)
    if d_model % 2:
        raise ValueError(
            f"relative_shift_matrix needs an even d_model, got d_model ({d_model}): the last "
            "sine column of an odd d_model has no cosine partner, so no linear map shifts it"
        )
    dtype = check_dtype("dtype", dtype, floating=True)
    where = torch.device(device or "cpu")
    check_fits(f"d_model ({d_model}) of a shift matrix", d_model * d_model * 8, where)
    wk = _frequencies(d_model, base, "interleaved", where) * k
    cos, sin = wk.cos(), wk.sin()
    sin_rows = torch.arange(0, d_model, 2, device=wk.device)
    cos_rows = sin_rows + 1
    shift = torch.zeros(d_model, d_model, dtype=wk.dtype, device=wk.device)
    shift[sin_rows, sin_rows] = cos
    shift[sin_rows, cos_rows] = sin
    shift[cos_rows, sin_rows] = -sin
    shift[cos_rows, cos_rows] = cos
    return shift.to(dtype or torch.float32)


class SinusoidalPositionalEncoding(nn.Module):
    """``dropout(x + PE)`` with the parameter-free sinusoidal table (SPEC section 1).

    There is no maximum length. Rows ``0 .. max_len-1`` are computed once, when the module is
    built, into a non-persistent buffer ``table`` (absent from ``state_dict``); forward slices
    them for ``offset .. offset + L - 1`` and never writes the module's state. Any other
    position (rows past the table, and explicit ``positions``, which would have to be read
    back to know whether the table holds them) is computed for that call with the same
    formula, on x's device, so the result does not depend on ``max_len``.
    :meth:`reserve` enlarges the table ahead of time. Moving or casting the module (``.to()``,
    ``.double()``, ``to_empty()``) recomputes the table from the formula in the new dtype and
    device (a ``meta`` table stays ``meta``): a float64 module's table is exact to float64,
    not upcast float32 values, and ``to_empty`` leaves none to convert.
    """

    table: torch.Tensor

    def __init__(
        self,
        d_model: int,
        *,
        base: float = 10000.0,
        dropout: float = 0.0,
        layout: str = "interleaved",
        max_len: int = 2048,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.base = check_float("base", base, min_value=1.0, min_inclusive=False)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        max_len = check_int("max_len", max_len, min_value=1)
        check_table_size("max_len", max_len, self.d_model, torch.get_default_device())
        table = self._formula(max_len, torch.float32, torch.get_default_device())
        self.register_buffer("table", table, persistent=False)

    @property
    def max_len(self) -> int:
        """Rows held by the precomputed table (positions ``0 .. max_len-1``)."""
        return self.table.shape[0]

    def _formula(self, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """PE rows ``0 .. rows-1``, (P, D), from the formula in ``dtype`` on ``device`` (the
        caller has checked ``rows`` with :func:`check_table_size`)."""
        positions = torch.arange(rows, device=device)  # (P,)
        return _sinusoids(positions, self.d_model, self.base, self.layout).to(dtype)

    def reserve(self, length: int) -> None:
        """Enlarge the table to at least ``length`` rows (``max_len`` grows with it): the
        explicit way to hold more rows; forward never does it."""
        length = check_int("length", length, min_value=0)
        if length > self.table.shape[0]:
            check_table_size("length", length, self.d_model, self.table.device)
            self.table = self._formula(length, self.table.dtype, self.table.device)

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> SinusoidalPositionalEncoding:
        """``nn.Module._apply``, then the moved table recomputed (see the class docstring)."""
        before = self.table
        super()._apply(fn, recurse)
        table = self.table
        if table is not before and table.is_floating_point() and not table.is_meta:
            check_table_size("max_len", table.shape[0], self.d_model, table.device)
            self.table = self._formula(table.shape[0], table.dtype, table.device)
        return self

    def encoding(
        self, length: int, *, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The PE rows of ``length`` tokens from ``offset``, or of explicit ``positions``.

        Rows ``offset .. offset + length - 1``, or integer ``positions``, that lie in the table
        are read from it; otherwise every row is computed for this call. Writes no state.

        Shapes:
            positions: (L,) or (B, L)
            returns: (L, D), or (B, L, D) for per-row positions
        """
        if positions is not None:  # computed: choosing rows of the table would read them back
            return self._computed(positions)  # (L, D) or (B, L, D)
        end = offset + length
        if end <= self.table.shape[0]:
            return self.table[offset:end]  # (L, D)
        return self._computed(torch.arange(offset, end, device=self.table.device))  # (L, D)

    def _computed(self, positions: torch.Tensor) -> torch.Tensor:
        """PE rows computed for (L,) or (B, L) positions, on their device, in the table's dtype."""
        pe = _sinusoids(positions.reshape(-1), self.d_model, self.base, self.layout)  # (N, D)
        return pe.to(self.table.dtype).reshape(*positions.shape, self.d_model)  # (L, D), (B, L, D)

    def forward(
        self, x: torch.Tensor, *, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Add the position code of each token to ``x``, then apply dropout.

        Args:
            x: token embeddings.
            offset: position of the first token (tokens already in a decoding cache).
            positions: explicit positions, shared (L,) or per row (B, L), e.g. for left-padded
                batched decoding; when given, ``offset`` is ignored. They are moved to x's
                device if they live elsewhere.

        Shapes:
            x: (B, L, D)
            positions: (L,) or (B, L)
            returns: (B, L, D)
        """
        x = check_tensor("x", x, ndim=3, last_dim=self.d_model, floating=True)
        offset = check_int("offset", offset, min_value=0)
        batch, length, _ = x.shape
        if positions is not None:
            positions = check_positions(positions, batch, length).to(x.device)
        pe = self.encoding(length, offset=offset, positions=positions)
        return self.dropout(x + pe.to(x.dtype))
