"""Deployable models: ``torch.export`` programs and ONNX files with a dynamic batch and length.

    program = addnorm.export.export_program(lm)        # a torch.export.ExportedProgram
    addnorm.export.to_onnx(lm, "lm.onnx")              # the dynamo-based ONNX exporter
    addnorm.export.onnx_max_error(lm, "lm.onnx")       # |onnxruntime - PyTorch| on new batches

What is exported, by family and ``part`` (the inputs are also the ONNX input names; B and the
lengths are dynamic, everything else is fixed by the config). Each model says it itself
(:class:`addnorm.family.ModelFamily`: its parts, example inputs, dynamic axes and output name),
so a new family exports with no edit here:

- ``TransformerLM``, ``forward``: ids (B, L) int64, padding_mask (B, L) bool
  -> logits (B, L, V)
- ``Transformer``, ``forward``: src_ids (B, S), tgt_ids (B, L) int64, src_padding_mask (B, S),
  tgt_padding_mask (B, L) bool -> logits (B, L, V)
- ``Transformer``, ``encoder``: src_ids (B, S) int64, src_padding_mask (B, S) bool
  -> memory (B, S, D)
- ``EncoderModel``, ``forward``: ids (B, L) int64, padding_mask (B, L) bool, and with a
  token-type table (BERT's segments, ``n_token_types > 0``) token_type_ids (B, L) int64
  -> hidden (B, L, D)
- ``DiT``, ``forward``: x (B, C, H, W) float32, t (B,) int64, y (B,) int64
  -> out (B, C_out, H, W)

Padding masks are inputs (True = padding), so a deployed model needs no pad id. The forward
that is captured is the general one (per-row positions from the padding, the mask always
applied; see :mod:`addnorm.transformer.embedding`), so left- and right-padded batches give
the eager results. Models are exported in eval mode (dropout off); the mode the model was in
is restored afterwards. With a learned position table L is at most ``max_len``.

``torch.jit.trace`` and ``torch.onnx.export(..., dynamo=False)`` refuse the Transformer
models: a trace freezes one batch's padding. Running the ONNX file needs ``onnxruntime``
(``pip install addnorm[export]``); writing it needs ``onnx`` and ``onnxscript``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from addnorm.family import ExportPart, ModelFamily
from addnorm.utils.checks import check_choice, check_int
from addnorm.utils.publish import publishing

__all__ = ["PARTS", "export_program", "onnx_max_error", "run_onnx", "sample_inputs", "to_onnx"]

# The parts of the library's models (``addnorm export --part``); a model names its own.
PARTS = ("forward", "encoder")


class _Method(nn.Module):
    """One of ``model``'s methods as this module's forward, signature included: export
    captures a module's forward and names the inputs after its arguments."""

    def __init__(self, model: nn.Module, method: str) -> None:
        super().__init__()
        self.model = model
        self.forward = getattr(model, method)


def _checked(model: object, part: str) -> ModelFamily:
    if not isinstance(model, nn.Module) or not isinstance(model, ModelFamily):
        raise TypeError(
            "model must be a TransformerLM, Transformer, EncoderModel, DiT or another "
            f"addnorm.family.ModelFamily, got {type(model).__name__}"
        )
    parts = tuple(model.export_parts)
    check_choice("part", part, tuple(dict.fromkeys(PARTS + parts)))
    if part not in parts:
        names = ", ".join(repr(p) for p in parts)
        raise ValueError(f"part={part!r} is not one of {type(model).__name__}'s parts ({names})")
    return model


def _module(model: nn.Module, part: ExportPart) -> nn.Module:
    """What is exported: the model, or the method ``part`` names; in the model's mode."""
    if part.method == "forward":
        return model
    return _Method(model, part.method).train(model.training)


