"""What a finished run writes (``addnorm.tasks.run_finish``): its held-out predictions in
``metrics.json``, and the figures of its best checkpoint when it kept one (``checkpoint``,
``validation``), or of its last.

Provenance: the task's own ``predict`` and ``evaluate_run`` on the weights loaded back, and the
validation records the run logged to ``metrics.jsonl``.
"""

from __future__ import annotations

from dataclasses import replace

from addnorm.data.dates import dates_in_split
from addnorm.tasks.lm import LMTaskConfig
from addnorm.tasks.run import train_run
from addnorm.tasks.trained import load_trained
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics


def test_a_translate_run_stores_held_out_predictions(tmp_path):
    task = TranslateTask()
    model_cfg = replace(task.default_model_config(), d_model=16, n_heads=2, d_ff=32)
    train_cfg = TrainConfig(max_steps=2, batch_size=4, warmup=1)
    summary = train_run(
        "translate", model_cfg, train_cfg, tmp_path, task_cfg=TranslateTaskConfig(eval_size=4)
    )
    samples = summary.metrics["samples"]
    loaded, model, _ = load_trained(tmp_path)
    assert [s["prediction"] for s in samples] == loaded.predict(
        model, [s["input"] for s in samples]
    )
    test_dates = {d.isoformat() for d in dates_in_split("test")}
    assert samples and all(s["answer"] in test_dates for s in samples)


def test_a_run_that_keeps_its_best_is_scored_with_the_best_checkpoints_weights(
    tmp_path, tiny_lm_run
):
    summary = tiny_lm_run(tmp_path, max_steps=12, keep_best=True, eval_every=3, ema_decay=0.5,
                          checkpoint_every=4)
    seen = {r["step"]: r["val_bpc"] for r in read_metrics(tmp_path / "metrics.jsonl")
            if "val_bpc" in r}
    assert sorted(seen) == [3, 6, 9, 12]
    record = summary.metrics["validation"]
    assert record["step"] == min(seen, key=seen.__getitem__) and record["evaluated"] == 12
    assert (record["metric"], record["every"], record["patience"]) == ("val_bpc", 3, None)
    assert summary.best == tmp_path / "checkpoints" / f"best-{record['step']:08d}"
    assert summary.metrics["checkpoint"] == "best"
    assert summary.metrics["checkpoint_step"] == record["step"]
    task, model, checkpoint = load_trained(summary.best)  # (its EMA weights, as scored)
    figures = task.evaluate_run(model, LMTaskConfig(seq_len=16, eval_size=4))
    assert figures == {k: summary.metrics[k] for k in ("val_bpc", "val_chars")}
    assert summary.metrics["val_bpc"] == record["value"]  # the same windows (no test split)
    assert checkpoint.state["train_config"]["keep_best"] is True


def test_the_bundled_data_keeps_no_best_unless_told(tmp_path, tiny_lm_run):
    summary = tiny_lm_run(tmp_path)
    assert summary.best is None and summary.metrics["checkpoint"] == "last"
    assert "validation" not in summary.metrics
    assert load_checkpoint(tmp_path).state["train_config"]["keep_best"] is False  # decided
    assert not list((tmp_path / "checkpoints").glob("best-*"))
