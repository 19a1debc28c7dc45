"""Memory estimates made from a config before anything is allocated.

A model config that asks for ``d_ff = 10**11``, or a batch of a billion examples, would end
deep inside torch's allocator (or swap for hours) if it were built. The estimates here are
computed from the config's numbers alone, in microseconds, so a caller can refuse such a
request first, with a message that names the setting, the estimate and the limit:

- the model's own numbers come from its config (:class:`addnorm.family.FamilyConfig`):
  ``cfg.count_parameters()`` (within 2% of the built model's), ``cfg.count_buffers()`` (the
  position tables) and ``cfg.activation_shape()`` (its layers and their widths), so a new
  model family needs no edit here;
- ``training_bytes``: float32 weights, gradients, AdamW's two moments (and an EMA copy), plus
  the activations one micro-batch keeps for the backward pass.
- ``inference_bytes``: the weights plus one layer's activations for a batch.
- ``check_model_fits``: the weights against ``addnorm.utils.memory.available_memory`` (what the
  machine can give now) and the layers against ``MAX_LAYERS``.
- ``largest_setting``: which setting makes an estimate large (the one whose default value
  shrinks it most), for the message.

The activation figures are estimates (within a small factor of what torch allocates, on the
high side); they guard against requests that cannot fit by orders of magnitude, not against
the last gigabyte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from addnorm.family import ActivationShape, FamilyConfig
from addnorm.utils.memory import MAX_LAYERS, available_memory, format_bytes

__all__ = [
    "SIZE_FIELDS",
    "RunSizeError",
    "SizeError",
    "check_model_fits",
    "inference_bytes",
    "largest_setting",
    "replace_fields",
    "training_bytes",
]

_FLOAT = 4  # bytes of a float32
# The model, train and task settings that drive the estimates (``largest_setting`` tries them
# first; ``seq_len`` and ``eval_size`` are the built-in tasks' own).
SIZE_FIELDS = (
    "d_model", "d_ff", "mlp_ratio", "n_heads", "n_layers", "n_encoder_layers",
    "n_decoder_layers", "max_len", "input_size", "patch_size", "batch_size", "seq_len",
    "eval_size",
)

class SizeError(ValueError):
    """A request that cannot fit in memory; the message names the setting and the numbers."""


class RunSizeError(SizeError):
    """A run whose sizes cannot fit: ``setting`` (a config field, or None when no one setting
    is to blame) has ``value``, and ``reason`` says why that is too much."""

    def __init__(self, setting: str | None, value: object, reason: str) -> None:
        blame = f"{setting} {value}" if setting is not None else "these settings"
        super().__init__(f"{blame}: {reason}")
        self.setting, self.value, self.reason = setting, value, reason


def _token_floats(shape: ActivationShape, length: int) -> int:
    """Floats one token keeps in one layer: projections, norms and residuals (16 D), the
    feed-forward's hidden units (2 F) and a row of attention probabilities (2 H S)."""
    return 16 * shape.d_model + 2 * shape.d_ff + 2 * shape.n_heads * length


def training_bytes(cfg: FamilyConfig, *, batch_size: int, length: int, ema: bool) -> int:
    """Bytes to train ``cfg`` on micro-batches of ``batch_size`` sequences of ``length``
    tokens: weights, gradients and AdamW's moments (plus an EMA copy) in float32, the buffers,
    and the activations kept for the backward pass (with the logits and their gradient)."""
    copies = 4 + (1 if ema else 0)
    state = copies * cfg.count_parameters() + cfg.count_buffers()
    shape, tokens = cfg.activation_shape(), batch_size * length
    activations = tokens * (shape.n_layers * _token_floats(shape, length) + 3 * shape.d_output)
    return _FLOAT * (state + activations)


def inference_bytes(cfg: FamilyConfig, *, batch_size: int, length: int) -> int:
    """Bytes to run ``cfg`` without gradients on ``batch_size`` sequences of ``length``
    tokens: the weights and buffers, one layer's activations, a key/value cache per layer and
    the logits."""
    shape, tokens = cfg.activation_shape(), batch_size * length
    cache = 2 * shape.n_layers * tokens * shape.d_model
    activations = tokens * (_token_floats(shape, length) + shape.d_output) + cache
    return _FLOAT * (cfg.count_parameters() + cfg.count_buffers() + activations)


def largest_setting(
    estimate: Callable[[dict], int], settings: dict, defaults: dict
) -> str | None:
    """The key of ``settings`` whose value in ``defaults`` shrinks ``estimate`` the most (None
    if none shrinks it): the setting to blame for a large estimate.

    ``estimate`` takes a dict like ``settings``; only keys of ``SIZE_FIELDS`` whose value
    differs from the default are tried.
    """
    best, best_value = None, estimate(settings)
    for key in SIZE_FIELDS:
        if key not in settings or key not in defaults or settings[key] == defaults[key]:
            continue
        try:
            value = estimate({**settings, key: defaults[key]})
        except (ValueError, TypeError):  # the default breaks another setting's constraint
            continue
        if value < best_value:
            best, best_value = key, value
    return best


def replace_fields(cfg, values: dict):
    """``dataclasses.replace(cfg, ...)`` with those of ``values`` that are fields of ``cfg``."""
    names = {f.name for f in dataclasses.fields(cfg)}
    return dataclasses.replace(cfg, **{k: v for k, v in values.items() if k in names})


def check_model_fits(cfg: FamilyConfig, device: torch.device | str = "cpu") -> None:
    """Raise ``SizeError`` if building ``cfg`` on ``device`` cannot work: a stack of more than
    ``MAX_LAYERS`` layers, or weights and buffers larger than the memory available there."""
    for name in ("n_layers", "n_encoder_layers", "n_decoder_layers"):
        value = getattr(cfg, name, None)
        if value is not None and value > MAX_LAYERS:
            raise SizeError(f"{name} ({value}) is more than {MAX_LAYERS} layers per stack")
    params, buffers = cfg.count_parameters(), cfg.count_buffers()
    needed = _FLOAT * (params + buffers)
    limit = available_memory(device)
    if limit is not None and needed > limit:
        raise SizeError(
            f"the model config asks for {params:.3g} parameters and "
            f"{buffers:.3g} buffered numbers, about {format_bytes(needed)}, more "
            f"than the {format_bytes(limit)} of memory available"
        )
