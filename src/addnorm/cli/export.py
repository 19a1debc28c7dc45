"""``addnorm export MODEL --out MODEL.onnx``: a model as an ONNX file, any family; with
``--format pipeline``, a DiT run on a VAE's latents as a diffusers pipeline folder
(:mod:`addnorm.cli.export_pipeline`).

    addnorm export runs/lm --out lm.onnx                       # ids, padding_mask -> logits
    addnorm export runs/translate --out enc.onnx --part encoder  # src_ids, mask -> memory
    addnorm export runs/dit --out dit.onnx                     # x, t, y -> noise (| variance)
    addnorm export my-encoder --out enc.onnx                   # ids, padding_mask -> hidden
    addnorm export runs/latent-dit --format pipeline --out latent-dit-pipeline  # a folder

``MODEL`` is whatever :func:`addnorm.load` opens: an ``addnorm train`` run or checkpoint, a
``save_pretrained`` folder (the BERT-family ``EncoderModel`` included), or a transformers
BERT or GPT-2 folder. ``--part`` takes the parts the model's family exports.

The file is written by :func:`addnorm.export.to_onnx` (batch and lengths dynamic; input names
in :mod:`addnorm.export`), then run with onnxruntime on fresh left- and right-padded batches
of other sizes and compared with PyTorch; a difference above ``TOLERANCE`` is a failure
(exit 1). Without onnxruntime the check is skipped, and said so.

``--out`` is checked before anything is loaded or exported (exit 2, one line): its folder must
exist and be writable, and it must not be a folder or a special file (a device, a FIFO). An
existing regular file there is replaced.

What torch's exporter and onnxruntime print while they work (its logging, deprecation
warnings, notes about optional packages: some twenty lines) is captured, and shown on stderr
only when the export or the check fails, or with ``--verbose``; a success prints its two
lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from addnorm.cli.captured_output import CapturedOutput

__all__ = ["FORMATS", "TOLERANCE", "CapturedOutput", "add_parser", "run"]

FORMATS = ("onnx", "pipeline")
TOLERANCE = 1e-3  # largest |onnxruntime - PyTorch| accepted (float32 kernels differ slightly)


def add_parser(subparsers) -> None:
    """Register ``addnorm export`` on the subcommand parsers ``subparsers``."""
    from addnorm.cli.shared_flags import add_weights_flag
    from addnorm.export import PARTS

    export = subparsers.add_parser(
        "export",
        help="write a model as ONNX (or a DiT run as a diffusers pipeline), checked",
        description="Write a model (an addnorm train run or checkpoint, a save_pretrained "
        "folder of any family, or a transformers BERT or GPT-2 folder) as an ONNX file with a "
        "dynamic batch and sequence lengths, then check it with onnxruntime against PyTorch "
        "on padded batches of other sizes. With --format pipeline: a DiT run trained on a "
        "VAE's latents (train dit --vae) as a diffusers DiTPipeline folder, then check that "
        "diffusers samples the images addnorm samples from the same noise.",
    )
    export.add_argument(
        "checkpoint", type=Path,
        help="a run or checkpoint directory, or a pretrained folder (what addnorm.load opens)",
    )
    export.add_argument(
        "--out", type=Path, required=True, metavar="MODEL.onnx|FOLDER",
        help="the ONNX file to write (its folder must exist; an existing file is replaced); "
        "with --format pipeline, the folder to write (new or empty, or --overwrite)",
    )
    export.add_argument(
        "--format", choices=FORMATS, default="onnx",
        help="onnx (default): an ONNX file; pipeline: a diffusers DiTPipeline folder of a DiT "
        "run on a VAE's latents",
    )
    export.add_argument(
        "--part", choices=PARTS, default=None,
        help="forward (default): the whole forward; encoder: the translator's encoder only "
        "(ONNX only)",
    )
    export.add_argument(
        "--overwrite", action="store_true",
        help="with --format pipeline: replace an existing non-empty --out folder (once the "
        "new one is complete)",
    )
    add_weights_flag(export)
    export.add_argument(
        "--no-check", action="store_true",
        help="skip the onnxruntime (or diffusers) comparison",
    )
    export.add_argument(
        "--verbose", action="store_true",
        help="show what torch's exporter, onnxruntime or diffusers print (else only if they "
        "fail)",
    )


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm export``; returns the exit code."""
    from addnorm.cli.checks import UsageError, check_out_file
    from addnorm.cli.exits import EXIT_FAILED, EXIT_OK
    from addnorm.export import onnx_max_error, to_onnx
    from addnorm.tasks.loading import load

    if args.format == "pipeline":
        from addnorm.cli.export_pipeline import export_pipeline

        return export_pipeline(args)
    if args.overwrite:
        raise UsageError("--overwrite: an ONNX file is always replaced; the flag is for "
                         "--format pipeline")
    args.part = args.part or "forward"
    check_out_file(args.out)
    model = load(args.checkpoint, weights=args.weights, device="cpu")
    name = type(model).__name__
    if args.part not in model.export_parts:
        parts = ", ".join(model.export_parts)
        raise UsageError(f"--part {args.part}: a {name} exports {parts}; {args.checkpoint}")
    quiet = not args.verbose
    try:
        with CapturedOutput(quiet) as exporting:
            path = to_onnx(model, args.out, part=args.part)
    except ImportError as err:
        exporting.show()
        print(
            f"addnorm export: error: {err}; writing ONNX needs the onnx and onnxscript "
            "packages (pip install 'addnorm[export]')",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except Exception as err:  # what the exporter said before it failed, then one line
        exporting.show()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"addnorm export: error: exporting the {name}'s {args.part} failed "
              f"({type(err).__name__}: {first})", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {path}: the {name}'s {args.part}")
    if args.no_check:
        return EXIT_OK
    try:
        with CapturedOutput(quiet) as checking:
            error = onnx_max_error(model, path, part=args.part)
    except ImportError:
        print("not checked: onnxruntime is not installed (pip install 'addnorm[export]')")
        return EXIT_OK
    except Exception as err:
        checking.show()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"addnorm export: error: checking {path} with onnxruntime failed "
              f"({type(err).__name__}: {first})", file=sys.stderr)
        return EXIT_FAILED
    print(f"onnxruntime vs PyTorch on padded batches: max |difference| {error:.1e}")
    if not error <= TOLERANCE:
        exporting.show()
        checking.show()
        print(
            f"addnorm export: error: the ONNX model differs from PyTorch by {error:.1e} "
            f"(more than {TOLERANCE:.0e})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK
