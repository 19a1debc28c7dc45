"""Data-parallel training on torch.distributed: two gloo processes on the CPU equal one.

Provenance of expected values: the single-process run with the same seed is the reference (an
N-process run follows its trajectory by construction, up to floating-point reduction order);
DDP is the reference for one FSDP2 step; the slicing of a global batch is ``torch.cat``'s
inverse (an identity). The default tests share one two-process launch (forked, so torch is
not imported again; a module fixture); the ``slow`` tests run ``torchrun -m addnorm train``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torchrun_runs import assert_two_ranks_train_as_one

import addnorm
from addnorm.data.batches import RankShard
from addnorm.tasks.translate import TranslateTask, TranslateTaskConfig
from addnorm.training import distributed
from addnorm.training.checkpoint import load_checkpoint
from addnorm.training.config import TrainConfig
from addnorm.training.metrics import read_metrics
from addnorm.training.schedules import ScheduleConfig
from addnorm.training.state import seed_everything
from addnorm.training.trainer import Trainer

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]

MODEL_OVERRIDES = dict(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=2, n_decoder_layers=2)


def _trainer(run_dir: Path, loss_fn=None, **overrides) -> Trainer:
    """A trainer of a tiny date translator in float64 (12 steps with gradient accumulation,
    clipping, label smoothing and an EMA unless ``overrides`` say otherwise)."""
    task = TranslateTask()
    model_cfg = task.prepare(dataclasses.replace(task.default_model_config(), **MODEL_OVERRIDES))
    task_cfg = TranslateTaskConfig(label_smoothing=0.1)
    settings = dict(max_steps=12, batch_size=16, grad_accum=2, lr=3e-3, warmup=3,
                    grad_clip=0.5, ema_decay=0.9, checkpoint_every=0, log_every=4)
    train_cfg = TrainConfig(**{**settings, **overrides})
    seed_everything(0)
    model = task.build_model(model_cfg).double()  # float64: see TRAJECTORY_RTOL
    schedule = ScheduleConfig("cosine", train_cfg.lr, train_cfg.warmup, total_steps=12)
    batches = task.batches(model_cfg, train_cfg, task_cfg)
    return Trainer(model, loss_fn or task.loss_fn(task_cfg), batches, train_cfg,
                   run_dir=run_dir, schedule=schedule)


def _train_runs(out: Path, *, reference_only: bool = False) -> None:
    """Train a tiny date translator into ``out``: 12 steps with gradient accumulation,
    clipping, label smoothing and an EMA ("ddp"); one step with FSDP2 (when there is a process
    group) and activation checkpointing, and one without ("fsdp-1", "ddp-1"); a run whose
    last rank gets SIGTERM inside step 3 ("stop"); with FSDP2, 4 and 6 steps ("fsdp-4",
    "fsdp-6") and the one-process run "ddp" of ``out``'s sibling ``one`` resumed to 14 steps
    ("fsdp-from-one"). Each rank notes how its run ended in ``rank<N>.json``.
    ``reference_only``: the first run alone."""
    task = TranslateTask()
    task_cfg = TranslateTaskConfig(label_smoothing=0.1)

    def train(name, loss_fn=None, resume=None, **overrides):
        trainer = _trainer(out / name, loss_fn, **overrides)
        if resume is not None:
            trainer.load(load_checkpoint(resume))
        result = trainer.fit()
        written = sorted(p.name for p in (out / name).iterdir() if not p.name.startswith("rank"))
        (out / name / f"rank{distributed.rank()}.json").write_text(json.dumps(
            {"step": result.step, "stopped_by": result.stopped_by,
             "world_size": distributed.world_size(), "files": written}))

    inner, calls = task.loss_fn(task_cfg), [0]

    def stopping_loss(model, batch):
        calls[0] += 1
        if calls[0] == 5 and distributed.rank() == distributed.world_size() - 1:
            os.kill(os.getpid(), signal.SIGTERM)  # this rank only, inside step 3
        return inner(model, batch)

    train("ddp")
    if reference_only:
        return
    train("fsdp-1", max_steps=1, fsdp=distributed.is_distributed(), activation_checkpointing=True)
    train("ddp-1", max_steps=1)
    train("stop", loss_fn=stopping_loss)
    train("fsdp-4", max_steps=4, fsdp=True)
    train("fsdp-6", max_steps=6, fsdp=True)
    train("fsdp-from-one", resume=out.parent / "one" / "ddp", max_steps=14, fsdp=True)


def _rank_main(rank: int, out: Path, port: int) -> None:
    """One of two processes (forked: torch is imported already), as torchrun would start it."""
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


# Where the tolerances come from. The runs train in float64 (unit roundoff u = 2**-53, about
# 1.1e-16), so the only difference between one process and two is the order of the gradient
# sums. Most parameters then differ by a few u per step. The exception is a parameter whose
# true gradient is zero (attention's key bias: softmax ignores a per-row constant): Adam
# turns its rounding noise g ~ u into a step lr * g / (|g| + eps) with eps = 1e-8, at most
# 12 steps * 3e-3 * 1.1e-16 / 1e-8, about 4e-10 per element, and less relative to the whole
# weight vector. 1e-9 holds that on any CPU or GPU (measured on AVX-512: 4e-14 for the
# weights). In float32 the same noise is u ~ 6e-8 > eps, which Adam scales up to lr-sized
# steps (2e-4 measured on AVX-512, under 1e-4 on AVX2): float32 cannot carry this claim, and
# any float32 step taken by mistake breaks 1e-9.
TRAJECTORY_RTOL = 1e-9


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensors[k].double().flatten() for k in sorted(tensors)])


def _relative_difference(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    x, y = _flat(a), _flat(b)
    return float((x - y).norm() / x.norm())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``_train_runs`` with one process (this one, no process group) and then with two
    (forked, gloo), which resume the first's checkpoint among their runs."""
    root = tmp_path_factory.mktemp("distributed")
    with _one_thread():
        _train_runs(root / "one", reference_only=True)
    mp.start_processes(
        _rank_main, args=(root / "two", _free_port()), nprocs=2, start_method="fork"
    )
    return root / "one", root / "two"


