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
import itertools
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import addnorm
from addnorm.cli.parser import main
from addnorm.family import ActivationShape
from addnorm.tasks.lm import LMTask, LMTaskConfig
from addnorm.tasks.plan import check_run_fits, plan_fresh_run, plan_resumed_run
from addnorm.tasks.registry import TASKS, register_task
from addnorm.tasks.run import load_trained, train_run
from addnorm.tasks.task import Sizing, TaskConfig, split_train_settings
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.probes import Probe
from addnorm.training.sizes import RunSizeError
from addnorm.utils import memory as _memory
from addnorm.utils.checks import check_int

# ------------------------------------------------------------------ a task the library lacks


@dataclass(frozen=True)
class SumConfig:
    """An MLP applied to each vector of a sequence: ``d_in`` -> ``n_layers`` x ``d_model``
    -> 1."""

    d_in: int = 1
    d_model: int = 16
    n_layers: int = 1

    def __post_init__(self) -> None:
        for name in ("d_in", "d_model", "n_layers"):
            check_int(name, getattr(self, name), min_value=1)

    def count_parameters(self) -> int:
        d = self.d_model
        return (self.d_in + 1) * d + self.n_layers * (d + 1) * d + (d + 1)

    def count_buffers(self) -> int:
        return 0

    def activation_shape(self) -> ActivationShape:
        return ActivationShape(
            n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_model, n_heads=0,
            d_output=1,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SumConfig:
        return cls(**data)


SUM_PRESETS = {"sum-small": SumConfig(d_model=8), "sum-wide": SumConfig(d_model=32)}


class SumModel(nn.Module):
    def __init__(self, cfg: SumConfig) -> None:
        super().__init__()
        self.cfg = cfg
        widths = [cfg.d_in, *[cfg.d_model] * (cfg.n_layers + 1)]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(cfg.d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (B, L, d_in) -> (B, L, 1)."""
        for layer in self.hidden:
            x = torch.tanh(layer(x))
        return self.head(x)


@dataclass(frozen=True)
class SumTaskConfig(TaskConfig):
    """The sum task's own settings.

    Attributes:
        length: vectors per training sequence.
        eval_size: held-out sequences scored at the end.
    """

    resumable: ClassVar[tuple[str, ...]] = ("eval_size",)

    length: int = 6
    eval_size: int = 16

    def __post_init__(self) -> None:
        check_int("length", self.length, min_value=1)
        check_int("eval_size", self.eval_size, min_value=1)


class SumBatches:
    """Sequences of uniform vectors and their entry sums, from a seeded ``random.Random``."""

    def __init__(self, batch_size: int, length: int, d_in: int, seed: int) -> None:
        self.shape, self.rng = (batch_size, length, d_in), random.Random(seed)

    def next_batch(self) -> dict[str, torch.Tensor]:
        b, n, d = self.shape
        x = torch.tensor([[[self.rng.random() for _ in range(d)] for _ in range(n)]
                          for _ in range(b)])
        return {"x": x, "y": x.sum(-1, keepdim=True)}

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class SumTask:
    """Regress each vector's entry sum; the vectors' width is the task's (``d_in``)."""

    name: ClassVar[str] = "vector-sum"
    description: ClassVar[str] = "the entry sum of random vectors (a test task)"
    metric: ClassVar[str] = "val_mse"
    owned_fields: ClassVar[frozenset[str]] = frozenset({"d_in"})
    loss_label = "loss (mean squared error)"

    def __init__(self, d_in: int = 3) -> None:
        self.d_in = d_in

    @staticmethod
    def default_model_config() -> SumConfig:
        return SumConfig()

    @staticmethod
    def default_train_config() -> TrainConfig:
        return TrainConfig(max_steps=8, max_minutes=None, batch_size=4, lr=1e-2,
                           schedule="constant", warmup=1, checkpoint_every=4, log_every=1)

    @staticmethod
    def default_task_config() -> SumTaskConfig:
        return SumTaskConfig()

    @staticmethod
    def presets() -> Mapping[str, SumConfig]:
        return SUM_PRESETS

    @staticmethod
    def config_from_dict(data: dict) -> SumConfig:
        return SumConfig.from_dict(data)

    @classmethod
    def from_config(cls, task_cfg: SumTaskConfig) -> SumTask:
        return cls()

    def prepare(self, cfg: SumConfig) -> SumConfig:
        return dataclasses.replace(cfg, d_in=self.d_in)

    def check(self, cfg: SumConfig, train_cfg: TrainConfig, task_cfg: SumTaskConfig) -> None:
        if task_cfg.eval_size < train_cfg.batch_size:
            raise ValueError(
                f"eval_size ({task_cfg.eval_size}) must be >= batch_size ({train_cfg.batch_size})"
            )

    def sizing(self, cfg: SumConfig, train_cfg: TrainConfig, task_cfg: SumTaskConfig) -> Sizing:
        return Sizing(length=task_cfg.length, eval_batch=task_cfg.eval_size)

    def build_model(self, cfg: SumConfig) -> SumModel:
        return SumModel(cfg)

    def batches(
        self, cfg: SumConfig, train_cfg: TrainConfig, task_cfg: SumTaskConfig
    ) -> SumBatches:
        return SumBatches(train_cfg.batch_size, task_cfg.length, cfg.d_in, train_cfg.seed)

    def loss_fn(self, task_cfg: SumTaskConfig):
        def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
            return F.mse_loss(model(batch["x"]), batch["y"]), batch["y"].numel()

        return loss

    def probe(self, task_cfg: SumTaskConfig) -> Probe:
        return Probe(every=2, score=lambda model: {"val_mse": self.val_mse(model, 4)})

    @torch.no_grad()
    def val_mse(self, model: nn.Module, n: int) -> float:
        batch = SumBatches(n, 5, self.d_in, seed=12345).next_batch()
        return F.mse_loss(model(batch["x"]), batch["y"]).item()

    def evaluate_run(self, model: SumModel, task_cfg: SumTaskConfig) -> dict[str, float]:
        return {"val_mse": self.val_mse(model, task_cfg.eval_size)}

    def run_samples(self, model: SumModel) -> list[dict[str, Any]]:
        batch = SumBatches(1, 2, self.d_in, seed=7).next_batch()
        with torch.no_grad():
            predictions = model(batch["x"])[0, :, 0].tolist()
        return [{"input": x, "prediction": p, "answer": y}
                for x, p, y in zip(batch["x"][0].tolist(), predictions,
                                   batch["y"][0, :, 0].tolist(), strict=True)]

    @staticmethod
    def samples_text(samples: list[dict[str, Any]]) -> str:
        return "".join(f"sum of {len(s['input'])} numbers: {s['prediction']:.3f} "
                       f"(answer {s['answer']:.3f})\n" for s in samples)

    def to_dict(self) -> dict:
        return {"d_in": self.d_in}

    @classmethod
    def from_dict(cls, data: dict) -> SumTask:
        return cls(**data)


@pytest.fixture
def sum_task():
    register_task(SumTask)
    yield SumTask
    del TASKS[SumTask.name]


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


def test_the_memory_estimate_reads_the_tasks_sizing_and_blames_its_setting(sum_task):
    plan = plan_fresh_run("vector-sum", train_overrides={"length": 10**9})
    with mock.patch.object(_memory, "available_memory", lambda device="cpu": 10**9):
        with pytest.raises(RunSizeError) as refused:
            check_run_fits(plan, "cpu")
    assert (refused.value.setting, refused.value.value) == ("length", 10**9)


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


def test_register_task_refuses_a_taken_name_and_a_setting_named_like_the_trainers():
    assert register_task(LMTask) is LMTask  # the same class again: nothing changes

    class Impostor(SumTask):
        name: ClassVar[str] = "lm"

    with pytest.raises(ValueError, match="'lm' is already registered"):
        register_task(Impostor)

    @dataclass(frozen=True)
    class Clashing(TaskConfig):
        lr: float = 0.1

    class ClashingTask(SumTask):
        name: ClassVar[str] = "clashing"

        @staticmethod
        def default_task_config() -> Clashing:
            return Clashing()

    with pytest.raises(ValueError, match=r"repeats TrainConfig fields \['lr'\]"):
        register_task(ClashingTask)
    assert "clashing" not in TASKS


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
