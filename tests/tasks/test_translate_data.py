"""The translate task on a user's sentence pairs: planned, trained, scored (exact match, the
error rates, and chrF by sacrebleu), saved, loaded and resumed through the generic code.

Provenance: the exact match is recounted from the task's own ``predict`` on the held-out
pairs; chrF is sacrebleu's ``CHRF`` on the same predictions (the reference implementation);
the error rates are ``text_metrics.error_rate`` (held to the textbook table in its own
tests) on the same predictions, in the target tokenizer's tokens, characters and words;
the model config's sizes are the tokenizers' (an identity); a resumed run refuses pairs that
changed, naming the file; the pairs as one data object (``addnorm.tasks.translate_data``),
their evaluation sets of the stated sizes, and a share of exact matches and of wrong
characters counted by hand; the held-out pairs' test and validation halves restated from
their rule (sources taken alternately in the order they first appear), the validation
recounted from ``predict``.
"""

from __future__ import annotations

import json
import logging

import pytest

from addnorm.data.fingerprint import DataChangedError
from addnorm.data.hf_tokenizer import HFTokenizer
from addnorm.data.pairs import PairCorpus
from addnorm.tasks.pair_data import Example
from addnorm.tasks.plan import plan_fresh_run, plan_resumed_run
from addnorm.tasks.run import train_run
from addnorm.tasks.text_metrics import error_rate
from addnorm.tasks.trained import load_trained
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.tasks.translate_data import (
    BundledDates,
    UserPairs,
    pair_data,
    pair_data_from_dict,
)
from addnorm.training.config import TrainConfig

