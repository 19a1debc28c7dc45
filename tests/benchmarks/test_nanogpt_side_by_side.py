"""benchmarks/nanogpt_side_by_side.py's own logic, without a nanoGPT checkout: the checkout
check and its one-line refusals, nanoGPT's character format written from addnorm's corpus,
the bits-per-character scoring, the log parsing, and the two commands (nanoGPT's README
recipe; addnorm's flags landing in the configs the docstring names). No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import math
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from addnorm.data import TokenCorpus
from addnorm.tasks.lm import LMTask
from addnorm.training.schedules import ScheduleConfig
from addnorm.transformer.config import LMConfig
from addnorm.transformer.lm import TransformerLM

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "nanogpt_side_by_side.py"
_spec = importlib.util.spec_from_file_location("nanogpt_side_by_side", SCRIPT)
assert _spec is not None and _spec.loader is not None
side = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(side)

# nanoGPT's README at the pinned commit, line 85: its CPU recipe for character-level text.
README_CPU_RECIPE = (
    "python train.py config/train_shakespeare_char.py --device=cpu --compile=False "
    "--eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 "
    "--n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0"
)

# Lines of text, some non-ASCII (a character past uint8, one past the BMP), ~7 kB.
TEXT = "".join(f"line {i}: the cat sat on the mat, naïve 漢字 {i * 7 % 13} 𝄞\n"
               for i in range(150))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One torch thread (tests/conftest.py): nothing here is timed."""


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return TokenCorpus.build(path, "char", val_fraction=side.VAL_FRACTION,
                             cache_dir=tmp_path / "cache")


def _git(*args, cwd):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _fake_checkout(folder: Path, monkeypatch) -> None:
    """A folder with the four run files (made-up contents), the script's expected blob ids
    patched to theirs."""
    files = {}
    for name in side.NANOGPT_FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        content = f"# stand-in for {name}\n".encode()
        (folder / name).write_bytes(content)
        files[name] = side.git_blob_id(content)
    monkeypatch.setattr(side, "NANOGPT_FILES", files)


# --------------------------------------------------------------------------- the checkout


