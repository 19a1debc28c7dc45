"""Autoregressive generation for the Transformer families: the generation settings (with
Hugging Face's names), the one decode loop (greedy, sampling, beam search), the logit rules,
stop strings and the compiled decode step."""

from addnorm.generation.config import STRATEGIES, GenerationConfig
from addnorm.generation.loop import generate_tokens
from addnorm.generation.stop_strings import cut_at_stop, stop_at_strings

__all__ = ["STRATEGIES", "GenerationConfig", "cut_at_stop", "generate_tokens", "stop_at_strings"]
