"""Error rates of generated text against its references, as speech recognition and machine
translation tooling reports them: the edit (Levenshtein) distance of each prediction from its
reference, summed over the examples and divided by the references' summed length, in tokens,
characters or words; and the share of predictions that are not exactly their reference.

The corpus-level ratio (not a mean of per-example ratios) is torchmetrics'
``word_error_rate`` / ``char_error_rate`` and jiwer's ``wer`` / ``cer``: both sum the edits
(substitutions, deletions, insertions) and the reference units over all examples. Words are
``str.split()``'s (runs of whitespace separate them), as torchmetrics splits them; jiwer's
default transforms do the same for words once it collapses repeated spaces, and strip outer
whitespace before counting characters, which here count as they are. A rate can pass 1 (a
prediction longer than its reference needs insertions); references of no units at all count
as one, torchmetrics' guard for an empty reference.

:func:`edit_distance` takes any two sequences of hashable items (a ``str``: characters; a
list of token ids; a list of words). It is Myers' bit-vector algorithm (1999), in Hyyrö's
formulation for the distance between two whole sequences (2001): the differences between
neighbouring cells of one column of the dynamic-programming table are held as the bits of
two integers, so a step over the longer sequence is a dozen integer operations whatever the
length of the shorter (Python's integers have no fixed width). The textbook table
(Wagner-Fischer) gives the same numbers and is what the tests hold it to.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

__all__ = ["edit_distance", "error_rate", "sequence_error_rates"]


def edit_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """The fewest insertions, deletions and substitutions of one item that turn ``a`` into
    ``b`` (the Levenshtein distance; symmetric)."""
    if len(a) < len(b):
        a, b = b, a
    m = len(b)
    if m == 0:
        return len(a)
    # The paper's names: bit i of peq[x] is set where b[i] == x; pv / mv hold the vertical
    # differences of the current column of the table over b (bit i set where cell i+1 is one
    # more / one less than cell i), ph / mh the horizontal ones (a cell against its left
    # neighbour). Column 0 is 0, 1, ..., m: every vertical difference +1.
    peq: dict[Hashable, int] = {}
    for i, item in enumerate(b):
        peq[item] = peq.get(item, 0) | (1 << i)
    full, last = (1 << m) - 1, 1 << (m - 1)
    pv, mv, distance = full, 0, m  # distance: the column's bottom cell
    for item in a:
        eq = peq.get(item, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | ~(xh | pv)
        mh = pv & xh
        if ph & last:
            distance += 1
        elif mh & last:
            distance -= 1
        ph = (ph << 1) | 1  # row 0 steps by +1 from column to column
        mh <<= 1
        pv = (mh | ~(xv | ph)) & full
        mv = ph & xv & full
    return distance


def error_rate(predictions: Sequence[Sequence[Hashable]],
               references: Sequence[Sequence[Hashable]]) -> float:
    """The edit distances of ``predictions`` from their ``references``, summed, over the
    references' summed length (at least 1). ValueError if the counts differ."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    edits = sum(edit_distance(p, r) for p, r in zip(predictions, references, strict=True))
    return edits / max(sum(len(r) for r in references), 1)


def sequence_error_rates(
    split: str, predictions: Sequence[str], references: Sequence[str],
    tokenize: Callable[[str], Sequence[Hashable]],
) -> dict[str, float]:
    """The error rates of a split's ``predictions`` against their ``references``, named
    ``{split}_...``: ``token_error_rate`` (in the units ``tokenize`` cuts a text into: a
    model's target tokenizer's tokens, characters for a character tokenizer),
    ``char_error_rate`` (characters, comparable across tokenizers), ``word_error_rate``
    (``str.split()``'s words) and ``sequence_error_rate`` (the share of predictions that
    differ from their reference: one minus exact match). ValueError if the counts differ or
    there are none."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        raise ValueError("no predictions to score")
    wrong = sum(p != r for p, r in zip(predictions, references, strict=True))
    return {
        f"{split}_token_error_rate": error_rate([tokenize(p) for p in predictions],
                                                [tokenize(r) for r in references]),
        f"{split}_char_error_rate": error_rate(predictions, references),
        f"{split}_word_error_rate": error_rate([p.split() for p in predictions],
                                               [r.split() for r in references]),
        f"{split}_sequence_error_rate": wrong / len(references),
    }
