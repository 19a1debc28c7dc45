"""Xiong et al. (2020) at initialization, on the README's 12-layer lm: how the gradient norm
grows over depth in post-LN and pre-LN, and how large post-LN's last FFN output weight's
gradient is against pre-LN's (the paper: sqrt(L) times, sqrt(12) = 3.46). Writes
``docs/watch-init.json`` and prints the README's figures ("Looking inside a run").

    python benchmarks/xiong_init.py --seeds 8     # ~1-3 min on a shared 2-core CPU

Each seed builds the model ``addnorm train lm --n-layers 12 --norm-position P --seed N`` builds
(``seed_everything``, the task's model, its first batch) and takes the gradient of the first
batch's loss at the initial weights: what the watch records at step 1, before any update,
and before clipping (clipping scales every gradient alike, so the ratios here are the watch's
at step 1 either way). Per seed and norm position: the fitted last-to-first ratio of the
layers' gradient norms (``depth_profile``, the README's table at step 1) and ``||grad W2||``
of the last layer's FFN output projection.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "watch-init.json"
N_LAYERS = 12


def at_init(position: str, seed: int) -> dict:
    """The layers' gradient norms and the last W2's, from the first batch at the initial
    weights of the lm run with ``seed`` and norm position ``position``."""
    from addnorm.inspection.model_map import ModelMap
    from addnorm.inspection.summary import depth_profile
    from addnorm.tasks.lm import LMTask
    from addnorm.training.state import seed_everything

    task_cfg = LMTask.default_task_config()
    task = LMTask.from_config(task_cfg)
    model_cfg = task.prepare(dataclasses.replace(
        LMTask.default_model_config(), n_layers=N_LAYERS, norm_position=position))
    train_cfg = dataclasses.replace(LMTask.default_train_config(), seed=seed)
    seed_everything(seed)
    model = task.build_model(model_cfg)
    batch = task.batches(model_cfg, train_cfg, task_cfg).next_batch()
    model.train()
    loss, _ = task.loss_fn(task_cfg)(model, batch)
    loss.backward()
    mapped = ModelMap.of(model)
    norms = {layer: torch.sqrt(sum(mapped.params[i][1].grad.double().square().sum()
                                   for i in mapped.groups[layer])).item()
             for layer in mapped.layers}
    last_w2 = dict(model.named_parameters())[f"{mapped.layers[-1]}.ff.w2.weight"]
    record = {"layers": list(mapped.layers), "grad_norm": norms}
    found = depth_profile(record)
    assert found is not None
    return {"ratio": found[1], "last_w2": last_w2.grad.norm().item(), "grad_norm": norms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from addnorm.experiments.record import machine

    runs = {position: [at_init(position, seed) for seed in range(args.seeds)]
            for position in ("post", "pre")}
    w2 = [post["last_w2"] / pre["last_w2"] for post, pre in zip(*runs.values(), strict=True)]
    RECORD.write_text(json.dumps({
        "_about": "benchmarks/xiong_init.py: the 12-layer lm at initialization, first batch, "
                  "per seed; ratio = depth_profile's fitted last/first layer gradient ratio, "
                  "last_w2 = ||grad|| of the last layer's ff.w2.weight.",
        "cpu": machine(), "runs": runs}, indent=1) + "\n", encoding="utf-8")
    for position, per_seed in runs.items():
        ratios = [r["ratio"] for r in per_seed]
        print(f"{position}-LN at init, last/first layer gradient (fitted): mean "
              f"{statistics.fmean(ratios):.3g}x, {min(ratios):.3g}-{max(ratios):.3g}x over "
              f"{len(ratios)} seeds ({sum(r < 1 for r in ratios)} below 1)")
    print(f"last layer's W2 gradient, post-LN / pre-LN: mean {statistics.fmean(w2):.3g}x, "
          f"{min(w2):.3g}-{max(w2):.3g}x (Xiong et al.: sqrt({N_LAYERS}) = "
          f"{N_LAYERS ** 0.5:.3g})")


if __name__ == "__main__":
    main()
