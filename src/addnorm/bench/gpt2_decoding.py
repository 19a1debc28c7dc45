"""GPU case: greedy decoding with GPT-2 small, prompt 32, 128 new tokens, batch 1 and 16.

Four ways to generate from the same weights (bf16 weights, or float32 with ``--fp32``):
addnorm's ``TransformerLM.generate`` eager and with ``GenerationConfig(compile=True)`` (its
compiled decode step over a static cache), Hugging Face's ``generate`` (dynamic cache), and
Hugging Face's static-cache compiled generation (``cache_implementation="static"``, which
compiles its forward: on CUDA with its default ``CompileConfig``, CUDA graphs included),
where it runs. The compiled ones come with ``--compile`` (the default on CUDA). Rates are
generated tokens/s (batch x new tokens per call) and ms per decoding step; every call
decodes all the way (no stop token) and includes the prompt's forward.

Checks: in float32, addnorm's tokens are Hugging Face's (identical); in the timed precision,
the compiled tokens against the eager ones, identical in float32; in bf16, where rounding
may flip a near-tie and everything after it, the share of equal tokens is a note.

Shapes legend: B batch, P prompt length, N new tokens.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from addnorm.bench.flops import decoding_flops, matmul_weights
from addnorm.bench.gpt2_training import GPT2_SMALL, GPT2_TINY
from addnorm.bench.harness import BenchSettings, Check, Report, time_case
from addnorm.bench.measure import dynamo_counts, peak_memory, seconds, state_bytes
from addnorm.bench.pairs import gpt2_pair
from addnorm.bench.profiling import Profiled, profile_calls
from addnorm.bench.references import optional_module
from addnorm.transformer.lm import TransformerLM

__all__ = ["run_gpt2_decoding"]

GROUP = "GPT-2 greedy decoding"
HF_STATIC = "HF static cache, compiled"


def _sizes(size: str) -> tuple[str, dict[str, int], int, int, int, list[int]]:
    """(name, widths, positions, prompt length, new tokens, batch sizes) for the run's size."""
    if size == "test":
        return "GPT-2 tiny", GPT2_TINY, 16, 4, 6, [1, 2]
    return "GPT-2 small", GPT2_SMALL, 1024, 32, 128, [1, 16]


def _ours(model: TransformerLM, prompt: torch.Tensor, new: int, *, compile: bool
          ) -> Callable[[], torch.Tensor]:
    config = dataclasses.replace(model.generation_config, max_new_tokens=new, eos_id=None,
                                 compile=compile)
    return lambda: model.generate(prompt, config)  # (B, N)


def _hf_compile_config(transformers: Any, device: torch.device) -> Any:
    """Hugging Face's default compile settings for static-cache generation on CUDA; on other
    devices (where it would not compile) the same without CUDA graphs, forced on."""
    if device.type == "cuda":
        return transformers.CompileConfig()
    config = transformers.CompileConfig(mode="default")
    config._compile_all_devices = True
    return config


def _hf(transformers: Any, model: Any, prompt: torch.Tensor, new: int, *, static: bool
        ) -> Callable[[], torch.Tensor]:
    settings: dict[str, Any] = {}
    if static:
        settings = {"cache_implementation": "static",
                    "compile_config": _hf_compile_config(transformers, prompt.device)}
    attention_mask = torch.ones_like(prompt)

    def run() -> torch.Tensor:
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=attention_mask, max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, num_beams=1,
                                 use_cache=True, **settings)
        return out[:, prompt.shape[1]:]  # (B, N)
    return run


def _first_call(fn: Callable[[], torch.Tensor], device: torch.device
                ) -> tuple[float, torch.Tensor]:
    """Seconds and tokens of the first call of a compiled generation (which compiles it)."""
    out: list[torch.Tensor] = []
    elapsed = seconds(lambda: out.append(fn()), device)
    return elapsed, out[0]


def _differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a != b).sum().item())


