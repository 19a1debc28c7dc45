"""The token cache: an entry corrupted in place is found out when opened and rebuilt with one
line saying so, a dead process's temporary files are removed under the entry's lock, a
read-only cache holding the entry is used, and the lock makes a second builder wait.

Provenance: each damaged entry is made from a good one by one edit (an id past the vocabulary
with its checksum made to match, a dtype changed in ``meta.json``, bytes flipped), and the
rebuilt corpus is compared with the good one (an identity: the same text and settings give
the same ids). The kill -9 is real (a child process kills itself mid-pass).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock
from unprivileged import as_a_reader, read_only, shared_folder

from addnorm.data import token_cache, token_corpus
from addnorm.data.fingerprint import DataReadError
from addnorm.data.text_files import BLOCK_BYTES
from addnorm.data.token_cache import checksum, clean_stale, read_entry
from addnorm.data.token_corpus import TokenCorpus

TEXT = "".join(f"line {i}: a cache entry checks itself {i * 7}\n" for i in range(400))


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def _entry(corpus: TokenCorpus) -> Path:
    assert corpus.token_file is not None
    return corpus.token_file.parent


def _edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(changes)
    (folder / "meta.json").write_text(json.dumps(meta))


def _put_id(folder: Path, index: int, value: int) -> None:
    """Write ``value`` as the id at ``index`` of tokens.bin in place, and record the file's
    new CRC-32 in meta.json, so that only the vocabulary check can tell."""
    tokens = np.memmap(folder / "tokens.bin", dtype=np.uint16, mode="r+")
    tokens[index] = value
    tokens.flush()
    del tokens
    _edit_meta(folder, crc32=checksum(folder / "tokens.bin"))


def _damage_ids(folder: Path) -> None:
    _put_id(folder, 5, 60000)


def _damage_dtype(folder: Path) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    _edit_meta(folder, dtype="uint32", n_tokens=meta["n_tokens"] // 2,
               n_train=meta["n_train"] // 2)


def _damage_bytes(folder: Path) -> None:
    data = bytearray((folder / "tokens.bin").read_bytes())
    data[10], data[11] = data[12], data[13]  # other ids in place: in the vocabulary
    (folder / "tokens.bin").write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_damage_ids, "holds id 60000 at or past id 0, outside the vocabulary of"),
        (_damage_dtype, "meta.json names dtype uint32, but"),
        (_damage_bytes, "tokens.bin's CRC-32 is not the one recorded"),
    ],
)
def test_an_entry_corrupted_in_place_is_rebuilt_with_one_line(text, cache, caplog, damage,
                                                              reason):
    """Issue 41's fifth finding: ids past the vocabulary or a changed dtype were trusted (a
    traceback at the first step, or training on garbage)."""
    good = TokenCorpus.build(text)
    expected = np.array(good.tokens)
    folder = _entry(good)
    del good
    damage(folder)
    with caplog.at_level(logging.WARNING, logger="addnorm.data.token_corpus"):
        again = TokenCorpus.build(text)
    assert np.array_equal(np.array(again.tokens), expected)
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert f"the token cache entry {folder} failed its check" in line and reason in line
    assert "tokenizing the text again" in line
    caplog.clear()
    TokenCorpus.build(text)  # the rebuilt entry passes
    assert not caplog.records


def test_read_entry_says_nothing_is_there_for_a_missing_entry(tmp_path):
    assert read_entry(tmp_path / "absent") is None


def test_a_dead_process_temporary_files_are_removed_under_the_lock(text, cache):
    folder = _entry(TokenCorpus.build(text))
    for name in (".tokens.bin.tmp-99999999", ".meta.json.tmp-99999998"):
        (folder / name).write_bytes(b"left by a kill -9")
    (folder / "keep.txt").write_text("not ours")
    TokenCorpus.build(text)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt", "meta.json", "tokens.bin"]
    assert clean_stale(folder) == []


_KILLED_MID_PASS = textwrap.dedent("""
    import os, signal, sys
    from addnorm.data import token_corpus, tokenize_pass
    real = tokenize_pass.read_text_pieces
    def dying(files, **kwargs):
        for i, piece in enumerate(real(files, **kwargs)):
            if i == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            yield piece
    tokenize_pass.read_text_pieces = dying
    token_corpus.TokenCorpus.build(sys.argv[1])
