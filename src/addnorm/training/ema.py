"""An exponential moving average (EMA) of a model's weights, as DiT samples with.

After each optimizer step, ``shadow = decay * shadow + (1 - decay) * weight`` for every
floating-point parameter and buffer; integer buffers (e.g. BatchNorm's step counter) are
copied. The shadow lives on the model's device in float32 (or the weight's wider dtype); for an
FSDP2-sharded model it holds each rank's shards (``state_dict`` returns them as ``DTensor``s).
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.utils.checks import check_bool, check_probability

__all__ = ["EMA"]


class EMA:
    """Keeps the moving average of ``model``'s state dict.

    Args:
        model: the model being trained; its current weights start the average.
        decay: the weight of the old average at each update, in [0, 1).
        warmup: at update ``n`` (counted from 0) use ``min(decay, (1 + n) / (10 + n))``, so
            the average leaves the initial weights behind within tens of updates (TensorFlow's
            ``ExponentialMovingAverage`` with ``num_updates``).
    """

    def __init__(self, model: nn.Module, decay: float, *, warmup: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        self.decay = check_probability("decay", decay)
        self.warmup = check_bool("warmup", warmup)
        self.shadow: dict[str, torch.Tensor] = {
            name: _wide(value).clone() for name, value in model.state_dict().items()
        }

    def decay_at(self, n: int) -> float:
        """The decay of update ``n`` (counted from 0)."""
        return min(self.decay, (1 + n) / (10 + n)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module, n: int = 0) -> None:
        """Move the average one step towards ``model``'s current weights; ``n`` is the
        update's number (from 0), which the warm-up reads."""
        decay = self.decay_at(n)
        for name, value in model.state_dict().items():
            average = self.shadow[name]
            if average.is_floating_point():
                average.lerp_(value.to(average.dtype), 1.0 - decay)
            else:
                average.copy_(value)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights, keyed like ``model.state_dict()``."""
        return dict(self.shadow)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore averaged weights saved by ``state_dict``; the keys must match."""
        missing = sorted(set(self.shadow) - set(state))
        unexpected = sorted(set(state) - set(self.shadow))
        if missing or unexpected:
            raise ValueError(f"EMA state keys differ: missing {missing}, unexpected {unexpected}")
        for name, value in state.items():
            self.shadow[name].copy_(_like(value, self.shadow[name]))

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Overwrite ``model``'s weights with the averages (cast to each weight's dtype)."""
        current = model.state_dict()
        model.load_state_dict(
            {name: value.to(current[name].dtype) for name, value in self.shadow.items()}
        )


def _like(value: torch.Tensor, shadow: torch.Tensor) -> torch.Tensor:
    """``value`` (a whole tensor) laid out as ``shadow``: this rank's shard of it when the
    shadow is a sharded ``DTensor`` (an FSDP2 model's), else ``value`` itself."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(shadow, DTensor):
        return value
    return distribute_tensor(
        value.to(shadow.device, shadow.dtype), shadow.device_mesh, shadow.placements
    )


def _wide(value: torch.Tensor) -> torch.Tensor:
    """A detached copy source: low-precision floats widened to float32, others unchanged."""
    value = value.detach()
    if value.is_floating_point() and value.element_size() < 4:
        return value.float()
    return value
