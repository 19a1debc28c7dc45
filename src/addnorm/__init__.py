"""addnorm: the Transformer and the Diffusion Transformer, part by part.

Conventions shared by every module (shapes legend, mask polarity) are in docs/design.md.
``addnorm.load`` opens training runs as well as pretrained folders, so it lives above the tasks
(:mod:`addnorm.tasks.loading`); it is imported on first use, keeping ``import addnorm`` to the
models. Type checkers see it as it is (typed ``Any``, or as the class passed:
``addnorm.load(path, TransformerLM)``).
"""

from typing import TYPE_CHECKING, Any

from addnorm._version import __version__ as __version__
from addnorm.attention import (
    AttentionMask,
    MultiHeadAttention,
    cross_attention_mask,
    self_attention_mask,
)
from addnorm.cache import DecodingCache, KVCache
from addnorm.diffusion import Diffusion, guided_eps_fn
from addnorm.dit import DIT_PRESETS, DiT, DiTBlock, DiTConfig
from addnorm.encodings import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    relative_shift_matrix,
    sinusoidal_encoding,
)
from addnorm.feedforward import FeedForward, GatedFeedForward, make_feedforward
from addnorm.generation.config import GenerationConfig
from addnorm.generation.loop import generate_tokens
from addnorm.inspection import Watch, watch
from addnorm.interop import (
    from_diffusers,
    from_dit_state_dict,
    from_torch,
    from_transformers,
    to_diffusers,
    to_dit_state_dict,
    to_torch,
    to_transformers,
)
from addnorm.norms import BatchNorm, GroupNorm, LayerNorm, NoNorm, RMSNorm, make_norm
from addnorm.pretrained.mixin import PretrainedMixin
from addnorm.residual import AddNorm
from addnorm.rotary import RotaryEmbedding
from addnorm.timestep import TimestepEmbedder, timestep_embedding
from addnorm.transformer.config import PRESETS, LayerConfig, LMConfig, TransformerConfig
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel, mean_pool
from addnorm.transformer.layers import DecoderLayer, EncoderLayer
from addnorm.transformer.lm import TransformerLM
from addnorm.transformer.stacks import Decoder, Encoder, EncoderDecoder

if TYPE_CHECKING:  # at run time, __getattr__ imports it when first asked for
    from addnorm.tasks.loading import load as load

__all__ = [
    "AddNorm",
    "AttentionMask",
    "BatchNorm",
    "DIT_PRESETS",
    "Decoder",
    "DecoderLayer",
    "DecodingCache",
    "DiT",
    "DiTBlock",
    "DiTConfig",
    "Diffusion",
    "Encoder",
    "EncoderConfig",
    "EncoderDecoder",
    "EncoderLayer",
    "EncoderModel",
    "FeedForward",
    "GatedFeedForward",
    "GenerationConfig",
    "GroupNorm",
    "KVCache",
    "LMConfig",
    "LayerConfig",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "NoNorm",
    "PRESETS",
    "PretrainedMixin",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "TimestepEmbedder",
    "Transformer",
    "TransformerConfig",
    "TransformerLM",
    "Watch",
    "cross_attention_mask",
    "from_diffusers",
    "from_dit_state_dict",
    "from_torch",
    "from_transformers",
    "generate_tokens",
    "guided_eps_fn",
    "load",
    "make_feedforward",
    "make_norm",
    "mean_pool",
    "relative_shift_matrix",
    "self_attention_mask",
    "sinusoidal_encoding",
    "timestep_embedding",
    "to_diffusers",
    "to_dit_state_dict",
    "to_torch",
    "to_transformers",
    "watch",
]


def __getattr__(name: str) -> Any:
    """``addnorm.load``, imported from :mod:`addnorm.tasks.loading` when first asked for."""
    if name == "load":
        from addnorm.tasks.loading import load

        return load
    raise AttributeError(f"module 'addnorm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "load"])
