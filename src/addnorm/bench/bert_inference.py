"""GPU case: BERT-base inference on a padded batch, B 64 x T 128 with about 35% padding.

addnorm's ``EncoderModel`` padded and with ``unpad=True`` (the layers run on the real tokens
only) against Hugging Face's ``BertModel`` (sdpa) holding the same weights, all in eval mode
without gradients, with bf16 weights (or float32 with ``--fp32``). Row lengths are uniform in
[38, 128] (seed 0): a mean of 83 real tokens, 35% padding. The rate is real tokens/s and the
FLOPs are the real tokens' (:mod:`addnorm.bench.flops`), so the padded implementations are
credited with the useful work only.

Checks: the hidden states of the real tokens, addnorm (both ways) against BertModel, in
float32 and, in bf16, against the float32 result no further than BertModel's bf16 result is
(:mod:`addnorm.bench.tolerances`).

Shapes legend: B batch, T padded length, D width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from addnorm.bench.flops import encoder_flops, matmul_weights
from addnorm.bench.harness import BenchSettings, Check, Report, time_case
from addnorm.bench.measure import peak_memory, state_bytes
from addnorm.bench.pairs import bert_pair
from addnorm.bench.references import optional_module
from addnorm.bench.tolerances import FP32_OUTPUT, bf16_bound, relative_error
from addnorm.transformer.encoder_model import EncoderConfig

__all__ = ["BERT_BASE", "run_bert_inference"]

GROUP = "BERT inference, padded batch"
BERT_BASE = EncoderConfig(vocab_size=30522, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                          activation="gelu", norm_position="post", norm_eps=1e-12,
                          max_len=512, n_token_types=2, embed_norm=True, dropout=0.0,
                          pad_id=0)
BERT_TINY = EncoderConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                          activation="gelu", norm_position="post", norm_eps=1e-12,
                          max_len=32, n_token_types=2, embed_norm=True, dropout=0.0, pad_id=0)


def _sizes(size: str) -> tuple[str, EncoderConfig, int, int, int]:
    """(name, config, batch, padded length, shortest row) for the run's size."""
    if size == "test":
        return "BERT-tiny", BERT_TINY, 4, 16, 5
    return "BERT-base", BERT_BASE, 64, 128, 38


def padded_batch(vocab: int, batch: int, length: int, shortest: int, *, pad_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) with row lengths uniform in [shortest, length], right-padded, and the
    padding mask (B, T), True = padding; the longest row has no padding."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(shortest, length + 1, (batch,), generator=gen)
    lengths[0] = length  # the batch's width is T
    padding = torch.arange(length)[None, :] >= lengths[:, None]  # (B, T)
    ids = torch.randint(1, vocab, (batch, length), generator=gen)
    return ids.masked_fill(padding, pad_id), padding


def run_bert_inference(settings: BenchSettings, report: Report, log: Callable[[str], None]
                       ) -> None:
    """Real tokens/s of addnorm padded and unpadded and of HF BertModel, same weights."""
    if optional_module("transformers", report.notes) is None:
        report.notes.append(f"{GROUP}: skipped, its reference (transformers) is missing")
        return
    name, cfg, batch, length, shortest = _sizes(settings.size)
    device = settings.torch_device
    padded, unpadded, bert = bert_pair(cfg, device)
    ids, padding = padded_batch(cfg.vocab_size, batch, length, shortest, pad_id=0)
    ids, padding = ids.to(device), padding.to(device)
    real = ~padding  # (B, T)
    attention_mask = real.long()
    case = f"{name} B={batch} x T={length}, {padding.float().mean().item():.0%} padding, " \
           f"{settings.precision}"
    log(f"{GROUP}: {case}")

    @torch.no_grad()
    def ours(model: nn.Module) -> torch.Tensor:
        return model(ids, padding_mask=padding)  # (B, T, D)

    @torch.no_grad()
    def theirs() -> torch.Tensor:
        return bert(input_ids=ids, attention_mask=attention_mask).last_hidden_state  # (B, T, D)

    models = {"addnorm, padded": padded, "addnorm, unpad=True": unpadded, "HF BertModel": bert}
    fns: dict[str, Callable[[], torch.Tensor]] = {
        "addnorm, padded": lambda: ours(padded), "addnorm, unpad=True": lambda: ours(unpadded),
        "HF BertModel": theirs}
    exact = {name: fn()[real] for name, fn in fns.items()}  # (real tokens, D)
    for impl in ("addnorm, padded", "addnorm, unpad=True"):
        report.checks.append(Check(GROUP, f"{case}: {impl} vs HF BertModel, same weights, float32 "
                                   "hidden states of the real tokens (relative)",
                                   relative_error(exact[impl], exact["HF BertModel"]),
                                   FP32_OUTPUT))
    if settings.precision == "bf16":
        for model in models.values():
            model.to(torch.bfloat16)
        _bf16_checks(case, fns, real, exact["HF BertModel"], report)
    times = time_case(fns, settings, report, GROUP, case)
    memory = {name: peak_memory(fn, device, state_bytes(models[name]))
              for name, fn in fns.items()}
    lengths = real.sum(dim=1).tolist()
    report.add_rows(GROUP, case, times, per_call=sum(lengths), unit="real tokens/s",
                    references={"HF BertModel"},
                    flops=encoder_flops(matmul_weights(padded), cfg.n_layers, cfg.d_model,
                                        lengths), memory=memory)


def _bf16_checks(case: str, fns: dict[str, Callable[[], torch.Tensor]], real: torch.Tensor,
                 exact: torch.Tensor, report: Report) -> None:
    errors = {name: relative_error(fn()[real], exact) for name, fn in fns.items()}
    tolerance = bf16_bound([errors["HF BertModel"]], 1.0)  # relative errors: scale 1
    for name in ("addnorm, padded", "addnorm, unpad=True"):
        report.checks.append(Check(GROUP, f"{case}: {name}: bf16 hidden states vs the float32 ones "
                                   "(relative), at most twice BertModel's bf16 error",
                                   errors[name], tolerance))