TINY = dict(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1)
TRAIN = dict(max_steps=3, batch_size=8, eval_size=12, log_every=1, checkpoint_every=0,
             max_minutes=None, warmup=1)
ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _pairs_file(path, n=300):
    lines = [f"{ONES[i // 10]} {ONES[i % 10]}\t{i}" for i in range(min(n, 100))]
    lines += [f"{ONES[i % 10]} {ONES[i // 10 % 10]} {ONES[i // 100]}\t{i}" for i in range(100, n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(out, data, **overrides):
    plan = plan_fresh_run("translate", model_overrides=TINY,
                          train_overrides={**TRAIN, "data": str(data), **overrides})
    summary = train_run("translate", plan.model_cfg, plan.train_cfg, out,
                        task_cfg=plan.task_cfg, resume=plan.resume)
    return plan, summary


def test_exact_match_and_chrf_are_the_models_on_the_held_out_pairs(tmp_path):
    sacrebleu = pytest.importorskip("sacrebleu")
    data = _pairs_file(tmp_path / "pairs.tsv")
    plan, summary = _run(tmp_path / "run", data)
    task, model, _ = load_trained(summary.best)  # (a run on a user's data keeps its best)
    held = task.data.held_out("test", 12)
    predictions = task.predict(model, [p.source for p in held])
    hits = sum(p == h.target for p, h in zip(predictions, held, strict=True))
    assert summary.metrics["test_exact_match"] == hits / len(held)
    assert summary.metrics["n_test"] == len(held)
    chrf = sacrebleu.metrics.CHRF().corpus_score(predictions, [[h.target for h in held]]).score
    assert summary.metrics["test_chrf"] == chrf
    answers = [h.target for h in held]
    tokens = error_rate([task.tgt_tok.encode(p) for p in predictions],
                        [task.tgt_tok.encode(a) for a in answers])
    assert summary.metrics["test_token_error_rate"] == tokens
    assert summary.metrics["test_char_error_rate"] == error_rate(predictions, answers)
    assert summary.metrics["test_word_error_rate"] == error_rate(
        [p.split() for p in predictions], [a.split() for a in answers])
    assert summary.metrics["test_sequence_error_rate"] == 1 - hits / len(held)
    on_disk = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert on_disk["test_token_error_rate"] == tokens


def test_without_sacrebleu_the_run_says_chrf_is_left_out(tmp_path, monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_sacrebleu(name, *args, **kwargs):
        if name.startswith("sacrebleu"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sacrebleu)
    with caplog.at_level(logging.WARNING):
        _, summary = _run(tmp_path / "run", _pairs_file(tmp_path / "pairs.tsv"), max_steps=1)
    assert "test_chrf" not in summary.metrics
    assert "chrF left out: it needs sacrebleu" in caplog.text


@pytest.mark.parametrize(("tokenizer", "shared", "files"), [
    ("char", False, set()),
    ("bpe", False, {"source_tokenizer.json", "target_tokenizer.json"}),
    ("bpe", True, {"tokenizer.json"}),
])
def test_tokenizers_size_the_model_and_are_kept_in_the_run(tmp_path, tokenizer, shared, files):
    data = _pairs_file(tmp_path / "pairs.tsv")
    overrides = {"tokenizer": tokenizer, "shared_vocab": shared}
    if tokenizer == "bpe":
        overrides["vocab_size"] = 280
    plan, _ = _run(tmp_path / "run", data, max_steps=1, **overrides)
    task, model, checkpoint = load_trained(tmp_path / "run")
    cfg = model.cfg
    assert (cfg.src_vocab_size, cfg.tgt_vocab_size) == (task.src_tok.vocab_size,
                                                        task.tgt_tok.vocab_size)
    assert cfg.share_embeddings == shared and (task.src_tok is task.tgt_tok) == shared
    written = {p.name for p in (tmp_path / "run").iterdir() if p.name.endswith("tokenizer.json")}
    assert written == files
    for name in files:
        text = (tmp_path / "run" / name).read_text()
        side = task.tgt_tok if name.startswith("target") else task.src_tok
        assert isinstance(side, HFTokenizer) and text == side.to_json()
    record = json.loads((tmp_path / "run" / "data.json").read_text())
    assert record["kind"] == "pairs" and record["split"]["train_pairs"] > 0
    assert task.answer_problem("anything at all") is None  # no date check for a user's pairs


def test_a_resumed_run_refuses_pairs_that_changed(tmp_path):
    data = _pairs_file(tmp_path / "pairs.tsv")
    _run(tmp_path / "run", data, max_steps=2)
    plan = plan_resumed_run("translate", tmp_path / "run", train_overrides={"max_steps": 3})
    assert plan.task_cfg.data == str(data)
    with open(data, "a", encoding="utf-8") as f:
        f.write("nine nine nine\t999\n")
    with pytest.raises(DataChangedError, match=r"pairs.tsv: \d+ -> \d+ bytes"):
        plan_resumed_run("translate", tmp_path / "run", train_overrides={"max_steps": 3})


def test_too_few_train_pairs_for_a_batch_are_refused(tmp_path):
    data = _pairs_file(tmp_path / "pairs.tsv", n=40)
    with pytest.raises(ValueError, match=r"fewer than a batch \(batch_size 64\)"):
        plan_fresh_run("translate", train_overrides={"data": str(data), "batch_size": 64})


def test_inputs_a_bpe_model_cannot_take_are_named(tmp_path):
    corpus = PairCorpus.build(_pairs_file(tmp_path / "pairs.tsv"), tokenizer="bpe",
                              vocab_size=280)
    task = TranslateTask(data=corpus)
    assert task.source_alphabet() is None
    assert task.input_problem("one two", 10) is None
    long = " ".join(["seven"] * 20)
    assert task.input_problem(long, 10) == (
        f"{len(task.src_tok.encode(long))} tokens; the model takes at most 10 (its max_len)"
    )
    dates = TranslateTask()
    assert dates.answer_problem("2026-11-21") is None
    assert dates.answer_problem("2026-13-01") == "not a valid date from 1900 to 2099"




def test_the_task_is_given_one_pair_data_whichever_it_is(tmp_path):
    """``pair_data``: the dates, a corpus, its record (with the tokenizers) or a PairData
    itself; each scores by exact match and the error rates (a user's pairs with chrF where
    sacrebleu is)."""
    dates = pair_data()
    assert isinstance(dates, BundledDates) and dates.max_new_tokens == 11
    assert [(split, len(examples)) for split, examples in dates.evaluation_sets(8)] == [
        ("val", 2), ("test", 8)]
    # One answer of two wrong, by 1 character of 10 in each's 10 (a char tokenizer's tokens).
    assert dates.scores("val", ["2026-11-21", "2026-11-22"], ["2026-11-21", "2026-11-23"]) == {
        "val_exact_match": 0.5, "n_val": 2, "val_sequence_error_rate": 0.5,
        "val_token_error_rate": 1 / 20, "val_char_error_rate": 1 / 20,
        "val_word_error_rate": 1 / 2}
    corpus = PairCorpus.build(_pairs_file(tmp_path / "pairs.tsv"))
    pairs = pair_data(data=corpus)
    assert isinstance(pairs, UserPairs) and pairs.corpus is corpus
    assert pairs.max_new_tokens == 2 * corpus.longest_target + 2
    assert pairs.evaluation_sets(5) == [("test", pairs.held_out("test", 5))]
    assert pairs.train_size() == len(corpus.train) and not pairs.shared
    task = TranslateTask(data=pairs)
    assert task.data is pairs and task.src_tok is corpus.src_tok
    rebuilt = pair_data_from_dict(json.loads(json.dumps(pairs.to_dict())))
    assert isinstance(rebuilt, UserPairs) and rebuilt.to_dict() == pairs.to_dict()
    with pytest.raises(TypeError, match="needs the tokenizers"):
        TranslateTask(data=corpus.record)
    with pytest.raises(TypeError, match="carries its own tokenizers"):
        TranslateTask(corpus.src_tok, data=pairs)


def test_the_held_out_pairs_are_halved_by_source_into_test_and_validation_pairs(tmp_path):
    path = tmp_path / "pairs.tsv"  # a lexicon: some sources twice, with two answers
    lines = [f"{ONES[i % 10]} {ONES[i // 10 % 10]}\t{i}" for i in range(100)]
    lines += [f"{ONES[i % 10]} {ONES[i // 10 % 10]}\tagain {i}" for i in range(0, 100, 3)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = PairCorpus.build(path, val_fraction=0.5)
    pairs = pair_data(data=corpus)
    test, val = pairs.held_out("test", 10**6), pairs.held_out("val", 10**6)
    assert sorted(test + val) == sorted(Example(*p) for p in corpus.held_out)
    assert test and val and not {e.source for e in test} & {e.source for e in val}
    sources = list(dict.fromkeys(p.source for p in corpus.held_out))  # first appearance
    assert [e.source for e in test] == [
        p.source for p in corpus.held_out if sources.index(p.source) % 2 == 0]
    assert pairs.held_out("val", 3) == val[:3]
    with pytest.raises(ValueError, match="split"):
        pairs.held_out("train", 3)
    task = TranslateTask(data=pairs)
    validation = task.validation(TranslateTaskConfig(data=str(path), eval_size=12))
    model = task.build_model(task.prepare(TranslateTask.default_model_config()))
    scored = val[:3]  # a quarter of eval_size
    assert validation.score(model) == pairs.scores(
        "val", task.predict(model, [e.source for e in scored]), [e.target for e in scored])
    assert (validation.metric, validation.higher_is_better) == ("val_exact_match", True)
    assert validation.keep_by_default and validation.unavailable is None


def test_held_out_pairs_of_one_source_leave_nothing_to_validate_on(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{ONES[i % 10]} {i}\t{i}\n" for i in range(40)), encoding="utf-8")
    corpus = PairCorpus.build(path, valid=_one_source(tmp_path / "valid.tsv"))
    task = TranslateTask(data=corpus)
    config = TranslateTaskConfig(eval_size=8)
    assert task.validation(config).unavailable is not None
    model_cfg = task.prepare(TranslateTask.default_model_config())
    task.check(model_cfg, TrainConfig(batch_size=8), config)  # keep_best none: simply off
    with pytest.raises(ValueError, match="keep_best needs a validation split"):
        task.check(model_cfg, TrainConfig(batch_size=8, keep_best=True), config)


def _one_source(path):
    path.write_text("held\tone\nheld\ttwo\n", encoding="utf-8")
    return path


def test_a_planned_run_reads_and_tokenizes_the_pairs_once(tmp_path, monkeypatch):
    """The plan's task (its data read) is the one the size check and the run use: nothing
    is cached elsewhere, so a second build would read and train the tokenizers again."""
    from addnorm.tasks.plan import check_run_fits

    built = []
    real = PairCorpus.build.__func__
    monkeypatch.setattr(PairCorpus, "build", classmethod(
        lambda cls, *args, **kwargs: built.append(args[0]) or real(cls, *args, **kwargs)))
    data = _pairs_file(tmp_path / "pairs.tsv")
    plan = plan_fresh_run("translate", model_overrides=TINY,
                          train_overrides={**TRAIN, "data": str(data), "max_steps": 1})
    check_run_fits(plan, "cpu")
    train_run("translate", plan.model_cfg, plan.train_cfg, tmp_path / "run",
              task_cfg=plan.task_cfg, task=plan.task)
    assert built == [str(data)]
