"""Models on disk for inference: ``save_pretrained`` / ``from_pretrained`` and ``load``.

A pretrained directory holds two files, the layout Hugging Face users know:

- ``config.json``: ``{"addnorm_class": "TransformerLM", "config": {...}, "addnorm_version":
  "0.1.0"}``, where ``config`` is the model config's ``to_dict()`` (read back with its
  ``from_dict()``, which refuses unknown fields);
- ``model.safetensors``: the state dict, each tensor stored once. Tied weights (a
  ``TransformerLM`` whose ``to_logits`` reuses the embedding table) are saved under their first
  name only and tied again on loading.

:func:`load` opens such a directory, or a run or checkpoint directory written by
``addnorm train``, and returns the model in eval mode. Every failure to read a directory raises
:class:`~addnorm.training.checkpoint.CheckpointError` naming the file and what is wrong with it
(the CLI turns it into exit status 1); bad arguments raise ``TypeError`` / ``ValueError``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from addnorm._checks import check_choice
from addnorm.training.checkpoint import (
    MANIFEST,
    CheckpointError,
    list_checkpoints,
    write_file_atomic,
)

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "PretrainedMixin", "load", "state_dict_without_aliases"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
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
        from addnorm import __version__

        if not isinstance(self, nn.Module):
            raise TypeError(f"{type(self).__name__} must be an nn.Module to be saved")
        directory = _check_path(path)
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"path must be a directory, got the file {directory}")
        config = {
            "addnorm_class": type(self).__name__,
            "addnorm_version": __version__,
            "config": self.cfg.to_dict(),
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
                model (naming the missing and unexpected keys and the mismatched shapes).
        """
        dtype = _check_dtype(dtype)
        device = _check_device(device)
        directory = _check_path(path)
        name, config = _read_config(directory)
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
        model: Any = target(cfg)  # type: ignore[call-arg]
        saved_dtype = _load_weights(model, directory / WEIGHTS_FILE)
        return _ready(model, dtype=dtype or saved_dtype, device=device)


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
    in :meth:`PretrainedMixin.from_pretrained`.

    Raises:
        CheckpointError: ``path`` holds neither, or what it holds is missing or damaged.
    """
    check_choice("weights", weights, ("ema", "raw"))
    dtype = _check_dtype(dtype)
    device = _check_device(device)
    directory = _check_path(path)
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is a file, not a directory"
        raise CheckpointError(f"cannot load {directory}: it {what}")
    if (directory / CONFIG_FILE).exists():
        model: Any = PretrainedMixin.from_pretrained(directory, dtype=dtype, device=device)
        return model
    if not (directory / MANIFEST).exists() and not list_checkpoints(directory):
        raise CheckpointError(
            f"{directory} holds no addnorm model: expected {CONFIG_FILE} and {WEIGHTS_FILE} "
            f"(save_pretrained), or a run or checkpoint of addnorm train ({MANIFEST} or "
            f"checkpoints/step-*/{MANIFEST})"
        )
    from addnorm.tasks.run import load_trained  # the tasks import the models: load lazily

    _, model, _ = load_trained(directory, weights=weights)
    return _ready(model, dtype=dtype, device=device)


def state_dict_without_aliases(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with each tied alias left out: the first name of a shared
    tensor is kept (``embed.tokens.weight``, not ``to_logits.weight``).

    ``safetensors.torch.save_file`` refuses tensors that share memory; this dict it accepts.
    Load it back with ``load_state_dict(sd, strict=False)`` and then the model's
    ``tie_weights()`` (:meth:`PretrainedMixin.from_pretrained` does both).
    """
    seen: set[tuple] = set()
    kept = {}
    for name, tensor in module.state_dict().items():
        identity = _identity(tensor)
        # Empty and meta tensors have no storage to share: never treat them as aliases.
        if tensor.device.type != "meta" and tensor.numel() and identity in seen:
            continue
        seen.add(identity)
        kept[name] = tensor
    return kept


def _identity(tensor: torch.Tensor) -> tuple:
    """Equal for two state-dict entries that are the same tensor (a tied parameter)."""
    return (
        tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
        tuple(tensor.shape), tensor.stride(), tensor.dtype,
    )


def _load_weights(model: nn.Module, path: Path) -> torch.dtype | None:
    """Load ``path`` into ``model`` after checking its keys and shapes; return the saved
    floating dtype (None when the saved floating tensors have several)."""
    if not path.is_file():
        raise CheckpointError(f"pretrained weights missing: {path}")
    try:
        saved = load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None
    expected = model.state_dict()
    groups: dict[tuple, list[str]] = {}
    for key, tensor in expected.items():
        groups.setdefault(_identity(tensor), []).append(key)
    full, missing = {}, []
    for names in groups.values():
        found = [name for name in names if name in saved]
        if not found:
            missing.append(names[0])
        for name in names:
            full[name] = saved[found[0]] if found else expected[name]
    unexpected = sorted(set(saved) - set(expected))
    shapes = [
        f"{key}: saved {tuple(saved[key].shape)}, model {tuple(expected[key].shape)}"
        for key in saved.keys() & expected.keys()
        if saved[key].shape != expected[key].shape
    ]
    problems = [
        f"{label} {items}"
        for label, items in [
            ("missing keys", missing), ("unexpected keys", unexpected),
            ("mismatched shapes", sorted(shapes)),
        ]
        if items
    ]
    if problems:
        raise CheckpointError(
            f"{path} does not fit the {type(model).__name__} of its config.json: "
            + "; ".join(problems)
        )
    model.load_state_dict(full)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    dtypes = {t.dtype for t in saved.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _ready(
    model: nn.Module, *, dtype: torch.dtype | None, device: torch.device | None
) -> Any:
    """The model on ``device`` in ``dtype`` (floating tensors only), in eval mode."""
    if dtype is not None:
        model = model.to(dtype=dtype)
    if device is not None:
        model = model.to(device=device)
    return model.eval()


def _read_config(directory: Path) -> tuple[str, dict]:
    """``(addnorm_class, config fields)`` of ``directory/config.json``, its structure checked."""
    if not directory.exists():
        raise CheckpointError(f"pretrained directory not found: {directory}")
    if not directory.is_dir():
        raise CheckpointError(f"pretrained path must be a directory, got the file {directory}")
    path = directory / CONFIG_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"pretrained config missing: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    name, config = data.get("addnorm_class"), data.get("config")
    if not isinstance(name, str):
        raise CheckpointError(f"{path} must name the model in 'addnorm_class', got {name!r}")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold the model's fields in a 'config' object")
    return name, config


def _check_path(path: object) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def _check_dtype(dtype: object) -> torch.dtype | None:
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


def _check_device(device: object) -> torch.device | None:
    if device is None:
        return None
    if not isinstance(device, str | torch.device):
        raise TypeError(f"device must be a str, a torch.device or None, got {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a torch device: {err}") from None
