"""The checks of a generation before it starts (``addnorm.generation.decode_checks``): ids
outside the vocabulary named, options that cannot work refused, and the rows of several
return sequences against the device's memory, exact at the most that fit.

Provenance: the vocabulary's size and the documented per-row bound (its cache's bytes and a
float32 row of logits), set against a device memory made to hold exactly ``most`` copies.
"""

from __future__ import annotations

import pytest
import torch

import addnorm.generation.decode_checks as checks_module
from addnorm.generation.config import GenerationConfig
from addnorm.generation.decode_checks import (
    check_decoding_options,
    check_rows_fit,
    check_token_ids,
)


def test_every_id_a_config_names_must_be_inside_the_vocabulary():
    check_token_ids(GenerationConfig(pad_id=4, eos_id=(3, 4), bad_words_ids=[[1, 2]]), 5)
    with pytest.raises(ValueError, match=r"bad_words_ids \(\(\(1, 5\),\)\) holds 5"):
        check_token_ids(GenerationConfig(bad_words_ids=[[1, 5]]), 5)
    with pytest.raises(ValueError, match=r"eos_id \(9\) must be < the vocabulary size V \(5\)"):
        check_token_ids(GenerationConfig(eos_id=9), 5)


def test_options_that_cannot_work_are_refused_before_decoding():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="not supported by beam search"):
        check_decoding_options(GenerationConfig(strategy="beam", eos_id=1), None, print, cpu)
    with pytest.raises(ValueError, match="set pad_id or eos_id"):
        check_decoding_options(GenerationConfig(eos_id=None, pad_id=None), None, print, cpu)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        check_decoding_options(GenerationConfig(strategy="sample"), 3, None, cpu)


def test_the_rows_bound_is_exact_at_the_most_return_sequences_it_names(monkeypatch):
    batch, vocab, row_bytes, most = 2, 11, 100, 3
    limit = batch * most * (row_bytes + vocab * 4)  # a row: its cache and float32 logits
    monkeypatch.setattr(checks_module, "device_memory", lambda device: limit)
    config = GenerationConfig(strategy="sample", num_return_sequences=most)
    check_rows_fit(config, batch, vocab, row_bytes, "cpu")
    more = GenerationConfig(strategy="sample", num_return_sequences=most + 1)
    with pytest.raises(ValueError, match=rf"num_return_sequences \({most + 1}\).* at most {most}"):
        check_rows_fit(more, batch, vocab, row_bytes, "cpu")
