"""DDIM sampling time of the digits DiT, and whether two source trees give the same samples.

What ``addnorm train dit`` draws at its probes and its final evaluation (``DiTTask.sample``):
the task's model (``DIT_PRESETS["DiT-digits"]`` at d_model 96, one channel, ten classes) with
seeded non-zero weights, its diffusion (1000 linear steps, v-prediction), 50 DDIM steps with
classifier-free guidance at scale 3, five samples per class. Public API only, so an older
tree runs it too.

    python benchmarks/dit_sampling.py --compare /work/baseline/src   # this tree against another
    python benchmarks/dit_sampling.py                                 # this tree alone
    python benchmarks/dit_sampling.py --device cuda --compare OTHER_SRC  # on a GPU

With ``--compare`` the trees run in alternating subprocesses (``--rounds`` of each), each
round reporting the median of ``--repeats`` timed samplings after one warm-up; the summary
is the median over rounds, and the samples' SHA-256 shows whether they are bit-identical.
On CUDA it also counts one sample call's host-device synchronisations
(``torch.cuda.set_sync_debug_mode("warn")``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE_SRC = str(Path(__file__).resolve().parent.parent / "src")


def one_round(repeats: int, per_class: int, threads: int, device: str) -> dict[str, object]:
    import dataclasses

    import torch

    from addnorm import DIT_PRESETS, Diffusion, DiT, guided_eps_fn

    torch.set_num_threads(threads)
    cfg = dataclasses.replace(DIT_PRESETS["DiT-digits"], d_model=96)
    torch.manual_seed(0)
    model = DiT(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # off adaLN-Zero's zero output, so the samples depend on every part
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    model.eval().to(device)
    diffusion = Diffusion(1000, "linear", prediction="v", min_snr_gamma=5.0)
    labels = torch.arange(cfg.n_classes).repeat_interleave(per_class)
    shape = (len(labels), cfg.in_channels, cfg.input_size, cfg.input_size)

    def sample() -> torch.Tensor:
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(device)
        eps_fn = guided_eps_fn(model, labels.to(device), guidance_scale=3.0,
                               null_class=cfg.n_classes)
        out = diffusion.sample(eps_fn, noise, steps=50, method="ddim")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    out = sample()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sample()
        times.append(time.perf_counter() - start)
    digest = hashlib.sha256(out.cpu().contiguous().numpy().tobytes()).hexdigest()
    result: dict[str, object] = {"median_s": statistics.median(times), "sha256": digest}
    if device.startswith("cuda"):  # the host-device synchronisations of one sample call
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            sample()
            torch.cuda.set_sync_debug_mode("default")
        result["cuda_syncs"] = sum("synchroniz" in str(w.message) for w in caught)
    return result


def run_tree(src: str, args: argparse.Namespace) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [sys.executable, __file__, "--once", "--repeats", str(args.repeats),
           "--per-class", str(args.per_class), "--threads", str(args.threads),
           "--device", args.device]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", metavar="SRC", help="another tree's src/ to alternate with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(json.dumps(one_round(args.repeats, args.per_class, args.threads, args.device)))
        return
    trees = {"this": HERE_SRC} | ({"other": args.compare} if args.compare else {})
    rounds: dict[str, list[dict[str, object]]] = {name: [] for name in trees}
    for i in range(args.rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            result = run_tree(trees[name], args)
            rounds[name].append(result)
            syncs = f", {result['cuda_syncs']} syncs" if "cuda_syncs" in result else ""
            print(f"round {i}: {name:5s} {result['median_s']:.4f} s{syncs}", flush=True)
    summary = {}
    for name, results in rounds.items():
        medians = [float(r["median_s"]) for r in results]
        summary[name] = {"src": trees[name], "median_s": statistics.median(medians),
                         "rounds_s": medians, "sha256": results[0]["sha256"],
                         "cuda_syncs": results[0].get("cuda_syncs")}
    if args.compare:
        summary["this_over_other"] = summary["this"]["median_s"] / summary["other"]["median_s"]
        summary["bit_identical"] = summary["this"]["sha256"] == summary["other"]["sha256"]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
