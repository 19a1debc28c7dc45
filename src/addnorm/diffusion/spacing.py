"""Which original steps a sampler with fewer steps visits.

For ``n_steps`` training steps and ``steps`` sampling steps, every spacing returns ``steps``
strictly increasing step numbers in ``[0, n_steps - 1]``; the sampler walks them from last to
first. Two come from facebookresearch/DiT's ``respace.py`` (and improved-diffusion), three from
diffusers' ``timestep_spacing`` (Table 2 of Lin et al., 2023, "Common diffusion noise schedules
and sample steps are flawed"):

| spacing      | steps visited (n = n_steps, K = steps)              | n=1000, K=50       |
|--------------|-----------------------------------------------------|--------------------|
| ``strided``  | ``range(0, n, s)`` with the smallest integer stride | 0, 20, ..., 980    |
|              | ``s`` giving exactly K steps (DiT's ``"ddimK"``);   |                    |
|              | an error where no stride does                       |                    |
| ``sections`` | ``round(i * (n - 1) / (K - 1))``, the fraction      | 0, 20, 41, ..., 999|
|              | summed step by step, Python's round half to even    |                    |
|              | (DiT's plain ``"K"``, one section)                  |                    |
| ``leading``  | ``i * (n // K)`` (diffusers, ``steps_offset=0``)    | 0, 20, ..., 980    |
| ``trailing`` | ``round(n - i * n / K) - 1``                        | 19, 39, ..., 999   |
| ``linspace`` | ``round(linspace(0, n - 1, K))``                    | 0, 20, 41, ..., 999|

The sampler's default (``spacing=None``) is the reference's convention: ``strided`` for DDIM
(DiT's ``create_diffusion("ddim50")``), ``sections`` for DDPM (DiT's ``sample.py``, which
calls ``create_diffusion("250")``).
"""

from __future__ import annotations

import numpy as np

from addnorm._checks import check_choice, check_int

__all__ = ["SPACINGS", "sampling_timesteps"]

SPACINGS = ("strided", "sections", "leading", "trailing", "linspace")


def sampling_timesteps(n_steps: int, steps: int, spacing: str) -> list[int]:
    """The ``steps`` increasing original step numbers a sampler visits (table above)."""
    n = check_int("n_steps", n_steps, min_value=1)
    k = check_int("steps", steps, min_value=1)
    check_choice("spacing", spacing, SPACINGS)
    if k > n:
        raise ValueError(f"steps ({k}) must be <= n_steps ({n})")
    if spacing == "strided":
        return _strided(n, k)
    if spacing == "sections":
        return _one_section(n, k)
    if spacing == "leading":
        return [i * (n // k) for i in range(k)]
    if spacing == "trailing":
        return sorted(round(n - i * (n / k)) - 1 for i in range(k))
    return [int(s) for s in np.linspace(0, n - 1, k).round()]


def _strided(n: int, k: int) -> list[int]:
    for stride in range(1, n):
        if len(range(0, n, stride)) == k:
            return list(range(0, n, stride))
    raise ValueError(
        f"spacing 'strided' has no integer stride giving exactly {k} of {n} steps; "
        "use spacing 'leading', 'trailing', 'linspace' or 'sections'"
    )


def _one_section(n: int, k: int) -> list[int]:
    stride = 1.0 if k == 1 else (n - 1) / (k - 1)
    taken, position = [], 0.0
    for _ in range(k):
        taken.append(round(position))
        position += stride
    return taken