""")


def test_a_kill_9_during_tokenization_leaves_no_temporary_file_after_the_next_run(
        tmp_path, cache):
    """Issue 41's eighth finding: ``.tokens.bin.tmp-<pid>`` was left in the cache forever.
    The text is two reads long (``BLOCK_BYTES`` each); the child kills itself at the second."""
    big = tmp_path / "big.txt"
    big.write_text(TEXT * 80, encoding="utf-8")
    assert big.stat().st_size > BLOCK_BYTES
    env = {**os.environ, "PYTHONPATH": str(Path(token_cache.__file__).parents[2])}
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_PASS, str(big)], env=env,
                            capture_output=True, timeout=300)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    left = list(cache.rglob(".tokens.bin.tmp-*"))
    assert len(left) == 1 and left[0].stat().st_size > 0  # the failure as it was
    corpus = TokenCorpus.build(big)
    assert not list(cache.rglob(".tokens.bin.tmp-*"))
    assert corpus.tokenizer.decode(np.array(corpus.tokens).tolist()) == TEXT * 80


def test_a_second_builder_waits_for_the_lock_then_reuses_the_entry(text, cache, monkeypatch):
    first = TokenCorpus.build(text)
    folder = _entry(first)
    shutil.rmtree(folder)
    passes = []
    real = token_corpus.tokenize_text
    monkeypatch.setattr(token_corpus, "tokenize_text", lambda *a: passes.append(1) or real(*a))
    built = []
    with FileLock(folder.with_name(folder.name + ".lock")):
        thread = threading.Thread(target=lambda: built.append(TokenCorpus.build(text)))
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive() and not built  # waiting on the lock
    thread.join(timeout=60)
    assert len(built) == 1 and passes == [1]
    assert np.array_equal(np.array(built[0].tokens), np.array(first.tokens))


# ---------------------------------------------------------------- a read-only cache


@pytest.fixture
def shared_tmp():
    with shared_folder() as folder:
        yield folder


def test_a_read_only_cache_holding_the_entry_is_used(shared_tmp, monkeypatch):
    """Issue 41: a read-only cache holding the right tokens could not be used (its lock could
    not be taken). Without the entry (other settings) it is one error naming the cache."""
    text, cache = shared_tmp / "text.txt", shared_tmp / "cache"
    text.write_text(TEXT, encoding="utf-8")
    text.chmod(0o644)
    monkeypatch.setenv("ADDNORM_CACHE", str(cache))
    expected = np.array(TokenCorpus.build(text).tokens)
    read_only(cache)
    got = as_a_reader(lambda: np.array(TokenCorpus.build(text).tokens))
    assert np.array_equal(got, expected)
    with pytest.raises(RuntimeError) as refused:
        as_a_reader(lambda: TokenCorpus.build(text, val_fraction=0.2))
    kind, message = refused.value.args
    assert kind == DataReadError.__name__
    assert message.startswith(f"{cache / 'tokens'}: the token cache cannot be written (")
    assert "--cache-dir" in message


def test_a_damaged_entry_in_a_read_only_cache_is_one_error_naming_it(shared_tmp, monkeypatch):
    text, cache = shared_tmp / "text.txt", shared_tmp / "cache"
    text.write_text(TEXT, encoding="utf-8")
    text.chmod(0o644)
    monkeypatch.setenv("ADDNORM_CACHE", str(cache))
    folder = _entry(TokenCorpus.build(text))
    _damage_bytes(folder)
    read_only(cache)
    with pytest.raises(RuntimeError) as refused:
        as_a_reader(lambda: TokenCorpus.build(text))
    kind, message = refused.value.args
    assert kind == DataReadError.__name__
    assert message.startswith(f"{folder}: the token cache entry is damaged (tokens.bin's CRC-32")


def test_the_checksum_is_zlibs_crc32_of_the_file(tmp_path):
    data = os.urandom(3 * 2**22 + 5)
    (tmp_path / "f").write_bytes(data)
    assert checksum(tmp_path / "f") == zlib.crc32(data)
