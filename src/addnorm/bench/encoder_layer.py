"""Case 1: one encoder layer (D 512, H 8, F 2048), where matrix multiplies decide.

Inference and a training step (forward + backward), fp32 and bf16 autocast, at 8 x 128 and
2 x 512 tokens: addnorm post-LN and pre-LN against torch.nn's ``TransformerEncoderLayer``,
x-transformers' ``Encoder`` (depth 1), timm's ViT ``Block`` and Hugging Face's ``BertLayer``.
Each row's FLOP rate is also given as a fraction of a ``torch.mm`` of the layer's FFN shape,
timed in the same rounds. Same-weight checks: addnorm against torch.nn (post and pre),
BertLayer (post-LN, GELU) and timm's Block (pre-LN, GELU).

Shapes legend: B batch, L length, D d_model, F d_ff.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from addnorm.bench.harness import (
    BenchSettings,
    Check,
    Report,
    Row,
    cpu_has_bf16,
    gemm,
    time_case,
)
from addnorm.bench.references import optional_module
from addnorm.interop.torch_nn import to_torch
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.layers import EncoderLayer

__all__ = ["run_encoder_layer"]

GROUP = "encoder layer"
BF16_TOLERANCE = 0.1  # max |bf16 autocast - fp32| of a layer output of unit scale


def _sizes(size: str) -> tuple[int, int, int, list[tuple[int, int]]]:
    """(D, H, F, [(B, L), ...]) for the run's size."""
    if size == "test":
        return 32, 4, 64, [(2, 8)]
    if size == "quick":
        return 512, 8, 2048, [(8, 128)]
    return 512, 8, 2048, [(8, 128), (2, 512)]


def _layer_flops(batch: int, length: int, d_model: int, d_ff: int) -> float:
    """Forward FLOPs: the four D x D projections, the FFN, and Q K^T and A V."""
    tokens = batch * length
    linear = 2.0 * tokens * (4 * d_model * d_model + 2 * d_model * d_ff)
    return linear + 4.0 * batch * length * length * d_model


