"""The diffusion timestep embedding (SPEC section 2, seed 004) and DiT's timestep MLP.

Shapes legend: N number of timesteps (one per sample), D d_model.

The sinusoidal part differs from the positional encoding of :mod:`addnorm.encodings` in three
ways (SPEC section 2): concatenated halves instead of interleaving, cos before sin, and the
exponent ``k/half`` instead of ``2i/d``.

:func:`timestep_embedding`'s keywords generalise the seed's function to diffusers'
``get_timestep_embedding``: the exponent divisor becomes ``half - downscale_freq_shift``, the
angles are multiplied by ``scale``, and ``flip_sin_to_cos=False`` gives ``[sin | cos]``. Note
that diffusers' own defaults (``flip_sin_to_cos=False, downscale_freq_shift=1``) are not ours:

| diffusers ``get_timestep_embedding(...)``  | addnorm ``timestep_embedding(...)``          |
|--------------------------------------------|----------------------------------------------|
| ``(t, d)`` (its defaults: flip False,      | ``(t, d, flip_sin_to_cos=False,``            |
| shift 1)                                   | ``downscale_freq_shift=1)``                  |
| ``(t, d, flip_sin_to_cos=True,``           | ``(t, d)`` (our defaults)                    |
| ``downscale_freq_shift=0)`` (SD, DiT)      |                                              |
| ``(t, d, f, s, c, m)``, positionally:      | ``(t, d, m, flip_sin_to_cos=f,``             |
| flip, shift, scale, max_period             | ``downscale_freq_shift=s, scale=c)``         |
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from addnorm.utils.checks import check_bool, check_float, check_int

__all__ = ["TimestepEmbedder", "timestep_embedding"]


def _as_timesteps(timesteps: object, device: torch.device | None = None) -> torch.Tensor:
    """A 1-D real tensor from a tensor (0-d or 1-D), a Python number or a list of numbers."""
    if isinstance(timesteps, torch.Tensor):
        t = timesteps
    elif isinstance(timesteps, bool) or not isinstance(timesteps, int | float | list | tuple):
        raise TypeError(
            "timesteps must be a tensor, a number or a list of numbers, "
            f"got {type(timesteps).__name__} ({timesteps!r})"
        )
    else:
        items = timesteps if isinstance(timesteps, list | tuple) else [timesteps]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int | float):
                kind = type(item).__name__
                raise TypeError(f"timesteps must hold numbers, got {kind} ({item!r})")
        t = torch.tensor(items, device=device)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"timesteps must be an integer or float tensor, got dtype {t.dtype}")
    if t.ndim == 0:
        t = t[None]  # (1,)
    if t.ndim != 1:
        raise ValueError(
            f"timesteps must be a scalar or have 1 dim (N,), got shape {tuple(t.shape)}"
        )
    return t


# Set once the "timesteps look normalized" warning has been issued: it is issued once per
# process whatever the warnings filter, and the check (a host sync) is skipped afterwards.
_warned_unit_timesteps = False


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 for float64 timesteps, else float32 (the seed's)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _angle_limit(dtype: torch.dtype) -> float:
    """The largest angle (and angle factor) accepted in ``dtype``: half its largest finite
    value, a factor 2 to spare for the roundings of the two products ``(t * freq) * scale``
    (each at most 1 + 2**-24 relative), so every computed angle is finite."""
    return torch.finfo(dtype).max / 2


def _highest_frequency(
    dim: int, max_period: float, shift: float, dtype: torch.dtype = torch.float32
) -> float:
    """The largest of the frequencies ``exp(-ln(max_period) * k / (half - shift))``, k < half.

    It is 1 (k = 0) when ``max_period >= 1``. A ``max_period`` below 1 makes the frequencies
    grow with k; where the largest would overflow ``dtype``, a ValueError names the values.
    """
    half = dim // 2
    exponent = max(0.0, -math.log(max_period) * (half - 1) / (half - shift))
    if exponent > math.log(_angle_limit(dtype)):
        raise ValueError(
            f"max_period ({max_period:g}) with dim ({dim}) and downscale_freq_shift ({shift:g}) "
            f"gives a highest frequency of exp({exponent:.6g}), beyond {dtype}'s range "
            f"(ln of its max / 2 = {math.log(_angle_limit(dtype)):.6g}); a max_period >= 1 "
            "keeps every frequency <= 1"
        )
    return math.exp(exponent)


def _check_values(
    t: torch.Tensor, max_period: float, freq: float = 0.0, scale: float = 1.0
) -> None:
    """Reject non-finite timesteps and ones whose angles ``t * freq * scale`` (``freq`` the
    highest frequency) would overflow the compute dtype; warn once when they look
    normalized to [0, 1].

    Reads one to four values back from the device (a host sync) for float timesteps; none
    for integer ones unless their dtype's range could overflow an angle; skipped entirely
    under ``torch.compile`` (no sync, no graph break).
    """
    global _warned_unit_timesteps
    if t.numel() == 0 or torch.compiler.is_compiling():
        return
    factor = freq * max(scale, 1.0)  # the largest |angle| per unit |t|, intermediates included
    dtype = _compute_dtype(t)
    limit = _angle_limit(dtype)
    if not t.is_floating_point():
        if torch.iinfo(t.dtype).max * factor > limit:  # only then can the values matter
            _check_angles(float(t.double().abs().max()), freq, scale, limit, dtype)
        return
    t = t.double()
    look_for_unit = max_period >= 1000 and not _warned_unit_timesteps
    flags = [torch.isfinite(t).all(), t.abs().max()]
    if look_for_unit:
        flags += [((t >= 0) & (t <= 1)).all(), (t != t.round()).any()]
    read = torch.stack([f.double() for f in flags]).tolist()  # the host sync
    if not read[0]:
        raise ValueError(f"timesteps must be finite, got {t[~torch.isfinite(t)][0].item()}")
    _check_angles(read[1], freq, scale, limit, dtype)
    if look_for_unit and read[2] and read[3]:
        _warned_unit_timesteps = True
        warnings.warn(
            f"all timesteps lie in [0, 1] while max_period ({max_period:g}) >= 1000: most "
            "channels then stay nearly constant. Pass integer-scale timesteps (e.g. t * 1000) "
            "or a smaller max_period. (Warned once per process.)",
            UserWarning,
            stacklevel=3,
        )


def _check_angles(
    largest_t: float, freq: float, scale: float, limit: float, dtype: torch.dtype
) -> None:
    if largest_t * freq * max(scale, 1.0) > limit:
        raise ValueError(
            f"timesteps up to |t| = {largest_t:g} with scale ({scale:g}) and a highest "
            f"frequency of {freq:g} give angles beyond the range of the compute dtype "
            f"({dtype}, max / 2 = {limit:.4g}); use smaller timesteps or scale"
        )


def _half_width(dim: int, shift: float) -> int:
    """``dim // 2``, the number of frequencies, which must exceed ``shift`` (the divisor)."""
    half = dim // 2
    if half == 0:
        raise ValueError(f"dim ({dim}) must be >= 2 for sinusoids (half = dim // 2 = 0)")
    if half - shift <= 0:
        raise ValueError(
            f"dim // 2 ({half}) must exceed downscale_freq_shift ({shift:g}), else the exponent "
            f"divides by {half - shift:g}; use dim >= {2 * math.floor(shift) + 2}"
        )
    return half


