"""Small float64 Transformer and TransformerLM (seed 0, no dropout) and their inputs, shared by
the model tests of tests/transformer."""

from __future__ import annotations

import torch

from addnorm.transformer import Transformer, TransformerLM
from addnorm.transformer.config import LMConfig, TransformerConfig

V = 23
PAD, BOS, EOS = 0, 1, 2
F64 = torch.float64  # the models' dtype: FLOAT64_EXACT wherever they stay in it
POSITIONS = ["sinusoidal", "learned", "rotary", "none"]


def transformer(positions: str = "sinusoidal", **changes) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=64, dropout=0.0, position_encoding=positions, max_len=16,
        **changes,
    )
    return Transformer(cfg).to(F64).eval()


def language_model(positions: str = "sinusoidal", **changes) -> TransformerLM:
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
        position_encoding=positions, max_len=16, **changes,
    )
    return TransformerLM(cfg).to(F64).eval()


def ids(*shape: int, seed: int = 1) -> torch.Tensor:
    """Random real tokens (never pad, bos or eos)."""
    return torch.randint(3, V, shape, generator=torch.Generator().manual_seed(seed))


SOURCE = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, PAD, PAD]])  # right-padded
PROMPT = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10]])  # left-padded
