"""``addnorm sample --out GRID.png``: digits drawn by a trained dit run, as a PNG grid for
people and, with ``--save-array``, an (N, 8, 8) array on the digits' own 0..16 scale for
programs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from addnorm.cli.checks import UsageError, check_out_file, seed
from addnorm.cli.exits import EXIT_OK
from addnorm.cli.shared_flags import add_inference_flags, load_task_model

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Register ``addnorm sample``."""
    sample = subparsers.add_parser(
        "sample",
        help="draw digits from a trained DiT",
        description="Generate digits with a trained dit run: a PNG grid for people and, with "
        "--save-array, an (N, 8, 8) array on the digits' own 0..16 scale for programs.",
    )
    sample.add_argument(
        "--checkpoint", type=Path, default=Path("runs/dit"),
        help="a dit run folder (its newest checkpoint), one checkpoint folder, "
        "or a folder addnorm.load opens (save_pretrained's, transformers' or diffusers') "
        "whose model the dit task trains; a folder holds no diffusion: it is sampled with "
        "the dit task's own settings (1000 linear steps, v-prediction)",
    )
    sample.add_argument(
        "--class", dest="digit", type=int, default=None,
        help="the digit to draw, 0-9 (default: every class in turn)",
    )
    sample.add_argument("--n", type=int, default=20, help="how many samples (default 20)")
    sample.add_argument(
        "--steps", type=int, default=50,
        help="sampling steps, 1 to the run's diffusion steps (default 50)",
    )
    sample.add_argument(
        "--method", choices=("ddim", "ddpm"), default="ddim",
        help="ddim (deterministic, eta 0, on DiT's strided steps: 0, 20, ..., 980 for 50 of "
        "1000) or ddpm (ancestral, on DiT's evenly divided steps: 0, 20, 41, ..., 999)",
    )
    sample.add_argument(
        "--guidance", type=float, default=3.0,
        help="classifier-free guidance scale, finite and >= 0; 1 = none (default 3.0)",
    )
    sample.add_argument("--seed", type=seed, default=0,
                        help="seeds the starting noise (and ddpm's), 0 to 2**64 - 1")
    sample.add_argument("--out", type=Path, required=True, metavar="GRID.png",
                        help="the PNG grid to write (its folder is created)")
    sample.add_argument(
        "--save-array", type=Path, default=None, metavar="SAMPLES.npy",
        help="also write the samples as an (N, 8, 8) float array, 0..16 scale (default: not "
        "written)",
    )
    sample.add_argument("--quiet", action="store_true", help="no progress bar")
    add_inference_flags(sample)


def run(args: argparse.Namespace) -> int:
    """Draw digits from a dit run: a PNG grid, and the raw array with --save-array.

    Accepted: ``--steps`` 1 .. the run's diffusion steps with either method (every count has
    its steps, :mod:`addnorm.diffusion.spacing`), ``--guidance`` finite and >= 0; anything
    else exits 2 before the checkpoint is read (the steps' upper bound: once it is). Samples
    that come out non-finite (a guidance scale far past any useful one) exit 1 with one line
    and nothing written."""
    import numpy as np
    import torch

    from addnorm.cli.grid import save_digit_grid
    from addnorm.tasks.dit import SampleSettings

    if args.digit is not None and not 0 <= args.digit <= 9:
        raise UsageError(f"--class must be a digit 0-9, got {args.digit}")
    if not 1 <= args.n <= 10_000:
        raise UsageError(f"--n must be from 1 to 10000, got {args.n}")
    if args.out.suffix.lower() != ".png":
        raise UsageError(f"--out must name a .png file, got {args.out}")
    if args.save_array is not None and args.save_array.suffix.lower() != ".npy":
        raise UsageError(f"--save-array must name a .npy file, got {args.save_array}")
    check_out_file(args.out, "--out", make_parents=True)
    if args.save_array is not None:
        check_out_file(args.save_array, "--save-array", make_parents=True)
    if args.steps < 1:  # its upper bound, the run's diffusion steps, once the run is loaded
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    try:
        settings = SampleSettings(steps=args.steps, method=args.method, guidance=args.guidance)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--{str(err).replace('_', '-')}") from None
    task, model = load_task_model(args, "dit")
    if settings.steps > task.n_steps:
        raise UsageError(
            f"--steps must be <= the diffusion's {task.n_steps} steps, got {settings.steps}"
        )
    if args.digit is None:
        labels = torch.arange(args.n) % 10
    else:
        labels = torch.full((args.n,), args.digit)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    try:
        pixels = task.sample(
            model, labels, settings, generator=generator,
            progress=not args.quiet and sys.stderr.isatty(),
        )  # (N, 8, 8), 0..16
    except FloatingPointError:  # the parser's main: one line, exit 1
        raise FloatingPointError(
            f"--guidance {settings.guidance:g} (--method {settings.method}, --steps "
            f"{settings.steps}) gave non-finite samples, nothing written: the model's guided "
            "predictions overflowed or were not finite; use a smaller --guidance (DiT uses "
            "1.5 to 4)"
        ) from None
    title = f"{settings.method} {settings.steps} steps, guidance {settings.guidance:g}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"grid: {save_digit_grid(pixels, labels, args.out, title=title)}")
    if args.save_array is not None:
        args.save_array.parent.mkdir(parents=True, exist_ok=True)
        np.save(args.save_array, pixels.numpy())
        print(f"array: {args.save_array} {tuple(pixels.shape)}, 0..16 scale")
    return EXIT_OK
