"""The watch under torch.distributed: two gloo processes (DDP with gradient accumulation; FSDP2
with activation checkpointing) write the record one process writes for the same global batch.

Provenance: the single-process run with the same seed is the reference. Every statistic is a
sum over tokens, rows or units divided at the end, so the two ranks' sums add up to the
whole batch's; the gradients are the global batch's mean (DDP averages them, FSDP2 shards
them: the sharded squares add up). The runs train and measure in float64, so the two differ
by the order of the sums alone (a relative 1e-9, test_distributed.py's TRAJECTORY_RTOL); the
files keep 7 significant digits, so the last digit may round either way: a relative 1e-6.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from addnorm.tasks.translate import TranslateTask
from addnorm.training import distributed
from addnorm.training.config import TrainConfig
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.state import seed_everything
from addnorm.training.trainer import Trainer
from addnorm.training.watch import read_watch

MODEL_OVERRIDES = dict(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1)
RTOL = 1e-6  # 7 significant digits in the files (the float64 runs agree to 1e-9)


def _train_runs(out: Path) -> None:
    """A tiny date translator, watched every step: two steps of two micro-batches ("ddp"), and
    one step sharded with activation checkpointing ("fsdp"; plain with one process)."""
    task = TranslateTask()
    model_cfg = task.prepare(dataclasses.replace(task.default_model_config(), **MODEL_OVERRIDES))
    task_cfg = task.default_task_config()

    def train(name, **overrides):
        settings = dict(batch_size=8, lr=3e-3, warmup=1, grad_clip=0.5, checkpoint_every=0)
        train_cfg = TrainConfig(**{**settings, **overrides})
        seed_everything(0)
        model = task.build_model(model_cfg).double()
        schedule = ScheduleConfig("constant", train_cfg.lr, 1, total_steps=train_cfg.max_steps)
        Trainer(model, task.loss_fn(task_cfg), task.batches(model_cfg, train_cfg, task_cfg),
                train_cfg, run_dir=out / name, schedule=schedule, watch=1).fit()

    train("ddp", max_steps=2, grad_accum=2)
    train("fsdp", max_steps=1, fsdp=distributed.is_distributed(), activation_checkpointing=True)


def _rank_main(rank: int, out: Path, port: int) -> None:
    torch.set_num_threads(1)
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    os.environ.update(env)
    world = distributed.world_from_env(env)
    assert world is not None
    distributed.init_distributed(world, "cpu", timeout_s=60)
    try:
        _train_runs(out)
    finally:
        distributed.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import socket

    root = tmp_path_factory.mktemp("watch-distributed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(root / "two", port), nprocs=2, start_method="fork")
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    try:
        torch.set_num_threads(1)
        _train_runs(root / "one")
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
    return root / "one", root / "two"


def _same(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}/{i}")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-12), (where, a, b)
    else:
        assert a == b, where


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_two_processes_write_the_one_process_record(runs, name):
    one, two = (read_watch(run / name / "watch.jsonl") for run in runs)
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for reference, record in zip(one, two, strict=True):
        _same(reference, record, f"{name} step {reference['step']}")
    assert {"residual", "norms", "attention_entropy", "ffn_units", "update_ratio"} <= set(
        two[0])
