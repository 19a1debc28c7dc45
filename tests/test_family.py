"""addnorm.family: a model family plugs into export, size estimates and distributed wrapping
by describing itself, with no edit to those modules.

Provenance: a minimal family defined here (residual tanh blocks over a sequence of vectors)
goes through :mod:`addnorm.export`, :mod:`addnorm.training.sizes` and
:mod:`addnorm.training.distributed` as the library's models do; the oracles are the eager
model on the same weights (export), the built model's ``numel`` and the estimates' own
definition in ``sizes`` (sizes), and gradients of the unwrapped model in float64, where
checkpointing is an identity (wrapping). The library's four models are checked to name the
layers the trainer used to list for them (``EncoderLayer``, ``DecoderLayer``, ``DiTBlock``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from tolerances import FLOAT64_EXACT
from torch import nn
from torch.export import Dim

import addnorm
from addnorm.dit.block import DiTBlock
from addnorm.export import export_program, onnx_max_error, sample_inputs, to_onnx
from addnorm.family import ActivationShape, DynamicShapes, ExportPart, ModelFamily
from addnorm.training import sizes
from addnorm.training.distributed import layer_classes, prepare_model
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel
from addnorm.transformer.layers import DecoderLayer, EncoderLayer


@dataclass(frozen=True)
class TanhConfig:
    """A family the library does not know: ``n_layers`` residual tanh blocks of width D."""

    d_in: int = 3
    d_model: int = 8
    n_layers: int = 2

    def count_parameters(self) -> int:
        d = self.d_model
        return (self.d_in + 1) * d + self.n_layers * (d + 1) * d + (d + 1)

    def count_buffers(self) -> int:
        return 0

    def activation_shape(self) -> ActivationShape:
        return ActivationShape(
            n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_model, n_heads=0,
            d_output=1,
        )


class TanhBlock(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Shapes: h (B, L, D) -> (B, L, D)."""
        return h + torch.tanh(self.linear(h))


class TanhModel(nn.Module):
    """A score per vector: ``head(blocks(embed(x)))``; its ``features`` are the blocks' output."""

    def __init__(self, cfg: TanhConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(cfg.d_in, cfg.d_model)
        self.blocks = nn.ModuleList(TanhBlock(cfg.d_model) for _ in range(cfg.n_layers))
        self.head = nn.Linear(cfg.d_model, 1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (B, L, d_in) -> (B, L, D)."""
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (B, L, d_in) -> (B, L, 1)."""
        return self.head(self.features(x))

    # addnorm.family.ModelFamily
    layer_classes = (TanhBlock,)
    export_parts = {"forward": ExportPart("forward", "score"),
                    "features": ExportPart("features", "hidden")}

    def example_inputs(
        self, part: str, *, batch: int, length: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(batch, length, self.cfg.d_in, generator=generator)}

    def dynamic_shapes(self) -> DynamicShapes:
        return {"x": {0: Dim("batch", min=1), 1: Dim("length", min=1)}}


def tanh_model(dtype: torch.dtype = torch.float32) -> TanhModel:
    torch.manual_seed(0)
    return TanhModel(TanhConfig()).to(dtype)


@pytest.mark.parametrize(("part", "method"), [("forward", "forward"), ("features", "features")])
def test_a_new_family_exports_with_dynamic_batch_and_length(part, method):
    model = tanh_model()
    program = export_program(model, part=part)
    inputs = sample_inputs(model, part=part, batch=4, length=9, seed=1)  # not the export sizes
    assert list(inputs) == ["x"] and inputs["x"].shape == (4, 9, 3)
    with torch.no_grad():
        expected = getattr(model, method)(**inputs)
        # The program runs eager's aten kernels (measured equal; see tests/test_export.py).
        torch.testing.assert_close(program.module()(**inputs), expected, rtol=0, atol=1e-6)


def test_a_new_family_writes_an_onnx_file_named_as_it_says(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = tanh_model()
    path = to_onnx(model, tmp_path / "tanh.onnx", part="features")
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["x"] and [o.name for o in graph.output] == ["hidden"]
    # onnxruntime's float32 tanh and sums are not torch's, so no rounding bound applies (see
    # tests/test_export.py): measured 2.4e-7 at |y| <= 2.5; a wrong op is off by O(0.1).
    assert onnx_max_error(model, path, part="features", batch=4, length=11) < 1e-4


def test_a_new_family_is_refused_parts_it_does_not_name():
    with pytest.raises(ValueError, match=r"part='encoder' is not one of TanhModel's parts "
                                         r"\('forward', 'features'\)"):
        sample_inputs(tanh_model(), part="encoder")


def test_a_new_family_is_sized_from_its_config():
    cfg = TanhConfig()
    built = TanhModel(cfg)
    assert cfg.count_parameters() == sum(p.numel() for p in built.parameters())  # exact here
    params, batch_size, length = cfg.count_parameters(), 2, 5
    # sizes' definition: float32 weights, grads and two moments; per token and layer 16 D +
    # 2 F + 2 H L floats, and 3 floats per output number (logits and their gradient).
    per_token = cfg.n_layers * (16 * 8 + 2 * 8) + 3 * 1  # D = F = 8, no heads, 1 output
    assert sizes.training_bytes(cfg, batch_size=batch_size, length=length, ema=False) == 4 * (
        4 * params + batch_size * length * per_token
    )
    tokens = batch_size * length  # inference: one layer's floats, the output, a K/V cache
    assert sizes.inference_bytes(cfg, batch_size=batch_size, length=length) == 4 * (
        params + tokens * (16 * 8 + 2 * 8 + 1) + 2 * cfg.n_layers * tokens * 8
    )
    sizes.check_model_fits(cfg)
    with pytest.raises(sizes.SizeError, match="n_layers"):
        sizes.check_model_fits(dataclasses.replace(cfg, n_layers=10**6))


def test_a_new_family_is_checkpointed_layer_by_layer_with_the_same_gradients():
    plain, wrapped = tanh_model(torch.float64), tanh_model(torch.float64)
    assert layer_classes(wrapped) == (TanhBlock,)
    assert prepare_model(wrapped, activation_checkpointing=True, fsdp=False) is wrapped
    assert sum(type(m).__name__ == "CheckpointWrapper" for m in wrapped.modules()) == 2
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    x = torch.randn(3, 4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    plain(x).square().sum().backward()
    wrapped(x).square().sum().backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad
             for n, p in wrapped.named_parameters()}
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **FLOAT64_EXACT, msg=name)


def test_a_model_held_in_a_container_is_found():
    holder = nn.ModuleDict({"model": tanh_model()})
    assert layer_classes(holder) == (TanhBlock,)
    assert layer_classes(nn.Linear(2, 2)) == ()


def test_the_library_models_name_the_layers_the_trainer_wraps():
    tiny, lm = addnorm.PRESETS["tiny"], addnorm.PRESETS["lm-tiny"]
    models = [
        ((EncoderLayer, DecoderLayer), addnorm.Transformer(tiny)),
        ((EncoderLayer,), addnorm.TransformerLM(lm)),
        ((EncoderLayer,), EncoderModel(EncoderConfig(d_model=32, n_layers=1, d_ff=64))),
        ((DiTBlock,), addnorm.DiT(addnorm.DIT_PRESETS["DiT-digits-tiny"])),
    ]
    for classes, model in models:
        assert isinstance(model, ModelFamily)
        assert layer_classes(model) == classes
        assert list(model.export_parts)[0] == "forward"
        assert set(sample_inputs(model)) <= set(model.dynamic_shapes())
