"""A toy decoder whose answers can be worked out by hand, for the decoding loops' tests.

The toy model is a second-order Markov chain: the logits of the next token are
``table[previous, current]``, where ``previous`` and ``current`` are the last two tokens of the
row's history. The history lives in a toy cache whose ``reorder`` is ``index_select(0, index)``,
as the interface requires, so a beam search that follows the wrong parent reads the wrong
history and stops matching the brute-force oracle. Oracles: a per-row Python loop
(:func:`greedy_reference`), exhaustive enumeration of every sequence (:func:`brute_force_best`,
:func:`ranked_hypotheses`).

:class:`Scripted` emits a fixed sequence of tokens per row whatever it is fed, and
:class:`BeamCache` is the cache of a model that needs none, which beam search asks to follow
the beams.
"""

from __future__ import annotations

import itertools

import torch

from addnorm.generation.loop import generate_tokens

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class HistoryCache:
    """Holds every token seen per row; ``reorder`` follows the documented contract."""

    def __init__(self, history: torch.Tensor) -> None:
        self.history = history  # (B, n)

    def reorder(self, index: torch.Tensor) -> None:
        self.history = self.history.index_select(0, index)

    @property
    def length(self) -> int:
        return self.history.shape[1]


class SecondOrderChain:
    """Toy model: next-token logits = ``table[previous, current]``."""

    def __init__(self, vocab: int, seed: int, scale: float = 2.0, device: str = "cpu") -> None:
        gen = torch.Generator().manual_seed(seed)
        table = torch.randn(vocab, vocab, vocab, generator=gen, dtype=torch.float64) * scale
        self.table = table.to(device)

    def start(self, prompt: torch.Tensor) -> tuple[HistoryCache, torch.Tensor]:
        cache = HistoryCache(prompt.clone())  # prompt (B, 2)
        return cache, self._logits(cache.history)

    def step(self, tokens: torch.Tensor, cache: HistoryCache) -> torch.Tensor:
        cache.history = torch.cat([cache.history, tokens], dim=1)
        return self._logits(cache.history)

    def _logits(self, history: torch.Tensor) -> torch.Tensor:
        return self.table[history[:, -2], history[:, -1]]

    def log_prob(self, prompt_row: list[int], sequence: list[int]) -> float:
        """Sum of next-token log-probabilities, computed one token at a time."""
        previous, current = prompt_row
        total = 0.0
        for token in sequence:
            total += float(torch.log_softmax(self.table[previous, current], dim=-1)[token])
            previous, current = current, token
        return total


def run(chain, prompt, config, generator=None):
    cache, first_logits = chain.start(prompt)
    out = generate_tokens(chain.step, first_logits, cache, config, generator=generator)
    return out, cache


def prompts(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(vocab, (batch, 2), generator=torch.Generator().manual_seed(seed))


def greedy_reference(chain, prompt_row, n, stop_ids=(), pad_id=0) -> list[int]:
    """Greedy one row at a time: argmax until a stop token, then pad_id."""
    previous, current = prompt_row
    out: list[int] = []
    ended = False
    for _ in range(n):
        if ended:
            out.append(pad_id)
            continue
        token = int(chain.table[previous, current].argmax())
        out.append(token)
        ended = token in stop_ids
        previous, current = current, token
    return out


def brute_force_best(chain, prompt_row, vocab, n, stop_ids=(), length_penalty=0.0):
    """Best of every sequence that ends in a stop token (length <= n) or reaches length n."""
    candidates = []
    for length in range(1, n + 1):
        for seq in itertools.product(range(vocab), repeat=length):
            if any(t in stop_ids for t in seq[:-1]):
                continue
            if length < n and seq[-1] not in stop_ids:
                continue
            score = chain.log_prob(prompt_row, list(seq)) / length**length_penalty
            candidates.append((score, list(seq)))
    return max(candidates)


def strip(row: list[int], stop_ids, pad_id=0) -> list[int]:
    """A returned row without the padding after its stop token."""
    for i, token in enumerate(row):
        if token in stop_ids:
            assert all(t == pad_id for t in row[i + 1 :]), row
            return row[: i + 1]
    return row


def ranked_hypotheses(chain, prompt_row, vocab, n, stop_ids, length_penalty):
    """Every hypothesis :func:`brute_force_best` considers, best first."""
    candidates = []
    for length in range(1, n + 1):
        for seq in itertools.product(range(vocab), repeat=length):
            ends = seq[-1] in stop_ids
            if any(t in stop_ids for t in seq[:-1]) or (length < n and not ends):
                continue
            score = chain.log_prob(prompt_row, list(seq)) / length**length_penalty
            candidates.append((score, list(seq)))
    return sorted(candidates, reverse=True)


class BeamCache:
    """The bigram needs no cache; beam search only asks it to follow the beams."""

    def reorder(self, index: torch.Tensor) -> None:
        pass


class Scripted:
    """Emits a fixed sequence of tokens per row, whatever it is fed."""

    def __init__(self, rows: list[list[int]], vocab: int = 12) -> None:
        self.rows, self.vocab, self.n = rows, vocab, 0

    def logits(self) -> torch.Tensor:
        out = torch.zeros(len(self.rows), self.vocab)
        for b, row in enumerate(self.rows):
            out[b, row[min(self.n, len(row) - 1)]] = 10.0
        self.n += 1
        return out

    def step(self, tokens: torch.Tensor, cache: object) -> torch.Tensor:
        return self.logits()
