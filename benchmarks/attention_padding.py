"""Attention forward + backward with and without padding, on two source trees alternately.

What padding costs attention, and whether two trees give the same numbers: a
``MultiHeadAttention`` over a right-padded batch (the path that keeps padding queries out of
the backward pass), the same module with no mask (SDPA's no-mask path), and a two-layer
pre-LN ``Decoder`` with target and memory padding (self- and cross-attention), each timed as
one forward and one backward of a loss on the real outputs. Public API only, so an older tree
runs it too.

    python benchmarks/attention_padding.py --compare /tmp/before/src    # this tree vs another
    python benchmarks/attention_padding.py --against-unisolated         # vs this tree without
    python benchmarks/attention_padding.py                              # this tree alone
    python benchmarks/attention_padding.py --device cuda --against-unisolated --compile

With ``--compare`` the trees run in alternating subprocesses (``--rounds`` of each, the order
flipped every round), each round reporting per case the median of ``--repeats`` timed calls
after two warm-ups; the summary is the median over rounds, this / other, and the SHA-256 of
every case's output and gradients (inputs' and parameters'), so bit-identity shows too.
``--against-unisolated`` compares this tree with itself where the two steps that keep padding
queries out of the backward pass (``addnorm.attention.finite_padding_queries`` and
``held_padding_rows``) are replaced by the identity in the child process: what those steps
cost, measured without a second checkout (on a GPU machine, say).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE_SRC = str(Path(__file__).resolve().parent.parent / "src")
CASES = ("mha padded", "mha no mask", "decoder padded")


def one_round(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    import hashlib
    import time

    import torch

    from addnorm import LayerConfig, MultiHeadAttention
    from addnorm.transformer.stacks import Decoder

    torch.set_num_threads(args.threads)
    if args.unisolated:  # the same tree without the two steps (see the module docstring)
        import addnorm.attention

        addnorm.attention.finite_padding_queries = lambda q, query_padding: q
        addnorm.attention.held_padding_rows = lambda heads, query_padding: heads
    device = torch.device(args.device)
    batch, length, d_model, n_heads = args.batch, args.length, args.d_model, args.heads
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=gen)
    padding = (torch.arange(length)[None, :] >= lengths[:, None]).to(device)  # (B, L)
    x = torch.randn(batch, length, d_model, generator=gen).to(device)
    memory = torch.randn(batch, length, d_model, generator=gen).to(device)
    weights = torch.randn(batch, length, d_model, generator=gen).to(device)
    real = ~padding[..., None]

    torch.manual_seed(0)
    attention = MultiHeadAttention(d_model, n_heads).to(device)
    cfg = LayerConfig(d_model, n_heads, 4 * d_model, norm_position="pre")
    decoder = Decoder(cfg, 2).to(device)

    def mha(mask: torch.Tensor | None) -> Callable[..., torch.Tensor]:
        return lambda t, m: attention(t, padding_mask=mask)

    calls = {
        "mha padded": (attention, mha(padding)),
        "mha no mask": (attention, mha(None)),
        "decoder padded": (decoder, lambda t, m: decoder(
            t, m, padding_mask=padding, memory_padding_mask=padding.flip(0))),
    }
    results: dict[str, dict[str, object]] = {}
    for name, (module, call) in calls.items():
        fn = torch.compile(call, fullgraph=True) if args.compile else call

        def step(module: torch.nn.Module = module, fn: Callable[..., torch.Tensor] = fn
                 ) -> tuple[torch.Tensor, ...]:
            module.zero_grad(set_to_none=True)
            inputs = x.clone().requires_grad_(), memory.clone().requires_grad_()
            out = fn(*inputs)
            torch.where(real, out * weights, torch.zeros_like(out)).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            grads = [t.grad for t in inputs] + [p.grad for p in module.parameters()]
            return (out.detach(), *(g for g in grads if g is not None))

        step()
        tensors = step()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        digest = hashlib.sha256()
        for t in tensors:
            digest.update(t.cpu().contiguous().numpy().tobytes())
        results[name] = {"median_ms": 1e3 * statistics.median(times),
                         "sha256": digest.hexdigest()}
    return results


def run_tree(src: str, args: argparse.Namespace, unisolated: bool = False
             ) -> dict[str, dict[str, object]]:
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [sys.executable, __file__, "--once", *sys.argv[1:], *(["--unisolated"] * unisolated)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", metavar="SRC", help="another tree's src/ to alternate with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True)")
    parser.add_argument("--against-unisolated", action="store_true",
                        help="compare with this tree without the padding-query isolation")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--unisolated", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(json.dumps(one_round(args)))
        return
    trees = {"this": HERE_SRC} | ({"other": args.compare} if args.compare else {})
    if args.against_unisolated:
        trees["other"] = HERE_SRC
    compared = "other" in trees
    rounds: dict[str, list[dict[str, dict[str, object]]]] = {name: [] for name in trees}
    for i in range(args.rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            unisolated = args.against_unisolated and name == "other"
            result = run_tree(trees[name], args, unisolated)
            rounds[name].append(result)
            times = ", ".join(f"{case} {result[case]['median_ms']:.2f} ms" for case in CASES)
            print(f"round {i}: {name:5s} {times}", flush=True)
    summary: dict[str, object] = {}
    for case in CASES:
        row: dict[str, object] = {}
        for name, results in rounds.items():
            row[f"{name}_ms"] = statistics.median(float(r[case]["median_ms"]) for r in results)
        if compared:
            row["this_over_other"] = row["this_ms"] / row["other_ms"]  # type: ignore[operator]
            row["bit_identical"] = (rounds["this"][0][case]["sha256"]
                                    == rounds["other"][0][case]["sha256"])
        summary[case] = row
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
