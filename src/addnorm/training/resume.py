"""Whether a checkpoint fits the model and trainer that would continue it, checked before
anything is loaded: the names and shapes of its weights, its EMA and its optimizer state.

The manifest's hashes (:mod:`addnorm.training.checkpoint`) catch damage; these checks catch
a checkpoint resealed after editing, or one of another model, with one ``CheckpointError``
line naming the file and the tensor or entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from addnorm.training.checkpoint import LoadedCheckpoint
from addnorm.training.config import TrainConfig
from addnorm.training.optimizer import make_optimizer
from addnorm.training.state import check_optimizer_parts
from addnorm.utils.files import CheckpointError

__all__ = ["check_checkpoint_fits", "refusing"]


def check_checkpoint_fits(
    model: nn.Module,
    config: TrainConfig,
    checkpoint: LoadedCheckpoint,
    *,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Raise ``CheckpointError`` naming the file and the tensor of ``checkpoint`` that does not
    fit ``model`` trained with ``config`` (its weights, EMA and optimizer state: names and
    shapes), loading nothing. ``model`` may live on the meta device (the CLI checks a resume
    so before it builds anything); ``optimizer``: the one in use (default: a fresh
    ``make_optimizer``, whose parameter order is the same)."""
    own = {  # (sharded: DTensors, whose shapes are the whole tensors')
        name.replace("_checkpoint_wrapped_module.", ""): value
        for name, value in model.state_dict().items()
    }
    for stem in ("model", "ema") if config.ema_decay > 0 else ("model",):
        if stem not in checkpoint.tensors:
            raise CheckpointError(f"{checkpoint.path} has no {stem}.safetensors")
        with refusing(checkpoint.path / f"{stem}.safetensors"):
            _check_shapes(stem, own, checkpoint.tensors[stem])
    with refusing(checkpoint.path / "optimizer.safetensors"):
        check_optimizer_parts(
            optimizer or make_optimizer(model, config),
            checkpoint.tensors["optimizer"],
            checkpoint.state["optimizer"],
        )


@contextlib.contextmanager
def refusing(path: Path) -> Iterator[None]:
    """Turn what loading a checkpoint's part raises (a tensor that does not fit, an entry that
    is missing or of the wrong type) into one ``CheckpointError`` line naming ``path``."""
    try:
        yield
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, KeyError):
            reason = f"no entry {reason}"
        raise CheckpointError(f"{path} does not fit this run: {reason}") from None


def _check_shapes(
    what: str, expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]
) -> None:
    """Raise ValueError naming the first tensor of ``got`` whose shape (or presence) differs
    from ``expected``'s (``load_state_dict`` alone would broadcast an EMA copy)."""
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{what} tensors differ: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for name, tensor in got.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{what} tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                f"{tuple(expected[name].shape)}"
            )
