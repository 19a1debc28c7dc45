"""``addnorm train lm|translate --data``, and ``generate``, ``translate`` and ``info`` on the
runs they make: the commands on a user's files, and every kind of bad data as one line on
stderr with exit status 2 (1 for a file that fails while read), nothing written or lost.

Provenance: the CLI's outputs are compared with the library calls they wrap (the task's
``sample`` / ``predict`` on the same checkpoint) and with the run's own files; a refused
command is checked to leave an earlier run in its folder byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal

import pytest
import torch

from addnorm.cli.parser import main
from addnorm.data import tokenize_pass
from addnorm.tasks.trained import load_trained
from addnorm.training.best_checkpoints import find_best, pick_checkpoint

TINY_LM = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-layers", "1",
           "--batch-size", "4", "--seq-len", "16", "--eval-size", "4", "--log-every", "1",
           "--quiet"]
TINY_TRANSLATE = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers",
                  "1", "--n-decoder-layers", "1", "--batch-size", "8", "--eval-size", "8",
                  "--log-every", "1", "--quiet"]
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("".join(f"note {i}: {WORDS[i % 10]} and {WORDS[i * 7 % 10]}\n"
                            for i in range(400)), encoding="utf-8")
    return path


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{WORDS[i // 10]} {WORDS[i % 10]}\t{i}\n" for i in range(100)),
                    encoding="utf-8")
    return path


def one_error_line(capsys, command: str = "train") -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"addnorm {command}: error: "), err
    assert "Traceback" not in err[0]
    return err[0]


def _digest(folder) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.endswith(".lock"):
            h.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


def test_lm_on_your_text_then_generate_and_info(tmp_path, text_file, capsys):
    out = tmp_path / "run"
    argv = ["train", "lm", "--data", str(text_file), "--tokenizer", "bpe", "--vocab-size",
            "300", *TINY_LM, "--max-steps", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "val_bpc: " in printed and "sample (prompt 'note " in printed
    assert main(["generate", "--checkpoint", str(out), "--prompt", "note 5:",
                 "--max-new-tokens", "4", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    task, model, _ = load_trained(pick_checkpoint(out)[0])  # (a --data run's best)
    expected = task.sample(model, "note 5:", max_new_tokens=4,
                           generator=torch.Generator().manual_seed(3))
    assert text == expected + "\n"
    assert main(["info", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["data"] == json.loads((out / "data.json").read_text())
    assert report["data"]["path"] == str(text_file)
    assert report["train_config"]["tokenizer"] == "bpe"


def test_translate_on_your_pairs_then_translate_streams_answers(tmp_path, pairs_file, capsys,
                                                                  monkeypatch):
    out = tmp_path / "run"
    assert main(["train", "translate", "--data", str(pairs_file), *TINY_TRANSLATE,
                 "--max-steps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "test_exact_match: " in printed
    metrics = json.loads((out / "metrics.json").read_text())
    for name in ("sequence", "token", "char", "word"):  # printed as metrics.json has them
        key = f"test_{name}_error_rate"
        assert f"\n{key}: {metrics[key]:.4f} (" in printed
    task, model, _ = load_trained(pick_checkpoint(out)[0])  # (a --data run's best)
    expected = task.predict(model, ["nine nine", "one two"])
    assert main(["translate", "--checkpoint", str(out), "nine nine", "", "one two"]) == 0
    assert capsys.readouterr().out.splitlines() == [expected[0], "", expected[1]]
    # A character the source vocabulary lacks is refused on its own, the rest translated.
    assert main(["translate", "--checkpoint", str(out), "one two", "ünknown"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [expected[1], ""]
    assert "argument 2: the character 'ü' (U+00FC) at position 1 is not one the model knows" \
        in captured.err


def test_a_data_run_keeps_its_best_and_resumed_after_ctrl_c_keeps_it_byte_for_byte(
        tmp_path, text_file, capsys, monkeypatch):
    from addnorm.training.trainer import Trainer

    flags = ["train", "lm", "--data", str(text_file), *TINY_LM, "--max-steps", "12",
             "--eval-every", "3", "--checkpoint-every", "4", "--max-minutes", "60",
             "--threads", "1"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    threads = torch.get_num_threads()
    real = Trainer._after_step

    def ctrl_c_after_step_7(self, loss, tokens):
        real(self, loss, tokens)
        if self.step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # as a first Ctrl-C: step 7 ends, is saved

    try:
        assert main([*flags, "--out", str(whole)]) == 0
        monkeypatch.setattr(Trainer, "_after_step", ctrl_c_after_step_7)
        assert main([*flags, "--out", str(split)]) == 130
        monkeypatch.setattr(Trainer, "_after_step", real)
        assert main(["train", "lm", "--out", str(split), "--resume", "--quiet",
                     "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    expected, got = find_best(whole), find_best(split)
    assert expected is not None and got is not None and got.name == expected.name
    for name in ("model.safetensors", "ema.safetensors", "state.json", "manifest.json"):
        if (expected / name).exists() or (got / name).exists():
            assert (got / name).read_bytes() == (expected / name).read_bytes(), name
    reports = [json.loads((run / "metrics.json").read_text()) for run in (whole, split)]
    assert reports[0]["validation"] == reports[1]["validation"]
    assert reports[0]["val_bpc"] == reports[1]["val_bpc"] == reports[0]["validation"]["value"]
    assert reports[0]["checkpoint"] == "best"
    capsys.readouterr()
    step = reports[0]["validation"]["step"]
    assert main(["generate", "--checkpoint", str(whole), "--prompt", "note", "--max-new-tokens",
                 "2"]) == 0
    line = capsys.readouterr().err.splitlines()
    assert line == [f"using the best checkpoint of {whole}: step {step}, val_bpc "
                    f"{reports[0]['val_bpc']:.4f} (by its validation score; the newest is "
                    "step 12: --which last)"]
    assert main(["generate", "--checkpoint", str(whole), "--prompt", "note", "--max-new-tokens",
                 "2", "--which", "last"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"using the newest checkpoint of {whole}: step 12 (its best is step {step}: "
        "--which best)"]


def _corrupt(tmp_path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    ("task", "make", "extra", "named"),
    [
        ("lm", lambda d: d / "missing.txt", [], "--data {path}: no such file or folder"),
        ("lm", lambda d: _corrupt(d, "empty.txt", b""), [], "--data {path}: is empty"),
        ("lm", lambda d: (d / "nothing").mkdir() or d / "nothing", [],
         "the folder holds no files"),
        ("lm", lambda d: _corrupt(d, "img.txt", b"GIF89a\x01\x00\x01\x00"), [],
         "{path}: a binary file, not text (a NUL byte at byte 7)"),
        ("lm", lambda d: _corrupt(d, "img.txt", b"\x89PNG\r\n\x1a\n\x00\x00"), [],
         "{path}: not UTF-8 text (invalid start byte at byte 0)"),
        ("lm", lambda d: _corrupt(d, "latin1.txt", "abc\ncafé\n".encode("latin-1")), [],
         "{path}: not UTF-8 text (invalid continuation byte at byte 7)"),
        ("lm", lambda d: _corrupt(d, "short.txt", b"tiny text\n" * 30),
         ["--seq-len", "4", "--batch-size", "400"], "fewer than a batch (--batch-size 400)"),
        ("lm", lambda d: _corrupt(d, "short.txt", b"tiny text\n" * 30), ["--seq-len", "40",
                                                                           "--batch-size", "2"],
         "--seq-len (40) must be < the validation split"),
        ("lm", lambda d: _corrupt(d, "t.txt", b"text\n" * 100),
         ["--tokenizer", "bpe", "--vocab-size", "100000000"], "--vocab-size (100000000) must be"),
        ("lm", lambda d: _corrupt(d, "t.txt", b"text\n" * 100), ["--tokenizer", "TOKFILE"],
         "--tokenizer {tok}: does not parse as a tokenizer.json"),
        ("lm", None, ["--tokenizer", "bpe"],
         "--tokenizer bpe needs data, your files to train on (--data)"),
        ("translate", lambda d: _corrupt(d, "p.tsv", b"one\t1\ntwo 2\n"), [],
         "--data {path}: line 2: no tab between source and target"),
        ("translate", lambda d: _corrupt(d, "p.tsv", b"one\t1\n\t2\n"), [],
         "--data {path}: line 2: the source is empty"),
        ("translate", lambda d: _corrupt(d, "p.jsonl", b'{"source": "one"}\n'), [],
         "--data {path}: line 1: no 'target' key"),
        ("translate", lambda d: _corrupt(d, "p.tsv", b"a\tb\xff\n"), [],
         "--data {path}: line 1: not UTF-8 text (invalid start byte at byte 3)"),
        ("translate", lambda d: _corrupt(d, "p.tsv", b"one\t1\n" * 3), [],
         "the held-out split of its 3 pairs is empty"),
        ("translate", lambda d: _corrupt(d, "p.tsv", b"".join(
            f"{WORDS[i % 10]} {WORDS[i // 10]}\t{i}\n".encode() for i in range(20))),
         ["--val-fraction", "0.5", "--batch-size", "16"],
         "holds 13 pairs, fewer than a batch (--batch-size 16)"),
    ],
)
def test_bad_data_is_one_line_and_exit_2(tmp_path, capsys, task, make, extra, named):
    path = make(tmp_path) if make is not None else None
    tok = _corrupt(tmp_path, "tokenizer.json", b'{"model": "nonsense"}')
    extra = [str(tok) if e == "TOKFILE" else e for e in extra]
    argv = ["train", task, *(["--data", str(path)] if path else []), *extra,
            "--out", str(tmp_path / "run"), "--quiet"]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert named.format(path=path, tok=tok) in line, line
    assert not (tmp_path / "run").exists()


def test_bad_data_leaves_an_earlier_run_as_it_was(tmp_path, text_file, capsys):
    out = tmp_path / "run"
    assert main(["train", "lm", "--data", str(text_file), *TINY_LM, "--max-steps", "1",
                 "--out", str(out)]) == 0
    before = _digest(out)
    capsys.readouterr()
    broken = _corrupt(tmp_path, "broken.txt", b"ok\n\xff\n")
    assert main(["train", "lm", "--data", str(broken), *TINY_LM, "--max-steps", "1",
                 "--out", str(out), "--overwrite"]) == 2
    one_error_line(capsys)
    assert _digest(out) == before


def test_resume_refuses_changed_data_naming_the_change_and_keeps_the_run(
    tmp_path, text_file, capsys
):
    out = tmp_path / "run"
    assert main(["train", "lm", "--data", str(text_file), *TINY_LM, "--max-steps", "1",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    before = _digest(out)
    with open(text_file, "a", encoding="utf-8") as f:
        f.write("an extra line\n")
    assert main(["train", "lm", "--out", str(out), "--resume", "--max-steps", "2"]) == 2
    line = one_error_line(capsys)
    assert f"{text_file}: changed since the run recorded it (notes.txt: 9490 -> 9504 bytes)" in line
    assert "a resumed run must train on the same files" in line
    assert _digest(out) == before


def test_a_corpus_that_changes_while_tokenized_exits_1_and_caches_nothing(
    tmp_path, text_file, capsys, monkeypatch
):
    real = tokenize_pass.read_text_pieces

    def changing(files, **kwargs):
        for i, piece in enumerate(real(files, **kwargs)):
            if i == 0:  # once: a reader that followed the file would otherwise never end
                with open(text_file, "a", encoding="utf-8") as f:
                    f.write("written meanwhile\n")
            yield piece

    monkeypatch.setattr(tokenize_pass, "read_text_pieces", changing)
    assert main(["train", "lm", "--data", str(text_file), *TINY_LM, "--out",
                 str(tmp_path / "run")]) == 1
    line = one_error_line(capsys)
    assert f"{text_file}: changed while it was read" in line
    assert not list((tmp_path / "cache").rglob("tokens.bin"))
    assert not (tmp_path / "run").exists()


def test_data_cannot_change_on_resume_by_flag_either(tmp_path, text_file, capsys):
    out = tmp_path / "run"
    assert main(["train", "lm", "--data", str(text_file), *TINY_LM, "--max-steps", "1",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    other = _corrupt(tmp_path, "other.txt", b"other text\n" * 200)
    assert main(["train", "lm", "--out", str(out), "--resume", "--data", str(other)]) == 2
    assert "--data cannot change when resuming" in one_error_line(capsys)
