"""Autoregressive generation for the Transformer families: the generation settings and the
Hugging Face call they map (``config``), the one ``generate`` of every model that implements
``addnorm.family.GenerativeModel`` (``generate``), the one decode loop (``loop``: greedy and
sampling; ``beam_search``), the logit rules (``repetition``), stop strings
(``stop_strings``), the decode step, compiled or not, with its logit checks (``step``), the
rules that reshape the logits (``logit_rules``), ``max_time``'s clock (``deadline``) and what
a call returns with ``return_dict_in_generate=True`` (``output``)."""

from addnorm.generation.config import STRATEGIES, GenerationConfig
from addnorm.generation.loop import generate_tokens
from addnorm.generation.output import GenerateOutput
from addnorm.generation.stop_strings import cut_at_stop, stop_at_strings

__all__ = [
    "STRATEGIES", "GenerateOutput", "GenerationConfig", "cut_at_stop", "generate_tokens",
    "stop_at_strings",
]
