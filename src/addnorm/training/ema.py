"""The exponential moving average (EMA) of a model's weights, as DiT samples with: torch's
``torch.optim.swa_utils.AveragedModel`` with an EMA averaging function.

After each optimizer step ``averaged.update_parameters(model)`` moves every floating-point
parameter and buffer (``use_buffers=True``: BatchNorm's running statistics are averaged like
the weights) by ``average.lerp_(weight, 1 - decay)``, the ``torch._foreach_lerp_`` of
``get_ema_multi_avg_fn``; integer buffers (BatchNorm's step counter) are copied, where
``get_ema_multi_avg_fn`` would scale them and round. Low-precision floating weights are
averaged in float32 (a bfloat16 average would not move at decays above 1 - 2^-8).

The average starts at the model's weights when :func:`make_ema` is called, which count as its
first average (``n_averaged`` 1; ``AveragedModel``'s own first update would copy the weights
instead), so update ``n`` (counted from 0) is the one made with ``n_averaged == n + 1``. With
``warmup`` the decay of update ``n`` is ``min(decay, (1 + n) / (10 + n))`` (TensorFlow's
``ExponentialMovingAverage`` with ``num_updates``): the average leaves the initial weights
behind within tens of updates. ``averaged.module`` holds the averaged weights, keyed like the
model's own (``averaged.module.state_dict()``); ``n_averaged`` is all the state besides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.optim.swa_utils import AveragedModel

from addnorm.utils.checks import check_bool, check_probability

__all__ = ["ema_average", "ema_decay", "make_ema", "saved_n_averaged"]

MultiAvgFn = Callable[[Sequence[Tensor], Sequence[Tensor], "Tensor | int"], None]


def ema_decay(decay: float, n: int, *, warmup: bool) -> float:
    """The decay of update ``n`` (counted from 0): ``min(decay, (1 + n) / (10 + n))`` with
    ``warmup``, else ``decay``."""
    return min(decay, (1 + n) / (10 + n)) if warmup else decay


def ema_average(decay: float, *, warmup: bool = False) -> MultiAvgFn:
    """``AveragedModel``'s ``multi_avg_fn`` for the EMA of :func:`make_ema`: one group of
    tensors (one device and dtype) at a time, floating ones lerped by ``1 - decay`` (the
    update's decay, :func:`ema_decay`, read from ``n_averaged``), others copied."""
    decay = check_probability("decay", decay)
    warmup = check_bool("warmup", warmup)

    @torch.no_grad()
    def average(averages: Sequence[Tensor], current: Sequence[Tensor], n_averaged) -> None:
        if not averages[0].is_floating_point():
            torch._foreach_copy_(list(averages), list(current))
            return
        n = int(n_averaged) - 1 if warmup else 0  # the update's number (from 0)
        weight = 1.0 - ema_decay(decay, n, warmup=warmup)
        # a sharded model's parameters are DTensors, its buffers plain: one call for each kind
        for sharded in (False, True):
            pairs = [(a, c.to(a.dtype)) for a, c in zip(averages, current, strict=True)
                     if isinstance(a, DTensor) == sharded]
            if pairs:
                torch._foreach_lerp_([a for a, _ in pairs], [c for _, c in pairs], weight)

    return average


def make_ema(model: nn.Module, decay: float, *, warmup: bool = False) -> AveragedModel:
    """An ``AveragedModel`` keeping the EMA of ``model``'s parameters and buffers (see the
    module docstring); call ``update_parameters(model)`` after each optimizer step.

    ``model`` must not be sharded yet (FSDP2 modules cannot be copied): shard the average the
    same way after (``distributed.shard``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    averaged = AveragedModel(model, multi_avg_fn=ema_average(decay, warmup=warmup),
                             use_buffers=True)
    with torch.no_grad():
        for value in [*averaged.module.parameters(), *averaged.module.buffers()]:
            if value.is_floating_point() and value.element_size() < 4:
                value.data = value.data.float()
        averaged.n_averaged.fill_(1)  # the weights it was built from: its first average
    averaged.requires_grad_(False)
    return averaged


def saved_n_averaged(state: dict, step: int) -> int:
    """The EMA's ``n_averaged`` a checkpoint's ``state`` saved at ``step``; one written before
    the EMA was torch's made one update per step after its initial weights: ``step + 1``."""
    saved = state.get("ema", {"n_averaged": step + 1})
    n = saved.get("n_averaged") if isinstance(saved, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"ema.n_averaged must be an int >= 1, got {n!r}")
    return n
