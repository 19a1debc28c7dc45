"""Memory estimates made from a config before anything is allocated.

A model config that asks for ``d_ff = 10**11``, or a batch of a billion examples, would end
deep inside torch's allocator (or swap for hours) if it were built. The estimates here are
computed from the config's numbers alone, in microseconds, so a caller can refuse such a
request first, with a message that names the setting, the estimate and the limit:

- ``count_parameters(cfg)``: the parameters of a ``TransformerConfig``, ``LMConfig`` or
  ``DiTConfig`` model (within 2% of the built model's: a few norm and bias vectors are
  counted whether the config has them or not), and ``count_buffers``: the position tables.
- ``training_bytes``: float32 weights, gradients, AdamW's two moments (and an EMA copy), plus
  the activations one micro-batch keeps for the backward pass.
- ``inference_bytes``: the weights plus one layer's activations for a batch.
- ``available_memory(device)``: what the machine can give now (``MemAvailable`` of
  ``/proc/meminfo``, a cgroup's limit, ``torch.cuda.mem_get_info`` on CUDA).
- ``largest_setting``: which setting makes an estimate large (the one whose default value
  shrinks it most), for the message.

The activation figures are estimates (within a small factor of what torch allocates, on the
high side); they guard against requests that cannot fit by orders of magnitude, not against
the last gigabyte.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import torch

from addnorm.dit.config import DiTConfig
from addnorm.feedforward import GATED_ACTIVATIONS
from addnorm.transformer.config import LMConfig, TransformerConfig

__all__ = [
    "MAX_LAYERS",
    "SIZE_FIELDS",
    "SizeError",
    "available_memory",
    "check_model_fits",
    "count_buffers",
    "count_parameters",
    "format_bytes",
    "inference_bytes",
    "largest_setting",
    "replace_fields",
    "training_bytes",
]

_FLOAT = 4  # bytes of a float32
# Layers per stack above this are refused outright: building 10**5 layers takes minutes even
# where memory would allow it, and no model of this package needs more.
MAX_LAYERS = 1024
# The config and TrainConfig fields that drive the estimates (``largest_setting`` tries them).
SIZE_FIELDS = (
    "d_model", "d_ff", "mlp_ratio", "n_heads", "n_layers", "n_encoder_layers",
    "n_decoder_layers", "max_len", "input_size", "patch_size", "batch_size", "seq_len",
    "eval_size",
)

ModelConfig = TransformerConfig | LMConfig | DiTConfig


class SizeError(ValueError):
    """A request that cannot fit in memory; the message names the setting and the numbers."""


def count_parameters(cfg: ModelConfig) -> int:
    """The number of parameters of the model ``cfg`` describes, without building it."""
    if isinstance(cfg, DiTConfig):
        return _dit_parameters(cfg)
    if not isinstance(cfg, (TransformerConfig, LMConfig)):
        raise TypeError(f"cfg must be a TransformerConfig, LMConfig or DiTConfig, got {cfg!r}")
    d = cfg.d_model
    attention = 4 * d * d + 4 * d
    width = 3 if cfg.activation in GATED_ACTIVATIONS else 2
    feedforward = width * d * cfg.d_ff + cfg.d_ff + d
    norm = 2 * d
    learned = cfg.max_len * d if cfg.position_encoding == "learned" else 0
    if isinstance(cfg, LMConfig):
        body = cfg.n_layers * (attention + feedforward + 2 * norm) + norm
        output = 0 if cfg.tie_output else cfg.vocab_size * (d + 1)
        return cfg.vocab_size * d + learned + body + output
    encoder = cfg.n_encoder_layers * (attention + feedforward + 2 * norm) + norm
    decoder = cfg.n_decoder_layers * (2 * attention + feedforward + 3 * norm) + norm
    tables = cfg.tgt_vocab_size * d + (0 if cfg.share_embeddings else cfg.src_vocab_size * d)
    output = 0 if cfg.tie_output else cfg.tgt_vocab_size * (d + 1)
    return tables + 2 * learned + encoder + decoder + output


def _dit_parameters(cfg: DiTConfig) -> int:
    d, patch = cfg.d_model, cfg.patch_size * cfg.patch_size
    d_ff = int(d * cfg.mlp_ratio)
    c_out = cfg.in_channels * (2 if cfg.learn_sigma else 1)
    block = (4 * d * d + 4 * d) + (2 * d * d_ff + d_ff + d) + (6 * d * d + 6 * d)
    embed = patch * cfg.in_channels * d + d + (cfg.d_freq * d + d + d * d + d)
    labels = (cfg.n_classes + 1) * d
    final = 2 * d * d + 2 * d + d * patch * c_out + patch * c_out
    return embed + labels + cfg.n_layers * block + final


def count_buffers(cfg: ModelConfig) -> int:
    """Numbers held in buffers: the sinusoid and rotary tables of ``max_len`` rows, the DiT's
    fixed 2-D position table."""
    if isinstance(cfg, DiTConfig):
        return (cfg.input_size // cfg.patch_size) ** 2 * cfg.d_model
    if cfg.position_encoding == "sinusoidal":  # one table per stack's embedder
        return (2 if isinstance(cfg, TransformerConfig) else 1) * cfg.max_len * cfg.d_model
    if cfg.position_encoding == "rotary":
        return 2 * cfg.max_len * (cfg.d_model // cfg.n_heads)
    return 0


def _layers(cfg: ModelConfig) -> int:
    if isinstance(cfg, TransformerConfig):
        return cfg.n_encoder_layers + cfg.n_decoder_layers
    return cfg.n_layers


def _token_floats(cfg: ModelConfig, length: int) -> int:
    """Floats one token keeps in one layer: projections, norms and residuals (16 D), the
    feed-forward's hidden units (2 F) and a row of attention probabilities (2 H S)."""
    d_ff = int(cfg.d_model * cfg.mlp_ratio) if isinstance(cfg, DiTConfig) else cfg.d_ff
    return 16 * cfg.d_model + 2 * d_ff + 2 * cfg.n_heads * length


