"""addnorm: the Transformer and the Diffusion Transformer, part by part.

Conventions shared by every module (shapes legend, mask polarity) are in docs/design.md.
"""

from addnorm.encodings import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    relative_shift_matrix,
    sinusoidal_encoding,
)
from addnorm.feedforward import FeedForward
from addnorm.norms import BatchNorm, GroupNorm, LayerNorm, RMSNorm, make_norm
from addnorm.residual import AddNorm
from addnorm.rotary import RotaryEmbedding
from addnorm.timestep import TimestepEmbedder, timestep_embedding

__version__ = "0.1.0"

__all__ = [
    "AddNorm",
    "BatchNorm",
    "FeedForward",
    "GroupNorm",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "TimestepEmbedder",
    "make_norm",
    "relative_shift_matrix",
    "sinusoidal_encoding",
    "timestep_embedding",
]
