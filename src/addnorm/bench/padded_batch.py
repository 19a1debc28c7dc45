"""Sentence embeddings of a padded batch, where unpadding decides.

A MiniLM-sized BERT (6 layers, D 384, 12 heads, F 1536, WordPiece vocabulary of 30,522:
all-MiniLM-L6-v2's shape, random weights) embeds 32 texts whose lengths are drawn uniformly
from 8 to 64 tokens (seed 0), padded to the longest: about half the batch is padding.
``addnorm embed`` runs :class:`~addnorm.transformer.encoder_model.EncoderModel` unpadded
(``EncoderConfig.unpad``); it is timed against itself padded and against Hugging Face's
``BertModel`` holding the same weights (which computes every padding position). The rate is
texts per second; the mean-pooled embeddings are checked equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from addnorm.bench.harness import BenchSettings, Check, Report, time_case
from addnorm.bench.references import optional_module
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel, mean_pool

__all__ = ["run_padded_batch"]

GROUP = "padded batch (sentence embeddings)"
MINILM = EncoderConfig(vocab_size=30522, d_model=384, n_heads=12, n_layers=6, d_ff=1536,
                       dropout=0.0, pad_id=0)


def _batch(cfg: EncoderConfig, texts: int, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids with lengths uniform in [8, longest], right-padded, and their padding mask."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, longest + 1, (texts,), generator=gen)
    width = int(lengths.max())
    padding = torch.arange(width)[None, :] >= lengths[:, None]  # (B, L)
    ids = torch.randint(1, cfg.vocab_size, (texts, width), generator=gen)
    return ids.masked_fill(padding, cfg.pad_id), padding  # type: ignore[arg-type]


def run_padded_batch(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """Texts/s of addnorm's unpadded and padded encoder and of HF ``BertModel``."""
    if optional_module("transformers", report.notes) is None:
        report.notes.append(f"{GROUP}: skipped, transformers is missing")
        return
    from addnorm.interop.hf_models import to_transformers

    small = settings.size == "test"
    cfg = dataclasses.replace(MINILM, d_model=32, n_heads=4, n_layers=2, d_ff=64) if small \
        else MINILM
    texts = 4 if small else 32
    torch.manual_seed(0)
    padded = EncoderModel(cfg).eval()
    unpadded = EncoderModel(dataclasses.replace(cfg, unpad=True)).eval()
    unpadded.load_state_dict(padded.state_dict())
    bert = to_transformers(padded).eval()
    ids, padding = _batch(cfg, texts, 16 if small else 64)
    case = f"{texts} texts, {padding.float().mean().item():.0%} padding"
    log(f"{GROUP}: {case}")

    @torch.no_grad()
    def embed(model: EncoderModel) -> torch.Tensor:
        return mean_pool(model(ids, padding_mask=padding), padding)  # (B, D)

    @torch.no_grad()
    def embed_bert() -> torch.Tensor:
        hidden = bert(input_ids=ids, attention_mask=(~padding).long()).last_hidden_state
        return mean_pool(hidden, padding)  # (B, D)

    want = embed_bert()
    for name, model in (("unpadded", unpadded), ("padded", padded)):
        error = (embed(model) - want).abs().max().item()
        report.checks.append(Check(GROUP, f"addnorm {name} vs BertModel, same weights, mean-"
                                   "pooled embeddings", error, 1e-4))
    fns = {
        "addnorm, unpadded": lambda: embed(unpadded),
        "addnorm, padded": lambda: embed(padded),
        "HF BertModel": embed_bert,
    }
    times = time_case(fns, settings, report, GROUP, case)
    report.add_rows(GROUP, case, times, per_call=texts, unit="texts/s",
                    references={"HF BertModel"})