@contextlib.contextmanager
def _one_thread():
    """One torch thread (as each rank has), the global torch generator restored after."""
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    try:
        torch.set_num_threads(1)
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)


def test_two_processes_follow_the_one_process_trajectory(runs):
    """12 steps with accumulation, clipping and an EMA, dropout 0: the same weights, EMA and
    optimizer moments up to reduction order (the attention's key bias, whose true gradient is
    zero, is where rounding shows most: see TRAJECTORY_RTOL)."""
    one, two = (load_checkpoint(run / "ddp") for run in runs)
    assert two.step == one.step == 12
    for part in ("model", "ema", "optimizer"):
        assert _relative_difference(one.tensors[part], two.tensors[part]) < TRAJECTORY_RTOL, part
    assert two.state["optimizer"] == one.state["optimizer"]
    assert two.state["data"] == one.state["data"]  # the global data order


def test_only_rank_0_writes_the_run_files(runs):
    _, two = runs
    ranks = [json.loads((two / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["files"] == ["checkpoints", "metrics.jsonl"]
    assert [p.name for p in (two / "ddp" / "checkpoints").iterdir()] == ["step-00000012"]
    lines = (two / "ddp" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [4, 8, 12]  # once, not per rank


def test_one_fsdp_step_equals_one_ddp_step_and_saves_the_same_format(runs):
    """FSDP2 with activation checkpointing: gathered weights and optimizer state equal DDP's,
    in the single-process checkpoint layout (keys and optimizer skeleton)."""
    _, two = runs
    fsdp, ddp = load_checkpoint(two / "fsdp-1"), load_checkpoint(two / "ddp-1")
    for part in ("model", "ema", "optimizer"):
        # one float64 step: both sum the same two shards, so only the order differs
        assert _relative_difference(ddp.tensors[part], fsdp.tensors[part]) < TRAJECTORY_RTOL, part
    assert fsdp.state["optimizer"] == ddp.state["optimizer"]


def test_fsdp_checkpoints_are_dcp_safetensors_shards_one_per_rank_and_no_pickle(runs):
    _, two = runs
    path = load_checkpoint(two / "fsdp-4").path
    shards = ["shard-00001-model-00001-of-00001.safetensors",
              "shard-00002-model-00001-of-00001.safetensors"]
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", *shards, "state.json"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["layout"] == "sharded" and sorted(manifest["files"]) == sorted(
        ["state.json", *shards])
    from safetensors import safe_open

    for shard in shards:  # each a safetensors file: a JSON header, raw tensor bytes
        with safe_open(path / shard, "pt") as f:
            assert "DCP_SHARDING_INFO" in f.metadata()
            names = list(f.keys())
        assert any(name.startswith("model.") for name in names)
        assert any(name.startswith("optimizer.") for name in names)


def test_a_two_process_sharded_checkpoint_continues_in_one_process(runs):
    """FSDP2 over 2 processes to step 4, continued to 6 in one process: the weights, EMA and
    optimizer state of the 2-process run to 6, up to reduction order."""
    _, two = runs
    with _one_thread():
        resumed = _trainer(two / "fsdp-4-in-one", max_steps=6)
        resumed.load(load_checkpoint(two / "fsdp-4"))
        resumed.fit()
    one, reference = load_checkpoint(two / "fsdp-4-in-one"), load_checkpoint(two / "fsdp-6")
    assert one.step == reference.step == 6
    for part in ("model", "ema", "optimizer"):
        assert _relative_difference(reference.tensors[part], one.tensors[part]) < TRAJECTORY_RTOL
    assert one.state["scheduler"] == reference.state["scheduler"]


def test_a_one_process_checkpoint_continues_sharded_over_two_processes(runs):
    """The one-process run at step 12 continued to 14 with FSDP2 over 2 processes (a sharded
    checkpoint) and in one process: the same weights, EMA and optimizer state up to
    reduction order."""
    one, two = runs
    sharded = load_checkpoint(two / "fsdp-from-one")
    assert json.loads((sharded.path / "manifest.json").read_text())["layout"] == "sharded"
    with _one_thread():
        resumed = _trainer(one / "ddp-to-14", max_steps=14)
        resumed.load(load_checkpoint(one / "ddp"))
        resumed.fit()
    reference = load_checkpoint(one / "ddp-to-14")
    assert sharded.step == reference.step == 14
    for part in ("model", "ema", "optimizer"):
        assert _relative_difference(reference.tensors[part], sharded.tensors[part]) < (
            TRAJECTORY_RTOL
        )
    assert sharded.state["ema"] == reference.state["ema"] == {"n_averaged": 15}


def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step(runs):
    _, two = runs
    ranks = [json.loads((two / "stop" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["step"], r["stopped_by"]) for r in ranks] == [(3, "terminate")] * 2
    assert load_checkpoint(two / "stop").step == 3


def test_rank_shards_concatenate_to_the_global_batch():
    class Source:
        def __init__(self):
            self.n = 0

        def next_batch(self):
            self.n += 1
            return {"x": torch.arange(7 * 2).reshape(7, 2) + 100 * self.n}

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    shards = [RankShard(Source(), rank=r, world_size=3) for r in range(3)]
    for _ in range(2):
        parts = [s.next_batch()["x"] for s in shards]
        assert [len(p) for p in parts] == [3, 2, 2]
        torch.testing.assert_close(torch.cat(parts), Source().next_batch()["x"] + 100 * (_))
    with pytest.raises(ValueError, match="cannot be shared by 8 ranks"):
        RankShard(Source(), rank=0, world_size=8).next_batch()
    with pytest.raises(ValueError, match=r"rank \(3\) must be < world_size \(3\)"):
        RankShard(Source(), rank=3, world_size=3)


def test_world_from_env_reads_torchrun_variables_and_rejects_bad_ones():
    assert distributed.world_from_env({}) is None
    world = distributed.world_from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert world == distributed.World(rank=3, local_rank=1, size=4)
    with pytest.raises(ValueError, match=r"RANK \(4\) must be in 0 .. WORLD_SIZE - 1 \(3\)"):
        distributed.world_from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="must be integers"):
        distributed.world_from_env({"RANK": "x", "WORLD_SIZE": "4"})


def test_without_a_process_group_the_helpers_are_the_single_process_identity():
    assert not distributed.is_distributed() and distributed.is_main()
    assert distributed.world_size() == 1 and distributed.rank() == 0
    assert distributed.global_mean_weight(17) == 1.0
    assert distributed.all_reduce_sum([2.5, 3.0]) == [2.5, 3.0]
    assert distributed.agree_on_stop("interrupt") == "interrupt"
    before = torch.get_rng_state()
    distributed.seed_rank(0, 3)  # rank 0 keeps the global generator (the checkpoint's)
    assert torch.equal(torch.get_rng_state(), before)
    assert distributed.as_float(torch.tensor(2.5)) == 2.5
    with pytest.raises(ValueError, match="fsdp needs a process group"):
        distributed.prepare_model(torch.nn.Linear(2, 2), activation_checkpointing=False,
                                  fsdp=True)


def _train_cli(out: Path, task: str, *args: str, nproc: int) -> subprocess.CompletedProcess:
    launcher = [*TORCHRUN[:-1], str(nproc)] if nproc > 1 else [sys.executable]
    command = [*launcher, "-m", "addnorm", "train", task, "--out", str(out), "--quiet", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "flags"),
    [
        ("translate", ["--max-steps", "12", "--eval-size", "8", "--batch-size", "16",
                       "--log-every", "1"]),
        ("lm", ["--max-steps", "12", "--eval-size", "2", "--batch-size", "8", "--seq-len", "32",
                "--log-every", "1"]),
    ],
)
def test_torchrun_cli_run_equals_the_one_process_run_and_resumes_with_one(tmp_path, task, flags):
    """``torchrun -m addnorm train``: the weights equal one process's, rank 0 reports once, and
    the 2-process checkpoint resumes in one process."""
    one = _train_cli(tmp_path / "one", task, *flags, nproc=1)
    two = _train_cli(tmp_path / "two", task, *flags, nproc=2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("trained 12 steps") == 1
    assert_two_ranks_train_as_one(tmp_path, 12)  # the losses, within LOSS_RTOL (why there)
    resumed = _train_cli(tmp_path / "two", task, "--resume", "--max-steps", "14", nproc=1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(tmp_path / "two").step == 14


@pytest.mark.slow
def test_torchrun_cli_trains_the_dit(tmp_path):
    """The DiT's label dropout draws differ per rank, so only the run itself is checked."""
    flags = ["--max-steps", "6", "--eval-size", "10", "--batch-size", "16"]
    done = _train_cli(tmp_path / "dit", "dit", *flags, nproc=2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert load_checkpoint(tmp_path / "dit").step == 6


@pytest.mark.slow
def test_torchrun_fsdp_checkpoints_resume_at_another_world_size_both_ways(tmp_path):
    """``torchrun --nproc-per-node 2 -m addnorm train --fsdp`` writes a sharded checkpoint that
    a one-process ``--resume`` continues; a one-process run's checkpoint continues sharded
    over two processes; and one written sharded by a single FSDP2 rank continues over two."""
    flags = ["--max-steps", "4", "--eval-size", "8", "--batch-size", "16", "--log-every", "1"]
    layouts = {}
    for name, first, second in (("2-to-1", (2, "--fsdp"), (1, "--no-fsdp")),
                                ("1-to-2", (1,), (2, "--fsdp")),
                                ("fsdp1-to-2", (1, "--fsdp", "torchrun"), (2, "--fsdp"))):
        out = tmp_path / name
        launcher = (TORCHRUN[:-1] + ["1"]) if "torchrun" in first else None
        args = [a for a in first[1:] if a != "torchrun"]
        done = (_train_cli(out, "translate", *flags, *args, nproc=first[0]) if launcher is None
                else subprocess.run(
                    [*launcher, "-m", "addnorm", "train", "translate", "--out", str(out),
                     "--quiet", *flags, *args],
                    env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                    timeout=600))
        assert done.returncode == 0, done.stderr[-2000:]
        layouts[name] = json.loads(
            (load_checkpoint(out).path / "manifest.json").read_text()).get("layout")
        assert isinstance(addnorm.load(out), torch.nn.Module)  # whichever layout
        resumed = _train_cli(out, "translate", "--resume", "--max-steps", "6", *second[1:],
                             nproc=second[0])
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert load_checkpoint(out).step == 6
        records = read_metrics(out / "metrics.jsonl")
        assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert layouts == {"2-to-1": "sharded", "1-to-2": None, "fsdp1-to-2": "sharded"}
