"""A user's text of two files (a folder with a subfolder, the second file without a final line
end), shared by the token corpus's tests and its tokenize pass's."""

from __future__ import annotations

from pathlib import Path

TEXT_A = "".join(f"line {i}: the quick brown fox — {i * i} ü\n" for i in range(300))
TEXT_B = "zweite Datei, ohne Zeilenende am Schluss: ångström"


def write_texts(tmp_path: Path) -> Path:
    """The folder ``texts`` holding ``a.txt`` (TEXT_A) and ``sub/b.txt`` (TEXT_B)."""
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(TEXT_A, encoding="utf-8")
    (folder / "sub" / "b.txt").write_text(TEXT_B, encoding="utf-8")
    return folder


def decoded(corpus, split: str) -> str:
    """A corpus's split decoded back to text."""
    return corpus.tokenizer.decode(corpus.ids(split).tolist())
