"""``addnorm generate --prompt TEXT``: a trained lm run continues the prompt (with the run's own
tokenizer: characters, or the BPE or tokenizer.json it trained with).

The model sees at most the windows its run trained on (``--window``, default the run's
``seq_len``; a folder that records no run: the model's ``max_len``), sliding past them, so
``--max-new-tokens`` are all generated; a prompt longer than the window is continued from
its end, which stderr says in one line. Decoding flags are checked before the checkpoint is
read (exit 2 naming the flag); ``--compile`` runs the decode step compiled and says on
stderr how long compiling and generating took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from addnorm.cli.checks import UsageError, as_flags, seed
from addnorm.cli.exits import EXIT_OK, require_stdout
from addnorm.cli.shared_flags import add_inference_flags, load_task_model

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Register ``addnorm generate``."""
    generate = subparsers.add_parser("generate", help="continue a prompt with a trained lm")
    generate.add_argument("--prompt", required=True,
                          help="the text to continue (a character run maps characters outside "
                          "its vocabulary to <unk>)")
    generate.add_argument(
        "--max-new-tokens", type=int, default=200,
        help="tokens (characters, for a character run) to generate, >= 1, all of them: past "
        "the --window the model sees the last --window tokens (its window slides)",
    )
    generate.add_argument(
        "--window", type=int, default=None,
        help="the most tokens the model sees at once, >= 1 (default: the length of the "
        "windows its run trained on, --seq-len; a folder without a run: the model's "
        "max_len); more asks for positions it never trained on, where it does worse",
    )
    generate.add_argument("--temperature", type=float, default=0.8,
                          help="sampling temperature, finite and >= 0; 0 = greedy")
    generate.add_argument(
        "--top-k", type=int, default=None,
        help="sample from the K most likely tokens only, K >= 1 (default: all)",
    )
    generate.add_argument(
        "--top-p", type=float, default=None,
        help="nucleus sampling: from the fewest tokens whose probability adds up to P, "
        "0 < P <= 1 (default: all)",
    )
    generate.add_argument(
        "--stop", action="append", default=[], metavar="TEXT",
        help="stop once the continuation holds TEXT and cut the output before it (repeatable)",
    )
    generate.add_argument("--seed", type=seed, default=0,
                          help="seeds the sampling, 0 to 2**64 - 1")
    generate.add_argument(
        "--compile", action="store_true",
        help="run the decode step compiled (torch.compile): the first call compiles for "
        "seconds (time printed to stderr), each token after is faster; pays off for long "
        "outputs at batch 1",
    )
    generate.add_argument(
        "--checkpoint", type=Path, default=Path("runs/lm"),
        help="an lm run folder (its best checkpoint, else its newest: --which), one checkpoint "
        "folder, or a folder addnorm.load opens (save_pretrained's, transformers' or diffusers') "
        "whose model the lm task trains",
    )
    add_inference_flags(generate)


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm generate``; returns the exit code."""
    import torch

    require_stdout("the text")
    if "" in args.stop:
        raise UsageError("--stop must not be empty")
    _check_sampling_flags(args)
    task, model = load_task_model(args, "lm")
    device = next(model.parameters()).device
    start = time.perf_counter()
    try:
        window = model.context if args.window is None else args.window
        _say_if_cut(len(task.tokenizer.encode(args.prompt)), window,
                    args.window is None)  # an unknown character: a ValueError, as in sample
        text = task.sample(
            model,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=torch.Generator(device=device).manual_seed(args.seed),
            stop=tuple(args.stop),
            compile=args.compile,
            window=args.window,
        )
    except (ValueError, TypeError) as err:
        raise UsageError(as_flags(str(err), ("window",) if args.window else ())) from None
    if args.compile:
        seconds = time.perf_counter() - start
        print(f"compiling the decode step and generating took {seconds:.1f} s", file=sys.stderr)
    print(text)
    return EXIT_OK


def _say_if_cut(prompt_length: int, window: int, trained: bool) -> None:
    """One line on stderr when the prompt is longer than the window: it is continued from its
    last ``window`` tokens (``LMTask.sample``; the output still starts with all of it).
    ``trained``: the window is the model's context (not ``--window``'s)."""
    if prompt_length > window:
        what = "the model's context" if trained else "--window"
        print(
            f"note: the prompt has {prompt_length} tokens, more than {what} ({window}): "
            f"continuing from its last {window}",
            file=sys.stderr,
        )


def _check_sampling_flags(args) -> None:
    """``generate``'s decoding flags, before the checkpoint is read: ``--max-new-tokens`` and
    ``--window`` >= 1, ``--temperature`` finite, >= 0 and
    representable in float32 (the logits' dtype: a larger one becomes inf there and turns the
    masked logits into NaN), ``--top-k`` >= 1, ``--top-p`` in (0, 1]."""
    import torch

    from addnorm.utils.checks import check_float, check_int

    try:
        check_int("max_new_tokens", args.max_new_tokens, min_value=1)
        if args.window is not None:
            check_int("window", args.window, min_value=1)
        check_float("temperature", args.temperature, min_value=0.0,
                    max_value=torch.finfo(torch.float32).max)
        if args.top_k is not None:
            check_int("top_k", args.top_k, min_value=1)
        if args.top_p is not None:
            check_float("top_p", args.top_p, min_value=0.0, min_inclusive=False, max_value=1.0)
    except (ValueError, TypeError) as err:
        names = ("max_new_tokens", "window", "temperature", "top_k", "top_p")
        raise UsageError(as_flags(str(err), names)) from None
