"""PretrainedTokenizer: a ``tokenizer.json`` read by the ``tokenizers`` library.

Oracle: a word-level tokenizer built here with ``tokenizers`` (its vocabulary is the
expectation: each word's id), saved with a fixed padding length and truncation that the
reader must replace. The real MiniLM tokenizer is compared with transformers' in
``tests/transformer/test_transformers_interop.py``.
"""

from __future__ import annotations

import pytest

from addnorm.data.pretrained_tokenizer import PretrainedTokenizer

tokenizers = pytest.importorskip("tokenizers")

VOCAB = {"[PAD]": 0, "[UNK]": 1, "the": 2, "cat": 3, "sat": 4, "down": 5}


@pytest.fixture
def tokenizer_file(tmp_path):
    model = tokenizers.models.WordLevel(VOCAB, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=8)  # replaced when read
    tok.enable_truncation(max_length=8)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_batches_are_right_padded_to_the_longest_row(tokenizer_file):
    tok = PretrainedTokenizer(tokenizer_file)
    ids, padding, types = tok.encode_batch(["the cat sat down", "the dog"])
    assert tok.pad_id == 0
    assert ids.tolist() == [[2, 3, 4, 5], [2, 1, 0, 0]]  # "dog" is unknown
    assert padding.tolist() == [[False] * 4, [False, False, True, True]]
    assert types.tolist() == [[0] * 4] * 2


def test_max_len_cuts_and_decode_inverts(tokenizer_file):
    tok = PretrainedTokenizer(tokenizer_file, max_len=2)
    assert tok.encode("the cat sat") == [2, 3]
    assert tok.decode([2, 3, 4]) == "the cat sat"
    assert tok.vocab_size == len(VOCAB)


def test_without_a_pad_token_padding_is_id_zero_marked_by_the_mask(tmp_path):
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    reader = PretrainedTokenizer.from_dir(tmp_path)
    ids, padding, _ = reader.encode_batch(["sat", "the cat"])
    assert reader.pad_id is None
    assert ids.tolist() == [[4, 0], [2, 3]] and padding.tolist() == [[False, True], [False] * 2]


def test_bad_files_and_arguments_are_refused(tokenizer_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        PretrainedTokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="cannot read .*bad.json as a tokenizer.json"):
        PretrainedTokenizer(tmp_path / "bad.json")
    with pytest.raises(ValueError, match=r"pad_token '<pad>' is not in the vocabulary"):
        PretrainedTokenizer(tokenizer_file, pad_token="<pad>")
    with pytest.raises(TypeError, match="texts must be a non-empty sequence of str"):
        PretrainedTokenizer(tokenizer_file).encode_batch("the cat")
