"""A tokenizer's files read without trusting them (addnorm.data.tokenizer_files), through
``HFTokenizer.from_file``: a file that is missing, not UTF-8 or not a tokenizer is one
``DataError`` naming it (a pretrained folder's files: test_hf_tokenizer.py's model tests).

Provenance: the messages are the ones the module states; the bytes are chosen to fail each way.
"""

from __future__ import annotations

import pytest

from addnorm.data.fingerprint import DataError
from addnorm.data.hf_tokenizer import HFTokenizer


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"not": "a tokenizer"}', "does not parse as a tokenizer.json"),
        (b"{broken", "does not parse as a tokenizer.json"),
        (b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_a_tokenizer_file_that_does_not_parse_is_one_data_error(tmp_path, content, message):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        HFTokenizer.from_file(path)
    assert str(info.value).startswith(f"tokenizer {path}:")


def test_a_missing_tokenizer_file_names_the_choices(tmp_path):
    with pytest.raises(DataError, match="no such file .name char, bpe or a tokenizer.json"):
        HFTokenizer.from_file(tmp_path / "nope.json")
