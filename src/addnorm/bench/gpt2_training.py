"""GPU case: a GPT-2 small training step (12 layers, D 768, vocab 50,257), B 16 x T 1024.

addnorm's ``TransformerLM`` against Hugging Face's ``GPT2LMHeadModel`` (sdpa) holding the same
weights, both eager and, with ``--compile`` (the default on CUDA), both ``torch.compile``d. The
loss is the same for both: cross-entropy of the float32 logits against the next tokens
(``addnorm.tasks.lm``'s), and what is compiled is the model with its loss (addnorm with
``fullgraph=True``; Hugging Face's model as its users compile it, graph breaks allowed). The
step protocol (bf16 autocast, fused AdamW, checks, memory) is :mod:`addnorm.bench.training_step`.

Checks: the float32 logits of both on two rows, and each implementation's first loss against
the float32 loss. FLOPs: ``6 N`` per token plus attention (:mod:`addnorm.bench.flops`).
``--profile DIR`` profiles the (compiled) steps of both.

Shapes legend: B batch, T length, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.bench.flops import lm_flops, matmul_weights
from addnorm.bench.harness import BenchSettings, Check, Report
from addnorm.bench.pairs import gpt2_pair
from addnorm.bench.profiling import Profiled, profile_calls
from addnorm.bench.references import optional_module
from addnorm.bench.tolerances import FP32_OUTPUT, relative_error
from addnorm.bench.training_step import TrainImpl, adamw, run_training_case

__all__ = ["GPT2_SMALL", "GPT2_TINY", "run_gpt2_training"]

GROUP = "GPT-2 training step"
GPT2_SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257}
GPT2_TINY = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 96}


def _sizes(size: str) -> tuple[str, dict[str, int], int, int]:
    """(name, widths, batch, length) for the run's size."""
    return ("GPT-2 tiny", GPT2_TINY, 2, 16) if size == "test" \
        else ("GPT-2 small", GPT2_SMALL, 16, 1024)


def lm_loss(model: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """addnorm's next-token loss: cross-entropy of the float32 logits."""
    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())  # (B T, V)
    return loss


def hf_loss(model: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The same loss of a Hugging Face causal LM's logits."""
    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(input_ids=x).logits.flatten(0, 1).float(), y.flatten())
    return loss


def run_gpt2_training(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """Tokens/s, TFLOP/s, memory and compile time of the training step, addnorm and HF."""
    transformers = optional_module("transformers", report.notes)
    if transformers is None:
        report.notes.append(f"{GROUP}: skipped, its reference (transformers) is missing")
        return
    name, widths, batch, length = _sizes(settings.size)
    device = settings.torch_device
    ours, hf = gpt2_pair(transformers, widths, length, device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, widths["vocab_size"], (batch, length + 1), generator=gen).to(device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # (B, T) inputs and targets
    case = f"{name} B={batch} x T={length}, {settings.precision}"
    log(f"{GROUP}: {case}")
    with torch.no_grad():  # the same weights: float32 logits on two rows
        error = relative_error(ours(x[:2]), hf(input_ids=x[:2]).logits)
        exact = lm_loss(ours)(x, y).item()
    report.checks.append(Check(GROUP, f"{case}: addnorm vs HF GPT-2, same weights, float32 logits "
                               "(relative)", error, FP32_OUTPUT))
    ours_opt, hf_opt = adamw(ours), adamw(hf)
    impls = [TrainImpl("addnorm", ours, lm_loss(ours), ours_opt, twin="HF GPT-2"),
             TrainImpl("HF GPT-2", hf, hf_loss(hf), hf_opt, reference=True)]
    if settings.compile:
        impls += [
            TrainImpl("addnorm compiled", ours, torch.compile(lm_loss(ours), fullgraph=True),
                      ours_opt, compiled=True, twin="HF GPT-2 compiled"),
            TrainImpl("HF GPT-2 compiled", hf, torch.compile(hf_loss(hf)), hf_opt,
                      compiled=True, reference=True),
        ]
    flops = lm_flops(matmul_weights(ours), widths["n_layer"], widths["n_embd"], batch, length,
                     training=True)
    steps = run_training_case(
        GROUP, case, impls, check_batch=(x, y), timed_batch=(x, y), exact=exact,
        per_call=batch * length, unit="tokens/s", flops=flops, settings=settings,
        report=report, log=log,
    )
    if settings.profile_dir is not None:
        chosen = ("addnorm compiled", "HF GPT-2 compiled") if settings.compile \
            else ("addnorm", "HF GPT-2")
        by_name = {impl.name: impl for impl in impls}
        profile_calls(f"training step {case}", [
            Profiled(impl, steps[impl], by_name[impl].model, by_name[impl].optimizer)
            for impl in chosen], settings, log)
