"""``GenerationConfig``: validated on construction, each bad setting refused by its name;
sequences stored as tuples, so every config is frozen and hashable."""

from __future__ import annotations

import pytest

from addnorm.generation.config import GenerationConfig


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens"),
        ({"max_new_tokens": True}, TypeError, "max_new_tokens"),
        ({"strategy": "top_k"}, ValueError, "strategy"),
        ({"strategy": "sample", "temperature": 0.0}, ValueError, 'strategy="greedy"'),
        ({"strategy": "sample", "temperature": -1.0}, ValueError, "temperature"),
        ({"strategy": "sample", "temperature": float("nan")}, ValueError, "temperature"),
        ({"strategy": "sample", "top_k": 0}, ValueError, "top_k"),
        ({"strategy": "sample", "top_p": 0.0}, ValueError, "top_p"),
        ({"strategy": "sample", "top_p": 1.5}, ValueError, "top_p"),
        ({"num_beams": 0}, ValueError, "num_beams"),
        ({"length_penalty": float("inf")}, ValueError, "length_penalty"),
        ({"eos_id": -1}, ValueError, "eos_id"),
        ({"eos_id": ()}, ValueError, "eos_id"),
        ({"eos_id": (2, -3)}, ValueError, "eos_id[1]"),
        ({"eos_id": "2"}, TypeError, "eos_id"),
        ({"pad_id": -1}, ValueError, "pad_id"),
        ({"top_k": 5}, ValueError, "top_k=5"),
        ({"strategy": "beam", "temperature": 0.7}, ValueError, "temperature=0.7"),
        ({"min_new_tokens": -1}, ValueError, "min_new_tokens"),
        ({"num_return_sequences": 0}, ValueError, "num_return_sequences"),
        ({"num_return_sequences": 2}, ValueError, "needs strategy='sample' or 'beam'"),
        ({"strategy": "beam", "num_beams": 2, "num_return_sequences": 3}, ValueError,
         "must be <= num_beams"),
        ({"beam_stop": "never"}, ValueError, "beam_stop"),
        ({"strategy": "sample", "min_p": 0.0}, ValueError, "min_p must be > 0"),
        ({"strategy": "sample", "min_p": 1.5}, ValueError, "min_p must be <= 1"),
        ({"min_p": 0.1}, ValueError, "min_p=0.1 only apply to strategy='sample'"),
        ({"bad_words_ids": "ab"}, TypeError, "bad_words_ids must be a sequence"),
        ({"bad_words_ids": [[1], []]}, ValueError, "bad_words_ids[1] must hold at least one"),
        ({"bad_words_ids": [[1, -2]]}, ValueError, "bad_words_ids[0][1] must be >= 0"),
        ({"bad_words_ids": [3]}, TypeError, "bad_words_ids[0] must be a sequence"),
        ({"suppress_tokens": 3}, TypeError, "suppress_tokens must be a sequence"),
        ({"suppress_tokens": [1, 2.0]}, TypeError, "suppress_tokens[1]"),
        ({"forced_eos_id": -1}, ValueError, "forced_eos_id must be >= 0"),
        ({"forced_eos_id": ()}, ValueError, "forced_eos_id must be an int, a non-empty tuple"),
        ({"forced_eos_id": (2, 3), "suppress_tokens": (3, 2)}, ValueError,
         "also in suppress_tokens"),
        ({"max_time": 0}, ValueError, "max_time must be > 0"),
        ({"max_time": float("inf")}, ValueError, "max_time must be finite"),
        ({"max_time": "1s"}, TypeError, "max_time must be a number"),
    ],
)
def test_bad_generation_config_is_rejected_with_its_name(kwargs, error, words):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        GenerationConfig(**kwargs)


def test_a_list_of_stop_ids_is_stored_as_a_tuple():
    config = GenerationConfig(max_new_tokens=3, eos_id=[1, 2])
    assert config.eos_id == (1, 2) and config.stop_ids == (1, 2)
    assert GenerationConfig(max_new_tokens=3, eos_id=4).stop_ids == (4,)
    lists = GenerationConfig(bad_words_ids=[[1, 2], [3]], suppress_tokens=[4, 5],
                             forced_eos_id=[6, 7])
    assert (lists.bad_words_ids, lists.suppress_tokens, lists.forced_ids) == (
        ((1, 2), (3,)), (4, 5), (6, 7))
    hash(lists)  # frozen and hashable, as every config


def test_from_transformers_maps_the_strategy_names():
    greedy = GenerationConfig.from_transformers()
    assert greedy.strategy == "greedy"
    sample = GenerationConfig.from_transformers(do_sample=True, temperature=0.7, top_k=5,
                                                top_p=0.9)
    assert (sample.strategy, sample.temperature, sample.top_k, sample.top_p) == (
        "sample", 0.7, 5, 0.9)
    beam = GenerationConfig.from_transformers(num_beams=5, length_penalty=0.6)
    assert (beam.strategy, beam.num_beams, beam.length_penalty) == ("beam", 5, 0.6)


def test_from_transformers_maps_the_token_names_and_the_rules():
    config = GenerationConfig.from_transformers(
        eos_token_id=[7, 8], pad_token_id=None, max_new_tokens=9, repetition_penalty=1.1,
        no_repeat_ngram_size=3,
    )
    assert config == GenerationConfig(
        eos_id=(7, 8), pad_id=None, max_new_tokens=9, repetition_penalty=1.1,
        no_repeat_ngram_size=3,
    )
