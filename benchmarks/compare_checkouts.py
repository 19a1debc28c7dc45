"""Two source trees of addnorm side by side on this machine: training steps and decoding.

A refactor must leave the speed as it was. This times the same work on two checkouts (their
``src/`` folders, e.g. a ``git worktree`` of the commit before a change and the working
tree), alternating A, B, A, B ... in fresh processes so that neither gets the warmer cache or
the quieter minute, and prints per-case medians, the per-round ratio spread, and B / A.
Only the public API that both trees share is used: the models' ``__call__``, ``generate`` and
``torch.optim.AdamW``. Not part of pytest.

    git worktree add /tmp/before HEAD~5
    .venv/bin/python benchmarks/compare_checkouts.py /tmp/before/src src --rounds 15

Cases (CPU, float32, the threads given): a training step (forward, loss, backward, AdamW) of
the date translator's model (preset ``tiny``, batch 64) and of a character LM (4 x 256,
batch 16 x 128); greedy decoding of 64 new tokens from a 16-token prompt, batch 1 and 8, with
the LM, and of 16 tokens with the translator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = ("translator train step", "lm train step", "lm decode b1", "lm decode b8",
         "translator decode b8")

# Runs in the child, against whichever tree PYTHONPATH names: one measurement per case.
_CHILD = r"""
import json, sys, time, torch
import addnorm
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[1]))
reps = int(sys.argv[2])

def best(fn, n):
    fn()  # warm-up
    times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]

out = {}
tcfg = addnorm.PRESETS["tiny"]
tr = addnorm.Transformer(tcfg)
src = torch.randint(4, tcfg.src_vocab_size, (64, 24))
tgt = torch.randint(4, tcfg.tgt_vocab_size, (64, 12))
opt = torch.optim.AdamW(tr.parameters(), lr=1e-4)
def tr_step():
    logits = tr(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
out["translator train step"] = best(tr_step, reps)

lcfg = addnorm.LMConfig(vocab_size=96, d_model=256, n_heads=4, n_layers=4, d_ff=1024,
                        max_len=256)
lm = addnorm.TransformerLM(lcfg)
ids = torch.randint(4, 96, (16, 129))
lopt = torch.optim.AdamW(lm.parameters(), lr=1e-4)
def lm_step():
    logits = lm(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    lopt.zero_grad(set_to_none=True); loss.backward(); lopt.step()
out["lm train step"] = best(lm_step, reps)

lm.eval(); tr.eval()
for b in (1, 8):
    prompt = torch.randint(4, 96, (b, 16))
    cfg = addnorm.GenerationConfig(max_new_tokens=64)
    out[f"lm decode b{b}"] = best(lambda: lm.generate(prompt, cfg), max(3, reps // 2))
tcfg_gen = addnorm.GenerationConfig(max_new_tokens=16)
out["translator decode b8"] = best(lambda: tr.generate(src[:8], tcfg_gen), max(3, reps // 2))
print(json.dumps(out))
"""


def _measure(src: str, threads: int, reps: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(threads), str(reps)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the child on {src} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the first tree's src/ folder (A)")
    parser.add_argument("after", help="the second tree's src/ folder (B)")
    parser.add_argument("--rounds", type=int, default=10, help="A/B pairs, alternating")
    parser.add_argument("--reps", type=int, default=10, help="timed calls per case per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")  # neither always goes first
        for which in order:
            tree = args.before if which == "A" else args.after
            runs[which].append(_measure(tree, args.threads, args.reps))
        print(f"round {r + 1}/{args.rounds} done ({time.strftime('%H:%M:%S')})", flush=True)
    print(f"\nA = {args.before}\nB = {args.after}\n{args.rounds} rounds, medians of each "
          f"round's median call, {args.threads} threads\n")
    print(f"{'case':<24}{'A (ms)':>10}{'B (ms)':>10}{'B / A':>8}   per-round B / A (min-max)")
    for case in CASES:
        a = [run[case] for run in runs["A"]]
        b = [run[case] for run in runs["B"]]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        print(f"{case:<24}{1e3 * statistics.median(a):>10.2f}{1e3 * statistics.median(b):>10.2f}"
              f"{statistics.median(b) / statistics.median(a):>8.3f}   "
              f"{min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