def timestep_embedding(
    timesteps: torch.Tensor | float | list[float],
    dim: int,
    max_period: float = 10000,
    repeat_only: bool = False,
    *,
    flip_sin_to_cos: bool = True,
    downscale_freq_shift: float = 0.0,
    scale: float = 1.0,
) -> torch.Tensor:
    """Sinusoidal embedding of diffusion timesteps (guided-diffusion / latent diffusion / DiT).

    With the defaults this is the seed's function (SPEC section 2)::

        half = dim // 2;  freqs = exp(-ln(max_period) * arange(half) / half)
        # freqs: from 1 down to max_period ** (-(half - 1) / half), not 1/max_period
        args = t[:, None] * freqs[None];  emb = [cos(args) | sin(args)]  (+ a zero column if odd)

    The keywords reproduce diffusers' ``get_timestep_embedding`` (mapped in the module doc).

    Args:
        timesteps: one per sample; a 1-D tensor, a 0-d tensor, a number or a list. May be
            fractional. A warning is issued, once per process, when they all lie in [0, 1],
            some fractionally, while ``max_period >= 1000`` (normalized t with a
            pixel-diffusion period: most channels then barely move).
        dim: output width; odd ``dim`` appends one zero column. Must leave
            ``dim // 2 > downscale_freq_shift`` (where diffusers would divide by 0 and return
            NaN, e.g. ``dim`` 2 or 3 with shift 1, this raises), so ``dim >= 2``.
        max_period: sets the lowest frequency, ``max_period ** (-(half - 1) / (half - shift))``
            (k = half - 1), which nears 1/max_period only as ``half`` grows: 7.5% above it
            at dim 256, 100 times it at dim 4 (max_period 10000, shift 0). Must be > 0.
            Below 1 the frequencies grow with k instead; where the highest would overflow the
            compute dtype (``exp(-ln(max_period) * (half-1) / (half-shift))`` > half its largest
            value), this raises ValueError naming it.
        repeat_only: return ``t`` repeated ``dim`` times (``result[n, j] = t_n``, in t's
            dtype, as the seed's ``repeat(timesteps, 'b -> b d')``), no sinusoids; any
            ``dim >= 1`` is allowed then.
        flip_sin_to_cos: ``[cos | sin]`` (True, the seed/DiT order) or ``[sin | cos]``.
        downscale_freq_shift: exponent ``-ln(max_period) * k / (half - shift)``.
        scale: multiplies the angles ``t * freq``; must be > 0. Accepted where every angle
            (and ``t * freq`` before it) stays within half the compute dtype's largest value,
            so all are finite: ``max|t| * highest freq * max(scale, 1) <= finfo.max / 2``;
            otherwise ValueError names the timesteps, ``scale`` and the frequency.

    Computed in float64 for float64 timesteps, else in float32, as the seed (bit for bit).
    Timestep values are not checked under ``torch.compile``.

    Shapes:
        timesteps: (N,) or scalar (N = 1)
        returns: (N, dim)
    """
    t = _as_timesteps(timesteps)
    dim = check_int("dim", dim, min_value=1)
    max_period = check_float("max_period", max_period, min_value=0.0, min_inclusive=False)
    check_bool("repeat_only", repeat_only)
    check_bool("flip_sin_to_cos", flip_sin_to_cos)
    shift = check_float("downscale_freq_shift", downscale_freq_shift)
    scale = check_float("scale", scale, min_value=0.0, min_inclusive=False)
    if repeat_only:
        _check_values(t, 0.0)
        return t[:, None].repeat(1, dim)  # (N, dim)
    _half_width(dim, shift)
    dtype = _compute_dtype(t)
    if scale > _angle_limit(dtype):
        raise ValueError(f"scale ({scale:g}) exceeds {dtype}'s range (max / 2 = "
                         f"{_angle_limit(dtype):.4g}), in which the angles are computed")
    freq = _highest_frequency(dim, max_period, shift, dtype)
    _check_values(t, max_period, freq, scale)
    return _sinusoids(t, dim, max_period, flip_sin_to_cos, shift, scale)


