"""addnorm.tasks.task: a task plugs into planning, training, resuming, loading and
``addnorm train`` by meeting the ``Task`` protocol and being registered, with no edit to the
library; the train settings split between the trainer and the task by name.

Provenance: a task the library does not know is defined here (each vector's entry sum,
regressed by a small MLP) and goes through the generic code as the built-in tasks do. The
oracles are identities: the settings each config ends up with are those given (by name); a
resumed run's records and final weights equal the uninterrupted run's bit for bit; the model
loaded back scores what the run's ``metrics.json`` says; the memory estimate grows with the
task's own ``length`` as ``sizes.training_bytes`` defines it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from sum_task import SUM_PRESETS, SumModel, SumTask, SumTaskConfig

import addnorm
from addnorm.cli.parser import main
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.plan import check_run_fits, plan_fresh_run, plan_resumed_run
from addnorm.tasks.run import train_run
from addnorm.tasks.task import split_train_settings
from addnorm.tasks.trained import load_trained
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.metrics import read_metrics

# ------------------------------------------------------------------ a task the library lacks


def records(run_dir) -> list[dict]:
    """The run's metrics records without their timings and probes (a run that ends at a
    step scores it with its evaluation, not a probe, so a split run has one probe less)."""
    return [{k: v for k, v in r.items()
             if k not in ("tokens_per_s", "elapsed_s") and not k.startswith("probe_")}
            for r in read_metrics(run_dir / "metrics.jsonl")]


# ------------------------------------------------------------------------------------ tests


def test_a_new_task_plans_trains_resumes_and_loads_through_the_generic_code(sum_task, tmp_path):
    plan = plan_fresh_run(
        "vector-sum", preset="sum-wide", train_values={"lr": 5e-3, "length": 5},
        source="--config sum.json", train_overrides={"max_steps": 6},
    )
    assert plan.model_cfg == SUM_PRESETS["sum-wide"]  # d_in comes with prepare, in the run
    assert (plan.train_cfg.lr, plan.train_cfg.max_steps) == (5e-3, 6)
    assert plan.task_cfg == SumTaskConfig(length=5)
    check_run_fits(plan, "cpu")

    def run(name, max_steps, **kwargs):
        train_cfg = dataclasses.replace(plan.train_cfg, max_steps=max_steps)
        return train_run("vector-sum", plan.model_cfg, train_cfg, tmp_path / name,
                         task_cfg=plan.task_cfg, **kwargs)

    whole = run("whole", 6)
    assert (whole.step, whole.stopped_by) == (6, "max_steps")
    assert whole.metrics["task"] == "vector-sum" and "val_mse" in whole.metrics
    assert whole.metrics["samples"] and all("answer" in s for s in whole.metrics["samples"])
    probed = [r["step"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")
              if "probe_val_mse" in r]
    assert probed == [2, 4]  # every 2 steps but the last, which the evaluation scores
    saved = load_checkpoint(tmp_path / "whole").state
    assert saved["train_config"]["length"] == 5 and saved["train_config"]["lr"] == 5e-3
    assert saved["run"]["model_config"]["d_in"] == 3  # set by the task's prepare

    run("split", 4)
    resumed = plan_resumed_run("vector-sum", tmp_path / "split",
                               train_overrides={"max_steps": 6, "eval_size": 8})
    assert (resumed.task_cfg.length, resumed.task_cfg.eval_size) == (5, 8)
    train_run("vector-sum", resumed.model_cfg, resumed.train_cfg, tmp_path / "split",
              task_cfg=dataclasses.replace(resumed.task_cfg, eval_size=16),
              resume=resumed.resume)
    assert records(tmp_path / "split") == records(tmp_path / "whole")
    final = {name: load_checkpoint(tmp_path / name).tensors["model"] for name in ("whole", "split")}
    assert all(torch.equal(final["whole"][k], final["split"][k]) for k in final["whole"])

    task, model, _ = load_trained(tmp_path / "whole")
    assert isinstance(task, SumTask) and task.d_in == 3
    assert task.evaluate_run(model, plan.task_cfg) == {"val_mse": whole.metrics["val_mse"]}
    assert isinstance(addnorm.load(tmp_path / "whole", SumModel), SumModel)


def test_a_resumed_run_of_a_new_task_refuses_to_change_its_own_settings(sum_task, tmp_path):
    plan = plan_fresh_run("vector-sum", train_overrides={"max_steps": 2})
    train_run("vector-sum", plan.model_cfg, plan.train_cfg, tmp_path, task_cfg=plan.task_cfg)
    with pytest.raises(ValueError, match="length cannot change when resuming"):
        plan_resumed_run("vector-sum", tmp_path, train_overrides={"length": 7})


def test_a_new_task_is_a_command_of_addnorm_train(sum_task, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "vector-sum", "--length", "4", "--max-steps", "3", "--quiet",
                 "--preset", "sum-small", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "val_mse: " in printed and "sum of 3 numbers: " in printed  # the task's own lines
    state = load_checkpoint(out).state
    assert state["train_config"]["length"] == 4 and state["run"]["model_config"]["d_model"] == 8

    assert main(["train", "vector-sum", "--help"]) == 0
    helped = " ".join(capsys.readouterr().out.split())
    assert "--length INT vectors per training sequence. (default 6)" in helped
    assert "--d-in" not in helped and "--d-model INT" in helped  # d_in is the task's

    code = main(["train", "vector-sum", "--batch-size", "8", "--eval-size", "4", "--out",
                 str(tmp_path / "small")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert "--eval-size (4) must be >= --batch-size (8)" in err

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model": {"d_in": 2}}))
    assert main(["train", "vector-sum", "--config", str(config), "--out",
                 str(tmp_path / "owned")]) == 2
    assert "d_in are set by the vector-sum task" in capsys.readouterr().err


def test_train_settings_split_by_name_between_the_trainer_and_the_task():
    values = {"lr": 0.5, "seq_len": 64, "eval_size": 3, "label_smoothing": 0.2}
    assert split_train_settings(LMTask, values) == (
        {"lr": 0.5}, {"seq_len": 64, "eval_size": 3, "label_smoothing": 0.2}
    )
    # A field earlier TrainConfigs held, which this task has none of, is dropped as ignored.
    assert split_train_settings(TranslateTask, values) == (
        {"lr": 0.5}, {"eval_size": 3, "label_smoothing": 0.2}
    )
    # So a config file written for an earlier version still plans the run it planned then.
    plan = plan_fresh_run("translate", train_values={"seq_len": 64, "eval_size": 5})
    assert plan.task_cfg == TranslateTaskConfig(eval_size=5)
    with pytest.raises(ValueError, match=r"c.json: unknown train keys \['lenght'\]") as err:
        split_train_settings(LMTask, {"lenght": 3}, "c.json")
    assert "'seq_len'" in str(err.value) and "'lr'" in str(err.value)  # the known ones


@pytest.mark.parametrize(
    ("config", "field", "value"),
    [
        (LMTaskConfig, "seq_len", 0),
        (LMTaskConfig, "label_smoothing", 1.0),
        (LMTaskConfig, "eval_size", 0),
        (TranslateTaskConfig, "label_smoothing", -0.1),
        (TranslateTaskConfig, "eval_size", 2.5),
    ],
)
def test_task_configs_refuse_bad_values_naming_the_field(config, field, value):
    with pytest.raises((ValueError, TypeError), match=field):
        config(**{field: value})


def test_a_task_config_round_trips_and_refuses_unknown_keys():
    cfg = LMTaskConfig(seq_len=64, label_smoothing=0.1, eval_size=7)
    assert LMTaskConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown LMTaskConfig keys \['lr'\]"):
        LMTaskConfig.from_dict({"lr": 0.1})
