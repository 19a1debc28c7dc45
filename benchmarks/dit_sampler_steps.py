"""How the digits DiT's samples hold up with fewer sampling steps: DDIM against DPM-Solver++(2M),
at 10, 25, 50 and 250 steps, scored by the task's own judge (``digit_judge``: class agreement
and the Fréchet distance to held-out digits; ``DiTTask.evaluate``'s figures).

The model is a digits DiT trained with ``addnorm train dit``'s defaults (what ``make demo``
trains into runs/dit): pass its run with ``--run``, or let ``--train-out`` train one first.
Each (sampler, steps) draws ``--per-class`` samples of every class with the task's recipe
(starting noise from the seed, classifier-free guidance at the task's scale 3, the EMA
weights, the task's diffusion: 1000 linear steps, v-prediction), once per sampling seed; the
samplers take their own default spacing (DDIM: DiT's strided steps; DPM-Solver++: diffusers'
``linspace``). Public API only.

    PYTHONPATH=src python benchmarks/dit_sampler_steps.py --train-out /tmp/dit-steps \\
        --seeds 0 1 2 --out docs/dit-sampler-steps.json

writes every seed's scores and prints the README's table (min-max over seeds). The README's
"Sampling with fewer steps" quotes docs/dit-sampler-steps.json; tests/test_readme.py checks
the table against it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

SAMPLERS = ("ddim", "dpm-solver++")
STEPS = (10, 25, 50, 250)
SCORES = ("class_agreement", "class_agreement_independent", "frechet_distance")


def train(out: Path) -> Path:
    """``addnorm train dit`` with its defaults into ``out`` (replaced if it is a run)."""
    from addnorm.cli.parser import main

    code = main(["train", "dit", "--out", str(out), "--overwrite", "--quiet"])
    if code != 0:
        raise SystemExit(f"addnorm train dit exited {code}")
    return out


def score(task, model, sampler: str, steps: int, per_class: int, seed: int) -> dict:
    """The judge's figures of ``per_class`` samples of every class."""
    from addnorm.data.digits import to_pixel_scale
    from addnorm.diffusion import guided_eps_fn
    from addnorm.tasks.digit_quality import digit_judge

    cfg = model.cfg
    labels = torch.arange(len(task.class_names)).repeat_interleave(per_class)  # (K * n,)
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn((len(labels), cfg.in_channels, cfg.input_size, cfg.input_size),
                        generator=generator)
    eps_fn = guided_eps_fn(model, labels, guidance_scale=task.sample_settings.guidance,
                           null_class=cfg.n_classes)
    start = time.perf_counter()
    x = task.diffusion.sample(eps_fn, noise, steps=steps, method=sampler)
    elapsed = time.perf_counter() - start
    figures = digit_judge().score(to_pixel_scale(x[:, 0].float()), labels)
    return {**{name: figures[name] for name in SCORES}, "sampling_s": elapsed}


def table(results: list[dict]) -> str:
    """The README's Markdown table: min-max over seeds per sampler and step count."""

    def cell(sampler: str, steps: int, name: str, digits: int) -> str:
        values = [r[name] for r in results if r["sampler"] == sampler and r["steps"] == steps]
        low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
        return low if low == high else f"{low}-{high}"

    lines = ["| steps | class agreement, DDIM | class agreement, DPM-Solver++ | "
             "Fréchet distance, DDIM | Fréchet distance, DPM-Solver++ |",
             "|---|---|---|---|---|"]
    for steps in STEPS:
        cells = [cell(s, steps, "class_agreement", 3) for s in SAMPLERS]
        cells += [cell(s, steps, "frechet_distance", 2) for s in SAMPLERS]
        lines.append(f"| {steps} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, help="a digits dit run (e.g. runs/dit)")
    source.add_argument("--train-out", type=Path, help="train one with the defaults here")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--per-class", type=int, default=50, help="samples per class")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from addnorm.tasks.trained import load_trained

    run = args.run if args.run is not None else train(args.train_out)
    task, model, checkpoint = load_trained(run)
    model.eval()
    results = []
    for seed in args.seeds:
        for sampler in SAMPLERS:
            for steps in STEPS:
                with torch.no_grad():
                    figures = score(task, model, sampler, steps, args.per_class, seed)
                results.append({"sampler": sampler, "steps": steps, "seed": seed, **figures})
                print(json.dumps(results[-1]), flush=True)
    record = {
        "run": {"step": checkpoint.step, "model": "addnorm train dit defaults",
                "samples": args.per_class * len(task.class_names),
                "guidance": task.sample_settings.guidance, "threads": torch.get_num_threads()},
        "results": results,
    }
    print(table(results))
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