def _sinusoids(
    t: torch.Tensor, dim: int, max_period: float, flip_sin_to_cos: bool, shift: float, scale: float
) -> torch.Tensor:
    """:func:`timestep_embedding`'s formula on checked arguments (t 1-D, half > shift).

    Shapes:
        t: (N,)
        returns: (N, dim)
    """
    half = dim // 2
    dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    k = torch.arange(half, dtype=dtype, device=t.device)
    freqs = torch.exp(-math.log(max_period) * k / (half - shift))  # (half,)
    args = scale * (t.to(dtype)[:, None] * freqs[None])  # (N, half)
    halves = [args.cos(), args.sin()] if flip_sin_to_cos else [args.sin(), args.cos()]
    if dim % 2:
        halves.append(torch.zeros_like(args[:, :1]))
    return torch.cat(halves, dim=-1)  # (N, dim)


class TimestepEmbedder(nn.Module):
    """DiT's timestep conditioning: ``w2(SiLU(w1(timestep_embedding(t, d_freq))))``.

    The sinusoids use the seed/DiT convention by default (``[cos | sin]``, exponent
    ``k/half``). ``flip_sin_to_cos`` and ``downscale_freq_shift`` are
    :func:`timestep_embedding`'s keywords, for ports that differ (diffusers' DiT uses
    ``downscale_freq_shift=1``).

    Its forward checks the timesteps' structure (a number, a list, a 0-d or 1-D real tensor),
    not their values (:func:`timestep_embedding` does, reading them back; a model checks
    them once at its own call).
    """

    def __init__(
        self,
        d_model: int,
        *,
        d_freq: int = 256,
        max_period: float = 10000,
        flip_sin_to_cos: bool = True,
        downscale_freq_shift: float = 0.0,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.d_freq = check_int("d_freq", d_freq, min_value=2)
        self.max_period = check_float("max_period", max_period, min_value=0.0, min_inclusive=False)
        self.flip_sin_to_cos = check_bool("flip_sin_to_cos", flip_sin_to_cos)
        self.downscale_freq_shift = check_float("downscale_freq_shift", downscale_freq_shift)
        _half_width(self.d_freq, self.downscale_freq_shift)
        _highest_frequency(self.d_freq, self.max_period, self.downscale_freq_shift)  # float32
        self.w1 = nn.Linear(self.d_freq, self.d_model)
        self.act = nn.SiLU()
        self.w2 = nn.Linear(self.d_model, self.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DiT's ``initialize_weights`` rule: both weights ~ N(0, 0.02^2), biases 0."""
        for linear in (self.w1, self.w2):
            nn.init.normal_(linear.weight, mean=0.0, std=0.02)
            nn.init.zeros_(linear.bias)

    def forward(self, t: torch.Tensor | float) -> torch.Tensor:
        """Embed one diffusion timestep per sample; ``t`` is moved to the weights' device.

        Shapes:
            t: (N,) or scalar (N = 1)
            returns: (N, D)
        """
        weight = self.w1.weight
        flip, shift = self.flip_sin_to_cos, self.downscale_freq_shift
        t = _as_timesteps(t, device=weight.device).to(weight.device)
        freq = _sinusoids(t, self.d_freq, self.max_period, flip, shift, 1.0)  # (N, d_freq)
        return self.w2(self.act(self.w1(freq.to(weight.dtype))))

    def extra_repr(self) -> str:
        return (
            f"d_freq={self.d_freq}, max_period={self.max_period:g}, "
            f"flip_sin_to_cos={self.flip_sin_to_cos}, "
            f"downscale_freq_shift={self.downscale_freq_shift:g}"
        )
