"""The tasks' data (``addnorm.tasks.data_source`` and each task's ``*_data`` module): the
batches every task trains on are, draw for draw, the batches of the code before the tasks
were given their data as one object; a state saved by either resumes in the other; a data
object is told apart without reading its files.

Provenance of ``RECORDED``: the digests ``_stream`` gives were computed by this file's
``_sources`` and ``_stream`` run against commit e7a6fb7 (the per-kind batch classes over
module-cached corpora, before the batch sources were the map-style Datasets drawn by
``SeededSampler``), on CPU with torch 2.13 (whose CPU generator draws the noise). Each
entry: the digests of three batches (names, dtypes, shapes and bytes of every tensor), then
of the state saved after them (its JSON).
"""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import torch

from addnorm.data.batches import DateBatches, DigitBatches, TextBatches
from addnorm.data.dates import dates_in_split, random_examples
from addnorm.data.fingerprint import DataRecord, fingerprint_files
from addnorm.data.image_batches import ImageBatches
from addnorm.data.pairs import PairBatches, PairCorpus
from addnorm.data.text import TextCorpus
from addnorm.data.token_corpus import TokenCorpus
from addnorm.data.tokenizers import date_source_tokenizer, date_target_tokenizer
from addnorm.dit import DIT_PRESETS
from addnorm.tasks.data_source import is_data_source, record_files
from addnorm.tasks.dit import DiTTask, DiTTaskConfig
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training.config import TrainConfig
from addnorm.transformer.config import LM_PRESETS, TRANSFORMER_PRESETS

RECORDED = {
    "dates": ["80ddca54f785850e", "3abd875cb7902bcd", "7b1e4672f00773d2", "bc693e97228080d6"],
    "translate": ["98d745fb0690e0a5", "03ee500db98d487b", "09957562e9996c33",
                  "2aa38c73dd55afc3"],
    "text": ["4e45dd17855cae3a", "e1150ddf8990861f", "252757d94c8bb1b1", "72d8583786b7a5e5"],
    "tokens": ["67d0d54e44fb8863", "6cc85b8c7cec99a4", "cc2eec9befb3da5e", "a6cdba38fad247f7"],
    "lm_user": ["6c6e9b91c43fe423", "1ff3ce0a6e853e81", "baaf402b881db064",
                "f7d8acea57df788d"],
    "pairs": ["161da5b7d967f956", "8f80c94be6b53994", "94e512e2713547bf", "2662f230dd3ff2b2"],
    "translate_user": ["927a6ac747206baf", "b4ff55ef08344e15", "60307b1d5a5111f0",
                       "f7d8acea57df788d"],
    "digits": ["ff23967ec4541b37", "4a08949a75f5c691", "74c51c7a7e6c3e38", "9a18476868ee0774"],
    "dit": ["8d4c683eb7302031", "c6ee67c518ad2cd0", "c2e0fd8593daf082", "ae5e43b8c1fc49c7"],
    "images": ["aa9e88abffaa477d", "6403bd69bdb155b8", "505b4f38edbd53bb", "d8981b08b11b5ba1"],
    "dit_user": ["92c2de0701c773be", "5f786dd05780a11c", "168d8b4f166c9765",
                 "ae5e43b8c1fc49c7"],
}


