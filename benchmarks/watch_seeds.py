"""The README's watch numbers ("Looking inside a run") over seeds: train the runs it names for
each seed and keep their watch records, trimmed, in ``docs/watch-lm.json`` (``run``); print
the README's table and figures from that file (``table``), so they can be made again.

    python benchmarks/watch_seeds.py run --seeds 0 1 2 --work /tmp/watch-seeds
    python benchmarks/watch_seeds.py table

The runs, through the CLI as the README gives them, for each seed N:

    addnorm train lm --norm-position post --n-layers 12 --watch 10 --max-steps 60 --seed N
    addnorm train lm --norm-position pre --n-layers 12 --watch 10 --max-steps 30 --seed N
    addnorm train lm --norm batch --watch 10 --max-steps 30 --seed N

with the time cap lifted (``--max-minutes 600``) so that a busy machine runs every step: the
README's first runs stopped at the 5-minute cap, after 60 and 34 steps. The learning rate
warms up over 100 steps from step 1, so every step shown here trains with the same rate as
under a larger step budget. On a shared 2-core CPU a 12-layer run takes 5-12 s a step:
``run`` takes about an hour for three seeds.

For each BatchNorm run, ``run`` also checks the watch's half-batch estimate of the batch's own
effect against the effect measured with statistics pooled over 64 batches
(``check_batch_effect``), kept in the file as ``batch_effect_check``.

The table shows ratios only: the fitted last-to-first layer ratio of the gradient norm
(:func:`addnorm.inspection.summary.depth_profile`, what ``addnorm info`` prints). Clipping
scales every layer's gradient by the same factor, so these ratios are the same whether the
watch records gradient norms before or after clipping; absolute norms are not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "watch-lm.json"
RUNS = {  # name -> (flags, steps)
    "post": (["--norm-position", "post", "--n-layers", "12"], 60),
    "pre": (["--norm-position", "pre", "--n-layers", "12"], 30),
    "batch": (["--norm", "batch"], 30),
}
TABLE_STEPS = (1, 10, 20, 30, 40, 50, 60)


def _trim(record: dict, norms: bool) -> dict:
    """What the README reads of a watch record: the layers' gradient norms and residual
    stream, and for a BatchNorm run its norms' statistics."""
    layers = record["layers"]
    kept = {"step": record["step"], "loss": record.get("loss"), "layers": layers,
            "grad_norm": {k: record["grad_norm"][k] for k in layers},
            "residual": {k: record["residual"][k] for k in layers}}
    if norms:
        kept["norms"] = record.get("norms", {})
    return kept


def check_batch_effect(run_dir: Path, n_batches: int = 64) -> dict[str, dict[str, float]]:
    """The watch's half-batch estimate of each BatchNorm's own batch effect against the effect
    itself, on the run's last checkpoint in training mode: ``pooled`` is
    ``||y - y_full|| / ||y||`` with ``y_full`` normalized by each norm's input statistics
    pooled over ``n_batches`` batches (float64), ``estimate`` what
    :func:`~addnorm.inspection.statistics.batch_effect_sums` makes of the same batches."""
    import dataclasses
    import math

    import torch

    from addnorm.inspection import statistics as stats
    from addnorm.norms import BatchNorm
    from addnorm.tasks.lm import LMTask
    from addnorm.tasks.trained import load_trained, task_of_checkpoint

    task, model, checkpoint = load_trained(run_dir, weights="raw")
    _, cfg = task_of_checkpoint(checkpoint)
    model.train()
    task_cfg = LMTask.default_task_config()
    source = task.batches(cfg, dataclasses.replace(LMTask.default_train_config(), seed=123),
                          task_cfg)
    norms = {name: m for name, m in model.named_modules() if isinstance(m, BatchNorm)}
    inputs: dict[str, list[torch.Tensor]] = {name: [] for name in norms}
    for name, norm in norms.items():
        norm.momentum = 0.0  # the checkpoint's running statistics stay as they are
        norm.register_forward_pre_hook(
            lambda module, args, name=name: inputs[name].append(args[0].detach().double()))
    loss_fn = task.loss_fn(task_cfg)
    with torch.no_grad():
        for _ in range(n_batches):
            loss_fn(model, source.next_batch())
    found = {}
    for name, norm in norms.items():
        tokens = torch.cat([x.reshape(-1, x.shape[-1]) for x in inputs[name]])
        var_full, mean_full = torch.var_mean(tokens, 0, correction=0)
        weight, bias = norm.weight.detach().double(), norm.bias.detach().double()
        none = torch.tensor(0.0, dtype=torch.float64)
        pooled = estimate = signal = 0.0
        for x in inputs[name]:
            t = x.reshape(-1, x.shape[-1])
            var, mean = torch.var_mean(t, 0, correction=0)
            y = (t - mean) / torch.sqrt(var + norm.eps) * weight + bias
            y_full = (t - mean_full) / torch.sqrt(var_full + norm.eps) * weight + bias
            pooled += (y - y_full).square().sum().item()
            signal += y.square().sum().item()
            estimate += stats.batch_effect_sums(
                x, None, weight=norm.weight.detach(), eps=norm.eps,
                train_eval={"gap_sq": none, "signal_sq": none})["effect_sq"].item()
        found[name] = {"pooled": math.sqrt(pooled / signal),
                       "estimate": math.sqrt(estimate / signal)}
    return found


