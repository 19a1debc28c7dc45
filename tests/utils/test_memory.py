"""How much memory a machine has and how an out-of-memory error is told."""

from __future__ import annotations

import pytest
import torch

from addnorm.utils.memory import (
    available_memory,
    check_fits,
    describe_out_of_memory,
    device_memory,
    format_bytes,
    is_out_of_memory,
)


def test_available_memory_is_a_positive_byte_count_on_linux():
    free = available_memory("cpu")
    assert free is None or free > 0
    assert format_bytes(16e9) == "16 GB" and format_bytes(999) == "999 B"


def test_the_cpu_allocators_refusal_is_out_of_memory_and_told_by_its_size():
    # torch's own refusal of an allocation no machine holds (2**60 bytes) is the oracle
    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**60, dtype=torch.uint8)
    assert is_out_of_memory(caught.value)
    assert describe_out_of_memory(caught.value) == f"could not allocate {format_bytes(2**60)}"
    assert is_out_of_memory(MemoryError()) and is_out_of_memory(torch.OutOfMemoryError("x"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)")
    assert describe_out_of_memory(cuda) == "could not allocate 2.00 GiB"
    assert describe_out_of_memory(ValueError("first\nsecond")) == "first"


def test_check_fits_refuses_more_bytes_than_the_device_has_naming_the_argument():
    limit = device_memory("cpu")
    if limit is None:
        pytest.skip("this machine does not tell its memory")
    check_fits("batch", 1, "cpu")
    with pytest.raises(ValueError, match=f"batch needs at least {limit + 1:,} bytes, more than "
                                         f"the {limit:,} bytes"):
        check_fits("batch", limit + 1, "cpu")
