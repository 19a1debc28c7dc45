"""Autoregressive generation for the Transformer families: the generation settings and the
Hugging Face call they map (``config``), the one ``generate`` of every model that implements
``addnorm.family.GenerativeModel`` (``generate``), the one decode loop (``loop``: greedy and
sampling; ``beam_search``), the logit rules (``repetition``), stop strings
(``stop_strings``) and the decode step, compiled or not, with its logit checks (``step``)."""

from addnorm.generation.config import STRATEGIES, GenerationConfig
from addnorm.generation.loop import generate_tokens
from addnorm.generation.stop_strings import cut_at_stop, stop_at_strings

__all__ = ["STRATEGIES", "GenerationConfig", "cut_at_stop", "generate_tokens", "stop_at_strings"]
