"""Write sentence pairs of a real mapping that addnorm does not generate: numbers spelled out
in words by the num2words library (French by default) and the same numbers in digits, one
``words<TAB>digits`` line each, for ``addnorm train translate --data``.

    python benchmarks/number_words.py pairs.tsv          # 4000 distinct numbers of 0..99999
    addnorm train translate --data pairs.tsv --out runs/numbers
    echo "quarante-deux mille sept" | addnorm translate --checkpoint runs/numbers

Needs num2words (``pip install num2words``). The numbers are drawn without replacement by a
seeded generator, so every line's source is distinct (a held-out line is an unseen input) and
the script writes the same file on every run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def write_pairs(out: Path, count: int, high: int, lang: str, seed: int) -> int:
    """Write ``count`` distinct numbers of ``[0, high]`` as words and digits; returns the count."""
    from num2words import num2words

    numbers = np.random.default_rng(seed).choice(high + 1, size=count, replace=False)
    lines = [f"{num2words(int(n), lang=lang)}\t{int(n)}\n" for n in numbers]
    out.write_text("".join(lines), encoding="utf-8")
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the TSV file to write")
    parser.add_argument("--count", type=int, default=4000, help="pairs (default 4000)")
    parser.add_argument("--high", type=int, default=99_999, help="largest number (default 99999)")
    parser.add_argument("--lang", default="fr", help="num2words's language (default fr)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the numbers (default 0)")
    args = parser.parse_args()
    n = write_pairs(args.out, args.count, args.high, args.lang, args.seed)
    print(f"{n} pairs ({args.lang} words -> digits) in {args.out}")


if __name__ == "__main__":
    main()
