"""The files of a pretrained folder, read without trusting them.

``config.json`` and ``model.safetensors`` (the layout of :mod:`addnorm.pretrained.mixin`), and the
steps that open them, shared by addnorm's own folders
(:meth:`~addnorm.pretrained.mixin.PretrainedMixin.from_pretrained`) and Hugging Face transformers'
(:mod:`addnorm.interop.hf_folder`): :func:`read_config_json`,
:func:`read_weights_header`, :func:`check_size` (before the model is built), :func:`check_fits`
(before any data is read), :func:`read_weights`, :func:`load_state`. What each refuses, and
why, is in :mod:`addnorm.pretrained.mixin`'s docstring. Tied tensors are stored once
(:func:`state_dict_without_aliases`) and tied again on loading.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from addnorm.utils.files import (
    MAX_JSON_BYTES,
    CheckpointError,
    TensorInfo,
    UnsafeFileError,
    parse_json,
    read_safetensors_header,
    read_text,
)
from addnorm.utils.memory import MAX_LAYERS, available_memory, format_bytes

__all__ = [
    "CONFIG_FILE",
    "MAX_COMPUTED_NUMBERS",
    "WEIGHTS_FILE",
    "check_fits",
    "check_size",
    "load_state",
    "read_addnorm_config",
    "read_config_json",
    "read_weights",
    "read_weights_header",
    "state_dict_without_aliases",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Numbers a model may compute when built (position tables, absent from the weights file)
# beyond the numbers its weights file holds: 2**25 float32 numbers are 128 MiB, more than the
# tables of any model of this package (a sinusoid of 32768 rows x 1024 wide).
MAX_COMPUTED_NUMBERS = 2**25
_BEYOND_TORCH = 2**63  # a tensor of more elements than an int64 counts cannot be built


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


def read_weights_header(path: Path) -> dict[str, TensorInfo]:
    """The weights file's tensors (names, dtypes, shapes) from its header; no data is read.

    Raises:
        CheckpointError: the file is missing, not a regular file, or its header is damaged.
    """
    try:
        return read_safetensors_header(path, what="pretrained weights")
    except FileNotFoundError:
        raise CheckpointError(f"pretrained weights missing: {path}") from None
    except UnsafeFileError as err:
        raise CheckpointError(f"cannot read {err}") from None


def check_size(
    target: type,
    cfg: Any,
    saved: dict[str, TensorInfo],
    directory: Path,
    *,
    names: Mapping[str, str] | None = None,
) -> None:
    """Refuse, before anything is allocated, a config whose model would hold more numbers
    than the weights file (a config edited to a larger model), compute tables far larger than
    it, have more than ``MAX_LAYERS`` layers per stack, or not fit in memory.

    ``saved`` is the weights file's header; ``names`` maps the config's field names to those
    ``config.json`` spells (a Hugging Face config's ``hidden_size`` for ``d_model``), for the
    message. Raises :class:`CheckpointError` naming the setting.
    """
    where = directory / CONFIG_FILE
    spelled = names or {}
    for field in _fields(cfg):
        value = getattr(cfg, field.name)
        if field.name.endswith("layers") and isinstance(value, int) and value > MAX_LAYERS:
            raise CheckpointError(
                f"{where}: {spelled.get(field.name, field.name)} ({value}) is more than "
                f"{MAX_LAYERS} layers per stack"
            )
    stored = sum(info.numel for info in saved.values())
    estimate, exact = _size_estimate(target, cfg)
    slack = 1 if exact else 2
    params, computed = estimate(cfg)
    if params > slack * stored:
        margin = "" if exact else " times 2 (the estimate's margin)"
        raise CheckpointError(
            f"{where}: its {target.__name__} would hold {_numbers(params)}, more than the "
            f"{_numbers(stored)} of {directory / WEIGHTS_FILE}{margin}: the config was "
            f"edited or belongs to other weights{_blame(cfg, lambda c: estimate(c)[0], spelled)}"
        )
    if computed > max(stored, MAX_COMPUTED_NUMBERS):
        raise CheckpointError(
            f"{where}: its {target.__name__} would compute tables (position codes) of "
            f"{_numbers(computed)}, more than its stored numbers and than "
            f"{MAX_COMPUTED_NUMBERS}{_blame(cfg, lambda c: estimate(c)[1], spelled)}"
        )
    limit = available_memory("cpu")
    if limit is not None and 4 * (params + computed) > limit:
        raise CheckpointError(
            f"{where}: its {target.__name__} would hold {_numbers(params + computed)}, more "
            f"than the {format_bytes(limit)} of memory available"
            f"{_blame(cfg, lambda c: sum(estimate(c)), spelled)}"
        )


def _numbers(n: int) -> str:
    """``"1.2e+07 numbers (48 MB in float32)"``; sizes beyond int64 are not spelled out."""
    if n >= _BEYOND_TORCH:
        return f"more than {_BEYOND_TORCH:.3g} numbers (beyond torch's int64 sizes)"
    return f"{n:.3g} numbers ({format_bytes(4 * n)} in float32)"


_Estimate = Callable[[Any], tuple[int, int]]


def _size_estimate(target: type, cfg: Any) -> tuple[_Estimate, bool]:
    """``(estimate, exact)``: ``estimate(cfg)`` is ``(stored numbers, computed numbers)`` of
    ``target(cfg)``: its parameters and persistent buffers (what its weights file holds),
    and its other buffers (position tables, computed when it is built).

    A model family describes its own size: its config's ``count_parameters()`` and
    ``count_buffers()`` count from the config alone, in microseconds, within a factor of 2
    of the exact count (``exact`` False): they count every bias and norm vector whether the
    config has them or not and leave out a gated feed-forward's second bias, at most one
    number per weight either way (a bias of D per D x D or D x F matrix, 2 D per norm of D).
    A config without them (a user's own family) is built on the ``meta`` device (no memory
    is allocated) and counted exactly.
    """
    if not (callable(getattr(cfg, "count_parameters", None))
            and callable(getattr(cfg, "count_buffers", None))):
        return _meta_count(target), True

    def estimate(cfg: Any) -> tuple[int, int]:
        # DiT's fixed 2-D position code is stored as well: counting it as computed only
        # makes the first number smaller (the second is bounded by the file's size anyway).
        return cfg.count_parameters(), cfg.count_buffers()

    return estimate, False


def _meta_count(target: type) -> _Estimate:
    def estimate(cfg: Any) -> tuple[int, int]:
        try:
            with torch.device("meta"):
                model = target(cfg)
        except (RuntimeError, OverflowError, TypeError):  # a size beyond int64: no file has it
            return _BEYOND_TORCH, 0
        stored = sum(t.numel() for t in _unique(model.state_dict(keep_vars=True)).values())
        every = {id(t): t.numel() for t in [*model.parameters(), *model.buffers()]}
        return stored, sum(every.values()) - stored

    return estimate


def _unique(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of a ``state_dict(keep_vars=True)``, each tensor object once."""
    kept: dict[int, tuple[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        kept.setdefault(id(tensor), (key, tensor))
    return dict(kept.values())


def _blame(cfg: Any, estimate: Callable[[Any], int], names: Mapping[str, str]) -> str:
    """``"; the setting that makes it large: d_ff (10**11)"``: the int field whose default
    value shrinks ``estimate`` the most ("" if none does), spelled as ``names`` says."""
    best, best_value = None, estimate(cfg)
    for field in _fields(cfg):
        value = getattr(cfg, field.name)
        if not isinstance(value, int) or isinstance(value, bool) or value == field.default:
            continue
        try:
            smaller = estimate(dataclasses.replace(cfg, **{field.name: field.default}))
        except (TypeError, ValueError):  # the default breaks another field's constraint
            continue
        if smaller < best_value:
            best, best_value = field.name, smaller
    if best is None:
        return ""
    return f"; the setting that makes it large: {names.get(best, best)} ({getattr(cfg, best)})"


def _fields(cfg: Any) -> tuple[dataclasses.Field, ...]:
    """The fields of a config dataclass (none for a config of another kind)."""
    return dataclasses.fields(cfg) if dataclasses.is_dataclass(cfg) else ()


def check_fits(model: nn.Module, saved: dict[str, TensorInfo], path: Path) -> None:
    """Check the saved tensors' names, shapes and dtypes against ``model`` (built from the
    config), naming every problem in a :class:`CheckpointError` about ``path``; tied
    parameters may be saved under any of their names."""
    expected = model.state_dict()
    groups = _alias_groups(expected)
    missing = [names[0] for names in groups if not any(n in saved for n in names)]
    unexpected = sorted(set(saved) - set(expected))
    common = sorted(saved.keys() & expected.keys())
    shapes = [
        f"{key}: saved {saved[key].shape}, model {tuple(expected[key].shape)}"
        for key in common
        if saved[key].shape != tuple(expected[key].shape)
    ]
    dtypes = [
        f"{key}: saved {saved[key].dtype}, model {expected[key].dtype}"
        for key in common
        if not _loadable(saved[key].dtype, expected[key].dtype)
    ]
    problems = [
        f"{label} {_listed(items)}"
        for label, items in [
            ("missing keys", missing), ("unexpected keys", unexpected),
            ("mismatched shapes", shapes), ("dtypes that cannot load", dtypes),
        ]
        if items
    ]
    if problems:
        raise CheckpointError(
            f"{path} does not fit the {type(model).__name__} of its config.json: "
            + "; ".join(problems)
        )


def _loadable(saved: torch.dtype, model: torch.dtype) -> bool:
    """A floating parameter or buffer takes any floating dtype (converted on loading, as
    ``from_pretrained(dtype=...)`` documents); anything else only its own dtype."""
    if model.is_floating_point:
        return saved.is_floating_point
    return saved == model


def _listed(items: list[str], limit: int = 20) -> str:
    """``items`` as a list, cut after ``limit`` entries (a config edited to 1000 layers would
    otherwise list thousands of keys)."""
    if len(items) <= limit:
        return str(items)
    return f"{items[:limit]} and {len(items) - limit} more"


def read_weights(path: Path, header: dict[str, TensorInfo]) -> dict[str, torch.Tensor]:
    """The tensors of the weights file ``path`` (on the CPU), which must still hold what its
    ``header`` (read and checked first) says."""
    try:
        saved = load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None
    found = {key: TensorInfo(t.dtype, tuple(t.shape)) for key, t in saved.items()}
    if found != header:
        raise CheckpointError(f"{path} changed while it was read: load it again")
    return saved


def load_state(model: nn.Module, saved: dict[str, torch.Tensor]) -> torch.dtype | None:
    """Load ``saved`` (its names, shapes and dtypes checked by :func:`check_fits`) into
    ``model`` and tie its weights again; return the saved floating dtype (None when the saved
    floating tensors have several)."""
    expected = model.state_dict()
    full = {}
    for names in _alias_groups(expected):
        present = [name for name in names if name in saved]
        for name in names:
            full[name] = saved[present[0]]
    model.load_state_dict(full)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    dtypes = {t.dtype for t in saved.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _alias_groups(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """The names of ``state``, grouped by the tensor they name (a tied weight's names)."""
    groups: dict[tuple, list[str]] = {}
    for key, tensor in state.items():
        groups.setdefault(_identity(tensor), []).append(key)
    return list(groups.values())


def read_addnorm_config(directory: Path) -> tuple[str, dict]:
    """``(addnorm_class, config fields)`` of ``directory/config.json``, its structure checked."""
    data = read_config_json(directory)
    path = directory / CONFIG_FILE
    name, config = data.get("addnorm_class"), data.get("config")
    if name is None and isinstance(data.get("model_type"), str):
        raise CheckpointError(
            f"{path} is a folder of Hugging Face transformers (model_type "
            f"{_short(data['model_type'])}), not of addnorm's save_pretrained: load it with "
            "addnorm.load(path)"
        )
    if not isinstance(name, str):
        raise CheckpointError(f"{path} must name the model in 'addnorm_class', got {name!r}")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold the model's fields in a 'config' object")
    return name, config


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_config_json(directory: Path) -> dict[str, Any]:
    """The JSON object of ``directory/config.json``, read without trusting it (a regular
    file, at most ``MAX_JSON_BYTES``, nested at most ``MAX_JSON_DEPTH`` deep); its fields are
    the caller's to check.

    Raises:
        CheckpointError: the directory or the file is missing or not what it must be, or the
            file is not valid JSON or not an object.
    """
    if not directory.exists():
        raise CheckpointError(f"pretrained directory not found: {directory}")
    if not directory.is_dir():
        raise CheckpointError(f"pretrained path must be a directory, got the file {directory}")
    path = directory / CONFIG_FILE
    try:
        data = parse_json(read_text(path, max_bytes=MAX_JSON_BYTES, what="pretrained config"))
    except FileNotFoundError:
        raise CheckpointError(f"pretrained config missing: {path}") from None
    except UnsafeFileError as err:  # not a regular file, too large, not UTF-8
        raise CheckpointError(f"cannot read {err}") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from None
    except ValueError as err:  # nested too deeply, an int of too many digits
        raise CheckpointError(f"{path} is refused: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
