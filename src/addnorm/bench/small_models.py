"""Case 2: training steps of small models, where per-op overhead decides.

- The date translator at its default size (``PRESETS["tiny"]``: D 64, 2 + 2 layers, its
  vocabularies of 132 and 15) on one batch of its own training data (64 dates, sources padded
  to the longest, about half of their tokens padding; targets of 11) against the same
  architecture built from torch.nn (``nn.Transformer`` between embeddings, a sinusoid table
  and the tied output), with the same weights (checked): addnorm with sinusoidal positions,
  padded and unpadded (the translator's default config), and with rotary positions
  (unpadded), which nn.Transformer does not have.
- The digits DiT (``DIT_PRESETS["DiT-digits"]``, batch 64) against diffusers'
  ``DiTTransformer2DModel`` holding the same weights.

A step is forward, loss, backward and an AdamW update: torch's fused AdamW for every
implementation, the fastest torch has on CPU and the one ``addnorm train`` uses, so that the
update (the same work for the same parameters) is no larger a share of the step than it must
be. ``--compile`` adds addnorm's forward compiled (compile time reported); ``--bf16`` adds
addnorm under bf16 autocast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.bench.harness import (
    BenchSettings,
    Check,
    Report,
    compiled_first_call,
    cpu_has_bf16,
    time_case,
)
from addnorm.bench.references import optional_module
from addnorm.dit.config import DIT_PRESETS
from addnorm.dit.model import DiT
from addnorm.encodings import sinusoidal_encoding
from addnorm.interop.torch_nn import to_torch
from addnorm.tasks.translate import TranslateTask
from addnorm.training.config import TrainConfig
from addnorm.transformer.config import TransformerConfig
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.stacks import EncoderDecoder

__all__ = ["TorchSeq2Seq", "run_small_models"]

GROUP = "small models (training steps)"


class TorchSeq2Seq(nn.Module):
    """The translator's architecture from torch.nn: ``E[ids] * sqrt(D) + PE`` on both sides,
    ``nn.Transformer`` (batch first), logits from the target table (tied)."""

    def __init__(self, ours: Transformer) -> None:
        super().__init__()
        cfg = ours.cfg
        self.scale = math.sqrt(cfg.d_model)
        weights = ours.state_dict()
        self.src_embed = nn.Embedding.from_pretrained(weights["src_embed.tokens.weight"].clone(),
                                                      freeze=False)
        self.tgt_embed = nn.Embedding.from_pretrained(weights["tgt_embed.tokens.weight"].clone(),
                                                      freeze=False)
        self.register_buffer("pe", sinusoidal_encoding(cfg.max_len, cfg.d_model))
        self.pe: torch.Tensor
        self.transformer = to_torch(EncoderDecoder(ours.encoder, ours.decoder))

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, src_padding: torch.Tensor
    ) -> torch.Tensor:
        """Shapes: src (B, S), tgt (B, L), src_padding (B, S) True = padding -> (B, L, V)."""
        length = tgt.shape[1]
        x = self.src_embed(src) * self.scale + self.pe[: src.shape[1]]  # (B, S, D)
        y = self.tgt_embed(tgt) * self.scale + self.pe[:length]  # (B, L, D)
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=tgt.device)
        h = self.transformer(
            x, y, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src_padding,
            memory_key_padding_mask=src_padding,
        )  # (B, L, D)
        return h @ self.tgt_embed.weight.T  # (B, L, V)


@contextlib.contextmanager
def _bf16(enabled: bool) -> Iterator[None]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        yield


def _train_step(
    model: nn.Module, loss_fn: Callable[[], torch.Tensor], *, bf16: bool = False
) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with _bf16(bf16):
            loss = loss_fn()
        loss.backward()
        optimizer.step()
    return step


def _translator_batch(
    task: TranslateTask, cfg: TransformerConfig, batch: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first training batch of the date task (seed 0): source ids padded to the longest,
    their padding mask, decoder input and target."""
    train_cfg = dataclasses.replace(TrainConfig(), batch_size=batch, seed=0)
    batches = task.batches(cfg, train_cfg, task.default_task_config())
    data = batches.next_batch()
    src = data["src"]  # (B, S)
    return src, src == cfg.pad_id, data["tgt_in"], data["tgt_out"]


