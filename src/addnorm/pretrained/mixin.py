"""Models on disk for inference: ``save_pretrained`` / ``from_pretrained``.

A pretrained directory holds two files, the layout Hugging Face users know:

- ``config.json``: ``{"addnorm_class": "TransformerLM", "config": {...}, "addnorm_version":
  "0.1.0", ...}``, where ``config`` is the model config's ``to_dict()`` (read back with its
  ``from_dict()``, which refuses unknown fields). For the tools of the Hugging Face ecosystem,
  which look for them, it also says what it holds: ``"model_type": "addnorm-transformer-lm"``
  (``addnorm-`` and the class name: a type no transformers architecture has, so
  ``AutoConfig.from_pretrained`` refuses the folder by that name instead of misreading it),
  ``"architectures": ["TransformerLM"]`` and a ``"note"`` on how to load it. Reading ignores
  these three keys, so folders written before them load as ever;
- ``model.safetensors``: the state dict, each tensor stored once. Tied weights (a
  ``TransformerLM`` whose ``to_logits`` reuses the embedding table) are saved under their first
  name only and tied again on loading.

``PretrainedMixin.from_pretrained`` opens such a directory (any registered class through the
mixin itself) and returns the model in eval mode; ``addnorm.load``
(:mod:`addnorm.tasks.loading`) opens it too, or a run written by ``addnorm train``, which needs
the tasks above, or a folder of Hugging Face transformers' ``save_pretrained``
(:func:`addnorm.interop.hf_folder.from_transformers_folder`, which reads it with
the same checked steps, those of :mod:`addnorm.pretrained.files`: ``read_config_json``,
``read_weights_header``, ``check_size``, ``check_fits``, ``read_weights``, ``load_state``). Every
failure to read a directory raises :class:`~addnorm.utils.files.CheckpointError` naming the file
and what is wrong with it (the CLI turns it into exit status 1); bad arguments raise
``TypeError`` / ``ValueError``.

This module sits below training: it imports the parts and helpers under it
(:mod:`addnorm.utils.files`, :mod:`addnorm.utils.memory`) and nothing of training or the tasks.

Loading trusts neither file, and refuses a tampered directory before it allocates the model:

- both files must be regular files (or symlinks to one): a directory, FIFO or device is
  refused without being opened (:mod:`addnorm.utils.files`);
- ``config.json`` may have at most ``MAX_JSON_BYTES`` bytes and ``MAX_JSON_DEPTH`` levels of nesting
  (``parse_json``, as the run format); its fields are checked by the config's ``from_dict``;
- the weights' safetensors header is read first (names, dtypes, shapes; no data). Before the
  model is built, its size is estimated from the config (its ``count_parameters()`` and
  ``count_buffers()``; for a config without them, a build on the ``meta`` device, which
  allocates nothing) and refused when the model would hold more numbers than the weights
  file (a config edited to a larger model; twice as many for the estimate, which may be off
  by that much), compute tables (position codes) larger than both the weights file and
  ``MAX_COMPUTED_NUMBERS``, have more than ``MAX_LAYERS`` layers per stack, or need more than
  the memory available; the message names the setting that makes it large;
- then every tensor's name, shape and dtype is checked against the built model, still before
  any data is read: a floating parameter takes any floating dtype (converted on loading),
  never an integer or bool one; other tensors take their own dtype only.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors.torch import save_file
from torch import nn

from addnorm._version import __version__
from addnorm.pretrained.files import (
    CONFIG_FILE,
    MAX_COMPUTED_NUMBERS,
    WEIGHTS_FILE,
    check_fits,
    check_size,
    load_state,
    read_addnorm_config,
    read_weights,
    read_weights_header,
    state_dict_without_aliases,
)
from addnorm.utils.files import CheckpointError, write_file_atomic

# The folder's file names and the size bound live with the file steps; re-exported here, the
# module users know, as ``state_dict_without_aliases`` is.
__all__ = [
    "CONFIG_FILE",
    "MAX_COMPUTED_NUMBERS",
    "WEIGHTS_FILE",
    "PretrainedMixin",
    "check_device",
    "check_dtype",
    "check_path",
    "for_inference",
    "model_type_of",
    "state_dict_without_aliases",
]

_REGISTRY: dict[str, type[PretrainedMixin]] = {}

_M = TypeVar("_M", bound="PretrainedMixin")


class PretrainedMixin:
    """``save_pretrained(path)`` and ``from_pretrained(path)`` for a model built from one config.

    How a model class adopts it:

    1. list it among the bases: ``class TransformerLM(PretrainedMixin, nn.Module)``;
    2. set the class attribute ``config_class`` to its frozen config dataclass (one with
       ``to_dict()`` and ``from_dict()``, as every addnorm config has): ``config_class =
       LMConfig``;
    3. keep that config as ``self.cfg`` and accept it as the one positional argument of
       ``__init__``: ``TransformerLM(cfg)`` rebuilds the model;
    4. optionally define ``tie_weights()``; it is called after loading, so parameters that are
       shared (saved once) are shared again.

    Each adopting class, and every subclass of one, is registered by its name (the
    ``addnorm_class`` of ``config.json``), which is how :func:`load` knows which class to
    build; the class must have been imported (defined) before it is loaded.
    """

    config_class: ClassVar[Any]  # the config dataclass: ``from_dict`` builds one
    cfg: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "config_class", None) is None:
            return
        registered = _REGISTRY.get(cls.__name__)
        if registered is not None and issubclass(cls, registered):
            # A same-named subclass is a proxy that tracing makes (torch.export's module-stack
            # tracer subclasses each module's class under its name): keep the real class.
            return
        _REGISTRY[cls.__name__] = cls  # a subclass inherits its parent's config_class

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into the directory ``path``.

        The directory is created if missing; files of an earlier save there are replaced
        (each written to a temporary name first, so a failed write leaves the old one).
        Tensors are saved from wherever they are, as they are (dtype kept), each once.
        Returns the directory.
        """
        if not isinstance(self, nn.Module):
            raise TypeError(f"{type(self).__name__} must be an nn.Module to be saved")
        directory = check_path(path)
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"path must be a directory, got the file {directory}")
        class_name = type(self).__name__
        config = {
            "addnorm_class": class_name,
            "addnorm_version": __version__,
            "config": self.cfg.to_dict(),
            # What the folder holds, for Hugging Face's tools (ignored when read back).
            "model_type": model_type_of(class_name),
            "architectures": [class_name],
            "note": _NOTE.format(name=class_name),
        }
        tensors = {  # CPU copies, each shared tensor once
            name: tensor.detach().to("cpu", copy=True).contiguous()
            for name, tensor in state_dict_without_aliases(self).items()
        }
        directory.mkdir(parents=True, exist_ok=True)
        metadata = {"format": "pt"}  # what Hugging Face's loaders expect to find
        write_file_atomic(directory / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp, metadata))
        text = json.dumps(config, indent=1, sort_keys=True) + "\n"
        write_file_atomic(directory / CONFIG_FILE, lambda tmp: tmp.write_text(text, "utf-8"))
        return directory

    @classmethod
    def from_pretrained(
        cls: type[_M],
        path: str | os.PathLike,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
    ) -> _M:
        """The model saved in ``path`` by :meth:`save_pretrained`, in eval mode.

        Args:
            dtype: the floating-point dtype of the parameters and buffers (a ``torch.dtype``
                or its name, ``"bfloat16"``); None (or ``"auto"``) keeps the saved one when
                all saved floating tensors share it, else float32.
            device: where the model goes (default: the CPU).
        Raises:
            CheckpointError: the directory or a file is missing, ``config.json`` is not valid
                JSON or names another class or a bad config, or the weights do not fit the
                model (naming the missing and unexpected keys, the mismatched shapes and the
                dtypes that cannot load), or the config describes a model larger than its
                weights file or than memory (naming the setting). Problems of the files and
                the config are found before the model is built, and problems of the tensors
                before their data is read.
        """
        dtype = check_dtype(dtype)
        device = check_device(device)
        directory = check_path(path)
        name, config = read_addnorm_config(directory)
        target = _REGISTRY.get(name)
        if target is None:
            known = sorted(_REGISTRY)
            raise CheckpointError(
                f"{directory / CONFIG_FILE}: unknown addnorm_class {name!r}; known: {known}"
            )
        if not issubclass(target, cls):
            raise CheckpointError(
                f"{directory / CONFIG_FILE} holds a {name}, not a {cls.__name__}; "
                f"use {name}.from_pretrained or addnorm.load"
            )
        try:
            cfg = target.config_class.from_dict(config)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{directory / CONFIG_FILE}: bad {name} config: {err}") from None
        weights = directory / WEIGHTS_FILE
        saved = read_weights_header(weights)
        check_size(target, cfg, saved, directory)  # before anything is allocated
        model: Any = target(cfg)  # type: ignore[call-arg]
        check_fits(model, saved, weights)  # before any data is read
        saved_dtype = load_state(model, read_weights(weights, saved))
        return for_inference(model, dtype=dtype or saved_dtype, device=device)


