"""The lm task on a user's text: planned, trained, scored, saved, loaded and resumed through the
generic code, with the data given to the task (``LMTask(data=...)``) or named by its config;
the text as one data object (``addnorm.tasks.lm_data``), opened only when needed.

Provenance: the held-out figures are one sum of bits divided by three counts, so
``bits/byte * bytes == bits/char * chars == bits/token * tokens`` (an identity, up to float64
rounding); the counts are the corpus's own (its token bytes, its decoded text); a resumed run
equals the uninterrupted one bit for bit (the trainer's exact-resume contract); the run's
``tokenizer.json`` is read back by ``tokenizers`` itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch

from addnorm.data.fingerprint import DataChangedError, DataRecord
from addnorm.data.token_corpus import TokenCorpus
from addnorm.tasks.lm import LMTask
from addnorm.tasks.lm_data import (
    SAMPLE_PROMPTS,
    BundledText,
    UserText,
    text_data,
    text_data_from_dict,
)
from addnorm.tasks.plan import plan_fresh_run, plan_resumed_run
from addnorm.tasks.run import train_run
from addnorm.tasks.trained import load_trained
from addnorm.training.metrics import read_metrics

TINY = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1)
TRAIN = dict(max_steps=4, batch_size=4, seq_len=16, eval_size=6, log_every=1,
             checkpoint_every=0, max_minutes=None, warmup=2)


def _text(n: int = 400) -> str:
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "ηta"]
    return "".join(" ".join(words[(i * j) % 7] for j in range(1, 8)) + f" {i}\n"
                   for i in range(n))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADDNORM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def corpus_dir(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "one.txt").write_text(_text(), encoding="utf-8")
    (folder / "two.md").write_text(_text(150), encoding="utf-8")
    return folder


def _run(out, data, **overrides):
    plan = plan_fresh_run(
        "lm", model_overrides=TINY, train_overrides={**TRAIN, "data": str(data), **overrides}
    )
    return plan, train_run("lm", plan.model_cfg, plan.train_cfg, out, task_cfg=plan.task_cfg,
                           resume=plan.resume)


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_run_on_your_text_reports_bits_per_byte_char_and_token(tmp_path, corpus_dir, tokenizer):
    overrides = {"tokenizer": tokenizer, **({"vocab_size": 300} if tokenizer == "bpe" else {})}
    plan, summary = _run(tmp_path / "run", corpus_dir, **overrides)
    m = summary.metrics
    bits = m["val_bits_per_token"] * m["val_tokens"]
    # One float64 sum divided three ways: a few units of rounding (2**-52 each).
    assert m["val_bits_per_byte"] * m["val_bytes"] == pytest.approx(bits, rel=1e-12)
    assert m["val_bpc"] * m["val_chars"] == pytest.approx(bits, rel=1e-12)
    assert m["val_tokens"] == 6 * 16  # eval_size windows of seq_len targets
    task = LMTask.from_config(plan.task_cfg)
    corpus = task.corpus
    scored = corpus.eval_windows("val", 16, max_windows=6)[:, 1:]
    assert m["val_bytes"] == int(corpus.token_bytes()[scored.numpy()].sum())
    if tokenizer == "char":
        assert m["val_chars"] == m["val_tokens"] and m["val_bpc"] == m["val_bits_per_token"]
    assert m["corpus_byte_entropy"] == corpus.record.details["byte_entropy"]
    prompts = [s["prompt"] for s in m["samples"]]
    assert all(s["text"].startswith(s["prompt"]) for s in m["samples"])
    assert all(p in _text() + _text(150) for p in prompts)  # starts of held-out lines


def test_the_run_keeps_its_data_record_and_tokenizer_json(tmp_path, corpus_dir):
    from tokenizers import Tokenizer

    plan, summary = _run(tmp_path / "run", corpus_dir, tokenizer="bpe", vocab_size=300)
    run = tmp_path / "run"
    record = json.loads((run / "data.json").read_text())
    task, model, checkpoint = load_trained(run)
    assert record == checkpoint.state["run"]["task_data"]["data"] == task.record.to_dict()
    assert record["path"] == str(corpus_dir) and record["n_files"] == 2
    assert record["tokenizer"] == {"kind": "bpe", "vocab_size": 300}
    assert record["split"]["val_fraction"] == 0.05
    saved = Tokenizer.from_file(str(run / "tokenizer.json"))
    assert saved.to_str() == task.tokenizer.to_json()
    assert checkpoint.state["train_config"]["data"] == str(corpus_dir)
    # a run on a user's data keeps its best by default (issue 40), and is scored with it
    assert checkpoint.state["train_config"]["keep_best"] is True
    assert summary.best is not None and summary.metrics["checkpoint"] == "best"


def test_a_loaded_run_generates_without_its_data(tmp_path, corpus_dir):
    _run(tmp_path / "run", corpus_dir, tokenizer="bpe", vocab_size=300)
    task, model, _ = load_trained(tmp_path / "run")
    generator = torch.Generator().manual_seed(0)
    expected = task.sample(model, "alpha beta", max_new_tokens=5, generator=generator)
    shutil.rmtree(corpus_dir)  # generating never reads the corpus
    task, model, _ = load_trained(tmp_path / "run")
    again = task.sample(model, "alpha beta", max_new_tokens=5,
                        generator=torch.Generator().manual_seed(0))
    assert again == expected and again.startswith("alpha beta")


def test_a_resumed_run_equals_the_uninterrupted_one_and_refuses_changed_files(
    tmp_path, corpus_dir
):
    # a constant lr after warm-up: cosine's curve depends on max_steps, which the cut run moves
    _run(tmp_path / "whole", corpus_dir, max_steps=6, schedule="constant")
    _run(tmp_path / "cut", corpus_dir, max_steps=3, schedule="constant")
    plan = plan_resumed_run("lm", tmp_path / "cut", train_overrides={"max_steps": 6})
    train_run("lm", plan.model_cfg, plan.train_cfg, tmp_path / "cut", task_cfg=plan.task_cfg,
              resume=plan.resume)
    whole = [r["loss"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")]
    cut = [r["loss"] for r in read_metrics(tmp_path / "cut" / "metrics.jsonl")]
    assert cut == whole
    with open(corpus_dir / "two.md", "a", encoding="utf-8") as f:
        f.write("one more line\n")
    with pytest.raises(DataChangedError, match=r"two.md: \d+ -> \d+ bytes"):
        plan_resumed_run("lm", tmp_path / "cut", train_overrides={"max_steps": 8})


def test_the_task_takes_a_corpus_as_its_data(tmp_path, corpus_dir):
    """The library path: a TokenCorpus handed to the task, no config naming it."""
    corpus = TokenCorpus.build(corpus_dir, "bpe", vocab_size=300)
    task = LMTask(data=corpus)
    assert task.tokenizer is corpus.tokenizer and task.record is corpus.record
    cfg = task.prepare(dataclasses.replace(LMTask.default_model_config(), **TINY))
    assert cfg.vocab_size == 300 and cfg.pad_id == 0
    rebuilt = LMTask.from_dict(json.loads(json.dumps(task.to_dict())))
    assert rebuilt.tokenizer == task.tokenizer and rebuilt.record == task.record
    assert rebuilt.prompts == task.prompts
    with pytest.raises(TypeError, match="needs the tokenizer"):
        LMTask(data=corpus.record)
    with pytest.raises(TypeError, match="data must be"):
        LMTask(data="corpus.txt")


def test_too_few_windows_for_a_batch_or_a_held_out_window_are_refused(tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("a short text\n" * 40)
    with pytest.raises(ValueError, match=r"fewer than a batch \(batch_size 500\)"):
        plan_fresh_run("lm", train_overrides={"data": str(small), "batch_size": 500,
                                              "seq_len": 8})
    with pytest.raises(ValueError, match=r"seq_len \(100\) must be < the validation split"):
        plan_fresh_run("lm", train_overrides={"data": str(small), "seq_len": 100})


def test_a_record_alone_reopens_the_corpus_when_training_needs_it(tmp_path, corpus_dir,
                                                                  monkeypatch):
    corpus = TokenCorpus.build(corpus_dir)
    reopened = []
    real = TokenCorpus.reopen.__func__

    def spy(cls, *args, **kwargs):
        reopened.append(args[0].path)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(TokenCorpus, "reopen", classmethod(spy))
    task = LMTask(corpus.tokenizer, data=DataRecord.from_dict(corpus.record.to_dict()))
    assert isinstance(task.data, UserText) and reopened == []  # nothing read yet
    assert task.corpus.n_train == corpus.n_train and task.data.train_size() == corpus.n_train
    assert task.corpus is task.corpus and reopened == [str(corpus_dir)]  # opened once


def test_the_task_is_given_one_text_data_whichever_it_is(tmp_path, corpus_dir):
    """``text_data``: the topics, a corpus, its record or a TextData itself; the bundled
    text's bits per character are the nats over the count over ln 2 (the definition)."""
    bundled = text_data()
    assert isinstance(bundled, BundledText) and bundled.prompts() == SAMPLE_PROMPTS
    assert bundled.scores(3.0, 4, torch.zeros(1, 5)) == {"val_bpc": 3.0 / 4 / math.log(2),
                                                        "val_chars": 4}
    corpus = TokenCorpus.build(corpus_dir)  # characters: no tokenizer.json to keep
    data = text_data(data=corpus)
    assert isinstance(data, UserText) and data.corpus() is corpus
    assert set(data.run_files()) == {"data.json"} and data.unit == "tokens"
    task = LMTask(data=data)
    assert task.data is data and task.tokenizer is corpus.tokenizer
    assert text_data_from_dict(json.loads(json.dumps(data.to_dict()))).to_dict() == (
        data.to_dict())
    with pytest.raises(TypeError, match="carries its own tokenizer"):
        LMTask(corpus.tokenizer, data=data)
