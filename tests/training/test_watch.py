"""Trainer(watch=EVERY): which steps are watched, what watch.jsonl holds through resumes, that
training itself is unchanged, the compiled fallback, and the seeds' two questions asked of a
small model with fixed seeds.

Provenance: the unwatched run is the reference for the watched one (bit for bit: the watch
changes no number of training); the uninterrupted run is the reference for a resumed one's
file; the hooks' presence is read from the modules themselves. The post-LN / pre-LN direction
(Xiong et al., 2020, Fig. 3) and BatchNorm's train/eval gap are the seeds' claims, checked as
measured on seeded models (numbers in the comments).
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
from toy_batches import IdBatches, lm_loss

import addnorm
from addnorm.inspection.summary import FLAT, depth_profile
from addnorm.training import Callback
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.trainer import Trainer
from addnorm.training.trainer_state import TrainerState
from addnorm.training.watch import WatchCallback, grad_norm_basis, read_watch, scalars
from addnorm.training.wrapping import WrappedModel


def _cfg(**overrides):
    settings = dict(vocab_size=32, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.1)
    return dataclasses.replace(addnorm.PRESETS["lm-tiny"], **{**settings, **overrides})


def _trainer(run_dir, cfg=None, *, steps=5, watch=None, callbacks=(), batches=None, loggers=(),
             **fields):
    settings = dict(max_steps=steps, lr=1e-2, warmup=1, checkpoint_every=0, log_every=1,
                    grad_accum=2)
    train_cfg = TrainConfig(**{**settings, **fields})
    cfg = cfg or _cfg()
    torch.manual_seed(0)
    model = addnorm.TransformerLM(cfg)
    return Trainer(model, lm_loss, batches or IdBatches(cfg.vocab_size), train_cfg,
                   run_dir=run_dir, schedule=ScheduleConfig("constant", 1e-2, 1, total_steps=steps),
                   watch=watch, callbacks=callbacks, loggers=loggers)


class HookCounter(Callback):
    """The forward hooks on the model when a step starts (after the trainer's own callbacks)
    and when its update is about to happen."""

    def __init__(self) -> None:
        self.counts: list[tuple[int, int, int]] = []

    @staticmethod
    def _hooks(trainer) -> int:
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                   for m in trainer.model.modules())

    def on_step_start(self, trainer):
        self._start = self._hooks(trainer)

    def on_before_update(self, trainer):
        self.counts.append((trainer.step + 1, self._start, self._hooks(trainer)))


def test_the_first_every_nth_and_last_steps_are_watched_and_only_they_carry_hooks(tmp_path):
    counter = HookCounter()
    trainer = _trainer(tmp_path, steps=5, watch=2, callbacks=[counter])
    trainer.fit()
    records = read_watch(tmp_path / "watch.jsonl")
    assert [r["step"] for r in records] == [1, 2, 4, 5]
    watched = {step for step, start, _ in counter.counts if start > 0}
    assert watched == {1, 2, 4, 5}
    assert all(end == 0 for _, _, end in counter.counts)  # gone once the gradients are done
    losses = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")}
    for record in records:
        assert record["loss"] == pytest.approx(losses[record["step"]], rel=1e-6)  # 7 digits
        assert record["layers"] == ["blocks.layers.0", "blocks.layers.1"]
        assert {"grad_norm", "update_ratio", "residual", "norms", "attention_entropy",
                "ffn_units"} <= set(record)


def test_watching_changes_no_number_of_training(tmp_path):
    """Dropout and two micro-batches per step: the checkpoint is the same bit for bit."""
    weights = []
    for name, watch in (("plain", None), ("watched", 1)):
        trainer = _trainer(tmp_path / name, steps=4, watch=watch)
        result = trainer.fit()
        weights.append(load_checkpoint(result.checkpoint).tensors["model"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not (tmp_path / "plain" / "watch.jsonl").exists()


def test_a_resumed_run_keeps_the_records_up_to_its_checkpoint(tmp_path):
    whole = _trainer(tmp_path / "whole", steps=6, watch=2)
    whole.fit()
    cut = _trainer(tmp_path / "cut", steps=6, watch=2, checkpoint_every=3)
    cut.fit()  # records of steps 1..6 and checkpoints at 3 and 6
    resumed = _trainer(tmp_path / "cut", steps=6, watch=2)
    resumed.load(load_checkpoint(tmp_path / "cut" / "checkpoints" / "step-00000003"))
    resumed.fit()
    lines = (tmp_path / "cut" / "watch.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 4, 6]
    uninterrupted = (tmp_path / "whole" / "watch.jsonl").read_text().splitlines()
    assert lines == uninterrupted


def test_records_go_to_sinks_and_flatten_into_scalars(tmp_path):
    received = []
    watch = WatchCallback(3, tmp_path / "w.jsonl", sinks=[received.append])
    _trainer(tmp_path, steps=3, callbacks=[watch]).fit()
    assert [r["step"] for r in received] == [1, 3]
    flat = scalars(received[-1])
    assert flat["watch/grad_norm/total"] == received[-1]["grad_norm"]["total"]
    assert flat["watch/residual/blocks.layers.1/out"] == received[-1]["residual"][
        "blocks.layers.1"]["out"]
    assert flat["watch/attention_entropy/blocks.layers.0.self_attn/h1"] == received[-1][
        "attention_entropy"]["blocks.layers.0.self_attn"][1]
    assert all(isinstance(v, float) for v in flat.values())


def test_a_compiled_model_is_watched_eagerly_and_trains_compiled_between(
    tmp_path, monkeypatch, fresh_dynamo
):
    """The eager backend (no code generation); the compiled callable is counted: it runs on
    the unwatched steps only, and the watched ones still see every sublayer."""
    calls = []
    compile_fn = torch.compile

    def counting_backend(graph, example_inputs):
        def run(*args):
            calls.append(1)
            return graph(*args)
        return run

    monkeypatch.setattr(torch, "compile",
                        lambda model, **kw: compile_fn(model, backend=counting_backend))
    trainer = _trainer(tmp_path, steps=4, watch=3, compile=True, grad_accum=1)
    trainer.fit()
    records = read_watch(tmp_path / "watch.jsonl")
    assert [r["step"] for r in records] == [1, 3, 4]
    assert all(set(r["residual"]) >= {"blocks.layers.0"} for r in records)
    assert len(calls) >= 1  # step 2 ran the compiled forward
    assert hasattr(trainer.forward_model, "_orig_mod")  # and it is back after watched steps


def _plain_grad_norms(cfg, batch, names) -> dict[str, float]:
    """The gradient norm of each named group (a module path: its parameters; "total": all) of
    a fresh seed-0 model's loss on ``batch``: one backward, nothing clipped."""
    torch.manual_seed(0)
    model = addnorm.TransformerLM(cfg)
    lm_loss(model, batch)[0].backward()
    grads = dict(model.named_parameters())

    def norm(group: str) -> float:
        members = [p.grad.flatten() for n, p in grads.items()
                   if group == "total" or n == group or n.startswith(group + ".")]
        return float(torch.linalg.vector_norm(torch.cat(members)))

    return {name: norm(name) for name in names}


def test_a_clipped_step_records_the_gradient_norms_before_clipping_and_the_factor(tmp_path):
    """Provenance: plain autograd on a twin of the model (the same seed, no dropout, the same
    first batch, one micro-batch), no clipping; the run clips to 1e-3, far below the norm.
    Tolerance: float32 norms summed in another grouping, the watch's division by the clip
    factor and its 7 written digits: a few 1e-7 relative, within rel 1e-5."""
    cfg = _cfg(dropout=0.0)
    clip = 1e-3
    _trainer(tmp_path, cfg, steps=1, watch=1, grad_accum=1, grad_clip=clip).fit()
    (record,) = read_watch(tmp_path / "watch.jsonl")
    plain = _plain_grad_norms(cfg, IdBatches(cfg.vocab_size).next_batch(), record["grad_norm"])
    assert plain["total"] > 100 * clip  # the clip was active, and by far
    assert record["grad_norm"] == pytest.approx(plain, rel=1e-5)
    assert record["clip_factor"] == pytest.approx(clip / plain["total"], rel=1e-5)
    (metrics,) = read_metrics(tmp_path / "metrics.jsonl")
    assert record["grad_norm"]["total"] == pytest.approx(metrics["grad_norm"], rel=1e-6)
    assert scalars(record)["watch/clip_factor"] == record["clip_factor"]
    assert scalars(record)["watch/grad_norm/total"] == record["grad_norm"]["total"]


def test_without_clipping_the_factor_is_one_and_the_norms_are_as_measured(tmp_path):
    cfg = _cfg(dropout=0.0)
    _trainer(tmp_path, cfg, steps=1, watch=1, grad_accum=1, grad_clip=0.0).fit()
    (record,) = read_watch(tmp_path / "watch.jsonl")
    plain = _plain_grad_norms(cfg, IdBatches(cfg.vocab_size).next_batch(), record["grad_norm"])
    assert record["clip_factor"] == 1.0
    assert record["grad_norm"] == pytest.approx(plain, rel=1e-6)  # 7 digits, float32 sums


@pytest.mark.parametrize(("factor", "written"), [(0.0, 0.0), (float("nan"), None)])
def test_a_factor_that_cannot_be_divided_by_leaves_the_norms_null(tmp_path, factor, written):
    """A factor of 0 (an infinite norm) or NaN: no norm before clipping can be recovered, and
    JSON has no NaN."""
    cfg = _cfg(dropout=0.0)
    torch.manual_seed(0)
    model = addnorm.TransformerLM(cfg)
    received: list[dict] = []
    watch = WatchCallback(1, sinks=[received.append])
    state = TrainerState(0, 0.1, TrainConfig(max_steps=1), tmp_path, None, model,
                         torch.optim.SGD(model.parameters()), WrappedModel(model, model),
                         torch.tensor(float("inf")), torch.tensor(factor))
    watch.on_fit_start(state)
    watch.on_step_start(state)
    lm_loss(model, IdBatches(cfg.vocab_size).next_batch())[0].backward()
    watch.on_before_update(state)
    watch.on_step_end(dataclasses.replace(state, step=1), 1.0, 32)
    (record,) = received
    assert record["clip_factor"] == written
    assert set(record["grad_norm"].values()) == {None}


def test_grad_norm_basis_tells_older_clipped_records_from_unclipped_ones():
    new = {"step": 2, "layers": [], "grad_norm": {}, "clip_factor": 0.5}
    old = {"step": 1, "layers": [], "grad_norm": {}}
    assert grad_norm_basis([new]) == "before clipping"
    assert grad_norm_basis([old]).startswith("after clipping")
    assert grad_norm_basis([old, new]) == (
        "before clipping from step 2, after clipping in the records before")
    assert "watch/clip_factor" not in scalars(old)


def test_torn_and_foreign_lines_are_skipped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "watch.jsonl"
    good = {"step": 1, "layers": [], "grad_norm": {}}
    path.write_text(json.dumps(good) + "\nnot json\n" + json.dumps({"step": -1}) + "\n"
                    + json.dumps({**good, "step": 2}) + '\n{"step": 3, "lay')
    with caplog.at_level(logging.WARNING):
        records = read_watch(path)
    assert [r["step"] for r in records] == [1, 2]
    assert "skipped 2 line(s)" in caplog.text and "line 2: not JSON" in caplog.text
    assert read_watch(tmp_path / "missing.jsonl") == []


def test_a_bad_interval_is_refused():
    with pytest.raises(ValueError, match="every"):
        WatchCallback(0)


STEPS, LR = 8, 3e-3  # early training: a few constant-lr steps


def _profiles(run_dir, cfg, seed: int) -> list[tuple[float, float]]:
    """The gradient profile over depth (:func:`depth_profile`) at the first and last step."""
    torch.manual_seed(seed)
    model = addnorm.TransformerLM(cfg)
    train_cfg = TrainConfig(max_steps=STEPS, lr=LR, warmup=1, checkpoint_every=0, grad_accum=1)
    Trainer(model, lm_loss, IdBatches(cfg.vocab_size, 8, 16, seed), train_cfg,
            run_dir=run_dir, schedule=ScheduleConfig("constant", LR, 1, total_steps=STEPS),
            watch=STEPS).fit()
    first, last = read_watch(run_dir / "watch.jsonl")
    return [depth_profile(first), depth_profile(last)]


def test_post_ln_gradients_grow_toward_the_output_and_pre_ln_gradients_stay_flat(tmp_path):
    """A 6-layer lm-tiny-like model (d_model 32) on random tokens, three seeds. At
    initialisation post-LN's profile already climbs more steeply than pre-LN's (slopes of
    ln||g|| per layer, measured: post-LN -0.067, -0.045, +0.008; pre-LN -0.085, -0.149,
    -0.121); after seven updates post-LN's last layer gets several times the first layer's
    gradient while pre-LN's profile stays flat (:data:`FLAT`; fitted last / first, measured:
    post-LN 9.2x, 9.1x, 8.8x; pre-LN 0.75x, 0.92x, 0.75x)."""
    found = {}
    for position in ("post", "pre"):
        cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], vocab_size=100, n_layers=6,
                                  d_model=32, d_ff=128, n_heads=2, norm_position=position,
                                  dropout=0.0)
        found[position] = [_profiles(tmp_path / f"{position}{seed}", cfg, seed)
                           for seed in range(3)]
    for post, pre in zip(found["post"], found["pre"], strict=True):
        (post_slope, _), (_, post_ratio) = post
        (pre_slope, _), (_, pre_ratio) = pre
        assert post_slope > pre_slope  # at initialisation
        assert post_ratio > FLAT  # early training: grows toward the output
        assert 1 / FLAT < pre_ratio < FLAT


