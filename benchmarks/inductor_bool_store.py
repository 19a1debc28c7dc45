"""Why the compiled date translator trains slower than eager on an AVX2 CPU: inductor's bool stores.

A compiled ReLU network saves its activations' masks (``relu(h) <= 0``, bool) for the backward
pass. Inductor's CPU code converts a vector mask to bool through a generic fallback (a scalar
loop per vector; no AVX2 fast path), so on the 2-core AVX2 machine of the README ``h <= 0`` on
2048 x 256 took 6.3 ms compiled and 0.36 ms eager, while the same comparison written to float
took 0.13 ms compiled. In the compiled translator step those kernels were about 13 of its
80 ms (``torch.profiler`` with ``torch._inductor.config.cpp.enable_kernel_profile = True``).
The DiT (GELU, no bool saved) is not hit, and compiles to 1.75x diffusers' forward.

Prints the vector ISA inductor picked and the median time of each function, eager and
compiled (inductor), one after the other. Not part of pytest.

    .venv/bin/python benchmarks/inductor_bool_store.py [--rows 2048] [--cols 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch._inductor import cpu_vec_isa


def _median_us(fn, *args, repeats: int = 100) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _relu_layer_step(x: torch.Tensor, w: torch.Tensor) -> None:
    torch.relu(x @ w.T).sum().backward()  # saves relu's bool mask for the backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=256)
    args = parser.parse_args()
    h = torch.randn(args.rows, args.cols)
    x, w = torch.randn(args.rows, 64), torch.randn(args.cols, 64, requires_grad=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, inductor vector ISA: "
          f"{cpu_vec_isa.pick_vec_isa() or 'none'}")
    cases = {
        "h <= 0 (bool out)": (lambda t: t <= 0, h),
        "(h <= 0).float()": (lambda t: (t <= 0).float(), h),
        "relu(x @ w.T).sum() fwd+bwd": (_relu_layer_step, x, w),
    }
    print(f"{'function':<30} {'eager us':>10} {'compiled us':>12} {'compiled/eager':>15}")
    for name, (fn, *inputs) in cases.items():
        compiled = torch.compile(fn)
        compiled(*inputs)  # compile
        eager_us, compiled_us = _median_us(fn, *inputs), _median_us(compiled, *inputs)
        print(f"{name:<30} {eager_us:>10.1f} {compiled_us:>12.1f} {compiled_us / eager_us:>15.2f}")


if __name__ == "__main__":
    main()
