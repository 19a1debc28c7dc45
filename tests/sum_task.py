"""A task the library does not know, for the tests of the task protocol, the registry and
planning: each vector's entry sum, regressed by a small MLP (``SumTask``, named
``vector-sum``; its model ``SumModel``, presets ``SUM_PRESETS``). tests/tasks/conftest.py
registers it for a test (the ``sum_task`` fixture)."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.family import ActivationShape
from addnorm.tasks.task import Sizing, TaskConfig
from addnorm.training.config import TrainConfig
from addnorm.training.probes import Probe
from addnorm.utils.checks import check_int


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


class SumData:
    """The task's data as a ``DataSource``: how many training sequences an epoch is (the
    vectors are drawn fresh; the number only counts epochs); ``record`` stands for a user's
    files (None: bundled)."""

    def __init__(self, n_train: int = 640, record: object = None) -> None:
        self.n_train, self.record = n_train, record

    def train_size(self) -> int:
        return self.n_train

    def to_dict(self) -> dict:
        return {}

    def run_files(self) -> dict[str, str]:
        return {}


class SumTask:
    """Regress each vector's entry sum; the vectors' width is the task's (``d_in``); ``data``
    counts its training sequences (``SumData``)."""

    name: ClassVar[str] = "vector-sum"
    description: ClassVar[str] = "the entry sum of random vectors (a test task)"
    metric: ClassVar[str] = "val_mse"
    owned_fields: ClassVar[frozenset[str]] = frozenset({"d_in"})
    loss_label = "loss (mean squared error)"

    def __init__(self, d_in: int = 3, data: SumData | None = None) -> None:
        self.d_in = d_in
        self.data = SumData() if data is None else data

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