def test_git_blob_id_is_what_git_hash_object_says(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    for content in (b"", b"print('hi')\n", "naïve\r\n".encode() * 100):
        path = tmp_path / "f"
        path.write_bytes(content)
        assert side.git_blob_id(content) == _git("hash-object", str(path), cwd=tmp_path)


def test_a_copy_whose_files_match_is_accepted_and_an_edited_one_refused(tmp_path, monkeypatch):
    _fake_checkout(tmp_path, monkeypatch)
    assert side.check_nanogpt(tmp_path).startswith("a copy at ")
    with open(tmp_path / "model.py", "a") as f:
        f.write("# edited\n")
    with pytest.raises(side.SetupError, match=r"model\.py differs from nanoGPT's"):
        side.check_nanogpt(tmp_path)


def test_a_git_checkout_at_another_commit_is_refused_naming_both(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("no git")
    _fake_checkout(tmp_path, monkeypatch)
    _git("init", "-q", cwd=tmp_path)
    _git("add", ".", cwd=tmp_path)
    _git("commit", "-qm", "x", cwd=tmp_path)
    head = _git("rev-parse", "HEAD", cwd=tmp_path)
    with pytest.raises(side.SetupError) as err:
        side.check_nanogpt(tmp_path)
    assert f"is at commit {head}" in str(err.value)
    assert f"checkout {side.NANOGPT_COMMIT}" in str(err.value)
    monkeypatch.setattr(side, "NANOGPT_COMMIT", head)  # at the pinned commit: accepted
    assert side.check_nanogpt(tmp_path).startswith("a git checkout at ")


@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_main_refuses_a_missing_or_wrong_checkout_with_one_line_and_exit_2(
        tmp_path, capsys, make):
    path = tmp_path / "nanoGPT"
    if make == "empty":
        path.mkdir()
    elif make == "file":
        path.write_text("x")
    assert side.main(["--nanogpt", str(path), "--iters", "3"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --nanogpt ") and captured.out == ""
    assert "git clone https://github.com/karpathy/nanoGPT" in lines[0]


@pytest.mark.parametrize("argv, message", [
    (["--iters", "1"], "--iters must be >= 2"),
    (["--minutes", "0"], "--minutes must be > 0"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--threads", "0"], "--threads 1.."),
])
def test_main_refuses_bad_numbers_with_one_line(tmp_path, monkeypatch, capsys, argv, message):
    _fake_checkout(tmp_path, monkeypatch)
    assert side.main(["--nanogpt", str(tmp_path), *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_main_refuses_missing_data_with_one_line(tmp_path, monkeypatch, capsys):
    _fake_checkout(tmp_path / "nanoGPT", monkeypatch)
    missing = tmp_path / "none.txt"
    argv = ["--nanogpt", str(tmp_path / "nanoGPT"), "--data", str(missing),
            "--workdir", str(tmp_path / "work")]
    assert side.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: --data {missing}: no such file or folder"]


# --------------------------------------------------------------------------- the data


def test_nanogpt_char_format_round_trips_to_addnorms_split(tmp_path, corpus):
    train, val, meta = side.nanogpt_char_data(corpus)
    side.write_nanogpt_data(tmp_path / "data", train, val, meta)
    back_train = np.fromfile(tmp_path / "data" / "train.bin", dtype=np.uint16)
    back_val = np.fromfile(tmp_path / "data" / "val.bin", dtype=np.uint16)
    with open(tmp_path / "data" / "meta.pkl", "rb") as f:  # the file this test just wrote
        back_meta = pickle.load(f)
    # nanoGPT's prepare.py numbers the sorted distinct characters of the whole text.
    chars = sorted(set(TEXT))
    assert back_meta == {"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                         "stoi": {c: i for i, c in enumerate(chars)}}
    decode = "".join
    train_text = decode(back_meta["itos"][int(i)] for i in back_train)
    val_text = decode(back_meta["itos"][int(i)] for i in back_val)
    assert train_text + val_text == TEXT
    # the held-out characters are addnorm's: from the byte its split records
    start = corpus.record.split["val_from"]["byte"]
    assert val_text == TEXT.encode("utf-8")[start:].decode("utf-8") and len(val_text) > 100
    assert val_text == corpus.tokenizer.decode(corpus.ids("val").tolist())


def test_nanogpt_ids_refuse_a_corpus_not_tokenized_by_character():
    class Corpus:  # the one attribute nanogpt_ids reads
        tokenizer = object()

    with pytest.raises(TypeError, match="tokenized by character"):
        side.nanogpt_ids(Corpus())


# --------------------------------------------------------------------------- the scoring


def test_bits_per_char_converts_nats():
    assert side.bits_per_char(math.log(2)) == pytest.approx(1.0, rel=1e-15)
    assert side.bits_per_char(math.log(65)) == pytest.approx(math.log2(65), rel=1e-15)


def test_held_out_bits_of_uniform_logits_is_log2_of_the_vocabulary():
    windows = torch.randint(0, 50, (7, 17))
    bits = side.held_out_bits(lambda ids: torch.zeros(*ids.shape, 50), windows, chunk=3)
    assert bits == pytest.approx(math.log2(50), rel=1e-6)  # float32 log-softmax of zeros


def test_held_out_bits_is_one_cross_entropy_over_every_target_whatever_the_chunk():
    torch.manual_seed(0)
    table = torch.randn(30, 30)  # a bigram "model": logits of the next id given this one
    windows = torch.randint(0, 30, (9, 13))
    expected = F.cross_entropy(table[windows[:, :-1]].flatten(0, 1),
                               windows[:, 1:].flatten()).item()
    for chunk in (1, 4, 64):
        # the sum over chunks in float64 against one float32 mean: 1e-6 relative
        assert side.held_out_bits(lambda ids: table[ids], windows, chunk) == pytest.approx(
            expected / math.log(2), rel=1e-6)


def test_held_out_bits_of_an_addnorm_model_is_addnorms_own_val_bpc(corpus):
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=corpus.tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1,
                   d_ff=32, max_len=16)
    model = TransformerLM(cfg).eval()
    own = LMTask(data=corpus).evaluate(model, seq_len=16)["val_bpc"]
    ours = side.held_out_bits(model, corpus.eval_windows("val", 16))
    assert ours == pytest.approx(own, rel=1e-6)  # same windows, same float32 logits


# --------------------------------------------------------------------------- the logs


def _nanogpt_log(iters: int, ms: list[float], val_loss: float) -> str:
    """Lines as nanoGPT's train.py prints them (its f-strings, restated)."""
    lines = ["tokens per iteration will be: 768", "step 0: train loss 4.6000, val loss 4.6100"]
    for it in range(iters + 1):
        if it == iters:
            lines.append(f"step {it}: train loss 1.5000, val loss {val_loss:.4f}")
            lines.append("saving checkpoint to out")
        lines.append(f"iter {it}: loss 2.0000, time {ms[it]:.2f}ms, mfu -100.00%")
    return "\n".join(lines) + "\n"


def test_nanogpt_timing_counts_iterations_1_to_n_minus_1_and_reads_its_val_estimate():
    ms = [5000.0, 100.0, 200.0, 300.0, 9000.0]  # iteration 0 and N hold evaluations
    found = side.nanogpt_timing(_nanogpt_log(4, ms, 1.3863), 4)
    assert found["tokens_per_s"] == pytest.approx(3 * 12 * 64 / 0.6, rel=1e-12)
    assert found["own_bpc"] == pytest.approx(1.3863 / math.log(2), rel=1e-12)
    broken = _nanogpt_log(4, ms, 1.0).replace("iter 2: ", "iter two: ")
    with pytest.raises(RuntimeError, match=r"iterations \[2\]"):
        side.nanogpt_timing(broken, 4)


def test_addnorm_timing_counts_steps_2_to_n(tmp_path):
    records = [{"step": s, "loss": 1.0, "elapsed_s": 10.0 + 0.5 * s} for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "metrics.json").write_text(json.dumps({"val_bpc": 2.5}))
    found = side.addnorm_timing(tmp_path, 5)
    assert found["tokens_per_s"] == pytest.approx(4 * 12 * 64 / 2.0, rel=1e-12)
    assert found["own_bpc"] == 2.5


# --------------------------------------------------------------------------- the commands


def test_nanogpt_command_is_the_readme_cpu_recipe_plus_data_and_checkpoint(tmp_path):
    command = side.nanogpt_command(2000, tmp_path)
    assert command[0] == sys.executable
    recipe = README_CPU_RECIPE.split()[1:]
    assert command[1 : 1 + len(recipe)] == recipe
    assert command[1 + len(recipe):] == [
        f"--dataset={side.DATASET}", f"--out_dir={tmp_path}", "--eval_interval=2000",
        "--always_save_checkpoint=True"]


def test_addnorm_command_trains_nanogpts_shape_and_recipe(tmp_path, corpus, capsys):
    from addnorm import load
    from addnorm.cli.parser import main

    data = Path(corpus.record.path)
    command = side.addnorm_command(data, 2, 1, tmp_path / "cache", tmp_path / "run")
    assert command[:5] == [sys.executable, "-m", "addnorm", "train", "lm"]
    assert main(command[3:]) == 0
    capsys.readouterr()
    cfg = load(tmp_path / "run", weights="raw").cfg
    # nanoGPT's model.py at the README's shape: pre-LN blocks, bias=False (train.py's
    # default), GELU MLP of 4 * n_embd, final ln_f, learned wpe of block_size rows, wte tied
    # to lm_head and not scaled, dropout 0.
    assert (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.max_len) == (128, 4, 4, 512, 64)
    assert (cfg.norm, cfg.norm_position, cfg.bias, cfg.final_norm, cfg.activation) == (
        "layer", "pre", False, True, "gelu")
    assert (cfg.position_encoding, cfg.embed_scale, cfg.tie_output, cfg.dropout) == (
        "learned", "none", True, 0.0)
    state = json.loads(next((tmp_path / "run" / "checkpoints").glob("*/state.json")).read_text())
    train = state["train_config"]
    # config/train_shakespeare_char.py and train.py's defaults: lr 1e-3, min_lr 1e-4,
    # warmup 100, beta2 0.99, beta1 0.9, weight_decay 0.1, grad_clip 1.0; batch 12 x 64.
    assert {k: train[k] for k in ("lr", "final_lr_fraction", "warmup", "beta1", "beta2",
                                  "weight_decay", "grad_clip", "batch_size", "seq_len",
                                  "schedule", "max_minutes", "val_fraction", "bf16")} == {
        "lr": 1e-3, "final_lr_fraction": 0.1, "warmup": 100, "beta1": 0.9, "beta2": 0.99,
        "weight_decay": 0.1, "grad_clip": 1.0, "batch_size": 12, "seq_len": 64,
        "schedule": "cosine", "max_minutes": None, "val_fraction": 0.1, "bf16": False}


def _nanogpt_lr(it: int, total: int) -> float:
    """nanoGPT train.py's get_lr with the recipe's constants (restated)."""
    lr, min_lr, warmup = 1e-3, 1e-4, 100
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > total:
        return min_lr
    coeff = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (total - warmup)))
    return min_lr + coeff * (lr - min_lr)


def test_addnorms_schedule_is_nanogpts_one_step_earlier_as_the_docstring_says():
    total = 300
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    sched = ScheduleConfig("cosine", lr=1e-3, warmup=100, total_steps=total,
                           final_lr_fraction=0.1).build(opt)
    lrs = []  # addnorm's lr at optimizer steps 1..total
    for _ in range(total):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for step in range(1, total + 1):
        if step < 100:  # warm-up: step / 100 against nanoGPT's step / 101
            assert lrs[step - 1] == pytest.approx(1e-3 * step / 100, rel=1e-9)
            assert _nanogpt_lr(step - 1, total) == pytest.approx(1e-3 * step / 101, rel=1e-12)
        else:  # from the peak on: addnorm's step s = nanoGPT's iteration s (its step s + 1)
            assert lrs[step - 1] == pytest.approx(_nanogpt_lr(step, total), rel=1e-9)