def model_type_of(class_name: str) -> str:
    """The ``model_type`` that ``save_pretrained`` writes for an addnorm class:
    ``"addnorm-"`` and the class name in lower case, split at words (``TransformerLM`` ->
    ``"addnorm-transformer-lm"``, ``DiT`` -> ``"addnorm-dit"``)."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z]|[A-Z]{2})", "-", class_name)
    return "addnorm-" + words.lower()


_NOTE = (
    "An addnorm {name}, not a transformers model: load it with addnorm.load(path) (the addnorm "
    "package); addnorm.to_transformers converts the families that transformers has "
    "(EncoderModel to BertModel, TransformerLM to GPT2LMHeadModel)."
)


def for_inference(
    model: nn.Module, *, dtype: torch.dtype | None, device: torch.device | None
) -> Any:
    """The model on ``device`` in ``dtype`` (floating tensors only; None: as it is), in eval
    mode."""
    if dtype is not None:
        model = model.to(dtype=dtype)
    if device is not None:
        model = model.to(device=device)
    return model.eval()


def check_path(path: object) -> Path:
    """``path`` (a str or os.PathLike) as a Path; TypeError otherwise."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def check_dtype(dtype: object) -> torch.dtype | None:
    """None, ``"auto"`` (both: the saved dtype), a floating ``torch.dtype`` or its name."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"dtype {dtype!r} names no torch dtype (e.g. 'float32', 'bfloat16')")
        dtype = found
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, its name or None, got {dtype!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    return dtype


def check_device(device: object) -> torch.device | None:
    """None, or a ``torch.device`` from a str or device; TypeError / ValueError otherwise."""
    if device is None:
        return None
    if not isinstance(device, str | torch.device):
        raise TypeError(f"device must be a str, a torch.device or None, got {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a torch device: {err}") from None
