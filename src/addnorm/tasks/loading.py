"""``addnorm.load``: a model saved either way, ready for inference.

A folder holds a model in one of two layouts: a pretrained directory (``config.json`` +
``model.safetensors``, written by ``save_pretrained``; :mod:`addnorm.pretrained`) or a run
written by ``addnorm train`` (its checkpoints; :func:`addnorm.tasks.run.load_trained`
rebuilds the model through its task). Knowing both, this function sits above the tasks;
``addnorm/__init__.py`` exports it without importing the tasks until it is first called.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from addnorm._checks import check_choice
from addnorm.pretrained import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    PretrainedMixin,
    check_device,
    check_dtype,
    check_path,
    for_inference,
)
from addnorm.safe_files import CheckpointError
from addnorm.tasks.run import WEIGHTS, load_trained
from addnorm.training.checkpoint import MANIFEST, list_checkpoints

__all__ = ["load"]


def load(
    path: str | os.PathLike,
    *,
    weights: str = "ema",
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """The model in ``path``, ready for inference (eval mode).

    ``path`` is a pretrained directory (``config.json`` + ``model.safetensors``, from
    ``save_pretrained``), or a run directory or one of its checkpoints written by
    ``addnorm train``. From a run, ``weights="ema"`` (the default) loads the exponential moving
    average of the weights when the run kept one (what a finished run was scored with) and the
    trained weights otherwise; ``"raw"`` always loads the trained weights. A pretrained
    directory holds one set of weights, which either choice loads. ``dtype`` and ``device`` as
    in :meth:`~addnorm.pretrained.PretrainedMixin.from_pretrained`.

    Raises:
        CheckpointError: ``path`` holds neither, or what it holds is missing or damaged.
    """
    check_choice("weights", weights, WEIGHTS)
    dtype = check_dtype(dtype)
    device = check_device(device)
    directory = check_path(path)
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is a file, not a directory"
        raise CheckpointError(f"cannot load {directory}: it {what}")
    if os.path.lexists(directory / CONFIG_FILE):  # a dangling symlink is named, not skipped
        model: Any = PretrainedMixin.from_pretrained(directory, dtype=dtype, device=device)
        return model
    if not (directory / MANIFEST).exists() and not list_checkpoints(directory):
        raise CheckpointError(
            f"{directory} holds no addnorm model: expected {CONFIG_FILE} and {WEIGHTS_FILE} "
            f"(save_pretrained), or a run or checkpoint of addnorm train ({MANIFEST} or "
            f"checkpoints/step-*/{MANIFEST})"
        )
    _, model, _ = load_trained(directory, weights=weights)
    return for_inference(model, dtype=dtype, device=device)
