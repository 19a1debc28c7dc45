"""Argument validation at the public boundary.

Every public function and constructor checks its inputs with these helpers, so a bad value
raises a ``ValueError``/``TypeError`` that names the offending argument and value, instead of
a NaN, a silently wrong shape or a stack trace from deep inside torch.

Two kinds of check, two places (docs/design.md, "Validation"):

- *Structure* (type, rank, sizes, dtype) costs a few attribute reads and no tensor values:
  every public module checks the structure of what it is given, on every call, as torch.nn's
  modules do; a prebuilt :class:`~addnorm.attention_mask.AttentionMask` or cache is trusted.
- *Values* (ids inside the vocabulary, finite timesteps, the layout of padding) need a read
  back from the tensor, a host synchronisation on an accelerator: they are checked where
  values enter, once, at a model's top-level call, ``start``/``generate``, the public
  functions, ``load`` and the CLI, never inside a part's forward.

A frozen config validates its fields once, when it is built. Every part (a norm, an
attention, a feed-forward block, an Add & Norm) has one constructor, its ``__init__``, which
checks its arguments, whoever calls it: the layers build their parts from a config's fields
through the same constructors (or ``make_norm`` / ``make_feedforward``) a user calls, so a
subclass's ``__init__`` runs on every path. These checks cost a few attribute reads per part,
once, when the module is built.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from collections.abc import Container, Sequence
from typing import Any

import torch

__all__ = [
    "assert_in_graph",
    "check_bool",
    "check_bool_mask",
    "check_choice",
    "check_dtype",
    "check_float",
    "check_int",
    "check_known_fields",
    "check_norm_input",
    "check_positions",
    "check_probability",
    "check_tensor",
    "check_weight_dtype",
    "refuse_tracing",
    "same_shape",
]


def check_int(name: str, value: object, *, min_value: int | None = None) -> int:
    """Return ``value`` as a Python int, or raise if it is not an integer >= ``min_value``.

    Any ``numbers.Integral`` is accepted (Python and NumPy integers) and converted with
    ``operator.index``; bools, floats (even whole ones) and tensors are refused.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    value = operator.index(value)
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {value}")
    return value


def check_float(
    name: str,
    value: object,
    *,
    min_value: float | None = None,
    min_inclusive: bool = True,
    max_value: float | None = None,
) -> float:
    """Return ``value`` as a finite Python float, or raise naming it; bounds are optional.

    Any ``numbers.Real`` is accepted (Python and NumPy ints and floats); bools are refused.
    While ``torch.compile`` traces, only the type is checked (a dynamic compile turns module
    floats into symbols; they were checked when the module was built).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    if torch.compiler.is_compiling():  # a dynamic compile traces a module's floats as symbols,
        return value  # type: ignore[return-value]  # which no Python comparison may touch
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if min_value is not None:
        too_small = value < min_value if min_inclusive else value <= min_value
        if too_small:
            op = ">=" if min_inclusive else ">"
            raise ValueError(f"{name} must be {op} {min_value}, got {value}")
    if max_value is not None and value > max_value:
        raise ValueError(f"{name} must be <= {max_value}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """A flag that must be a real ``bool`` (``0``, ``1`` or ``"no"`` are refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return value


def check_dtype(name: str, value: object, *, floating: bool = False) -> torch.dtype | None:
    """``None`` or a ``torch.dtype`` (a floating-point one when ``floating``)."""
    if value is None:
        return None
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {type(value).__name__} ({value!r})")
    if floating and not value.is_floating_point:
        raise TypeError(f"{name} must be a floating-point dtype, got {value}")
    return value


def check_probability(name: str, value: object) -> float:
    """A dropout-style probability in [0, 1)."""
    p = check_float(name, value, min_value=0.0)
    if p >= 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return p


def check_choice(name: str, value: object, choices: Container[str] | Sequence[str]) -> str:
    """A string option from a fixed set, e.g. ``norm_position in ("post", "pre")``."""
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)  # type: ignore[union-attr]
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def check_known_fields(cls: type, data: object, where: str) -> dict[str, Any]:
    """``data`` unchanged, after checking it is a dict whose keys all name fields of the
    dataclass ``cls``; else ValueError naming the unknown keys and the known ones.

    ``where`` (what ``data`` is or where it came from: ``"--config run.json"``,
    ``"TrainConfig.from_dict"``) starts the message; ``""`` leaves it out.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"cls must be a dataclass type, got {cls!r}")
    prefix = f"{where}: " if where else ""
    if not isinstance(data, dict):
        raise TypeError(f"{prefix}{cls.__name__} data must be a dict, got {type(data).__name__}")
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{prefix}unknown {cls.__name__} keys {unknown}; known keys are {known}")
    return data


def check_tensor(
    name: str,
    x: object,
    *,
    ndim: int | Sequence[int] | None = None,
    last_dim: int | None = None,
    floating: bool = False,
    dim_name: str = "d_model",
) -> torch.Tensor:
    """Raise unless ``x`` is a tensor of the given rank / last-dim width / float dtype."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.ndim not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have {want} dims, got shape {tuple(x.shape)}")
    if last_dim is not None and (x.ndim == 0 or x.shape[-1] != last_dim):
        raise ValueError(
            f"{name} last dim must be {last_dim} ({dim_name}), got shape {tuple(x.shape)}"
        )
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def same_shape(shape: Sequence[int], want: Sequence[int]) -> bool:
    """Whether ``shape`` equals ``want``: the ranks first, then dimension by dimension.

    Python's ``tuple(shape) == tuple(want)`` compares elements before lengths, so while
    ``torch.export`` traces (it runs the forward as plain Python over symbolic sizes) a
    (B, L) against an (L,) asks whether B == L and keeps the answer as a guard: a program
    captured at B != L then refuses every batch whose size equals its length, and one
    captured at B == L every other. Comparing ranks first asks only what must hold: each
    dim of ``shape`` equal to the same dim of ``want``.
    """
    return len(shape) == len(want) and all(a == b for a, b in zip(shape, want, strict=True))


