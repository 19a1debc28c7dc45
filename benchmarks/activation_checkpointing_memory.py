"""Memory saved by per-layer activation checkpointing (``--activation-checkpointing``).

One training step (forward, backward, AdamW update) of the "base" encoder-decoder (Vaswani et
al. 2017: 6 + 6 layers, d_model 512, d_ff 2048, 8 heads) with and without
``checkpoint_layers``, each in a fresh process so that peaks do not mix. On CPU it reports
the peak resident set size (``ru_maxrss``) and its rise over the process's size with the model
built (the rise holds the gradients and AdamW's two moments, the same in both, and the
activations, which checkpointing shrinks); on CUDA ``torch.cuda.max_memory_allocated``. It
also times the step (the recomputation costs about one more forward). Not part of pytest.

    .venv/bin/python benchmarks/activation_checkpointing_memory.py [--batch 16] [--length 128]
        [--device cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time

import torch

import addnorm
from addnorm.training.config import TrainConfig
from addnorm.training.distributed import checkpoint_layers
from addnorm.training.trainer import make_optimizer


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _step(model, optimizer, src, tgt, device) -> float:
    """One training step; its time in seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    logits = model(src, tgt[:, :-1])  # (B, L, V)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(checkpointed: bool, args) -> dict:
    """Peak memory of one step in this process (call once per process)."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = dataclasses.replace(addnorm.PRESETS["base"], src_vocab_size=args.vocab,
                              tgt_vocab_size=args.vocab, dropout=0.1)
    model = addnorm.Transformer(cfg).to(device).train()
    if checkpointed:
        checkpoint_layers(model)
    optimizer = make_optimizer(model, TrainConfig())
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, args.vocab, (args.batch, args.length), generator=g).to(device)
    tgt = torch.randint(3, args.vocab, (args.batch, args.length + 1), generator=g).to(device)
    before = _rss_mib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    seconds = _step(model, optimizer, src, tgt, device)  # the peak's time: one step
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
            else _rss_mib())
    return {"checkpointed": checkpointed, "before_mib": before, "peak_mib": peak,
            "step_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--only", choices=["plain", "checkpointed"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.only is not None:  # the child process: one measurement as JSON
        print(json.dumps(measure(args.only == "checkpointed", args)))
        return
    rows = []
    for variant in ("plain", "checkpointed"):
        child = [sys.executable, __file__, "--only", variant, *sys.argv[1:]]
        done = subprocess.run(child, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    kind = "CUDA max allocated" if args.device.startswith("cuda") else "peak RSS"
    print(f"base preset, batch {args.batch} x {args.length} tokens, vocab {args.vocab}, "
          f"{args.device}; {kind} during one training step:")
    for row in rows:
        name = "checkpointed" if row["checkpointed"] else "plain"
        rise = row["peak_mib"] - row["before_mib"]
        print(f"  {name:>12}: peak {row['peak_mib']:8.0f} MiB (+{rise:6.0f} MiB over the "
              f"built model), step {row['step_s']:.2f} s")
    plain, checkpointed = rows
    saved = plain["peak_mib"] - checkpointed["peak_mib"]
    ratio = (checkpointed["peak_mib"] - checkpointed["before_mib"]) / max(
        plain["peak_mib"] - plain["before_mib"], 1e-9
    )
    print(f"  saved {saved:.0f} MiB of the peak; the step's rise is {ratio:.0%} of plain; "
          f"time x{checkpointed['step_s'] / plain['step_s']:.2f}")


if __name__ == "__main__":
    main()
