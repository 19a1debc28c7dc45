"""What ``--bf16`` (bfloat16 autocast) gains and loses, as measured, for the flags' help and the
warning a CPU run gets at its start.

Measurements behind the numbers (steps/s of bf16 autocast over fp32, same code, same run):

* CPU, an Intel Xeon VM with 2 cores, AVX-512 with avx512_bf16 and AMX, torch 2.13.0+cpu,
  shared with another training run: ``addnorm bench --bf16 --only small --rounds 3``, two
  runs, gave 0.21x and 0.33x for the date translator's training step (default config, B=64)
  and 0.58x and 0.43x for the digits DiT's; two more under heavier load 0.17x and 0.29x for
  the translator; with ``--threads 1`` (steadier beside the other run) 0.37x and 0.32x for
  the translator, 0.52x and 0.50x for the DiT. ``addnorm bench --only encoder --rounds 3``
  (one D-512 encoder layer, bf16 timed automatically on such a CPU): 1.0x-1.4x. A CPU without
  bf16 instructions emulates bf16 matrix products, many times slower than fp32 (the bench
  does not time it there).
* GPU, one NVIDIA H100, torch 2.11.0+cu130, ``train_run`` steps/s after warm-up, two rounds:
  the default translator 0.79x-0.87x and digits DiT 0.83x-0.97x (their steps are bound by
  kernel launches, not arithmetic); the paper's base translator at batch 64 0.90x-0.99x, at
  batch 1024 1.76x-2.34x; an 8-layer D-1024 LM at batch 32 x 256 tokens 4.4x-5.3x.

So bf16 pays for large matrix products on a GPU, and loses on the CPU with the task models
addnorm trains; a ``train --bf16`` run on the CPU starts with a warning that says so (it is not
refused: bf16 activations also take half the memory).
"""

from __future__ import annotations

import sys

__all__ = ["BF16_HELP", "cpu_bf16_warning", "warn_if_bf16_on_cpu"]

BF16_HELP = (
    "bfloat16 autocast for the forward and loss. Measured against fp32: on a GPU (H100) it "
    "trains large models faster (an 8-layer D-1024 LM 4.4-5.3x, the base-size translator at "
    "batch 1024 1.8-2.3x) and the small task models no faster (0.8-1.0x); on a CPU it made "
    "the default translator 0.2-0.4x and the digits DiT 0.4-0.6x as fast as fp32, even with "
    "avx512_bf16 and AMX (a CPU without bf16 instructions emulates it, slower still), and a "
    "D-512 encoder layer 1.0-1.4x. A CPU run starts with a warning"
)


def cpu_bf16_warning(has_bf16_instructions: bool) -> str:
    """The warning for a bf16 run on the CPU, given whether the CPU has bf16 instructions."""
    where = (
        "this CPU has bf16 instructions, as that one did"
        if has_bf16_instructions
        else "this CPU has no bf16 instructions, so its bf16 matrix products are emulated and "
        "slower still"
    )
    return (
        "warning: --bf16 on the CPU trained the task models slower than fp32 where measured: "
        "0.2-0.4x fp32's steps/s for the date translator and 0.4-0.6x for the digits DiT "
        "(addnorm bench --bf16 --only small, a 2-core Xeon with avx512_bf16 and AMX, torch "
        f"2.13); {where}. bf16 pays for large models on a GPU; drop --bf16 here unless you "
        "need its smaller activations"
    )


def warn_if_bf16_on_cpu(bf16: bool, device: str, *, prefix: str) -> None:
    """Print :func:`cpu_bf16_warning` on stderr, as ``PREFIX: warning: ...``, when a run with
    ``bf16`` trains on the CPU ``device``."""
    if not bf16 or not str(device).startswith("cpu"):
        return
    from addnorm.bench.harness import cpu_has_bf16

    print(f"{prefix}: {cpu_bf16_warning(cpu_has_bf16())}", file=sys.stderr, flush=True)
