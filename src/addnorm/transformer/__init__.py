"""The Transformer family built from the parts: configs, layers, stacks, the encoder-decoder,
the decoder-only LM, generation and torch.nn interop."""

from addnorm.transformer.config import PRESETS, LMConfig, TransformerConfig
from addnorm.transformer.encoder_decoder import Transformer
from addnorm.transformer.encoder_model import EncoderConfig, EncoderModel, mean_pool
from addnorm.transformer.layers import DecoderLayer, EncoderLayer
from addnorm.transformer.lm import TransformerLM
from addnorm.transformer.stacks import Decoder, Encoder, EncoderDecoder

__all__ = [
    "PRESETS",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderConfig",
    "EncoderDecoder",
    "EncoderLayer",
    "EncoderModel",
    "LMConfig",
    "Transformer",
    "TransformerConfig",
    "TransformerLM",
    "mean_pool",
]