def _digest(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(batch):
        t = batch[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _stream(source, n: int = 3) -> list[str]:
    out = [_digest(source.next_batch()) for _ in range(n)]
    state = json.dumps(source.state_dict(), sort_keys=True).encode()
    return [*out, hashlib.sha256(state).hexdigest()[:16]]


def _text(n: int = 400) -> str:
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "ηta"]
    return "".join(" ".join(words[(i * j) % 7] for j in range(1, 8)) + f" {i}\n"
                   for i in range(n))


def _sources(tmp):
    """Every batch source the tasks train on, bundled and a user's, by name."""
    (tmp / "text.txt").write_text(_text(), encoding="utf-8")
    examples = random_examples(dates_in_split("train"), random.Random(0), 300)
    (tmp / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in examples),
                                   encoding="utf-8")
    images = (np.arange(30 * 8 * 8 * 3) * 7 % 256).astype(np.uint8).reshape(30, 8, 8, 3)
    np.savez(tmp / "images.npz", images=images, labels=np.arange(30) % 3)
    train = TrainConfig(batch_size=5, seed=7)
    yield "dates", DateBatches(date_source_tokenizer(), date_target_tokenizer(), batch_size=5,
                               seed=3)
    task = TranslateTask()
    yield "translate", task.batches(task.prepare(TRANSFORMER_PRESETS["tiny"]), train,
                                    TranslateTaskConfig())
    yield "text", TextBatches(TextCorpus(_text(200)), batch_size=4, length=12, seed=5)
    corpus = TokenCorpus.build(tmp / "text.txt", cache_dir=tmp / "cache")
    yield "tokens", TextBatches(corpus, batch_size=4, length=12, seed=5)
    lm_cfg = LMTaskConfig(seq_len=12, data=str(tmp / "text.txt"), cache_dir=str(tmp / "cache"))
    task = LMTask.from_config(lm_cfg)
    yield "lm_user", task.batches(task.prepare(LM_PRESETS["lm-tiny"]), train, lm_cfg)
    yield "pairs", PairBatches(PairCorpus.build(tmp / "pairs.tsv"), batch_size=5, seed=2)
    tr_cfg = TranslateTaskConfig(data=str(tmp / "pairs.tsv"))
    task = TranslateTask.from_config(tr_cfg)
    yield "translate_user", task.batches(task.prepare(TRANSFORMER_PRESETS["tiny"]), train,
                                         tr_cfg)
    yield "digits", DigitBatches(batch_size=5, n_steps=1000, seed=4)
    task = DiTTask()
    yield "dit", task.batches(task.prepare(DIT_PRESETS["DiT-digits-tiny"]), train,
                              DiTTaskConfig())
    g = torch.Generator().manual_seed(0)
    yield "images", ImageBatches(torch.rand(20, 3, 4, 4, generator=g) * 2 - 1,
                                 torch.arange(20) % 4, batch_size=5, n_steps=1000,
                                 class_dropout=0.25, seed=6)
    dit_cfg = DiTTaskConfig(data=str(tmp / "images.npz"))
    task = DiTTask.from_config(dit_cfg)
    yield "dit_user", task.batches(task.prepare(DIT_PRESETS["DiT-digits-tiny"]), train,
                                   dit_cfg)


def test_every_tasks_batches_are_the_recorded_stream_draw_for_draw(tmp_path):
    streams = {name: _stream(source) for name, source in _sources(tmp_path)}
    assert streams == RECORDED


def test_a_state_saved_after_some_batches_resumes_the_stream_in_a_fresh_source(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for (name, first), (_, second) in zip(_sources(tmp_path / "a"), _sources(tmp_path / "b"),
                                          strict=True):
        first.next_batch()
        first.next_batch()
        second.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert _digest(second.next_batch()) == RECORDED[name][2], name


def test_a_data_object_is_told_apart_without_reading_its_properties():
    class Reads:
        @property
        def corpus(self):
            raise AssertionError("read")

        def train_size(self) -> int:
            return 1

        def to_dict(self) -> dict:
            return {}

        def run_files(self) -> dict:
            return {}

    assert is_data_source(Reads())
    assert not is_data_source(TextCorpus(_text(20))) and not is_data_source(None)
    assert all(is_data_source(task().data) for task in (LMTask, TranslateTask, DiTTask))


def test_the_record_file_is_the_records_json(tmp_path):
    (tmp_path / "a.txt").write_text("some text\n")
    record = DataRecord(str(tmp_path), "text", fingerprint_files([tmp_path / "a.txt"], tmp_path),
                        details={"note": "é"})
    files = record_files(record)
    assert list(files) == ["data.json"]
    assert DataRecord.from_dict(json.loads(files["data.json"])) == record


@pytest.mark.parametrize("task", [LMTask, TranslateTask, DiTTask])
def test_the_bundled_data_writes_no_run_files_and_rebuilds_from_its_dict(task):
    data = task().data
    assert data.record is None and data.run_files() == {} and data.train_size() > 0
    rebuilt = task.from_dict(json.loads(json.dumps(task().to_dict())))
    assert type(rebuilt.data) is type(data) and rebuilt.to_dict() == task().to_dict()
