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
from addnorm.tasks.trained import load_trained

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
    from image_folders import write_folder

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


# ---------------------------------------------------------------- what a data folder holds


def _pairs(n: int, start: int = 0) -> str:
    return "".join(f"w{i} x{i % 10}\t{i}\n" for i in range(start, start + n))


def test_a_link_leading_out_of_the_data_folder_is_skipped_and_named(tmp_path, capsys, caplog):
    """A link inside a --data folder to a file outside it (``/etc/passwd`` in the issue) was
    trained on; it is left out with a note naming it, and read with --follow-links."""
    data, secret = tmp_path / "texts", tmp_path / "secret.txt"
    data.mkdir()
    (data / "notes.txt").write_text(LINE * 200, encoding="utf-8")
    secret.write_text("root:x:0:0:SECRET\n" * 50, encoding="utf-8")
    (data / "passwd.txt").symlink_to(secret)
    out = tmp_path / "run"
    with caplog.at_level("WARNING", logger="addnorm.data.notes"):
        assert main(["train", "lm", "--data", str(data), *TINY_LM, "--max-steps", "1",
                     "--out", str(out)]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"addnorm: note: data {data}: skipped 1 link leading outside it (passwd.txt); "
        "--follow-links reads them"]
    task, _, _ = load_trained(out)
    assert "S" not in task.tokenizer.chars  # nothing of the secret was read
    assert task.record.fingerprint.n_files == 1
    assert task.record.details["links_skipped"] == ["passwd.txt"]
    followed = tmp_path / "followed"
    assert main(["train", "lm", "--data", str(data), "--follow-links", *TINY_LM,
                 "--max-steps", "1", "--out", str(followed)]) == 0
    task, _, _ = load_trained(followed)
    assert "S" in task.tokenizer.chars and task.record.fingerprint.n_files == 2
    capsys.readouterr()
    assert main(["train", "lm", "--out", str(followed), "--resume", "--max-steps", "2"]) == 0


def test_a_pair_side_past_the_longest_allowed_is_refused_naming_file_line_and_length(
        tmp_path, capsys):
    """One over-long example was refused by the memory estimate ("needs about 328 TB")
    without naming it."""
    from addnorm.data.pairs import MAX_SIDE_CHARS

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(_pairs(100) + "a" * 200_000 + "\tb\n" + _pairs(100, 100), encoding="utf-8")
    assert main(["train", "translate", "--data", str(pairs), "--out", str(tmp_path / "run"),
                 "--quiet"]) == 2
    assert (f"--data {pairs}: line 101: the source is 200000 characters long, more than the "
            f"{MAX_SIDE_CHARS} a side may have") in one_error_line(capsys)


def test_a_tsv_header_row_is_skipped_with_a_note_or_refused_with_a_hint(tmp_path, capsys,
                                                                        caplog):
    """A TSV header row was trained on as a pair."""
    named = tmp_path / "named.tsv"
    named.write_text("Source\tTarget\n" + _pairs(200), encoding="utf-8")
    out = tmp_path / "run"
    with caplog.at_level("WARNING", logger="addnorm.data.notes"):
        assert main(["train", "translate", "--data", str(named), *TINY_TRANSLATE,
                     "--max-steps", "1", "--out", str(out)]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"addnorm: note: data {named}: line 1: 'Source', 'Target' is a header row, skipped "
        "(--header no trains on it as a pair)"]
    task, _, _ = load_trained(out)
    pairs = task.corpus.train + task.corpus.held_out
    assert len(pairs) == 200 and ("Source", "Target") not in pairs
    unclear = tmp_path / "unclear.tsv"
    unclear.write_text("source\tziel\n" + _pairs(200), encoding="utf-8")
    capsys.readouterr()
    assert main(["train", "translate", "--data", str(unclear), "--out", str(tmp_path / "u"),
                 "--quiet"]) == 2
    assert (f"--data {unclear}: line 1: 'source', 'ziel' may be a header row; say which: "
            "--header yes skips it, --header no trains on it as a pair") in one_error_line(capsys)
    kept = tmp_path / "kept"
    assert main(["train", "translate", "--data", str(unclear), "--header", "no",
                 *TINY_TRANSLATE, "--max-steps", "1", "--out", str(kept)]) == 0
    task, _, _ = load_trained(kept)
    assert ("source", "ziel") in task.corpus.train + task.corpus.held_out
    capsys.readouterr()
    assert main(["train", "translate", "--out", str(kept), "--resume", "--max-steps", "2"]) == 0


def test_crlf_text_is_read_as_lf(tmp_path):
    """CRLF text kept ``\\r`` as a character (a pairs file already dropped it)."""
    crlf, lf = tmp_path / "crlf.txt", tmp_path / "lf.txt"
    crlf.write_bytes((LINE * 300).replace("\n", "\r\n").encode())
    lf.write_bytes((LINE * 300).encode())
    assert main(["train", "lm", "--data", str(crlf), *TINY_LM, "--max-steps", "1",
                 "--out", str(tmp_path / "a")]) == 0
    assert main(["train", "lm", "--data", str(lf), *TINY_LM, "--max-steps", "1",
                 "--out", str(tmp_path / "b")]) == 0
    (crlf_task, _, _), (lf_task, _, _) = load_trained(tmp_path / "a"), load_trained(tmp_path / "b")
    assert "\r" not in crlf_task.tokenizer.chars
    assert crlf_task.tokenizer.chars == lf_task.tokenizer.chars
    assert crlf_task.record.details["crlf_line_ends_read_as_lf"] == 300


def test_a_class_folder_without_images_is_named_in_a_note(tmp_path, caplog):
    """An empty class folder was dropped without a note."""
    from image_folders import write_folder

    from addnorm.data.images import ImageCorpus

    write_folder(tmp_path / "pics", {"ants": 3, "bees": 3}, size=8)
    (tmp_path / "pics" / "wasps").mkdir()
    (tmp_path / "pics" / "wasps" / "notes.txt").write_text("no images here")
    with caplog.at_level("WARNING", logger="addnorm.data.notes"):
        corpus = ImageCorpus.build(tmp_path / "pics")
    assert corpus.classes == ("ants", "bees")
    assert [r.getMessage() for r in caplog.records] == [
        f"addnorm: note: data {tmp_path / 'pics'}: 1 class folder without images left out: "
        "wasps"]
    assert corpus.record.details["empty_class_folders"] == ["wasps"]
