"""What a training step that fails says, in one line the command line prints: a loss that is
not finite (:func:`non_finite_loss`, raised as ``FloatingPointError``) and an allocation that
failed (:func:`out_of_memory`, raised as ``MemoryError``).

A non-finite loss after updates of this ``fit`` points at the step size; one on its first
step, before any update, cannot be the lr's doing: it points at the weights the run started
from (a resumed checkpoint's, which is named) and names the worst of them.
"""

from __future__ import annotations

import math
from pathlib import Path

from torch import nn

from addnorm.training.checkpoint import list_checkpoints
from addnorm.utils.memory import describe_out_of_memory

__all__ = ["non_finite_loss", "out_of_memory"]


def out_of_memory(err: BaseException, *, step: int, run_dir: Path) -> str:
    """An allocation that failed inside ``fit`` at step ``step`` (past the estimates made
    before it, which cannot see what other processes take meanwhile): the step, what could not
    be allocated and the checkpoint kept (none is written for a step that failed)."""
    newest = list_checkpoints(run_dir)
    kept = f"{newest[-1]} is kept" if newest else "no checkpoint was written yet"
    return (f"out of memory at step {step} ({describe_out_of_memory(err)}); "
            f"{kept}: train with a smaller batch_size or model, or free memory")


def non_finite_loss(
    loss: float,
    lr: float,
    *,
    step: int,
    updated: bool,
    model: nn.Module,
    resumed_from: int | None,
    run_dir: Path,
) -> str:
    """What the non-finite ``loss`` of step ``step`` (taken with ``lr``) says: with
    ``updated`` (this ``fit`` has updated the weights), the step size; else the weights it
    started from (the checkpoint of step ``resumed_from`` in ``run_dir``, or the initial ones),
    the worst of ``model``'s named."""
    where = f"training loss is {loss} at step {step}"
    if updated:
        return f"{where}; try a lower lr ({lr:.3g})"
    worst, name = 0.0, ""
    for key, tensor in model.state_dict().items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # (sharded)
        if local.is_floating_point() and local.numel():
            top = float(local.detach().abs().max())
            if not top <= worst:  # NaN wins too
                worst, name = top, key
            if math.isnan(worst):
                break
    largest = (f"NaN in {name}" if math.isnan(worst)
               else f"largest |weight| {worst:.3g}, in {name}")
    if resumed_from is None:
        return (f"{where}, before any update: the initial weights or the first batch give a "
                f"non-finite loss ({largest}), not the lr")
    return (f"{where}, before any update of this run: the weights of its checkpoint "
            f"step-{resumed_from:08d} (in {run_dir / 'checkpoints'}) give a "
            f"non-finite loss ({largest}); they are broken, not the lr: continue from an "
            "earlier checkpoint or train afresh")
