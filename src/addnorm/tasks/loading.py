"""``addnorm.load``: a model saved any way addnorm reads, ready for inference.

A folder holds a model in one of five layouts: a pretrained directory (``config.json`` +
``model.safetensors``, written by ``save_pretrained``; :mod:`addnorm.pretrained.mixin`), a folder
that Hugging Face transformers' ``save_pretrained`` wrote (BERT or GPT-2, converted:
:func:`~addnorm.interop.hf_folder.from_transformers_folder`), one that diffusers'
``save_pretrained`` wrote (a ``DiTTransformer2DModel``, converted:
:func:`~addnorm.interop.diffusers_folder.from_diffusers_folder`), a diffusers DiT pipeline
(``model_index.json``: DiT, VAE, scheduler, class names;
:func:`~addnorm.interop.diffusers_pipeline.from_diffusers_pipeline`), or a run written
by ``addnorm train`` (its checkpoints; :func:`addnorm.tasks.trained.load_trained` rebuilds the
model through its task: a run's best checkpoint when it kept one,
:mod:`addnorm.training.best_checkpoints`, unless ``which="last"`` asks for its newest).
Knowing all five, this function sits above the tasks; ``addnorm/__init__.py`` exports it
without importing the tasks until it is first called.

Types: which class a folder holds is known only when it is read, so ``load(path)`` is typed
``Any``: ``addnorm.load(path).generate(ids)`` type-checks (under ``mypy --strict`` too) and
is checked when it runs. Name the class to have a type checker check the calls as well:
``addnorm.load(path, TransformerLM)`` is typed ``TransformerLM``, and refuses a folder that
holds another class (before building it, for the two pretrained layouts).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar, overload

import torch
from torch import nn

from addnorm.interop.diffusers_folder import (
    PIPELINE_INDEX,
    diffusers_class_of,
    from_diffusers_folder,
    is_diffusers_config,
)
from addnorm.interop.diffusers_pipeline import from_diffusers_pipeline
from addnorm.interop.dit_pipeline import DiTPipeline
from addnorm.interop.hf_folder import (
    from_transformers_folder,
    transformers_class_of,
)
from addnorm.pretrained.files import CONFIG_FILE, WEIGHTS_FILE, read_config_json
from addnorm.pretrained.mixin import (
    PretrainedMixin,
    check_device,
    check_dtype,
    check_path,
    for_inference,
)
from addnorm.tasks.trained import WEIGHTS, load_trained
from addnorm.training.best_checkpoints import WHICH, pick_checkpoint
from addnorm.training.checkpoint import MANIFEST, list_checkpoints
from addnorm.utils.checks import check_choice
from addnorm.utils.files import CheckpointError

__all__ = ["load"]

_M = TypeVar("_M", bound=nn.Module)


@overload
def load(
    path: str | os.PathLike[str],
    cls: None = None,
    *,
    weights: str = "ema",
    which: str = "best",
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> Any: ...


@overload
def load(
    path: str | os.PathLike[str],
    cls: type[_M],
    *,
    weights: str = "ema",
    which: str = "best",
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> _M: ...


def load(
    path: str | os.PathLike[str],
    cls: type[nn.Module] | None = None,
    *,
    weights: str = "ema",
    which: str = "best",
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> Any:
    """The model in ``path``, ready for inference (eval mode).

    ``path`` is a pretrained directory (``config.json`` + ``model.safetensors``, from
    ``save_pretrained``), a folder of Hugging Face transformers' ``save_pretrained`` whose
    ``config.json`` names a ``model_type`` addnorm converts ("bert": an
    :class:`~addnorm.transformer.encoder_model.EncoderModel`; "gpt2": a
    :class:`~addnorm.transformer.lm.TransformerLM`), a folder of diffusers'
    ``save_pretrained`` whose ``config.json`` names the ``_class_name``
    "DiTTransformer2DModel" (a :class:`~addnorm.dit.model.DiT`, as
    :func:`~addnorm.interop.diffusers.from_diffusers` converts it), a diffusers DiT pipeline
    folder (``model_index.json``; a :class:`~addnorm.interop.dit_pipeline.DiTPipeline`:
    ``load(path).sample(labels)`` draws decoded images; its VAE needs diffusers), or a run
    directory or one of its checkpoints written by ``addnorm train``: a run's best checkpoint
    when it kept one (``keep_best``; ``which="last"``: its newest periodic checkpoint instead;
    a run without a best loads its newest either way). From a run, ``weights="ema"`` (the
    default) loads
    the exponential moving average of the weights when the run kept one (what a finished run
    was scored with) and the trained weights otherwise; ``"raw"`` always loads the trained
    weights. A pretrained directory holds one set of weights, which either choice loads.
    ``dtype`` and ``device`` as in
    :meth:`~addnorm.pretrained.mixin.PretrainedMixin.from_pretrained`.

    ``cls`` (optional): the class the caller expects, e.g. ``TransformerLM``; the result is
    typed as it (without it, ``Any``: see the module docstring), and a folder holding another
    class is refused.

    Raises:
        CheckpointError: ``path`` holds none of these, what it holds is missing or damaged,
            or it holds a model that is not a ``cls`` (a pipeline folder whose parts do not
            fit: its subclass ``PipelinePartError``).
        TypeError: ``cls`` is not an ``nn.Module`` class.
        ImportError: a pipeline folder, and diffusers (for its VAE) is not installed.
    """
    if cls is not None and not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"cls must be an nn.Module class or None, got {cls!r}")
    check_choice("weights", weights, WEIGHTS)
    check_choice("which", which, WHICH)
    dtype = check_dtype(dtype)
    device = check_device(device)
    directory = check_path(path)
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is a file, not a directory"
        raise CheckpointError(f"cannot load {directory}: it {what}")
    if os.path.lexists(directory / CONFIG_FILE):  # a dangling symlink is named, not skipped
        model = _load_pretrained(directory, cls, dtype=dtype, device=device)
    elif (directory / PIPELINE_INDEX).is_file():
        if cls is not None and not issubclass(DiTPipeline, cls):
            raise CheckpointError(
                f"{directory} is a diffusers pipeline, which loads as a DiTPipeline, not "
                f"{cls.__name__}; its DiT alone is {directory / 'transformer'}"
            )
        model = from_diffusers_pipeline(directory, dtype=dtype, device=device)
    elif not (directory / MANIFEST).exists() and not list_checkpoints(directory):
        raise CheckpointError(
            f"{directory} holds no addnorm model: expected {CONFIG_FILE} and {WEIGHTS_FILE} "
            f"(save_pretrained, addnorm's or transformers'), or a run or checkpoint of addnorm "
            f"train ({MANIFEST} or checkpoints/step-*/{MANIFEST})"
        )
    else:
        _, trained, _ = load_trained(pick_checkpoint(directory, which)[0], weights=weights)
        model = for_inference(trained, dtype=dtype, device=device)
    if cls is not None and not isinstance(model, cls):
        raise CheckpointError(f"{directory} holds a {type(model).__name__}, not a {cls.__name__}")
    return model


def _load_pretrained(
    directory: Path,
    cls: type[nn.Module] | None,
    *,
    dtype: torch.dtype | None,
    device: torch.device | None,
) -> nn.Module:
    """The model of a folder with a ``config.json``: addnorm's layout (``addnorm_class``),
    transformers' (``model_type``) or diffusers' (``_class_name``); a ``cls`` it does not hold
    is refused before building."""
    config = read_config_json(directory)
    if is_diffusers_config(config):
        dit = diffusers_class_of(config, directory / CONFIG_FILE)
        if cls is not None and not issubclass(dit, cls):
            raise CheckpointError(
                f"{directory} holds a diffusers {config['_class_name']} that loads as "
                f"{dit.__name__}, not {cls.__name__}"
            )
        return from_diffusers_folder(directory, dtype=dtype, device=device)
    if "addnorm_class" not in config and "model_type" in config:
        target = transformers_class_of(config, directory / CONFIG_FILE)
        if cls is not None and not issubclass(target, cls):
            raise CheckpointError(
                f"{directory} holds a Hugging Face model (model_type "
                f"{config['model_type']!r}) that loads as {target.__name__}, not {cls.__name__}"
            )
        return from_transformers_folder(directory, dtype=dtype, device=device)
    if "addnorm_class" not in config:
        raise CheckpointError(
            f"{directory / CONFIG_FILE} must name the model in 'addnorm_class' (a folder of "
            "addnorm's save_pretrained), 'model_type' (one of transformers') or '_class_name' "
            "(one of diffusers')"
        )
    loader = cls if cls is not None and issubclass(cls, PretrainedMixin) else PretrainedMixin
    model: Any = loader.from_pretrained(directory, dtype=dtype, device=device)
    return model