def _translator(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    batch = 4 if settings.size == "test" else 64
    task = TranslateTask()
    default = task.prepare(TranslateTask.default_model_config())  # sinusoidal, unpadded
    cfg = dataclasses.replace(default, unpad=False)
    torch.manual_seed(0)
    sinusoidal = Transformer(cfg)
    unpadded = Transformer(default)
    unpadded.load_state_dict(sinusoidal.state_dict())
    rotary = Transformer(dataclasses.replace(default, position_encoding="rotary"))
    reference = TorchSeq2Seq(sinusoidal)
    src, padding, tgt_in, tgt_out = _translator_batch(task, cfg, batch)

    def ours_loss(model: Callable[..., torch.Tensor]) -> Callable[[], torch.Tensor]:
        return lambda: F.cross_entropy(
            model(src, tgt_in, src_padding_mask=padding).flatten(0, 1), tgt_out.flatten()
        )

    def torch_loss() -> torch.Tensor:
        return F.cross_entropy(reference(src, tgt_in, padding).flatten(0, 1), tgt_out.flatten())

    with torch.no_grad():
        sinusoidal.eval(), reference.eval()
        error = (sinusoidal(src, tgt_in, src_padding_mask=padding)
                 - reference(src, tgt_in, padding)).abs().max().item()
    report.checks.append(Check(GROUP, "translator: addnorm (sinusoidal) vs nn.Transformer, "
                               "same weights, logits", error, 1e-4))
    with torch.no_grad():
        unpadded.eval()
        error = (unpadded(src, tgt_in, src_padding_mask=padding)
                 - sinusoidal(src, tgt_in, src_padding_mask=padding)).abs().max().item()
    report.checks.append(Check(GROUP, "translator: addnorm unpadded vs padded, same weights, "
                               "logits", error, 1e-5))
    fns: dict[str, Callable[[], object]] = {
        "addnorm, sinusoidal": _train_step(sinusoidal, ours_loss(sinusoidal)),
        "addnorm, default (sinusoidal, unpadded)": _train_step(unpadded, ours_loss(unpadded)),
        "addnorm, rotary, unpadded": _train_step(rotary, ours_loss(rotary)),
        "torch.nn": _train_step(reference, torch_loss),
    }
    if _use_bf16(settings, report):
        fns["addnorm, default, bf16"] = _train_step(unpadded, ours_loss(unpadded), bf16=True)
    if settings.compile:  # compiled, the encoder keeps the padded layout (the shapes are fixed)
        compiled = torch.compile(unpadded, fullgraph=True)
        fns["addnorm, default, compiled"] = compiled_first_call(
            _train_step(unpadded, ours_loss(compiled)), report,
            f"{GROUP}: the translator training step")
    _time_training(fns, {"torch.nn"}, f"translator B={batch}", settings, report, log,
                   models=(sinusoidal, unpadded, rotary, reference))


def _use_bf16(settings: BenchSettings, report: Report) -> bool:
    """``--bf16`` on a CPU with bf16 instructions; without them the variant is left out (its
    matmuls would be emulated, many times slower than fp32), with a note."""
    if settings.bf16 and not cpu_has_bf16():
        note = f"{GROUP}: --bf16 variants left out: this CPU has no bf16 instructions"
        if note not in report.notes:
            report.notes.append(note)
        return False
    return settings.bf16


def _time_training(fns: dict, refs: set[str], case: str, settings: BenchSettings,
                   report: Report, log: Callable[[str], None], *, models) -> None:
    log(f"{GROUP}: {case}")
    for model in models:
        model.train()
    times = time_case(fns, settings, report, GROUP, case)
    report.add_rows(GROUP, case, times, per_call=1, unit="steps/s", references=refs)
    for model in models:
        model.eval()


def randomized_dit(name: str) -> DiT:
    """A preset DiT in the variant diffusers can express (timestep shift 1), whose every
    weight is random (a fresh one outputs exactly zero, which would make any comparison
    pass)."""
    torch.manual_seed(0)
    model = DiT(dataclasses.replace(DIT_PRESETS[name], timestep_downscale_freq_shift=1.0))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def _dit(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    if optional_module("diffusers", report.notes) is None:
        report.notes.append(f"{GROUP}: the DiT case is skipped, diffusers is missing")
        return
    from addnorm.interop.diffusers import to_diffusers

    name = "DiT-digits-tiny" if settings.size == "test" else "DiT-digits"
    batch = 4 if settings.size == "test" else 64
    ours = randomized_dit(name)
    theirs = to_diffusers(ours)
    cfg = ours.cfg
    x = torch.randn(batch, cfg.in_channels, cfg.input_size, cfg.input_size)
    t = torch.randint(0, 1000, (batch,))
    y = torch.randint(0, cfg.n_classes, (batch,))
    noise = torch.randn_like(x)

    def theirs_out() -> torch.Tensor:
        return theirs(x, timestep=t, class_labels=y).sample

    with torch.no_grad():
        error = (ours(x, t, y) - theirs_out()).abs().max().item()
    report.checks.append(Check(GROUP, f"{name}: addnorm vs diffusers, same weights", error, 1e-4))
    fns: dict[str, Callable[[], object]] = {
        "addnorm": _train_step(ours, lambda: F.mse_loss(ours(x, t, y), noise)),
        "diffusers": _train_step(theirs, lambda: F.mse_loss(theirs_out(), noise)),
    }
    if _use_bf16(settings, report):
        fns["addnorm, bf16"] = _train_step(ours, lambda: F.mse_loss(ours(x, t, y), noise),
                                           bf16=True)
    if settings.compile:
        compiled = torch.compile(ours, fullgraph=True)
        fns["addnorm, compiled"] = compiled_first_call(
            _train_step(ours, lambda: F.mse_loss(compiled(x, t, y), noise)), report,
            f"{GROUP}: the DiT training step")
    _time_training(fns, {"diffusers"}, f"{name} B={batch}", settings, report, log,
                   models=(ours, theirs))


def run_small_models(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """Training steps per second: the translator against torch.nn, the DiT against diffusers."""
    _translator(settings, report, log)
    _dit(settings, report, log)
