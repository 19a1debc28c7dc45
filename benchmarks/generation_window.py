"""Generating past a language model's training context: held-out bits per character by
position, and tokens per second, with and without a sliding window, for several strides.

Takes an lm run (``addnorm train lm --seq-len C ...``): the model loads with its context C (the
run's ``seq_len``). Held-out: windows of 4C + 1 characters of the run's validation split,
scored through the decode path (``addnorm.generation.scoring.decode_log_probs``: start on the
first character, then one cached step per character, teacher-forced), so the figures are
those of what ``generate`` computes at each position:

- ``no window``: every position seen (up to the model's ``max_len``), the behaviour before
  windows;
- ``stride S``: the window of C characters slides by S (``GenerationConfig.window_stride``).

Then tokens per second of greedy generation of ``--new`` characters at batch 1 (eager), per
setting, the fastest of ``--repeats`` rounds, and how samples of 4C characters (temperature 1)
look past the context: how often a letter repeats the character before it (within the
context and past it) and their longest run of one letter past it, beside the held-out
text's own. Not part of pytest.

    .venv/bin/python benchmarks/generation_window.py runs/lm64 [--windows 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
import time

import torch

from addnorm.generation.scoring import decode_log_probs
from addnorm.tasks.trained import load_trained


def _blocks(bits: torch.Tensor, context: int) -> list[float]:
    """Mean bits per character of each block of ``context`` scored positions."""
    return [bits[:, i : i + context].mean().item() for i in range(0, bits.shape[1], context)]


def _longest_letter_run(text: str) -> int:
    """The longest run of one letter (runs of spaces and rules of "*" are the text's own)."""
    return max([len(list(group)) for key, group in itertools.groupby(text) if key.isalpha()]
               or [0])


def _letter_repeats(texts: list[str]) -> float:
    """How often a letter repeats the character before it."""
    pairs = [a == b for text in texts for a, b in zip(text[:-1], text[1:], strict=True)
             if b.isalpha()]
    return sum(pairs) / max(len(pairs), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="an lm run folder or checkpoint")
    parser.add_argument("--windows", type=int, default=32, help="held-out windows scored")
    parser.add_argument("--strides", default="1,q,h", help="strides: numbers, q (C/4), h (C/2)")
    parser.add_argument("--new", type=int, default=512, help="characters generated for speed")
    parser.add_argument("--samples", type=int, default=64, help="samples for the run lengths")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (the fastest counts)")
    parser.add_argument("--skip-scores", action="store_true", help="time and sample only")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task, model, _ = load_trained(args.run)
    context = model.context
    length = 4 * context
    if model.cfg.position_encoding == "learned":
        length = min(length, model.cfg.max_len)
    strides = [{"q": max(context // 4, 1), "h": max(context // 2, 1)}.get(s) or int(s)
               for s in args.strides.split(",")]
    val = task.open_corpus().ids("val")
    n = min(args.windows, (len(val) - 1) // (length + 1))
    held_out = torch.stack([val[i * (length + 1) : (i + 1) * (length + 1)] for i in range(n)])
    print(f"run {args.run}: context {context}, max_len {model.cfg.max_len}, "
          f"{model.cfg.position_encoding} positions; {n} held-out windows of {length + 1}")
    text = task.tokenizer.decode(val.tolist())
    runs = [_longest_letter_run(text[i : i + length]) for i in range(0, len(text), length)]
    print(f"held-out text: letters repeating the character before {_letter_repeats([text]):.3f};"
          f" longest run of one letter per {length} characters: median "
          f"{statistics.median(runs)}, max {max(runs)}")
    settings = [("no window", {"window": max(length, model.cfg.max_len)})] + [
        (f"stride {s}", {"window_stride": s}) for s in strides]
    header = "setting        within C  past C   " + "  ".join(
        f"{i * context}-{(i + 1) * context - 1}".rjust(9) for i in range(length // context))
    print(header)
    for name, window in [] if args.skip_scores else settings:
        start = time.perf_counter()
        bits = -decode_log_probs(model, held_out, **window) / math.log(2)  # (n, length)
        seconds = time.perf_counter() - start
        blocks = _blocks(bits, context)
        print(f"{name:<14} {bits[:, :context].mean().item():8.3f}  "
              f"{bits[:, context:].mean().item():6.3f}   "
              + "  ".join(f"{b:9.3f}" for b in blocks) + f"   ({seconds:.0f} s)")
    print(f"\ngeneration at batch 1, eager (greedy for the speed: the fastest of "
          f"{args.repeats} rounds, settings taken in turn; temperature 1 for the samples):")
    prompt = torch.tensor([task.tokenizer.encode("The ")])  # (1, 4)
    new = args.new
    if model.cfg.position_encoding == "learned":  # no window: the table's rows at most
        new = min(new, model.cfg.max_len - prompt.shape[1])
    greedy = {name: dataclasses.replace(model.generation_config, eos_id=None, max_new_tokens=new,
                                        **window) for name, window in settings}
    seconds = {name: math.inf for name, _ in settings}
    for _ in range(args.repeats):
        for name, config in greedy.items():
            start = time.perf_counter()
            model.generate(prompt, config)
            seconds[name] = min(seconds[name], time.perf_counter() - start)
    for name, _ in settings:
        sampling = dataclasses.replace(greedy[name], strategy="sample", temperature=1.0,
                                       max_new_tokens=length - prompt.shape[1])
        generator = torch.Generator().manual_seed(0)
        rows = model.generate(prompt.expand(args.samples, -1), sampling, generator=generator)
        samples = [task.tokenizer.decode(prompt[0].tolist() + row) for row in rows.tolist()]
        runs = [_longest_letter_run(sample[context:]) for sample in samples]
        within = _letter_repeats([sample[:context] for sample in samples])
        past = _letter_repeats([sample[context - 1 :] for sample in samples])
        print(f"{name:<14} {new / seconds[name]:7.0f} tokens/s ({new} tokens); samples: letters "
              f"repeated {within:.3f} within the context, {past:.3f} past it; longest run of "
              f"one letter past it: median {statistics.median(runs)}, max {max(runs)}")


if __name__ == "__main__":
    main()
