"""How long a prompt longer than the lm's context takes to continue: the whole prompt prefilled
(what ``LMTask.sample`` did before it cut prompts to ``max_len``; the attention of the prefill
grows with the prompt's length squared) against ``LMTask.sample`` now, which continues the
prompt's last ``max_len - 1`` characters.

Random weights of the lm task's default model; one timing per length (the gap is orders of
magnitude, larger than a shared machine's noise).

    PYTHONPATH=src python benchmarks/long_prompt_timing.py
"""

from __future__ import annotations

import dataclasses
import time

import torch

from addnorm.tasks.lm import LMTask

UNIT = "def fn(x):\n    return x\n"


def text(n: int) -> str:
    return (UNIT * (n // len(UNIT) + 1))[:n]


def main() -> None:
    task = LMTask()
    cfg = task.prepare(task.default_model_config())
    torch.manual_seed(0)
    model = task.build_model(cfg).eval()
    print(f"lm: d_model {cfg.d_model}, {cfg.n_layers} layers, max_len {cfg.max_len}, "
          f"{cfg.position_encoding} positions")
    config = dataclasses.replace(model.generation_config, max_new_tokens=1, eos_id=None)
    for n in (5_000, 10_000, 20_000):
        ids = torch.tensor([task.tokenizer.encode(text(n))])
        start = time.perf_counter()
        model.generate(ids, config)
        print(f"{n:>7} characters prefilled whole: {time.perf_counter() - start:7.2f} s")
    for n in (20_000, 100_000):
        start = time.perf_counter()
        task.sample(model, text(n), max_new_tokens=5, temperature=0)
        print(f"{n:>7} characters, LMTask.sample: {time.perf_counter() - start:7.2f} s")


if __name__ == "__main__":
    main()
