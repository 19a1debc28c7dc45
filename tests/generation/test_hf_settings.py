"""Hugging Face's generation settings (``addnorm.generation.hf_settings``): what has no meaning
here is refused or, for sampling-only settings outside sampling, ignored with a warning pointed
at the caller's line, as transformers ignores them; ``max_length`` counts the prompt.

Provenance: transformers' own rules (its ``GenerationConfig.validate`` warns of the same
ignored settings; ``max_length`` = prompt + new tokens), and the caller's file and line.
"""

from __future__ import annotations

import pytest

from addnorm.generation.config import GenerationConfig
from addnorm.generation.hf_settings import TRANSFORMERS_NAMES, fields_from_transformers


def test_from_transformers_refuses_what_has_no_meaning_here():
    with pytest.raises(ValueError, match="beam sampling"):
        GenerationConfig.from_transformers(do_sample=True, num_beams=4)
    with pytest.warns(UserWarning, match=r"sampling settings are ignored.*temperature=0\.5"):
        assert GenerationConfig.from_transformers(temperature=0.5) == (
            GenerationConfig.from_transformers())  # greedy: ignored, as transformers does
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        GenerationConfig.from_transformers(repetition_penalty=0.0)
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be >= 0"):
        GenerationConfig.from_transformers(no_repeat_ngram_size=-1)
    with pytest.raises(TypeError, match="do_sample must be a bool"):
        GenerationConfig.from_transformers(do_sample=1)  # type: ignore[arg-type]


def test_the_ignored_sampling_settings_warning_points_at_the_callers_line():
    with pytest.warns(UserWarning, match="top_p=0.5") as caught:
        GenerationConfig.from_transformers(top_p=0.5)
    assert caught[0].filename == __file__


def test_max_length_counts_the_prompt_and_an_unknown_name_is_named_with_the_known_ones():
    fields = fields_from_transformers({"max_length": 12, "min_length": 3}, prompt_length=5)
    assert (fields["max_new_tokens"], fields["min_new_tokens"]) == (7, 0)
    with pytest.raises(ValueError, match="pass prompt_length"):
        fields_from_transformers({"max_length": 12}, None)
    with pytest.raises(ValueError, match=r"num_beam_groups=2.*" + TRANSFORMERS_NAMES[0]):
        fields_from_transformers({"num_beam_groups": 2}, None)