def sample_inputs(
    model: nn.Module, *, part: str = "forward", batch: int = 3, length: int = 7, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random inputs of ``model``'s exported ``part``, by input name, on the model's device.

    Token batches (B >= 2) hold an unpadded row, a right-padded and a left-padded one, so a
    capture or a check sees every kind of padding; the target of a Transformer is one token
    shorter than its source. DiT inputs are noise, integer timesteps and class ids.

    Shapes:
        see the module docstring; B = ``batch``, L (and S) = ``length``
    """
    family = _checked(model, part)
    batch = check_int("batch", batch, min_value=1)
    length = check_int("length", length, min_value=2)
    gen = torch.Generator().manual_seed(seed)
    inputs = family.example_inputs(part, batch=batch, length=length, generator=gen)
    device = next(model.parameters()).device
    return {name: value.to(device) for name, value in inputs.items()}


def _dynamic_shapes(family: ModelFamily, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The family's dynamic axes of ``inputs`` (one ``Dim`` for the batch, one per sequence),
    in their order: the ONNX exporter names the axes by position."""
    shapes = family.dynamic_shapes()
    return {name: shapes[name] for name in inputs}


class _EvalMode:
    """Run a block with the model in eval mode, then restore the mode it had."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.training = self.model.training
        self.model.eval()

    def __exit__(self, *exc_info: object) -> None:
        self.model.train(self.training)


def export_program(model: nn.Module, *, part: str = "forward") -> ExportedProgram:
    """``torch.export.export`` of ``model``'s ``part`` in eval mode, batch and lengths dynamic.

    Call the result as ``program.module()(**inputs)`` with the inputs of the module
    docstring (for example :func:`sample_inputs`).
    """
    family = _checked(model, part)
    inputs = sample_inputs(model, part=part)
    with _EvalMode(model):
        return torch.export.export(
            _module(model, family.export_parts[part]), (), inputs,
            dynamic_shapes=_dynamic_shapes(family, inputs),
        )


def to_onnx(model: nn.Module, path: str | os.PathLike, *, part: str = "forward") -> Path:
    """Write ``model``'s ``part`` as an ONNX file (the dynamo-based exporter); return the path.

    Inputs and output are named as in the module docstring; batch and lengths are dynamic.
    Needs the ``onnx`` and ``onnxscript`` packages (``pip install addnorm[export]``).
    """
    family = _checked(model, part)
    exported, path = family.export_parts[part], Path(path)
    inputs = sample_inputs(model, part=part)
    with _EvalMode(model), warnings.catch_warnings():
        # Axes that share a Dim are named once; the exporter says so for every other use.
        warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
        program = torch.onnx.export(
            _module(model, exported), (), kwargs=inputs, dynamo=True, verbose=False,
            dynamic_shapes=_dynamic_shapes(family, inputs), input_names=list(inputs),
            output_names=[exported.output],
        )
    if program is None:  # pragma: no cover - the dynamo exporter always returns its program
        raise RuntimeError("torch.onnx.export returned no ONNX program")
    with publishing(path) as staged:  # a failed write leaves the previous file, or none
        program.save(str(staged))
    return path


def run_onnx(path: str | os.PathLike, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Run an ONNX file written by :func:`to_onnx` with onnxruntime on the CPU.

    Shapes:
        inputs: by name, as in the module docstring; returns: the output, as a tensor
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name].detach().cpu().numpy() for i in session.get_inputs()}
    return torch.from_numpy(session.run(None, feed)[0])


@torch.no_grad()
def onnx_max_error(
    model: nn.Module, path: str | os.PathLike, *, part: str = "forward", batch: int = 4,
    length: int = 11,
) -> float:
    """The largest |onnxruntime - PyTorch| difference on fresh padded inputs.

    The inputs differ in batch size and lengths from those the file was captured with, and
    hold left- and right-padded rows (:func:`sample_inputs`).
    """
    family = _checked(model, part)
    inputs = sample_inputs(model, part=part, batch=batch, length=length, seed=1)
    with _EvalMode(model):
        expected = _module(model, family.export_parts[part])(**inputs).float().cpu()
    return float((run_onnx(path, inputs).float() - expected).abs().max())