def _copy(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for target, source in pairs:
            target.copy_(source)


def _addnorm_pairs(ours: EncoderLayer) -> dict[str, torch.Tensor]:
    """The layer's tensors by short names (views sharing the parameters' storage)."""
    sd = ours.state_dict()
    short = {"qkv": "self_attn.in_proj", "out": "self_attn.out_proj", "w1": "ff.w1",
             "w2": "ff.w2", "n1": "attn_add_norm.norm", "n2": "ff_add_norm.norm"}
    return {f"{k}.{p}": sd[f"{name}.{kind}"] for k, name in short.items()
            for p, kind in (("w", "weight"), ("b", "bias"))}


def _bert_layer(transformers: Any, ours: EncoderLayer) -> nn.Module:
    """Hugging Face's ``BertLayer`` (post-LN, GELU) holding ``ours``'s weights."""
    cfg = ours.cfg
    bert_cfg = transformers.BertConfig(
        hidden_size=cfg.d_model, num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=cfg.norm_eps,
        attn_implementation="sdpa",
    )
    from transformers.models.bert.modeling_bert import BertLayer

    bert = BertLayer(bert_cfg)
    w = _addnorm_pairs(ours)
    q, k, v = w["qkv.w"].chunk(3)
    qb, kb, vb = w["qkv.b"].chunk(3)
    att = bert.attention
    _copy([
        (att.self.query.weight, q), (att.self.key.weight, k), (att.self.value.weight, v),
        (att.self.query.bias, qb), (att.self.key.bias, kb), (att.self.value.bias, vb),
        (att.output.dense.weight, w["out.w"]), (att.output.dense.bias, w["out.b"]),
        (att.output.LayerNorm.weight, w["n1.w"]), (att.output.LayerNorm.bias, w["n1.b"]),
        (bert.intermediate.dense.weight, w["w1.w"]), (bert.intermediate.dense.bias, w["w1.b"]),
        (bert.output.dense.weight, w["w2.w"]), (bert.output.dense.bias, w["w2.b"]),
        (bert.output.LayerNorm.weight, w["n2.w"]), (bert.output.LayerNorm.bias, w["n2.b"]),
    ])
    return bert


def _timm_block(vit: Any, ours: EncoderLayer) -> nn.Module:
    """timm's ViT ``Block`` (pre-LN, GELU, fused qkv) holding ``ours``'s weights."""
    cfg = ours.cfg
    block = vit.Block(cfg.d_model, cfg.n_heads, mlp_ratio=cfg.d_ff / cfg.d_model, qkv_bias=True)
    w = _addnorm_pairs(ours)
    _copy([
        (block.norm1.weight, w["n1.w"]), (block.norm1.bias, w["n1.b"]),
        (block.attn.qkv.weight, w["qkv.w"]), (block.attn.qkv.bias, w["qkv.b"]),
        (block.attn.proj.weight, w["out.w"]), (block.attn.proj.bias, w["out.b"]),
        (block.norm2.weight, w["n2.w"]), (block.norm2.bias, w["n2.b"]),
        (block.mlp.fc1.weight, w["w1.w"]), (block.mlp.fc1.bias, w["w1.b"]),
        (block.mlp.fc2.weight, w["w2.w"]), (block.mlp.fc2.bias, w["w2.b"]),
    ])
    return block


class _BertCall(nn.Module):
    """BertLayer called as ``layer(x)`` returning a tensor (its return type varies by version)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


def _implementations(
    d_model: int, n_heads: int, d_ff: int, report: Report
) -> tuple[dict[str, nn.Module], set[str], list[tuple[str, str, str, float]]]:
    """The layers by name, the names of the references, and the same-weight pairs to check
    as (addnorm name, reference name, what, tolerance)."""
    torch.manual_seed(0)
    base = LayerConfig(d_model, n_heads, d_ff)
    post = EncoderLayer(base)
    pre = EncoderLayer(LayerConfig(d_model, n_heads, d_ff, norm_position="pre"))
    layers: dict[str, nn.Module] = {"addnorm post-LN": post, "addnorm pre-LN": pre}
    refs = {"torch.nn post-LN": to_torch(post), "torch.nn pre-LN": to_torch(pre)}
    pairs = [("addnorm post-LN", "torch.nn post-LN", "same weights", 1e-5),
             ("addnorm pre-LN", "torch.nn pre-LN", "same weights", 1e-5)]
    x_transformers = optional_module("x_transformers", report.notes)
    if x_transformers is not None:
        refs["x-transformers"] = x_transformers.Encoder(
            dim=d_model, depth=1, heads=n_heads, ff_mult=d_ff // d_model, attn_flash=True
        )
    transformers = optional_module("transformers", report.notes)
    if transformers is not None:
        bert_ours = EncoderLayer(LayerConfig(d_model, n_heads, d_ff, activation="gelu",
                                             norm_eps=1e-12))
        layers["addnorm post-LN, GELU"] = bert_ours
        refs["HF BertLayer"] = _BertCall(_bert_layer(transformers, bert_ours))
        pairs.append(("addnorm post-LN, GELU", "HF BertLayer", "same weights", 1e-5))
    vit = optional_module("timm.models.vision_transformer", report.notes)
    if vit is not None:
        timm_ours = EncoderLayer(LayerConfig(d_model, n_heads, d_ff, activation="gelu",
                                             norm_position="pre", norm_eps=1e-6))
        layers["addnorm pre-LN, GELU"] = timm_ours
        refs["timm ViT Block"] = _timm_block(vit, timm_ours)
        pairs.append(("addnorm pre-LN, GELU", "timm ViT Block", "same weights", 1e-5))
    return {**layers, **refs}, set(refs), pairs


@contextlib.contextmanager
def _precision(bf16: bool) -> Iterator[None]:
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


def _call(layer: nn.Module, x: torch.Tensor, *, train: bool, bf16: bool) -> Callable[[], object]:
    if train:
        def step() -> None:
            layer.zero_grad(set_to_none=True)
            with _precision(bf16):
                out = layer(x)
            out.float().square().mean().backward()
        return step

    def infer() -> torch.Tensor:
        with torch.no_grad(), _precision(bf16):
            return layer(x)
    return infer


def _checks(layers: dict[str, nn.Module], pairs: list, x: torch.Tensor, report: Report) -> None:
    with torch.no_grad():
        for ours, theirs, what, tolerance in pairs:
            error = (layers[ours](x) - layers[theirs](x)).abs().max().item()
            report.checks.append(Check(GROUP, f"{ours} vs {theirs}, {what}", error, tolerance))
        for name in ("addnorm post-LN", "addnorm pre-LN"):
            full = layers[name](x)
            with _precision(True):
                half = layers[name](x).float()
            error = (half - full).abs().max().item()
            report.checks.append(
                Check(GROUP, f"{name}: bf16 autocast vs fp32", error, BF16_TOLERANCE)
            )


def run_encoder_layer(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """Time every implementation on every case; append rows and checks to ``report``."""
    d_model, n_heads, d_ff, shapes = _sizes(settings.size)
    layers, refs, pairs = _implementations(d_model, n_heads, d_ff, report)
    _checks(layers, pairs, torch.randn(2, 16, d_model), report)
    modes = [(False, False), (True, False), (False, True), (True, True)]  # (train, bf16)
    if settings.size == "quick":
        modes = [(False, False), (True, False), (False, True)]
    if not cpu_has_bf16():
        modes = [(train, bf16) for train, bf16 in modes if not bf16]
        report.notes.append(f"{GROUP}: bf16 autocast not timed: this CPU has no bf16 "
                            "instructions (its bf16 matmuls are emulated, many times slower "
                            "than fp32); the bf16-vs-fp32 accuracy check still runs")
    for batch, length in shapes:
        x = torch.randn(batch, length, d_model)
        for train, bf16 in modes:
            case = f"{batch}x{length} {'train' if train else 'infer'} {'bf16' if bf16 else 'fp32'}"
            log(f"{GROUP}: {case}")
            for layer in layers.values():
                layer.train(train)
            fns = {name: _call(layer, x, train=train, bf16=bf16) for name, layer in layers.items()}
            dtype = torch.bfloat16 if bf16 else torch.float32
            fns["torch.mm"], gemm_flops = gemm(batch * length, d_model, d_ff, dtype=dtype)
            times = time_case(fns, settings, report, GROUP, case)
            gemm_times = times.pop("torch.mm")
            flops = _layer_flops(batch, length, d_model, d_ff) * (3 if train else 1)
            twins = {ours: theirs for ours, theirs, _, _ in pairs}  # the same weights
            for name, samples in times.items():
                # per round, the layer's FLOP rate over the GEMM's in the same round
                fractions = [(flops / mine) / (gemm_flops / gemm)
                             for mine, gemm in zip(samples, gemm_times, strict=True)]
                report.rows.append(Row(
                    GROUP, case, name, samples, batch * length, "tokens/s",
                    reference=name in refs, flops=flops,
                    gemm_fraction=statistics.median(fractions), twin=twins.get(name),
                ))
    for layer in layers.values():
        layer.eval()