def test_batchnorm_shows_its_batch_statistics_gap_and_train_eval_gap(tmp_path):
    """The lm model with BatchNorm or LayerNorm, 6 steps: BatchNorm's batch statistics sit
    away from its running ones and its output moves with the batch (measured at steps 1, 3
    and 6: gap 0.62-0.75, 0.50-0.59, 0.25-0.28 running stds; train/eval gap 0.66-1.07,
    0.53-0.68, 0.30-0.32, shrinking as the running statistics catch up); LayerNorm's output
    does not depend on the batch (noise exactly 0)."""
    records = {}
    for norm in ("batch", "layer"):
        _trainer(tmp_path / norm, _cfg(norm=norm), steps=6, watch=3).fit()
        records[norm] = read_watch(tmp_path / norm / "watch.jsonl")
    for record in records["batch"]:
        entries = list(record["norms"].values())
        assert all(e["kind"] == "batch" for e in entries)
        assert min(e["mean_gap"] for e in entries) > 0.1
        assert min(e["train_eval_gap"] for e in entries) > 0.1
        assert min(e["batch_effect"] for e in entries) > 0.0
    for record in records["layer"]:
        assert all(e["train_eval_gap"] == 0.0 for e in record["norms"].values())


class ScalarLogger:
    """A tracker that keeps the scalars it is given."""

    def __init__(self) -> None:
        self.scalars: list[tuple[int, dict]] = []

    def start(self, step):
        pass

    def log_scalars(self, step, values):
        self.scalars.append((step, dict(values)))

    def log_image(self, step, tag, image):
        pass

    def flush(self):
        pass

    def close(self):
        pass


def test_the_trainers_loggers_get_the_watch_records_as_scalars(tmp_path):
    logger = ScalarLogger()
    _trainer(tmp_path, steps=3, watch=2, loggers=[logger]).fit()
    records = read_watch(tmp_path / "watch.jsonl")
    watched = [(step, values) for step, values in logger.scalars
               if any(tag.startswith("watch/") for tag in values)]
    assert [step for step, _ in watched] == [r["step"] for r in records] == [1, 2, 3]
    for (_, values), record in zip(watched, records, strict=True):
        # the file keeps SIGNIFICANT digits; the logger gets the numbers as measured
        assert values.keys() == scalars(record).keys()
        for tag, value in scalars(record).items():
            assert values[tag] == pytest.approx(value, rel=1e-6), tag
