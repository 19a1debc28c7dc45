"""Which original steps a sampler with fewer steps visits: the spacings of the references,
facebookresearch/DiT's ``respace.py`` (``strided``, ``sections``), diffusers'
``timestep_spacing`` (``leading``, ``trailing``, ``linspace``) and its DPM-Solver scheduler's
(``dpm-linspace``, ``dpm-leading``), for any step count. How each maps to the references'
samplers, and where they differ: ``docs/measurements.md``.
"""

from __future__ import annotations

import numpy as np

from addnorm.utils.checks import check_choice, check_int

__all__ = ["SPACINGS", "sampling_timesteps", "spaced_timesteps"]

SPACINGS = (
    "strided", "sections", "leading", "trailing", "linspace", "dpm-linspace", "dpm-leading",
)


def sampling_timesteps(n_steps: int, steps: int, spacing: str) -> list[int]:
    """The ``steps`` strictly increasing step numbers in ``[0, n_steps - 1]`` that a sampler
    visits (it walks them from last to first), for any ``steps`` in ``1 .. n_steps``.

    | spacing      | steps visited (n = n_steps, K = steps)              | n=1000, K=50       |
    |--------------|-----------------------------------------------------|--------------------|
    | ``strided``  | ``range(0, n, s)`` with the smallest integer stride | 0, 20, ..., 980    |
    |              | ``s`` giving exactly K steps (DiT's ``"ddimK"``);   |                    |
    |              | where none does, ``i * (n // K)`` (``leading``)     |                    |
    | ``sections`` | ``round(i * (n - 1) / (K - 1))``, the fraction      | 0, 20, 41, ..., 999|
    |              | summed step by step, Python's round half to even    |                    |
    |              | (DiT's plain ``"K"``, one section)                  |                    |
    | ``leading``  | ``i * (n // K)`` (diffusers, ``steps_offset=0``)    | 0, 20, ..., 980    |
    | ``trailing`` | ``round(n - i * n / K) - 1``, ``i = 0 .. K - 1``    | 19, 39, ..., 999   |
    | ``linspace`` | ``round(linspace(0, n - 1, K))``                    | 0, 20, 41, ..., 999|
    | ``dpm-``     | ``round(linspace(0, n - 1, K + 1))`` without its 0  | 20, 40, 60, ...,   |
    | ``linspace`` | (diffusers' DPM-Solver scheduler's default)         | 979, 999           |
    | ``dpm-``     | ``i * (n // (K + 1))``, i = 1 .. K (its             | 19, 38, ..., 950   |
    | ``leading``  | ``"leading"``, ``steps_offset=0``)                  |                    |

    The ``dpm-`` spacings leave out the lowest of K + 1 points because that scheduler's last
    step goes from the lowest visited step to the data; for ``K = n`` they visit every step.
    """
    n = check_int("n_steps", n_steps, min_value=1)
    k = check_int("steps", steps, min_value=1)
    check_choice("spacing", spacing, SPACINGS)
    if k > n:
        raise ValueError(f"steps ({k}) must be <= n_steps ({n})")
    return spaced_timesteps(n, k, spacing)


def spaced_timesteps(n: int, k: int, spacing: str) -> list[int]:
    """:func:`sampling_timesteps` on arguments checked already (``1 <= k <= n``, a known
    spacing), as :meth:`addnorm.diffusion.Diffusion.sample` has them."""
    if spacing == "strided":
        return _strided(n, k)
    if spacing == "sections":
        return _one_section(n, k)
    if spacing == "leading":
        return [i * (n // k) for i in range(k)]
    if spacing == "trailing":
        return sorted(round(n - i * (n / k)) - 1 for i in range(k))
    if spacing == "linspace":
        return [int(s) for s in np.linspace(0, n - 1, k).round()]
    if k == n:  # the dpm- spacings need K + 1 distinct steps: every step instead
        return list(range(n))
    if spacing == "dpm-linspace":
        return [int(s) for s in np.linspace(0, n - 1, k + 1).round()[1:]]
    return [i * (n // (k + 1)) for i in range(1, k + 1)]  # dpm-leading


def _strided(n: int, k: int) -> list[int]:
    # DiT's loop returns the smallest stride with exactly k steps. Strides below ceil(n / k)
    # give more than k steps, so that stride is ceil(n / k) (stride < n, as DiT's loop), if any.
    stride = -(-n // k)
    if stride < n and len(range(0, n, stride)) == k:
        return list(range(0, n, stride))
    return [i * (n // k) for i in range(k)]  # diffusers' "leading"


def _one_section(n: int, k: int) -> list[int]:
    stride = 1.0 if k == 1 else (n - 1) / (k - 1)
    taken, position = [], 0.0
    for _ in range(k):
        taken.append(round(position))
        position += stride
    return taken
