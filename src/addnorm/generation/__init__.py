"""Autoregressive generation for the Transformer families: the generation settings and the
Hugging Face call they map (``config``), the one ``generate`` of every model that implements
``addnorm.family.GenerativeModel`` (``generate``), the one decode loop (``loop``: greedy and
sampling; ``beam_search``), the logit rules (``repetition``), stop strings
(``stop_strings``), the decode step, compiled or not, with its logit checks (``step``), the
rules that reshape the logits (``logit_rules``), ``max_time``'s clock (``deadline``), what
a call returns with ``return_dict_in_generate=True`` (``output``), the window a decoder-only
model slides past its trained context (``window``) and a text scored as the decode path
reads it (``scoring``)."""

from addnorm.generation.config import STRATEGIES, GenerationConfig
from addnorm.generation.loop import generate_tokens
from addnorm.generation.output import GenerateOutput
from addnorm.generation.scoring import decode_log_probs
from addnorm.generation.stop_strings import cut_at_stop, stop_at_strings

__all__ = [
    "STRATEGIES", "GenerateOutput", "GenerationConfig", "cut_at_stop", "decode_log_probs",
    "generate_tokens", "stop_at_strings",
]
