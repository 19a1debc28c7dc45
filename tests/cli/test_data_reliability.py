"""Issue 41 through the command: the user's data seen whole (an edit the old 64 KiB sample
missed is refused on resume, naming the file, and a fresh run tokenizes the corrected text
again) and every bad file refused in one line.

Provenance: each case is the issue's reproduction (the file sizes and edits it names), run
through ``addnorm.cli.parser.main``; what a fixed run trained on is read back from the run
(its tokenizer holds the corrected letter: an identity with the text given).
"""

from __future__ import annotations

import os
import zipfile

import pytest
from cli_runs import TINY_LM, TINY_TRANSLATE

from addnorm.cli.parser import main
from addnorm.tasks.run import load_trained

LINE = "the quick brown fox jumps over the lazy dog, again and again\n"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def one_error_line(capsys, command: str = "train") -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"addnorm {command}: error: "), err
    return err[0]


def _fix_typo(path, offset: int, new: bytes) -> None:
    """Three letters changed in place: the same size, as an editor's fix leaves a file."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(new)


def test_an_edit_inside_a_730_kb_corpus_is_refused_on_resume_and_retokenized_fresh(
        tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(LINE * (730_000 // len(LINE)), encoding="utf-8")
    out = tmp_path / "a"
    assert main(["train", "lm", "--data", str(corpus), *TINY_LM, "--max-steps", "1",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    _fix_typo(corpus, 400_010, b"QQQ")  # a letter the text did not hold
    assert main(["train", "lm", "--out", str(out), "--resume", "--max-steps", "2"]) == 2
    line = one_error_line(capsys)
    assert f"{corpus}: changed since the run recorded it (corpus.txt: content changed, same " \
           "size)" in line
    fresh = tmp_path / "b"
    assert main(["train", "lm", "--data", str(corpus), *TINY_LM, "--max-steps", "1",
                 "--out", str(fresh)]) == 0
    task, _, _ = load_trained(fresh)
    assert "Q" in task.tokenizer.chars  # the corrected text, not the stale cached tokens


def test_an_edit_inside_a_136_kb_tsv_is_refused_on_resume(tmp_path, capsys):
    pairs = tmp_path / "pairs.tsv"
    rows = [f"{w} {i % 7}\t{i % 7} {w}\n" for i, w in enumerate(LINE.split() * 800)]
    pairs.write_text("".join(rows)[:136_000].rsplit("\n", 1)[0] + "\n", encoding="utf-8")
    assert pairs.stat().st_size > 130_000
    out = tmp_path / "t"
    assert main(["train", "translate", "--data", str(pairs), *TINY_TRANSLATE, "--max-steps",
                 "1", "--out", str(out)]) == 0
    capsys.readouterr()
    _fix_typo(pairs, 70_001, b"z")
    assert main(["train", "translate", "--out", str(out), "--resume", "--max-steps", "2"]) == 2
    assert "pairs.tsv: content changed, same size" in one_error_line(capsys)


def _as_an_older_run(out, data) -> None:
    """Rewrite the run's newest checkpoint as addnorm before fingerprint version 2 wrote it:
    its data record made by the 64 KiB sampling rule, without ``fingerprint_version`` (the
    manifest's hash of state.json updated to match)."""
    import hashlib
    import json

    from addnorm.data.fingerprint import fingerprint_files, resolve_data_files
    from addnorm.training.checkpoint import find_checkpoint

    folder = find_checkpoint(out)
    state = json.loads((folder / "state.json").read_text())
    record = state["run"]["task_data"]["data"]
    root, files = resolve_data_files(data)
    old = fingerprint_files(files, root, version=1).to_dict()
    del old["fingerprint_version"], record["fingerprint_version"]
    record.update(old)
    text = json.dumps(state)
    (folder / "state.json").write_text(text)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"bytes": len(text.encode()),
                                       "sha256": hashlib.sha256(text.encode()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_an_older_run_resumes_checked_by_the_rule_it_was_recorded_with(tmp_path, capsys):
    """The decision for runs recorded before the whole-file fingerprint: they resume, their
    files checked as they were recorded (names, sizes, the 64 KiB sample); a change of size is
    still refused, naming the file."""
    corpus = tmp_path / "notes.txt"
    corpus.write_text(LINE * 300, encoding="utf-8")
    out = tmp_path / "old"
    assert main(["train", "lm", "--data", str(corpus), *TINY_LM, "--max-steps", "1",
                 "--out", str(out)]) == 0
    _as_an_older_run(out, corpus)
    capsys.readouterr()
    assert main(["train", "lm", "--out", str(out), "--resume", "--max-steps", "2"]) == 0
    _, _, checkpoint = load_trained(out)
    assert checkpoint.step == 2
    assert checkpoint.state["run"]["task_data"]["data"]["fingerprint_version"] == 1  # kept
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("one more line\n")
    capsys.readouterr()
    assert main(["train", "lm", "--out", str(out), "--resume", "--max-steps", "3"]) == 2
    assert "notes.txt: 18300 -> 18314 bytes" in one_error_line(capsys)


def _write(tmp_path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _latin1_class(tmp_path):
    """An image folder whose class ``café`` is named in Latin-1 bytes (not UTF-8)."""
    from data.test_images import write_folder

    write_folder(tmp_path / "pics", {"ants": 3, "bees": 3}, size=8)
    (tmp_path / "pics" / "ants").rename(os.fsdecode(bytes(tmp_path / "pics") + b"/caf\xe9"))
    return tmp_path / "pics"


def _npz_member_not_an_array(tmp_path):
    path = tmp_path / "pics.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("images.npy", b"not an array at all")
    return path


GOOD_PAIRS = b"".join(b'{"source": "w%d", "target": "%d"}\n' % (i, i) for i in range(40))


@pytest.mark.parametrize(
    ("task", "make", "named"),
    [
        ("translate", lambda d: _write(d, "p.jsonl", GOOD_PAIRS + b'{"source": "o\\ud800ne", '
                                       b'"target": "1"}\n'),
         "--data {path}: line 41: the source holds a lone surrogate U+D800 at character 2"),
        ("translate", lambda d: _write(d, "p.jsonl", GOOD_PAIRS + b'{"source": "one", '
                                       b'"target": "\\udfff"}\n'),
         "--data {path}: line 41: the target holds a lone surrogate U+DFFF at character 1"),
        ("dit", _latin1_class, "--data {path}: the name caf\\xe9/img0.png is not UTF-8 text"),
        ("dit", _npz_member_not_an_array,
         "--data {path}: its member images.npy is not a NumPy array (it holds 19 bytes"),
    ],
)
def test_a_decode_error_is_one_line_naming_the_file_and_line_or_member(tmp_path, capsys, task,
                                                                       make, named):
    """Issue 41's fourth and sixth findings: an npz member that is not an array was an
    AttributeError traceback; a lone surrogate or a Latin-1 folder name a nameless
    UnicodeEncodeError (or, in a target, a crash of ``addnorm translate`` later)."""
    path = make(tmp_path)
    assert main(["train", task, "--data", str(path), "--out", str(tmp_path / "run"),
                 "--quiet"]) == 2
    line = one_error_line(capsys)
    assert named.format(path=path) in line, line
    assert not (tmp_path / "run").exists()
