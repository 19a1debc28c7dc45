"""Claim 8 (seed posts 000 and 002): sinusoidal positions work past the longest training
length; a learned table cannot.

Three small decoder-only :class:`TransformerLM` s, identical but for ``position_encoding``
(sinusoidal, rotary, learned), learn to copy: ``[bos, a_1 .. a_n, sep, a_1 .. a_n]`` with
n up to ``TRAIN_MAX`` tokens. They are then scored (teacher forcing, argmax) on the copy
half for longer n. The learned table has rows for the test lengths, but rows past the
training length never receive a gradient: they stay at their random initialisation.

The comparison past the training length means something only once a model has learned to
copy at the lengths it trained on (accuracy ``WORKS`` there); until then, as after the quick
run's 10 steps, every model is at chance everywhere and the claim is undecided.
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.transformer.config import LMConfig
from addnorm.transformer.lm import TransformerLM

NAME = "length-extrapolation"
CLAIM = (
    "A model with sinusoidal (or rotary) positions still works on sequences longer than any "
    "seen in training; one with a learned position table does not."
)
SEEDS = ("000", "002")  # the seed posts the claim comes from
N_SYMBOLS, SEP, FIRST_SYMBOL = 16, 3, 4  # ids 0, 1, 2: pad, bos, eos
TRAIN_MAX, BATCH, LR = 8, 32, 1e-3
ENCODINGS = ("sinusoidal", "rotary", "learned")
WORKS = 0.5  # copy accuracy above which a model "works" at a length


def copy_batch(gen: torch.Generator, n: int) -> torch.Tensor:
    """Shapes: returns (B, 2n + 2) ids, ``[bos, a, sep, a]``."""
    symbols = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + N_SYMBOLS, (BATCH, n), generator=gen)
    bos = torch.ones(BATCH, 1, dtype=torch.long)
    sep = torch.full((BATCH, 1), SEP, dtype=torch.long)
    return torch.cat([bos, symbols, sep, symbols], dim=1)


def copy_logits(model: TransformerLM, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Logits that predict the copy half: positions sep .. end - 1. Shapes: (B, n, V)."""
    return model(ids[:, :-1])[:, n + 1 :]


def make_model(encoding: str, max_len: int, seed: int) -> TransformerLM:
    torch.manual_seed(seed)
    cfg = LMConfig(vocab_size=FIRST_SYMBOL + N_SYMBOLS, d_model=64, n_heads=4, n_layers=2,
                   d_ff=128, dropout=0.0, position_encoding=encoding, max_len=max_len)
    return TransformerLM(cfg)


def train(model: TransformerLM, n_steps: int, seed: int) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for step in range(n_steps):
        n = 1 + step % TRAIN_MAX
        ids = copy_batch(gen, n)
        logits = copy_logits(model, ids, n)  # (B, n, V)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, n + 2 :].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def accuracy(model: TransformerLM, n: int, n_batches: int, seed: int) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    correct = 0.0
    for _ in range(n_batches):
        ids = copy_batch(gen, n)
        correct += (copy_logits(model, ids, n).argmax(-1) == ids[:, n + 2 :]).float().mean().item()
    return correct / n_batches


def run(*, quick: bool = False) -> Outcome:
    n_steps, test_ns, n_batches = (10, [4, 8, 12], 1) if quick else (800, [2, 4, 6, 8, 10,
                                                                             12, 16, 24], 8)
    max_len = 2 * max(test_ns) + 2
    acc: dict[str, list[float]] = {}
    untouched_rows = 0.0
    for encoding in ENCODINGS:
        model = make_model(encoding, max_len, seed=0)
        if encoding == "learned":
            table = dict(model.named_parameters())["embed.pos_enc.embedding.weight"]
            initial = table.detach().clone()
        train(model, n_steps, seed=1)
        acc[encoding] = [accuracy(model, n, n_batches, seed=2) for n in test_ns]
        if encoding == "learned":
            beyond = 2 * TRAIN_MAX + 1  # rows the longest training input never reaches
            untouched_rows = (table[beyond:] - initial[beyond:]).abs().max().item()
    longer = [i for i, n in enumerate(test_ns) if n > TRAIN_MAX]
    long_acc = {e: sum(acc[e][i] for i in longer) / len(longer) for e in ENCODINGS}
    seen = [i for i, n in enumerate(test_ns) if n <= TRAIN_MAX]
    seen_acc = {e: sum(acc[e][i] for i in seen) / len(seen) for e in ENCODINGS}
    undecided_because = ""
    supported: bool | None = (long_acc["sinusoidal"] >= WORKS and
                              long_acc["sinusoidal"] > long_acc["learned"] + 0.1)
    if max(seen_acc.values()) < WORKS:
        supported = None
        undecided_because = (
            f"after {n_steps} steps no model copies even at the trained lengths (best accuracy "
            f"{max(seen_acc.values()):.2f} at n <= {TRAIN_MAX}, chance {1 / N_SYMBOLS:.2f}), so "
            "there is nothing to compare past them"
            + ("; the full run (without --quick) trains 800 steps" if quick else "")
        )

    fig = new_figure(8, 5)
    ax = fig.subplots()
    for encoding, marker in zip(ENCODINGS, "osD", strict=True):
        ax.plot(test_ns, acc[encoding], marker + "-", label=encoding, linewidth=2)
    ax.axvspan(0, TRAIN_MAX + 0.5, color="gray", alpha=0.15, label="lengths seen in training")
    ax.axhline(1 / N_SYMBOLS, color="gray", linestyle=":", label="chance")
    ax.set(title=f"Copy task: trained on n <= {TRAIN_MAX} symbols, tested longer",
           xlabel="n (symbols to copy; input length 2n + 2 tokens)",
           ylabel="copy accuracy (fraction of tokens)", ylim=(0, 1.05))
    ax.legend(loc="lower left")
    ax.grid(alpha=0.3)
    headline = (
        f"copy accuracy past n = {TRAIN_MAX}: " + ", ".join(
            f"{e} {long_acc[e]:.2f}" for e in ENCODINGS)
        + f" (at n <= {TRAIN_MAX}: " + ", ".join(
            f"{e} {acc[e][test_ns.index(TRAIN_MAX)]:.2f}" for e in ENCODINGS) + ")"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"TransformerLM (d_model 64, 2 layers, 4 heads) per position_encoding, "
                f"{n_steps} AdamW steps (lr {LR:g}, batch {BATCH}) on copying n = 1..{TRAIN_MAX}"
                f" of {N_SYMBOLS} symbols; accuracy on n in {test_ns} over {n_batches} batches "
                f"of {BATCH}. 'Works' = accuracy >= {WORKS} past the training length and above "
                "the learned table's by 0.1."),
        numbers={"test_n": test_ns, "accuracy": acc, "accuracy_past_training": long_acc,
                 "learned_rows_past_training_max_change": untouched_rows,
                 "accuracy_at_trained_lengths": seen_acc, "train_max_n": TRAIN_MAX},
        figure=fig, undecided_because=undecided_because,
    )