def check_bool_mask(
    name: str,
    mask: object,
    shape: Sequence[int] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """A boolean mask whose shape equals ``shape`` exactly (when given), on ``device`` (when
    given: the device of the tensor it masks).

    Masks are never float: a float mask is ambiguous (additive -inf or multiplicative 0/1?),
    so it is rejected with the polarity the caller must use spelled out in ``name``.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must have dtype torch.bool, got {mask.dtype}")
    if shape is not None and not same_shape(mask.shape, shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    want = None if device is None else torch.device(device)
    if want is not None and (
        mask.device.type != want.type or want.index not in (None, mask.device.index)
    ):
        raise ValueError(
            f"{name} is on {mask.device} but what it masks is on {device}; move it there "
            f"({name.split(' ')[0]}.to({str(device)!r}))"
        )
    return mask


def check_norm_input(
    x: object, padding_mask: object, d_model: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A norm's ``norm(x, padding_mask)``: x (B, L, D) or (B, D) floating, the mask bool (B, L)
    on x's device, and only for (B, L, D) input."""
    x = check_tensor("x", x, ndim=(2, 3), last_dim=d_model, floating=True)
    if padding_mask is None:
        return x, None
    if x.ndim == 2:
        raise ValueError(
            "padding_mask is only meaningful for (B, L, D) input; "
            f"got x of shape {tuple(x.shape)} (B, D)"
        )
    padding_mask = check_bool_mask(
        "padding_mask (True = padding)", padding_mask, x.shape[:2], x.device
    )
    return x, padding_mask


def check_positions(positions: object, batch: int, length: int) -> torch.Tensor:
    """Per-token positions of shape (L,) or (B, L), real-valued and finite."""
    pos = check_tensor("positions", positions, ndim=(1, 2))
    if pos.dtype == torch.bool or pos.is_complex():
        raise TypeError(f"positions must be an integer or float tensor, got dtype {pos.dtype}")
    # Rank first, then each dim against the one it must equal (see ``same_shape``).
    if not (pos.shape[-1] == length and (pos.ndim == 1 or pos.shape[0] == batch)):
        raise ValueError(
            f"positions must have shape ({length},) or ({batch}, {length}) to match x, "
            f"got {tuple(pos.shape)}"
        )
    if pos.is_floating_point() and not bool(torch.isfinite(pos).all()):
        raise ValueError(f"positions must be finite, got {pos[~torch.isfinite(pos)][0].item()}")
    return pos


# ------------------------------------------------------------ checks inside compiled graphs


def assert_in_graph(condition: torch.Tensor, message: str) -> None:
    """A check of tensor *values* that ``torch.compile`` and ``torch.export`` keep in the graph.

    Eager code reads such a value back (a host sync) and raises a ``ValueError`` naming the
    culprit; a graph cannot branch on data, so while one is captured the same check becomes
    ``torch._assert_async``: no host sync, no graph break, a ``RuntimeError`` with
    ``message`` when a compiled or exported program runs on bad values (a device-side assert
    on CUDA). ONNX has no assert, so an ONNX file drops it.

    Shapes:
        condition: () bool, True = fine
    """
    torch._assert_async(condition, message)


def refuse_tracing(what: str) -> None:
    """Raise while ``torch.jit.trace`` (or the legacy ONNX exporter, which traces) runs ``what``.

    A trace records one run's Python decisions as constants. A model whose forward decides
    from the data (is there padding? does any precede a real token?) would be recorded for
    the example's padding only, and be silently wrong on other batches.
    """
    if torch.jit.is_tracing():
        raise ValueError(
            f"{what} cannot be traced with torch.jit.trace or exported with "
            "torch.onnx.export(..., dynamo=False): a trace records one batch's padding as "
            "constants and would be wrong on other padding. Use torch.export.export, "
            "torch.onnx.export(..., dynamo=True) or addnorm.export.to_onnx"
        )


def check_weight_dtype(
    name: str, x: torch.Tensor, weight: torch.Tensor | None, *, allow_narrower: bool = False
) -> None:
    """Raise TypeError unless ``x`` has the dtype of the module's ``weight`` (torch cannot
    multiply mixed dtypes; under autocast it casts them itself, so anything goes there).
    ``allow_narrower`` lets a narrower float through (float16 into float32 weights), for ops
    that upcast it (``F.layer_norm``)."""
    if weight is None or x.dtype == weight.dtype or torch.is_autocast_enabled(x.device.type):
        return
    if allow_narrower and x.dtype.itemsize < weight.dtype.itemsize:
        return
    raise TypeError(
        f"{name} has dtype {x.dtype} but the module's weights are {weight.dtype}; convert one "
        f"to the other (module.to({x.dtype}) or {name}.to({weight.dtype}))"
    )

