"""A character model trained on short windows generates four windows' worth as well past its
context as within it (issue 40.4): held-out bits per character are no worse past the
context than within it, and samples do not collapse into runs of one character.

The model: a tiny TransformerLM (sinusoidal positions, the lm task's default, which compute
any position, so nothing but the window keeps generation within the trained ones) trained on
windows of CONTEXT characters of the bundled pydoc text, seeded, on one CPU thread (about 8
s of CPU time): 2.9 bits per character held out within its context.

Provenance of the bounds. Held out: windows of 4 * CONTEXT + 1 characters of the validation
split, scored through the decode path (``decode_log_probs``: what ``generate`` computes at
each position). Each window gives a paired difference, its mean bits past the context minus
its mean bits within; "no worse within noise" is a mean difference below three standard
errors of that mean (a one-sided test that a model truly no worse past its context fails
with probability about 0.1%). Samples (temperature 1): how often a letter repeats the
character before it; collapse into runs of one letter raises that rate. Its rate past the
context must stay within three standard errors of the rate within the context, where the
model is as trained (two proportions, pooled). Both checks fail without the window: the same
model run at positions it never trained on (``window=4 * CONTEXT``) is asserted to fail them
(measured: 2.2 bits worse past the context against 0.1 better with the window; letters
repeated at 10% past the context against 2% within, 2.6% with the window).
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
import torch.nn.functional as F

from addnorm.data.text import TextCorpus
from addnorm.generation.scoring import decode_log_probs
from addnorm.transformer.config import LMConfig
from addnorm.transformer.lm import TransformerLM

CONTEXT = 16
LENGTH = 4 * CONTEXT  # what is generated and scored
STEPS = 800


@pytest.fixture(scope="module")
def trained():
    """A TransformerLM trained on windows of CONTEXT characters, and its corpus."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second thread only waits on a shared machine
    try:
        yield _train()
    finally:
        torch.set_num_threads(threads)


def _train() -> tuple[TransformerLM, TextCorpus]:
    corpus = TextCorpus()
    tok = corpus.tokenizer
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=tok.vocab_size, d_model=64, n_heads=4, n_layers=2, d_ff=256,
                   dropout=0.0, max_len=LENGTH, pad_id=tok.pad_id, bos_id=tok.bos_id,
                   eos_id=tok.eos_id)
    model = TransformerLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for step in range(STEPS):
        for group in optimizer.param_groups:  # warm-up, then cosine decay
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 20) * 0.5 * (
                1 + math.cos(math.pi * step / STEPS))
        windows = corpus.random_windows(rng, 32, CONTEXT)  # (32, CONTEXT + 1)
        logits = model(windows[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.context = CONTEXT  # as a loaded run's model knows its seq_len
    return model, corpus


def _held_out(corpus: TextCorpus, n: int) -> torch.Tensor:
    """n tiling windows of LENGTH + 1 characters of the validation split."""
    val = corpus.ids("val")
    return torch.stack([val[i * (LENGTH + 1) : (i + 1) * (LENGTH + 1)] for i in range(n)])


def _past_minus_within(bits: torch.Tensor) -> tuple[float, float]:
    """The mean over windows of (bits past the context - bits within), and its standard
    error."""
    difference = bits[:, CONTEXT:].mean(dim=1) - bits[:, :CONTEXT].mean(dim=1)  # (n,)
    return difference.mean().item(), difference.std().item() / math.sqrt(len(difference))


def _repeats(texts: list[str]) -> tuple[float, float, float]:
    """The rates of letters that repeat the character before them, within the context and
    past it, and the standard error of their difference (two proportions, pooled)."""

    def repeated(a: str, b: str) -> list[bool]:  # per letter of b, whether a's char is it
        return [x == y for x, y in zip(a, b, strict=True) if y.isalpha()]

    within = [r for t in texts for r in repeated(t[: CONTEXT - 1], t[1:CONTEXT])]
    past = [r for t in texts for r in repeated(t[CONTEXT - 1 : -1], t[CONTEXT:])]
    pooled = (sum(within) + sum(past)) / (len(within) + len(past))
    error = math.sqrt(pooled * (1 - pooled) * (1 / len(within) + 1 / len(past)))
    return sum(within) / len(within), sum(past) / len(past), error


@torch.no_grad()
def test_held_out_bits_past_the_context_are_no_worse_than_within(trained):
    model, corpus = trained
    held_out = _held_out(corpus, 96)
    bits = -decode_log_probs(model, held_out) / math.log(2)  # (96, LENGTH), sliding
    worse, error = _past_minus_within(bits)
    assert worse < 3 * error, (worse, error)
    # The same model at positions it never trained on: clearly worse (the issue: 2.30
    # bits within a context of 64, 5.27-5.36 past it).
    unseen = -decode_log_probs(model, held_out, window=LENGTH) / math.log(2)
    worse, error = _past_minus_within(unseen)
    assert worse > 3 * error, (worse, error)


@torch.no_grad()
def test_samples_past_the_context_do_not_collapse_into_runs(trained):
    model, corpus = trained
    prompt = torch.tensor([corpus.tokenizer.encode("The ")] * 64)  # (64, 4)
    config = dataclasses.replace(model.generation_config, strategy="sample", eos_id=None,
                                 max_new_tokens=LENGTH - prompt.shape[1])

    def samples(**window) -> list[str]:
        generator = torch.Generator().manual_seed(0)
        new = model.generate(prompt, dataclasses.replace(config, **window), generator=generator)
        # one character per id (a special id, which decodes to none, as "\0")
        return ["".join(corpus.tokenizer.decode([i]) or "\0" for i in row)
                for row in torch.cat([prompt, new], dim=1).tolist()]

    within, past, error = _repeats(samples())
    assert past - within < 3 * error, (within, past, error)
    within, past, error = _repeats(samples(window=LENGTH))  # positions never trained on
    assert past - within > 3 * error, (within, past, error)
