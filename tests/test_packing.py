"""Packing a padded batch into one row of its real tokens, and back.

Provenance: identities. The packed row is x[~padding] in batch order; unpacking puts every
token back and zeros the padding; the row starts, positions and per-row attend keys restate
their definitions on small batches written out by hand.
"""

from __future__ import annotations

import pytest
import torch

from addnorm.packing import Packing, check_unpad

F64 = torch.float64
PADDING = torch.tensor([
    [0, 0, 0, 0, 0, 0, 0],  # no padding
    [0, 0, 0, 0, 1, 1, 1],  # right padding
    [1, 1, 0, 0, 0, 0, 0],  # left padding
]).bool()


def test_pack_then_unpack_keeps_real_tokens_in_order_and_zeros_padding():
    x = torch.arange(3 * 7 * 2, dtype=F64).view(3, 7, 2)
    packing = Packing.from_padding(PADDING)
    packed = packing.pack(x)
    assert packed.shape == (1, int((~PADDING).sum()), 2)
    torch.testing.assert_close(packed[0], x[~PADDING], rtol=0, atol=0)  # batch order
    expected = x.masked_fill(PADDING[..., None], 0)
    torch.testing.assert_close(packing.unpack(packed), expected, rtol=0, atol=0)  # data moved
    assert packing.has_padding and not Packing.from_padding(PADDING[:1]).has_padding


def test_row_starts_positions_and_attend_keys_follow_the_padding():
    packing = Packing.from_padding(PADDING)  # rows of 7, 4 and 5 real tokens
    assert packing.row_lengths == (7, 4, 5)
    assert torch.equal(packing.cu_lengths, torch.tensor([0, 7, 11, 16], dtype=torch.int32))
    # default positions: each token's index in its padded row (the left-padded row starts at 2)
    assert packing.positions()[0].tolist() == [*range(7), *range(4), *range(2, 7)]
    explicit = torch.arange(7).expand(3, 7) * 10  # (B, L) per-row positions
    assert packing.positions(explicit)[0].tolist() == [10 * p for p in packing.positions()[0]]
    assert torch.equal(packing.attend_keys[:, 0, 0], ~PADDING)
    empty = Packing.from_padding(torch.tensor([[True, True], [False, True]]))
    assert empty.attend_keys[0, 0, 0].tolist() == [True, True]  # no real token: every key
    assert empty.rows_by_length == (None, ((1, 1),))  # a row of padding only is in no group


def test_unpad_is_a_bool_and_refused_with_group_norm():
    assert check_unpad(True, "layer") is True and check_unpad(False, "group") is False
    with pytest.raises(ValueError, match="unpad=True cannot be used with norm='group'"):
        check_unpad(True, "group")
    with pytest.raises(TypeError, match="unpad"):
        check_unpad(1, "layer")
