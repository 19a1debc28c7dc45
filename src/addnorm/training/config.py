"""``TrainConfig``: the trainer's settings, one frozen dataclass validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from addnorm.training.schedules import SCHEDULES, ScheduleKind
from addnorm.utils.checks import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_known_fields,
    check_probability,
)

__all__ = ["FORMER_FIELDS", "MAX_LR", "MAX_SEED", "TrainConfig"]

# The largest seed every generator takes (torch's are seeded with a uint64).
MAX_SEED = 2**64 - 1
# The largest peak learning rate: Adam moves each weight by about lr per step whatever the
# gradient's scale, so lr = 1 already moves weights initialised near 1/sqrt(d_model) by more
# than their own size; a larger one only makes the weights overflow.
MAX_LR = 1.0
# Fields of earlier TrainConfigs that only a task read and that now live in the tasks' own
# configs (``addnorm.tasks.task.TaskConfig``): a saved run's ``train_config`` or a config
# file may still hold them, and a task without such a field ignores them, as it did then.
FORMER_FIELDS = ("label_smoothing", "seq_len", "eval_size")


@dataclass(frozen=True)
class TrainConfig:
    """How to train, whatever the task: budget, batches, optimizer (AdamW), schedule,
    regularisation, saving. What only a task reads (its loss's label smoothing, its window
    length, its held-out evaluation) is in that task's own config
    (:class:`addnorm.tasks.task.TaskConfig`).

    Attributes:
        max_steps: optimizer steps to run (the step budget).
        max_minutes: wall-clock budget of one invocation in minutes, counted in training time
            (probes and the held-out evaluation at the end come on top); None = no limit. A
            fresh run that would not finish its steps in it is planned shorter, its lr
            schedule fitted to the steps that fit (measured in its first steps, inside the
            warm-up), rather than cut; the time cap stays as the last resort.
        batch_size: sequences per micro-batch.
        grad_accum: micro-batches accumulated into one optimizer step.
        lr: the peak learning rate, for every schedule; in (0, ``MAX_LR``], and
            ``lr * weight_decay <= 1``.
        schedule: one of ``schedules.SCHEDULES``: "noam" (the shape of Vaswani et al. 2017,
            eq. 3, peaking at ``lr`` at step ``warmup``: ``lr * sqrt(warmup) * min(step^-0.5,
            step * warmup^-1.5)``; the paper's own values are ``lr = d_model^-0.5 *
            warmup^-0.5``), "cosine" (linear warm-up, then cosine decay to
            ``final_lr_fraction * lr`` at ``max_steps``, held after) or "constant" (after
            warm-up); torch's lr schedulers (``schedules.ScheduleConfig``).
        warmup: warm-up steps (0 or 1: the first step takes the peak ``lr``).
        final_lr_fraction: the cosine schedule's last learning rate, as a fraction of ``lr``.
        weight_decay: AdamW's decoupled weight decay.
        beta1, beta2: AdamW's moment decay rates (the paper: 0.9, 0.98).
        grad_clip: max global gradient norm; 0 disables clipping.
        ema_decay: decay of the exponential moving average of the weights; 0 disables it.
        ema_warmup: at update n (from 0) decay by ``min(ema_decay, (1 + n) / (10 + n))``, so
            the average forgets the initial weights within tens of steps rather than the
            ``1 / (1 - ema_decay)`` a constant decay takes (TensorFlow's num_updates rule);
            for short runs.
        bf16: run forward and loss under bfloat16 autocast.
        seed: seeds the weights, dropout and the data order; 0 to 2**64 - 1.
        checkpoint_every: save every this many steps (0 = only at the end).
        keep_checkpoints: how many of the newest checkpoints to keep on disk.
        log_every: write a metrics line every this many steps.
        activation_checkpointing: recompute each layer's activations in the backward pass
            instead of storing them (less memory, about one more forward of time).
        fsdp: shard the weights, gradients and optimizer state over the processes of a
            ``torchrun`` launch (FSDP2) instead of replicating them (DDP).
        compile: run the model's forward through ``torch.compile``.
        epochs: passes over the training data (a text's tokens, pairs, images) that set
            max_steps when the run is planned, epochs * examples / (batch_size * grad_accum)
            rounded up; none = max_steps as given (a run on your data without either: as
            many steps as fit the time budget).
        fill_budget: the steps are as many as fit the time budget (``max_minutes``): the plan
            made before training fits them to a measured warm-up, and the run re-plans them in
            training to its measured pace, up when the machine turns out faster as well as
            down when slower (:mod:`addnorm.training.budget`); none = on for a run on your
            data given neither max_steps nor epochs, off otherwise (the plan decides and
            records it). Needs max_minutes; excludes max_steps and epochs.
        keep_best: score the weights on the validation split every eval_every steps (and at
            the end) and keep the best as a checkpoint of its own (checkpoints/best-N), which
            translate, generate, sample and addnorm.load then use, and metrics.json scores;
            none = on for runs on your data (--data), off for the bundled data.
        eval_every: steps between those evaluations (with keep_best or patience); none = a
            tenth of max_steps. Their size is the task's eval_size (see the task).
        patience: stop after this many evaluations in a row without a better score than the
            best so far (early stopping); none = never.
    """

    max_steps: int = 1000
    max_minutes: float | None = None
    batch_size: int = 64
    grad_accum: int = 1
    lr: float = 1e-3
    schedule: ScheduleKind = "cosine"
    warmup: int = 100
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0
    ema_decay: float = 0.0
    ema_warmup: bool = False
    bf16: bool = False
    seed: int = 0
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    activation_checkpointing: bool = False
    fsdp: bool = False
    compile: bool = False
    # How long the run is planned to be (addnorm.tasks.budget); the fields added for issue 40
    # stay together here.
    epochs: float | None = None
    fill_budget: bool | None = None
    # Keeping the best (addnorm.training.best): evaluations on the validation split while
    # training, the best checkpoint, early stopping.
    keep_best: bool | None = None
    eval_every: int | None = None
    patience: int | None = None

    def __post_init__(self) -> None:
        check_int("max_steps", self.max_steps, min_value=1)
        if self.max_minutes is not None:
            check_float("max_minutes", self.max_minutes, min_value=0.0, min_inclusive=False)
        check_int("batch_size", self.batch_size, min_value=1)
        check_int("grad_accum", self.grad_accum, min_value=1)
        check_float("lr", self.lr, min_value=0.0, min_inclusive=False, max_value=MAX_LR)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_int("warmup", self.warmup, min_value=0)
        if self.schedule == "noam" and self.warmup < 1:
            raise ValueError(f"warmup must be >= 1 for the noam schedule, got {self.warmup}")
        check_float("final_lr_fraction", self.final_lr_fraction, min_value=0.0, max_value=1.0)
        check_float("weight_decay", self.weight_decay, min_value=0.0)
        if self.lr * self.weight_decay > 1.0:  # AdamW scales weights by 1 - lr * wd per step
            raise ValueError(
                f"lr * weight_decay must be <= 1, got {self.lr} * {self.weight_decay}: AdamW "
                "multiplies the weights by 1 - lr * weight_decay each step, which above 1 "
                "flips their sign and above 2 grows them"
            )
        check_probability("beta1", self.beta1)
        check_probability("beta2", self.beta2)
        check_float("grad_clip", self.grad_clip, min_value=0.0)
        check_probability("ema_decay", self.ema_decay)
        check_bool("ema_warmup", self.ema_warmup)
        for name in ("bf16", "activation_checkpointing", "fsdp", "compile"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        check_int("seed", self.seed, min_value=0)
        if self.seed > MAX_SEED:  # torch.manual_seed takes at most a uint64
            raise ValueError(f"seed must be <= 2**64 - 1 ({MAX_SEED}), got {self.seed}")
        check_int("checkpoint_every", self.checkpoint_every, min_value=0)
        check_int("keep_checkpoints", self.keep_checkpoints, min_value=1)
        check_int("log_every", self.log_every, min_value=1)
        if self.epochs is not None:
            check_float("epochs", self.epochs, min_value=0.0, min_inclusive=False)
        if self.fill_budget is not None:
            check_bool("fill_budget", self.fill_budget)
        # Keeping the best.
        if self.keep_best is not None:
            check_bool("keep_best", self.keep_best)
        if self.eval_every is not None:
            check_int("eval_every", self.eval_every, min_value=1)
        if self.patience is not None:
            check_int("patience", self.patience, min_value=1)

    def to_dict(self) -> dict:
        """A JSON-ready dict of the fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """Build from a dict; unknown keys raise ValueError naming them and the known ones."""
        return cls(**check_known_fields(cls, data, "TrainConfig.from_dict"))
