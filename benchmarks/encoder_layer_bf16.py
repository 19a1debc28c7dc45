"""One encoder layer under CPU bf16 autocast, inference: addnorm with SDPA, addnorm with the
explicit product (``addnorm.attention_kernel``), and torch.nn's fast path, same weights.

The three run in interleaved rounds in one process (so a drift of the machine hits all of
them alike); each round times ``--calls`` calls of each. Prints the median time of each and
the median of the per-round speed ratios with their 25-75% range. With ``--threads 1`` the
clock is the process's CPU time, which other jobs on a shared machine disturb least. Not
part of pytest.

    python benchmarks/encoder_layer_bf16.py --batch 8 --length 128 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import addnorm.attention_kernel as kernel
from addnorm.interop.torch_nn import to_torch
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.layers import EncoderLayer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    torch.manual_seed(0)
    ours = EncoderLayer(LayerConfig(512, 8, 2048)).eval()
    reference = to_torch(ours).eval()
    x = torch.randn(args.batch, args.length, 512)
    limit = kernel.EXPLICIT_MAX_SCORES

    def infer(layer: torch.nn.Module, explicit: bool = True):
        def call() -> torch.Tensor:
            kernel.EXPLICIT_MAX_SCORES = limit if explicit else 0  # 0: SDPA
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                return layer(x)
        return call

    fns = {"addnorm, SDPA": infer(ours, explicit=False), "addnorm, explicit": infer(ours),
           "torch.nn": infer(reference)}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(args.rounds):
        for name, fn in fns.items():
            start = clock()
            for _ in range(args.calls):
                fn()
            times[name].append((clock() - start) / args.calls)
    kernel.EXPLICIT_MAX_SCORES = limit

    def speed(name: str, base: str) -> str:
        ratios = sorted(b / a for a, b in zip(times[name], times[base], strict=True))
        n = len(ratios)
        return f"{statistics.median(ratios):.3f} ({ratios[n // 4]:.3f}-{ratios[3 * n // 4]:.3f})"

    print(f"{args.batch} x {args.length}, {args.threads} thread(s), torch {torch.__version__}")
    for name, samples in times.items():
        print(f"  {name:18} {1e3 * statistics.median(samples):7.2f} ms")
    print(f"  speed vs torch.nn: SDPA {speed('addnorm, SDPA', 'torch.nn')}, explicit "
          f"{speed('addnorm, explicit', 'torch.nn')}; explicit vs SDPA "
          f"{speed('addnorm, explicit', 'addnorm, SDPA')}")


if __name__ == "__main__":
    main()
