"""Unpadded encoders on two source trees, side by side: where variable-length attention pays.

Times ``unpad=True`` (and the padded layout for scale) on the CPU, float32, through the public
API both trees share, alternating the trees in fresh processes (A, B, A, B ...) so neither
gets the quieter minute; prints each case's median over rounds and the median of the
per-round ratios B / A. Not part of pytest.

    python benchmarks/unpadded_attention.py /tmp/before/src src --rounds 9
    python benchmarks/unpadded_attention.py /tmp/before/src src --threads 1 --clock cpu

Cases: sentence embeddings of 32 texts of 8-64 tokens by a MiniLM-sized BERT (6 x 384, the
``addnorm bench`` padded case), inference; 4 layers of BERT-base (768, 12 heads) on 16 x 128
tokens with rows of 38-128 real tokens (35% padding, the GPU suite's BERT case at a CPU
size), inference; the date translator's model (preset ``tiny``, sinusoidal, unpadded encoder)
training step on 64 sources of 6-32 tokens (44% padding).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = ("minilm embed unpadded", "bert4 unpadded", "bert4 padded", "translator train unpadded")

_CHILD = r"""
import dataclasses, json, sys, time, torch
import addnorm
torch.set_num_threads(int(sys.argv[1]))
reps = int(sys.argv[2])
clock = time.process_time if sys.argv[3] == "cpu" else time.perf_counter

def median_time(fn, n):
    fn()
    times = []
    for _ in range(n):
        t = clock(); fn(); times.append(clock() - t)
    return sorted(times)[len(times) // 2]

def batch(vocab, texts, shortest, longest, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (texts,), generator=gen)
    lengths[0] = longest
    padding = torch.arange(longest)[None, :] >= lengths[:, None]
    ids = torch.randint(1, vocab, (texts, longest), generator=gen)
    return ids.masked_fill(padding, 0), padding

out = {}
torch.manual_seed(0)
mini = addnorm.EncoderConfig(vocab_size=30522, d_model=384, n_heads=12, n_layers=6, d_ff=1536,
                             max_len=512, dropout=0.0, pad_id=0, unpad=True)
model = addnorm.EncoderModel(mini).eval()
ids, padding = batch(mini.vocab_size, 32, 8, 64)
with torch.no_grad():
    out["minilm embed unpadded"] = median_time(lambda: model(ids, padding_mask=padding), reps)

bert = dataclasses.replace(mini, d_model=768, n_layers=4, d_ff=3072)
ids, padding = batch(bert.vocab_size, 16, 38, 128)
for unpad in (True, False):
    torch.manual_seed(0)
    model = addnorm.EncoderModel(dataclasses.replace(bert, unpad=unpad)).eval()
    name = "bert4 unpadded" if unpad else "bert4 padded"
    with torch.no_grad():
        out[name] = median_time(lambda: model(ids, padding_mask=padding), reps)

torch.manual_seed(0)
cfg = dataclasses.replace(addnorm.PRESETS["tiny"], dropout=0.0, share_embeddings=False,
                          position_encoding="sinusoidal", unpad=True)
tr = addnorm.Transformer(cfg)
src, src_padding = batch(cfg.src_vocab_size, 64, 6, 32, seed=1)
tgt = torch.randint(4, cfg.tgt_vocab_size, (64, 12))
opt = torch.optim.AdamW(tr.parameters(), lr=1e-4)
def step():
    logits = tr(src, tgt[:, :-1], src_padding_mask=src_padding)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
out["translator train unpadded"] = median_time(step, reps)
print(json.dumps(out))
"""


def run_tree(src: str, threads: int, reps: int, clock: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    command = [sys.executable, "-c", _CHILD, str(threads), str(reps), clock]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree_a", help="src/ of the first tree (the baseline)")
    parser.add_argument("tree_b", help="src/ of the second tree")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=5, help="timed calls per round and case")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the process's CPU time (with --threads 1, what the work costs "
                        "whatever else runs on a shared machine)")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for i in range(args.rounds):
        for name, tree in (("A", args.tree_a), ("B", args.tree_b)):
            runs[name].append(run_tree(tree, args.threads, args.reps, args.clock))
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{'case':28} {'A ms':>9} {'B ms':>9} {'B/A time':>9}  per-round B/A range")
    for case in CASES:
        a = [r[case] * 1e3 for r in runs["A"]]
        b = [r[case] * 1e3 for r in runs["B"]]
        ratios = sorted(y / x for x, y in zip(a, b, strict=True))
        print(f"{case:28} {statistics.median(a):9.2f} {statistics.median(b):9.2f} "
              f"{statistics.median(ratios):9.3f}  {ratios[0]:.3f}-{ratios[-1]:.3f}")


if __name__ == "__main__":
    main()