def _vocab(cfg: ModelConfig) -> int:
    if isinstance(cfg, TransformerConfig):
        return cfg.tgt_vocab_size
    if isinstance(cfg, LMConfig):
        return cfg.vocab_size
    return 0


def training_bytes(cfg: ModelConfig, *, batch_size: int, length: int, ema: bool) -> int:
    """Bytes to train ``cfg`` on micro-batches of ``batch_size`` sequences of ``length``
    tokens: weights, gradients and AdamW's moments (plus an EMA copy) in float32, the buffers,
    and the activations kept for the backward pass (with the logits and their gradient)."""
    copies = 4 + (1 if ema else 0)
    state = copies * count_parameters(cfg) + count_buffers(cfg)
    tokens = batch_size * length
    activations = tokens * (_layers(cfg) * _token_floats(cfg, length) + 3 * _vocab(cfg))
    return _FLOAT * (state + activations)


def inference_bytes(cfg: ModelConfig, *, batch_size: int, length: int) -> int:
    """Bytes to run ``cfg`` without gradients on ``batch_size`` sequences of ``length``
    tokens: the weights and buffers, one layer's activations, a key/value cache per layer and
    the logits."""
    tokens = batch_size * length
    cache = 2 * _layers(cfg) * tokens * cfg.d_model
    activations = tokens * (_token_floats(cfg, length) + _vocab(cfg)) + cache
    return _FLOAT * (count_parameters(cfg) + count_buffers(cfg) + activations)


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes the process can still allocate on ``device``; None where it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    found = [n for n in (_meminfo_available(), _cgroup_available(), _sysconf_available())
             if n is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """The cgroup v2 limit of this process's group minus its use, if it has one."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit():  # "max": no limit
        return None
    return max(int(limit) - used, 0)


def _sysconf_available() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def format_bytes(n_bytes: float) -> str:
    """``n_bytes`` in the largest unit that keeps it >= 1: ``"3.2 GB"``, ``"4.1e+03 TB"``."""
    for unit in ("B", "kB", "MB", "GB"):
        if n_bytes < 1000:
            return f"{n_bytes:.3g} {unit}"
        n_bytes /= 1000
    return f"{n_bytes:.3g} TB"


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


def check_model_fits(cfg: ModelConfig, device: torch.device | str = "cpu") -> None:
    """Raise ``SizeError`` if building ``cfg`` on ``device`` cannot work: a stack of more than
    ``MAX_LAYERS`` layers, or weights and buffers larger than the memory available there."""
    for name in ("n_layers", "n_encoder_layers", "n_decoder_layers"):
        value = getattr(cfg, name, None)
        if value is not None and value > MAX_LAYERS:
            raise SizeError(f"{name} ({value}) is more than {MAX_LAYERS} layers per stack")
    needed = _FLOAT * (count_parameters(cfg) + count_buffers(cfg))
    limit = available_memory(device)
    if limit is not None and needed > limit:
        raise SizeError(
            f"the model config asks for {count_parameters(cfg):.3g} parameters and "
            f"{count_buffers(cfg):.3g} buffered numbers, about {format_bytes(needed)}, more "
            f"than the {format_bytes(limit)} of memory available"
        )
