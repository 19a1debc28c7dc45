"""addnorm.cache_checks: the size checks of a decoding cache (against a machine whose memory
is patched to a known size, or the CPU's own) and a step's arguments. Oracles: the byte counts
the docstrings state (2 * layers * rows * positions * d_model * itemsize; 8 bytes an id) and
their "at most M" bound, accepted at M and refused at M + 1. The models' ``start`` and
``step`` asking these checks: tests/test_generation_edges.py, tests/transformer/test_models.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from addnorm.cache import DecodingCache
from addnorm.cache_checks import check_cache_fits, check_decoding_step
from addnorm.utils.memory import device_memory


def test_the_cache_bound_is_exact_at_the_most_tokens_it_names():
    # Identity: check_cache_fits accepts the "at most M" it names and refuses M + 1.
    limit = device_memory("cpu")
    if limit is None:
        pytest.skip("this machine does not tell its memory")
    batch = 2**20  # 2 * 1 layer * 2**20 rows * 16 * 4 bytes = 128 MiB per position
    per_position = 2 * 1 * batch * 16 * 4
    most = limit // per_position - 3
    args = {"batch_size": batch, "prompt_len": 3, "dtype": torch.float32,
            "device": torch.device("cpu"), "n_layers": 1, "d_model": 16}
    check_cache_fits(max_new_tokens=most, **args)
    with pytest.raises(ValueError, match=rf"max_new_tokens \({most + 1}\).* at most {most} new"):
        check_cache_fits(max_new_tokens=most + 1, **args)


@given(n_layers=st.integers(1, 48), d_model=st.integers(1, 8192))
def test_the_room_checks_refuse_what_no_memory_holds_and_pass_what_it_does(
        monkeypatch, n_layers, d_model):
    # A machine of 1 MiB (device_memory patched): the cache's lower bound is 2 * n_layers *
    # d_model bytes a token (keys and values at batch 1, one-byte dtype), the ids' 8 (int64).
    from addnorm import cache_checks
    from addnorm.utils import memory

    for module in (cache_checks, memory):  # the largest memory here, and what check_fits reads
        monkeypatch.setattr(module, "device_memory", lambda device: 2**20)
    tokens = 2**20 // (2 * n_layers * d_model)  # the most that fit
    cache_checks.check_cache_room(tokens, n_layers=n_layers, d_model=d_model)
    with pytest.raises(ValueError, match=rf"max_new_tokens \({tokens + 1}\) needs at least"):
        cache_checks.check_cache_room(tokens + 1, n_layers=n_layers, d_model=d_model)
    cache_checks.check_ids_room(2**17)  # 2**17 ids of 8 bytes: 1 MiB exactly
    with pytest.raises(ValueError, match=r"max_new_tokens \(131073\) needs at least 1,048,584"):
        cache_checks.check_ids_room(2**17 + 1)


def test_a_step_takes_a_decoding_cache_and_one_token_per_row():
    cache = DecodingCache.allocate(n_layers=1, batch_size=2, n_heads=1, d_head=2, max_len=4,
                                   dtype=torch.float32, device=torch.device("cpu"))
    check_decoding_step(torch.zeros(2, 1, dtype=torch.long), cache, needs_memory=False)
    with pytest.raises(TypeError, match=r"cache must be the DecodingCache from start\(\), got"
                                        r" tuple"):
        check_decoding_step(torch.zeros(2, 1, dtype=torch.long), (), needs_memory=False)
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, 1\) = \(2, 1\), got "
                                         r"\(2, 2\)"):
        check_decoding_step(torch.zeros(2, 2, dtype=torch.long), cache, needs_memory=False)
