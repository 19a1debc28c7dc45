"""Deployable models: ``torch.export`` programs and ONNX files with a dynamic batch and length.

    program = addnorm.export.export_program(lm)        # a torch.export.ExportedProgram
    addnorm.export.to_onnx(lm, "lm.onnx")              # the dynamo-based ONNX exporter
    addnorm.export.onnx_max_error(lm, "lm.onnx")       # |onnxruntime - PyTorch| on new batches

What is exported, by family and ``part`` (the inputs are also the ONNX input names; B and the
lengths are dynamic, everything else is fixed by the config):

- ``TransformerLM``, ``forward``: ids (B, L) int64, padding_mask (B, L) bool
  -> logits (B, L, V)
- ``Transformer``, ``forward``: src_ids (B, S), tgt_ids (B, L) int64, src_padding_mask (B, S),
  tgt_padding_mask (B, L) bool -> logits (B, L, V)
- ``Transformer``, ``encoder``: src_ids (B, S) int64, src_padding_mask (B, S) bool
  -> memory (B, S, D)
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
from torch.export import Dim, ExportedProgram

from addnorm._checks import check_choice, check_int
from addnorm.dit.model import DiT
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.lm import TransformerLM

__all__ = ["PARTS", "export_program", "onnx_max_error", "run_onnx", "sample_inputs", "to_onnx"]

PARTS = ("forward", "encoder")

Exportable = TransformerLM | Transformer | DiT


class _Encoder(nn.Module):
    """The encoder-decoder's ``encode`` as a module's forward, for export."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: torch.Tensor, src_padding_mask: torch.Tensor) -> torch.Tensor:
        """Shapes: src_ids, src_padding_mask: (B, S); returns: (B, S, D)."""
        return self.model.encode(src_ids, src_padding_mask=src_padding_mask)


def _checked(model: object, part: str) -> Exportable:
    if not isinstance(model, TransformerLM | Transformer | DiT):
        raise TypeError(
            f"model must be a TransformerLM, Transformer or DiT, got {type(model).__name__}"
        )
    check_choice("part", part, PARTS)
    if part == "encoder" and not isinstance(model, Transformer):
        raise ValueError(f"part='encoder' is the Transformer's; {type(model).__name__} has none")
    return model


def _module(model: Exportable, part: str) -> nn.Module:
    """What is exported: the model, or its encoder; in the model's mode."""
    if part == "encoder" and isinstance(model, Transformer):
        return _Encoder(model).train(model.training)
    return model


def _output_name(model: Exportable, part: str) -> str:
    if part == "encoder":
        return "memory"
    return "out" if isinstance(model, DiT) else "logits"


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
    model = _checked(model, part)
    batch = check_int("batch", batch, min_value=1)
    length = check_int("length", length, min_value=2)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    if isinstance(model, DiT):
        dit = model.cfg
        size = dit.input_size
        inputs = {
            "x": torch.randn(batch, dit.in_channels, size, size, generator=gen),
            "t": torch.randint(0, 1000, (batch,), generator=gen),
            "y": torch.randint(0, dit.n_classes, (batch,), generator=gen),
        }
    elif isinstance(model, TransformerLM):
        lm = model.cfg
        ids, padding = _padded_ids(batch, length, lm.vocab_size, lm.pad_id, gen)
        inputs = {"ids": ids, "padding_mask": padding}
    else:
        cfg = model.cfg
        src, src_padding = _padded_ids(batch, length, cfg.src_vocab_size, cfg.pad_id, gen)
        inputs = {"src_ids": src, "src_padding_mask": src_padding}
        if part == "forward":
            tgt, tgt_padding = _padded_ids(batch, length - 1, cfg.tgt_vocab_size, cfg.pad_id, gen)
            inputs.update(tgt_ids=tgt, tgt_padding_mask=tgt_padding)
    return {name: inputs[name].to(device) for name in _names(model, part)}


