"""Case 3: greedy decoding with the cache, addnorm's ``TransformerLM`` against Hugging Face's
``GPT2LMHeadModel`` of the same size (4 layers, D 256, 4 heads, vocab 256), same weights.

Both generate 200 new tokens (no stop token) after a 16-token prompt, at batch 1 and 8; the
tokens must be identical. With ``--compile`` addnorm's compiled decode step
(``GenerationConfig(compile=True)``) is timed as well, and its compile time reported.

Shapes legend: B batch, L0 prompt length, N new tokens, D d_model, V vocab.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from addnorm.bench.harness import BenchSettings, Check, Report, time_case
from addnorm.bench.references import optional_module
from addnorm.interop.hf_models import from_transformers
from addnorm.transformer.lm import TransformerLM

__all__ = ["gpt2_config", "run_decoding"]

GROUP = "decoding"
PROMPT_LEN = 16


def _sizes(size: str) -> tuple[dict[str, int], int, list[int]]:
    """(GPT-2 widths, new tokens, batch sizes) for the run's size."""
    if size == "test":
        return {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 64}, 8, [1, 2]
    gpt2 = {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 256}
    return gpt2, 200, ([1] if size == "quick" else [1, 8])


def gpt2_config(transformers: Any, widths: dict[str, int], max_len: int) -> Any:
    """A ``GPT2Config`` without dropout; like GPT-2, its last id starts and ends texts."""
    last = widths["vocab_size"] - 1
    return transformers.GPT2Config(
        **widths, n_positions=max_len, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=last, eos_token_id=last, pad_token_id=None,
    )


def _hf_generate(gpt2: Any, prompt: torch.Tensor, new: int) -> Callable[[], torch.Tensor]:
    attention_mask = torch.ones_like(prompt)

    def run() -> torch.Tensor:
        with torch.no_grad():
            out = gpt2.generate(
                prompt, attention_mask=attention_mask, max_new_tokens=new, min_new_tokens=new,
                do_sample=False, num_beams=1, use_cache=True,
            )
        return out[:, prompt.shape[1]:]
    return run


def _ours_generate(
    model: TransformerLM, prompt: torch.Tensor, new: int, *, compile: bool
) -> Callable[[], torch.Tensor]:
    config = dataclasses.replace(
        model.generation_config, max_new_tokens=new, eos_id=None, compile=compile
    )
    return lambda: model.generate(prompt, config)


def run_decoding(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """Tokens/s of greedy decoding, addnorm (eager, and compiled with ``--compile``) against
    GPT-2 with the same weights; the tokens are checked identical."""
    transformers = optional_module("transformers", report.notes)
    if transformers is None:
        report.notes.append(f"{GROUP}: skipped, its reference (transformers) is missing")
        return
    widths, new, batches = _sizes(settings.size)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(gpt2_config(transformers, widths, 512)).eval()
    ours = from_transformers(gpt2)  # the same weights: addnorm.interop's conversion
    # Both decode all the way (no stop token), so that the same work is timed.
    gpt2.generation_config.eos_token_id = None
    gpt2.generation_config.bos_token_id = None
    assert isinstance(ours, TransformerLM)
    for batch in batches:
        case = f"B={batch}, {new} new tokens"
        log(f"{GROUP}: {case}")
        prompt = torch.randint(0, widths["vocab_size"], (batch, PROMPT_LEN))
        fns = {"addnorm": _ours_generate(ours, prompt, new, compile=False),
               "HF GPT-2": _hf_generate(gpt2, prompt, new)}
        if settings.compile:
            compiled = _ours_generate(ours, prompt, new, compile=True)
            start = time.perf_counter()
            compiled()
            first = time.perf_counter() - start
            fns["addnorm compiled"] = compiled
        tokens = {name: fn() for name, fn in fns.items()}
        for name in fns:
            if name != "HF GPT-2":
                differ = (tokens[name] != tokens["HF GPT-2"]).sum().item()
                report.checks.append(Check(GROUP, f"{case}: {name} vs HF GPT-2, tokens that "
                                           "differ", float(differ), 0.0))
        times = time_case(fns, settings, report, GROUP, case)
        if settings.compile:
            warm = statistics.median(times["addnorm compiled"])
            report.notes.append(f"{GROUP} {case}: compiling the decode step took "
                                f"{first - warm:.1f} s (first call minus a warm one)")
        report.add_rows(GROUP, case, times, per_call=batch * new, unit="tokens/s",
                        references={"HF GPT-2"})
