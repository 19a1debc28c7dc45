"""What Min-SNR-5 loss weights do to the digits DiT, over seeds: v-prediction alone against
v-prediction with Min-SNR-5 (the task's default), each trained with the task's default model
and train configs, scored by the task's own judge (``DiTTask.evaluate``: 500 samples, DDIM 50
steps, guidance 3, the EMA weights) every 100 steps and at the end.

A run the time cap stops early is scored with the weights it has then, so the score at step
200 is what a machine too busy for the whole run gets. Each run trains on one thread;
``--jobs`` runs that many at once (one process each).

    PYTHONPATH=src python benchmarks/dit_min_snr.py --seeds 0 1 2 --out dit_min_snr.json

writes every run's scores and prints their min-max over seeds per recipe and step. The
README's "The digits DiT's recipe" quotes such a file, docs/dit-min-snr.json (six seeds, run
with ``--jobs 12`` on a 16-core x86-64 machine); tests/test_readme.py checks the quoted
ranges against it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

RECIPES = {"v": None, "v + Min-SNR-5": 5.0}
SCORES = ("class_agreement", "class_agreement_independent", "frechet_distance")


def train_and_score(recipe: str, seed: int, max_steps: int, eval_size: int) -> dict:
    """One run of ``recipe`` from ``seed``: its scores at every 100 steps and at the end."""
    torch.set_num_threads(1)
    from addnorm.tasks import run as runs
    from addnorm.tasks.dit import DiTTask
    from addnorm.training.trainer import Probe

    class Recipe(DiTTask):
        def __init__(self) -> None:
            super().__init__(min_snr_gamma=RECIPES[recipe])

        def probe(self, train_cfg):
            def score(model):
                scores = self.evaluate(model, per_class=train_cfg.eval_size // 10)
                return {name: scores[name] for name in SCORES}

            return Probe(every=100, score=score)

    runs.TASKS["dit"] = Recipe
    model_cfg = DiTTask.default_model_config()
    train_cfg = replace(DiTTask.default_train_config(), seed=seed, max_steps=max_steps,
                        max_minutes=60.0, eval_size=eval_size)
    with tempfile.TemporaryDirectory() as run_dir:
        summary = runs.train_run("dit", model_cfg, train_cfg, run_dir)
        by_step = {}
        for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            if "probe_class_agreement" in record:
                by_step[record["step"]] = {name: record[f"probe_{name}"] for name in SCORES}
    by_step[summary.step] = {name: summary.metrics[name] for name in SCORES}
    return {"recipe": recipe, "seed": seed, "elapsed_s": summary.elapsed_s,
            "scores": {str(step): scores for step, scores in sorted(by_step.items())}}


def summarize(runs: list[dict]) -> dict:
    """recipe -> step -> score -> [min, max] over seeds."""
    table: dict = {}
    for result in runs:
        for step, scores in result["scores"].items():
            for name, value in scores.items():
                table.setdefault(result["recipe"], {}).setdefault(step, {}).setdefault(
                    name, []).append(value)
    return {recipe: {step: {name: [min(v), max(v)] for name, v in scores.items()}
                     for step, scores in steps.items()} for recipe, steps in table.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    jobs = [(recipe, seed, args.max_steps, args.eval_size)
            for seed in args.seeds for recipe in RECIPES]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(train_and_score, *zip(*jobs, strict=True)))
    record = {"torch": torch.__version__, "seeds": args.seeds, "runs": results}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for recipe, steps in summarize(results).items():
        for step, scores in steps.items():
            print(recipe, step, {name: [round(x, 3) for x in v] for name, v in scores.items()})


if __name__ == "__main__":
    main()