def _padded_ids(
    batch: int, length: int, vocab_size: int, pad_id: int | None, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random non-pad ids; row 1 right-padded, row 2 left-padded (a third of L each).

    A model without a padding token (``pad_id=None``, GPT-2) gets id 0 at the padded
    places: only the mask says they are padding."""
    if pad_id is None:
        ids = torch.randint(0, vocab_size, (batch, length), generator=gen)  # (B, L)
    else:
        ids = torch.randint(0, vocab_size - 1, (batch, length), generator=gen)  # (B, L)
        ids = ids + (ids >= pad_id).long()  # never pad_id
    padding = torch.zeros(batch, length, dtype=torch.bool)  # (B, L)
    n_pad = max(1, length // 3)
    if batch > 1:
        padding[1, length - n_pad :] = True
    if batch > 2:
        padding[2, :n_pad] = True
    return ids.masked_fill(padding, 0 if pad_id is None else pad_id), padding


def _names(model: Exportable, part: str) -> tuple[str, ...]:
    if isinstance(model, DiT):
        return ("x", "t", "y")
    if isinstance(model, TransformerLM):
        return ("ids", "padding_mask")
    if part == "encoder":
        return ("src_ids", "src_padding_mask")
    return ("src_ids", "tgt_ids", "src_padding_mask", "tgt_padding_mask")


def _dynamic_shapes(model: Exportable, part: str) -> dict[str, Any]:
    """One ``Dim`` for the batch, one per sequence; lengths bounded by a learned table.

    In the order of the inputs (the ONNX exporter names the axes by position).
    """
    shapes = _dims(model, part)
    return {name: shapes[name] for name in _names(model, part)}


def _dims(model: Exportable, part: str) -> dict[str, Any]:
    batch = Dim("batch", min=1)
    if isinstance(model, DiT):
        return {"x": {0: batch}, "t": {0: batch}, "y": {0: batch}}
    cfg = model.cfg
    longest = cfg.max_len if cfg.position_encoding == "learned" else None
    if isinstance(model, TransformerLM):
        length = Dim("length", min=1, max=longest)
        return {"ids": {0: batch, 1: length}, "padding_mask": {0: batch, 1: length}}
    source = Dim("src_length", min=1, max=longest)
    shapes = {"src_ids": {0: batch, 1: source}, "src_padding_mask": {0: batch, 1: source}}
    if part == "encoder":
        return shapes
    target = Dim("tgt_length", min=1, max=longest)
    shapes.update(tgt_ids={0: batch, 1: target}, tgt_padding_mask={0: batch, 1: target})
    return shapes


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
    model = _checked(model, part)
    inputs = sample_inputs(model, part=part)
    with _EvalMode(model):
        return torch.export.export(
            _module(model, part), (), inputs, dynamic_shapes=_dynamic_shapes(model, part)
        )


def to_onnx(model: nn.Module, path: str | os.PathLike, *, part: str = "forward") -> Path:
    """Write ``model``'s ``part`` as an ONNX file (the dynamo-based exporter); return the path.

    Inputs and output are named as in the module docstring; batch and lengths are dynamic.
    Needs the ``onnx`` and ``onnxscript`` packages (``pip install addnorm[export]``).
    """
    model = _checked(model, part)
    path = Path(path)
    inputs = sample_inputs(model, part=part)
    with _EvalMode(model), warnings.catch_warnings():
        # Axes that share a Dim are named once; the exporter says so for every other use.
        warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
        program = torch.onnx.export(
            _module(model, part), (), kwargs=inputs, dynamo=True, verbose=False,
            dynamic_shapes=_dynamic_shapes(model, part), input_names=list(inputs),
            output_names=[_output_name(model, part)],
        )
    if program is None:  # pragma: no cover - the dynamo exporter always returns its program
        raise RuntimeError("torch.onnx.export returned no ONNX program")
    program.save(str(path))
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
    model = _checked(model, part)
    inputs = sample_inputs(model, part=part, batch=batch, length=length, seed=1)
    with _EvalMode(model):
        expected = _module(model, part)(**inputs).float().cpu()
    return float((run_onnx(path, inputs).float() - expected).abs().max())
