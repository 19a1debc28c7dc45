"""Compiled cached decoding (``GenerationConfig(compile=True)``) vs eager, same model, same run.

Greedy decoding of a ``TransformerLM`` from left-padded prompts: eager steps over the
growing cache, then the step compiled once (inductor, ``fullgraph=True``) over the static
cache. Prints the compile time (the first compiled call minus a warm one), the median time
per generated token of both, the speed-up, how many graphs dynamo compiled, and whether the
tokens are identical. Not part of pytest.

    .venv/bin/python benchmarks/compiled_decoding.py [--preset lm-small] [--device cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from torch._dynamo.utils import counters

import addnorm


def _seconds(fn, device: torch.device) -> tuple[float, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="lm-small", choices=["lm-tiny", "lm-small"])
    parser.add_argument("--position-encoding", default="rotary")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = dataclasses.replace(
        addnorm.PRESETS[args.preset], dropout=0.0, position_encoding=args.position_encoding,
        max_len=max(512, args.prompt_len + args.new_tokens),
    )
    model = addnorm.TransformerLM(cfg).to(device).eval()
    prompt = torch.randint(3, cfg.vocab_size, (args.batch, args.prompt_len), device=device)
    for row in range(1, args.batch):  # left padding of different lengths
        prompt[row, : row * args.prompt_len // (2 * args.batch)] = cfg.pad_id
    eager_cfg = dataclasses.replace(
        model.generation_config, max_new_tokens=args.new_tokens, eos_id=None
    )
    compiled_cfg = dataclasses.replace(eager_cfg, compile=True)

    def eager() -> torch.Tensor:
        return model.generate(prompt, eager_cfg)

    def compiled() -> torch.Tensor:
        return model.generate(prompt, compiled_cfg)

    eager()  # warm-up
    eager_runs = [_seconds(eager, device) for _ in range(args.repeats)]
    eager_times, eager_tokens = [t for t, _ in eager_runs], eager_runs[0][1]
    counters.clear()
    first, compiled_tokens = _seconds(compiled, device)
    warm_times = [_seconds(compiled, device)[0] for _ in range(args.repeats)]
    t_eager, t_compiled = statistics.median(eager_times), statistics.median(warm_times)
    n = args.new_tokens
    print(f"{args.preset} ({args.position_encoding}), B={args.batch}, prompt {args.prompt_len}, "
          f"{n} new tokens, {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"  compile (first call - warm call): {first - t_compiled:.1f} s")
    print(f"  eager    {1e3 * t_eager / n:.2f} ms/token")
    print(f"  compiled {1e3 * t_compiled / n:.2f} ms/token   speed-up {t_eager / t_compiled:.2f}x")
    print(f"  graphs compiled: {counters['stats']['unique_graphs']}   tokens identical: "
          f"{torch.equal(eager_tokens, compiled_tokens)}")


if __name__ == "__main__":
    main()
