"""The Transformer family built from the parts: configs, layers, stacks, the encoder-decoder,
the decoder-only LM, generation and torch.nn interop."""

from addnorm.transformer.config import PRESETS, LMConfig, TransformerConfig
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.layers import DecoderLayer, EncoderLayer
from addnorm.transformer.lm import TransformerLM
from addnorm.transformer.stacks import Decoder, Encoder, EncoderDecoder

__all__ = [
    "PRESETS",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderDecoder",
    "EncoderLayer",
    "LMConfig",
    "Transformer",
    "TransformerConfig",
    "TransformerLM",
]
