"""Which original steps a sampler with fewer steps visits.

For ``n_steps`` training steps and ``steps`` sampling steps, every spacing returns ``steps``
strictly increasing step numbers in ``[0, n_steps - 1]``; the sampler walks them from last to
first. Two come from facebookresearch/DiT's ``respace.py`` (and improved-diffusion), the others
from diffusers' ``timestep_spacing`` (Table 2 of Lin et al., 2023, "Common diffusion noise schedules
and sample steps are flawed"):

| spacing      | steps visited (n = n_steps, K = steps)              | n=1000, K=50       |
|--------------|-----------------------------------------------------|--------------------|
| ``strided``  | ``range(0, n, s)`` with the smallest integer stride | 0, 20, ..., 980    |
|              | ``s`` giving exactly K steps (DiT's ``"ddimK"``);   |                    |
|              | where none does, ``i * (n // K)`` (see below)       |                    |
| ``sections`` | ``round(i * (n - 1) / (K - 1))``, the fraction      | 0, 20, 41, ..., 999|
|              | summed step by step, Python's round half to even    |                    |
|              | (DiT's plain ``"K"``, one section)                  |                    |
| ``leading``  | ``i * (n // K)`` (diffusers, ``steps_offset=0``)    | 0, 20, ..., 980    |
| ``trailing`` | ``round(n - i * n / K) - 1``                        | 19, 39, ..., 999   |
| ``linspace`` | ``round(linspace(0, n - 1, K))``                    | 0, 20, 41, ..., 999|
| ``dpm-``     | ``round(linspace(0, n - 1, K + 1))`` without its 0  | 20, 40, 60, ...,   |
| ``linspace`` | (diffusers' ``DPMSolverMultistepScheduler``,        | 979, 999           |
|              | ``"linspace"``, its default)                        |                    |
| ``dpm-``     | ``i * (n // (K + 1))``, i = 1 .. K (the same        | 19, 38, ..., 950   |
| ``leading``  | scheduler's ``"leading"``, ``steps_offset=0``)      |                    |

The two ``dpm-`` spacings are what diffusers' DPM-Solver scheduler visits: K of the K + 1
points of its ``linspace`` or ``leading`` rule, leaving out the lowest (0), because its last
step goes from the lowest visited step to the data (its ``final_sigmas_type="zero"``), as every
sampler here does. Its ``"trailing"`` is ``trailing`` above. For ``K = n`` there are not K + 1
distinct steps (diffusers then visits some twice); both visit every step, ``0 .. n - 1``.

Every ``K`` in ``1 .. n`` works with every spacing. DiT's ``"ddimK"`` (``space_timesteps``
in ``respace.py``, improved-diffusion's too) raises "cannot create exactly K steps with an
integer stride" for most counts: ``range(0, n, s)`` has ``ceil(n / s)`` steps, so a stride
exists only where ``ceil(n / ceil(n / K)) == K`` and ``ceil(n / K) < n`` (its loop stops at
stride n - 1, so K = 1 never has one); for n = 1000, 938 of the counts 1 .. 1000 have none
(1, 37, 41, 43, ..., 333, ..., 999). ``strided`` keeps DiT's steps wherever DiT has them,
and elsewhere takes the first K multiples of the stride ``n // K``: diffusers'
``DDIMScheduler`` with ``timestep_spacing="leading"`` and ``steps_offset=0``, the other
reference's strided DDIM. The two rules agree where K divides n (stride ``n / K``); either
way the steps are ``0, s, 2s, ..., (K - 1) s`` with an integer stride ``s``, ``ceil(n / K)``
(DiT's) or ``n // K`` (diffusers').

``trailing`` is diffusers' formula taken for ``i = 0 .. K - 1``: diffusers builds it with
``np.arange(n, 0, -n / K)``, whose float step yields K + 1 steps for some counts, the last
one -1 (diffusers 0.42.1, n = 1000: 62 counts, K = 61 the first).

The sampler's default (``spacing=None``) is the reference's convention: ``strided`` for DDIM
(DiT's ``create_diffusion("ddim50")``), ``sections`` for DDPM (DiT's ``sample.py``, which
calls ``create_diffusion("250")``).

How a spacing maps to the two references (checked against diffusers 0.42.1's
``DDIMScheduler``, ``scheduling_ddim.py``):

| addnorm      | facebookresearch/DiT      | diffusers ``DDIMScheduler``                       |
|--------------|---------------------------|---------------------------------------------------|
| ``strided``  | ``"ddimK"`` where it has  | ``"leading"`` where K divides n or DiT has no     |
|              | one                       | ``ddimK``: the same samples                       |
| ``sections`` | ``"K"``                   | none                                              |
| ``leading``  | ``"ddimK"`` where K       | ``"leading"`` (``steps_offset=0``): the same      |
|              | divides n                 | samples for every K                               |
| ``trailing`` | none                      | ``"trailing"``: the same samples where K divides n|
| ``linspace`` | none                      | ``"linspace"``: the same steps, *other samples*   |

The visited steps are diffusers' ``set_timesteps`` for each of its three names (``steps_offset``
0; ``trailing`` cut to K steps, above). The update differs. addnorm's sampler, like DiT's
respacing, steps from each visited step to the *next visited one*: its ``abar_prev`` is
``abar`` at the next lower visited step, and 1 after the lowest (x_0 has no noise).
diffusers' ``DDIMScheduler.step`` always steps back by a fixed ``n // K``
(``prev_timestep = timestep - num_train_timesteps // num_inference_steps``), whatever the
spacing, and below 0 uses ``final_alpha_cumprod``: 1 with ``set_alpha_to_one=True`` (its
default), ``abar[0]`` with False. So, with ``set_alpha_to_one=True`` and the same
``abar`` table:

- ``leading`` gives diffusers' DDIM samples for every K (its steps are ``n // K`` apart).
- ``trailing`` gives them where K divides n (steps ``n / K`` apart); for other K its visited
  steps are ``n / K`` apart, rounded, and diffusers steps ``n // K`` back from each, landing
  beside the next one (n = 1000, K = 30: from 966 diffusers updates to ``abar[933]``, then
  calls the model at 932; here the update goes to ``abar[932]``), so the samples differ.
- ``linspace`` has diffusers' steps, ``round(i (n - 1) / (K - 1))``, but for every K other
  than 1 and n their spacing ``(n - 1) / (K - 1)`` is not ``n // K`` (n = 1000, K = 50:
  999, 979, ..., 41, 20, 0, while diffusers steps back 20 each time: 41 -> 21, 20 -> 0,
  0 -> "-20" = x_0), so diffusers' ``"linspace"`` samples are not these: it uses the
  ``abar`` of steps it never visits. addnorm's ``linspace`` walks its own steps consistently.
- ``set_alpha_to_one=False`` changes diffusers' last update for every spacing; addnorm has
  no such option (its last step always ends at ``abar = 1``, DiT's rule).

``tests/diffusion/test_sampling_reference.py`` holds ``leading`` and ``trailing`` (K = 50) to
diffusers' samples to 1e-12 in float64.
"""

from __future__ import annotations

import numpy as np

from addnorm.utils.checks import check_choice, check_int

__all__ = ["SPACINGS", "sampling_timesteps", "spaced_timesteps"]

SPACINGS = (
    "strided", "sections", "leading", "trailing", "linspace", "dpm-linspace", "dpm-leading",
)


def sampling_timesteps(n_steps: int, steps: int, spacing: str) -> list[int]:
    """The ``steps`` increasing original step numbers a sampler visits (table above)."""
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