def run(seeds: list[int], work: Path, names: list[str], path: Path = RECORD) -> None:
    from addnorm.experiments.record import machine

    record = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    runs = record.get("runs", {})
    for name, kept in runs.items():
        if isinstance(kept, list):  # the file's first form: seed 0's records alone
            runs[name] = {"0": kept}
    for name in names:
        flags, steps = RUNS[name]
        for seed in seeds:
            out = work / f"{name}-{seed}"
            command = [sys.executable, "-m", "addnorm", "train", "lm", *flags, "--watch", "10",
                       "--max-steps", str(steps), "--max-minutes", "600", "--seed", str(seed),
                       "--out", str(out), "--overwrite"]
            print(" ".join(command[2:]), flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            lines = (out / "watch.jsonl").read_text(encoding="utf-8").splitlines()
            trimmed = [_trim(json.loads(line), name == "batch") for line in lines]
            runs.setdefault(name, {})[str(seed)] = trimmed
            if name == "batch":
                record.setdefault("batch_effect_check", {})[str(seed)] = check_batch_effect(out)
            record["runs"] = runs
            record["cpu"] = machine()
            record["_about"] = (
                "Trimmed watch.jsonl records of the README's runs (section 'Looking inside a "
                "run'), by run and seed, made by benchmarks/watch_seeds.py run (its docstring "
                "gives the commands). Gradient norms as the watch recorded them then (the "
                "README reads only their ratios, which clipping leaves alone). "
                "batch_effect_check: per BatchNorm run and norm, the watch's half-batch "
                "estimate of the batch's own effect against the effect measured with "
                "statistics pooled over 64 batches (check_batch_effect).")
            path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _ratio(record: dict) -> float:
    from addnorm.inspection.summary import depth_profile

    found = depth_profile(record)
    assert found is not None, record["step"]
    return found[1]


def _cell(value: float) -> str:
    return f"{value:.3g}x"


def _span(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def table() -> None:
    runs = json.loads(RECORD.read_text(encoding="utf-8"))["runs"]
    print("| step | " + " | ".join(str(s) for s in TABLE_STEPS) + " |")
    print("|---|" + "---|" * len(TABLE_STEPS))
    for name in ("post", "pre"):
        for seed, records in sorted(runs[name].items()):
            by_step = {r["step"]: r for r in records}
            cells = [_cell(_ratio(by_step[s])) if s in by_step else "" for s in TABLE_STEPS]
            print(f"| {name}-LN, seed {seed} | " + " | ".join(cells) + " |")
    print()
    for name in ("post", "pre"):
        for step in TABLE_STEPS:
            values = [_ratio(r) for records in runs[name].values() for r in records
                      if r["step"] == step]
            if len(values) == len(runs[name]):
                print(f"{name}-LN step {step}: {min(values):.3g}-{max(values):.3g}x, mean "
                      f"{statistics.fmean(values):.3g}x over {len(values)} seeds")
    pre30 = [r for records in runs["pre"].values() for r in records if r["step"] == 30]
    entering = [r["residual"][r["layers"][0]]["in"] for r in pre30]
    leaving = [r["residual"][r["layers"][-1]]["out"] for r in pre30]
    print(f"pre-LN residual RMS at step 30: {_span(entering, 1)} entering the first layer, "
          f"{_span(leaving, 1)} leaving the last")
    print()
    batch = runs["batch"]
    for step in (1, 30):
        entries = [e for records in batch.values() for r in records if r["step"] == step
                   for e in r["norms"].values() if e.get("kind") == "batch"]
        for stat in ("mean_gap", "train_eval_gap", "batch_effect", "running_lag"):
            values = [e[stat] for e in entries if e.get(stat) is not None]
            if values:
                print(f"BatchNorm step {step} {stat}: {_span(values)} over {len(batch)} seeds "
                      f"x {len(entries) // len(batch)} norms")
    checks = json.loads(RECORD.read_text(encoding="utf-8")).get("batch_effect_check", {})
    for path in sorted({p for found in checks.values() for p in found}):
        ratios = [found[path]["estimate"] / found[path]["pooled"] for found in checks.values()]
        print(f"BatchNorm {path}: half-batch estimate / pooled-statistics effect "
              f"{_span(ratios)}x over {len(ratios)} seeds")
    for path in sorted({p for records in batch.values() for r in records for p in r["norms"]}):
        values = {stat: [r["norms"][path][stat] for records in batch.values() for r in records
                         if r["step"] == 30 and path in r["norms"]]
                  for stat in ("batch_effect", "running_lag")}
        print(f"BatchNorm step 30 {path}: batch effect {_span(values['batch_effect'])}, "
              f"running lag {_span(values['running_lag'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="train the runs and update docs/watch-lm.json")
    go.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    go.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    go.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "watch-seeds")
    go.add_argument("--record", type=Path, default=RECORD, help="default: docs/watch-lm.json")
    sub.add_parser("table", help="print the README's numbers from docs/watch-lm.json")
    args = parser.parse_args()
    if args.command == "run":
        os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
        run(args.seeds, args.work, args.runs, args.record)
    else:
        table()


if __name__ == "__main__":
    main()