def run_gpt2_decoding(settings: BenchSettings, report: Report, log: Callable[[str], None]) -> None:
    """Generated tokens/s and ms per step of the four, same weights, tokens checked."""
    transformers = optional_module("transformers", report.notes)
    if transformers is None:
        report.notes.append(f"{GROUP}: skipped, its reference (transformers) is missing")
        return
    name, widths, positions, prompt_len, new, batches = _sizes(settings.size)
    device = settings.torch_device
    ours, hf = gpt2_pair(transformers, widths, positions, device)
    gen = torch.Generator().manual_seed(0)
    prompts = {b: torch.randint(0, widths["vocab_size"], (b, prompt_len), generator=gen).to(device)
               for b in batches}
    for batch, prompt in prompts.items():  # float32: the same tokens
        differ = _differ(_ours(ours, prompt, new, compile=False)(),
                         _hf(transformers, hf, prompt, new, static=False)())
        report.checks.append(Check(GROUP, f"{name} B={batch}: addnorm vs HF generate, same "
                                   "weights, float32, tokens that differ", float(differ), 0.0))
    dtype = torch.bfloat16 if settings.precision == "bf16" else torch.float32
    ours.to(dtype), hf.to(dtype)
    flop_weights = matmul_weights(ours)
    for batch, prompt in prompts.items():
        case = f"{name} B={batch}, P={prompt_len}, {new} new, {settings.precision}"
        log(f"{GROUP}: {case}")
        fns = {"addnorm": _ours(ours, prompt, new, compile=False),
               "HF generate": _hf(transformers, hf, prompt, new, static=False)}
        models: dict[str, nn.Module] = {"addnorm": ours, "HF generate": hf}
        twins = {"addnorm": "HF generate"}
        first: dict[str, float] = {}
        tokens = {impl: fn() for impl, fn in fns.items()}
        if settings.compile:
            log(f"{GROUP}: {case}: compiling")
            for impl, fn, model in (
                ("addnorm compiled", _ours(ours, prompt, new, compile=True), ours),
                (HF_STATIC, _hf(transformers, hf, prompt, new, static=True), hf),
            ):
                graphs, breaks = dynamo_counts()
                try:
                    first[impl], tokens[impl] = _first_call(fn, device)
                except Exception as err:  # noqa: BLE001  (a reference that does not run here)
                    if impl != HF_STATIC:
                        raise
                    report.notes.append(f"{GROUP} {case}: {HF_STATIC} left out, it failed: "
                                        f"{type(err).__name__}: {str(err).splitlines()[0]}")
                    continue
                fns[impl], models[impl] = fn, model
                after = dynamo_counts()
                report.notes.append(f"{GROUP} {case}: {impl}: {after[0] - graphs} graphs, "
                                    f"{after[1] - breaks} graph breaks")
            twins["addnorm compiled"] = HF_STATIC
        _token_checks(case, tokens, dtype, report)
        times = time_case(fns, settings, report, GROUP, case)
        memory = {impl: peak_memory(fn, device, state_bytes(models[impl]))
                  for impl, fn in fns.items()}
        compile_seconds = {impl: max(0.0, t - statistics.median(times[impl]))
                           for impl, t in first.items()}
        report.add_rows(
            GROUP, case, times, per_call=batch * new, unit="tokens/s",
            references={"HF generate", HF_STATIC},
            flops=decoding_flops(flop_weights, widths["n_layer"], widths["n_embd"], batch,
                                 prompt_len, new),
            twins={k: v for k, v in twins.items() if v in fns}, memory=memory,
            compile_seconds=compile_seconds, steps=new,
        )
        if settings.profile_dir is not None and batch == batches[0]:
            chosen = [n for n in ("addnorm compiled", HF_STATIC) if n in fns] or ["addnorm"]
            profile_calls(f"greedy decoding {case}, one call ({new} steps)",
                          [Profiled(n, fns[n], models[n]) for n in chosen], settings, log)


def _token_checks(case: str, tokens: dict[str, torch.Tensor], dtype: torch.dtype,
                  report: Report) -> None:
    """Compiled against eager: identical in float32 (checks), the share equal in bf16 (notes)."""
    pairs = [("addnorm compiled", "addnorm"), (HF_STATIC, "HF generate"),
             ("addnorm", "HF generate")]
    for got, want in pairs:
        if got not in tokens:
            continue
        differ = _differ(tokens[got], tokens[want])
        if dtype == torch.float32 and got == "addnorm compiled":
            report.checks.append(Check(GROUP, f"{case}: {got} vs {want}, tokens that differ",
                                       float(differ), 0.0))
        elif dtype != torch.float32:
            share = 1 - differ / tokens[want].numel()
            report.notes.append(f"{GROUP} {case}: {got} and {want} give the same token at "
                                f"{share:.1%} of positions (bf16: a flipped near-tie changes "
                                "the rest of its row)")
