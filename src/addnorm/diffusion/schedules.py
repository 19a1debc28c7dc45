"""Beta schedules and the float64 tables a Gaussian diffusion precomputes from them.

Conventions (those of facebookresearch/DiT's ``gaussian_diffusion.py``, itself from
improved-diffusion): the chain has ``n_steps`` noising steps indexed ``t = 0 .. n_steps - 1``;
``t = 0`` is the first step, so ``x_t`` has been noised ``t + 1`` times and
``alphas_cumprod[t] = prod_{s <= t} (1 - betas[s])``. Every table is float64 and is cast to the
data's dtype only when it is used (:func:`gather`).

A sampler that skips steps runs a *respaced* chain (:meth:`NoiseSchedule.respaced`): it keeps
the ``alphas_cumprod`` of the kept steps and derives new betas from them, so each entry jumps
from one kept step to the next, while the model is still fed the original step numbers
(``timesteps``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from addnorm.utils.checks import check_choice, check_int

__all__ = ["SCHEDULES", "NoiseSchedule", "beta_schedule", "gather"]

SCHEDULES = ("linear", "cosine")


def beta_schedule(name: str, n_steps: int) -> Tensor:
    """The (n_steps,) float64 betas of a named schedule.

    - ``"linear"``: Ho et al.'s 1e-4 .. 0.02 over 1000 steps, both ends scaled by
      ``1000 / n_steps`` so that other lengths keep the same overall noise (DiT's and
      improved-diffusion's ``get_named_beta_schedule("linear")``). Needs ``n_steps > 20``,
      or the last beta reaches 1.
    - ``"cosine"``: Nichol & Dhariwal's ``alpha_bar(s) = cos((s + 0.008) / 1.008 * pi / 2)^2``
      on ``s = t / n_steps``, each beta ``1 - alpha_bar(s_{t+1}) / alpha_bar(s_t)`` capped at
      0.999 (improved-diffusion's "cosine", DiT's and diffusers' "squaredcos_cap_v2").
    """
    check_choice("schedule", name, SCHEDULES)
    n = check_int("n_steps", n_steps, min_value=2)
    if name == "linear":
        scale = 1000 / n
        if scale * 0.02 >= 1.0:
            raise ValueError(
                f"the linear schedule needs n_steps > 20 (its last beta, {scale * 0.02:g}, "
                f"must be < 1), got n_steps={n}; use schedule='cosine' for short chains"
            )
        betas = np.linspace(scale * 0.0001, scale * 0.02, n, dtype=np.float64)
        return torch.from_numpy(betas)

    def alpha_bar(s: float) -> float:
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    cosine = [min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), 0.999) for i in range(n)]
    return torch.tensor(cosine, dtype=torch.float64)


@dataclass(frozen=True, eq=False)
class NoiseSchedule:
    """The float64 tables of one chain of noising steps, all of shape (K,).

    Entry ``k`` describes the jump from kept step ``k - 1`` to kept step ``k``; ``timesteps[k]``
    is the original step number the model sees (``arange(K)`` for a full chain).
    ``alphas_cumprod_prev[0]`` is 1: before the first step there is no noise.

    Posterior q(x_{k-1} | x_k, x_0) = N(coef_x0 x_0 + coef_xt x_k, posterior_variance).
    ``posterior_variance[0]`` is 0, so ``posterior_log_variance`` repeats entry 1 at entry 0.
    ``large_log_variance`` is ``log betas`` with entry 0 taken from the posterior as well
    (DiT's FIXED_LARGE, the variance of DDPM steps for a model without learned variance).
    """

    timesteps: Tensor
    betas: Tensor
    alphas_cumprod: Tensor
    alphas_cumprod_prev: Tensor
    sqrt_alphas_cumprod: Tensor
    sqrt_one_minus_alphas_cumprod: Tensor
    sqrt_recip_alphas_cumprod: Tensor
    sqrt_recipm1_alphas_cumprod: Tensor
    posterior_variance: Tensor
    posterior_log_variance: Tensor
    posterior_coef_x0: Tensor
    posterior_coef_xt: Tensor
    log_betas: Tensor
    large_log_variance: Tensor

    @classmethod
    def from_betas(cls, betas: Tensor, timesteps: Tensor | None = None) -> NoiseSchedule:
        """All tables from (K,) betas in (0, 1); ``timesteps`` defaults to ``arange(K)``."""
        betas = betas.to(torch.float64)
        if betas.ndim != 1 or len(betas) < 1:
            raise ValueError(
                f"betas must be a non-empty 1-D tensor, got shape {tuple(betas.shape)}"
            )
        if not bool(((betas > 0) & (betas < 1)).all()):
            raise ValueError(
                f"betas must lie in (0, 1), got min {betas.min().item():g}, "
                f"max {betas.max().item():g}"
            )
        if timesteps is None:
            timesteps = torch.arange(len(betas))
        alphas = 1.0 - betas
        ac = torch.cumprod(alphas, dim=0)
        ac_prev = torch.cat([ac.new_ones(1), ac[:-1]])
        post_var = betas * (1.0 - ac_prev) / (1.0 - ac)
        # Entry 0 of the posterior variance is 0: its log borrows entry 1 (K == 1: log beta).
        post_log_var = torch.log(
            torch.cat([post_var[1:2], post_var[1:]]) if len(betas) > 1 else betas
        )
        large_var = torch.cat([post_var[1:2], betas[1:]]) if len(betas) > 1 else betas
        return cls(
            timesteps=timesteps.to(torch.long),
            betas=betas,
            alphas_cumprod=ac,
            alphas_cumprod_prev=ac_prev,
            sqrt_alphas_cumprod=torch.sqrt(ac),
            sqrt_one_minus_alphas_cumprod=torch.sqrt(1.0 - ac),
            sqrt_recip_alphas_cumprod=torch.sqrt(1.0 / ac),
            sqrt_recipm1_alphas_cumprod=torch.sqrt(1.0 / ac - 1.0),
            posterior_variance=post_var,
            posterior_log_variance=post_log_var,
            posterior_coef_x0=betas * torch.sqrt(ac_prev) / (1.0 - ac),
            posterior_coef_xt=(1.0 - ac_prev) * torch.sqrt(alphas) / (1.0 - ac),
            log_betas=torch.log(betas),
            large_log_variance=torch.log(large_var),
        )

    def respaced(self, timesteps: Sequence[int]) -> NoiseSchedule:
        """The chain that keeps only ``timesteps`` (increasing indices into this chain).

        Its betas are ``1 - alphas_cumprod[t_k] / alphas_cumprod[t_{k-1}]`` (with 1 before the
        first kept step), so its ``alphas_cumprod`` are this chain's at the kept steps.
        """
        keep = torch.as_tensor(list(timesteps), dtype=torch.long)
        if keep.ndim != 1 or len(keep) == 0 or not bool((keep[1:] > keep[:-1]).all()):
            raise ValueError(f"timesteps must be strictly increasing, got {keep.tolist()}")
        if int(keep[0]) < 0 or int(keep[-1]) >= len(self.betas):
            raise ValueError(
                f"timesteps must lie in [0, {len(self.betas) - 1}], got {keep.tolist()}"
            )
        kept = self.alphas_cumprod[keep]
        before = torch.cat([kept.new_ones(1), kept[:-1]])
        return NoiseSchedule.from_betas(1.0 - kept / before, self.timesteps[keep])


def gather(table: Tensor, index: Tensor | int, like: Tensor) -> Tensor:
    """``table[index]`` in ``like``'s dtype, ready to broadcast against ``like`` (B, ...).

    A (B,) ``index`` (one step per sample) gives (B, 1, ..., 1) on ``index``'s device; the cast
    happens before the move, as some devices lack float64. An int (one step for the batch, as
    in sampling) gives a 0-d CPU tensor, which torch treats as a scalar on any device.
    """
    if isinstance(index, int):
        return table[index].to(like.dtype)  # ()
    values = table.to(like.dtype).to(index.device)[index]  # (B,)
    return values.reshape(-1, *([1] * (like.ndim - 1)))  # (B, 1, ..., 1)
