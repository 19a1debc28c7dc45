"""The data record a run keeps of a user's files: resolving a path, fingerprinting without a
full read, naming what changed.

Provenance: a fingerprint is compared with itself after each kind of change (an identity:
unchanged files give the same digest; a change in a sampled byte, a size or a name gives
another); the bytes it reads are counted through a wrapped ``open``; the sample positions
follow from the stated rule (blocks from the first byte to the last).
"""

from __future__ import annotations

import builtins
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data import fingerprint as fp
from addnorm.data.fingerprint import (
    DataChangedError,
    DataError,
    DataFingerprint,
    DataRecord,
    fingerprint_files,
    reopening,
    resolve_data_files,
)


def _tree(root, files: dict[str, bytes]):
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def _fingerprint(path):
    return fingerprint_files(*reversed(resolve_data_files(path)))


def test_a_folder_resolves_to_its_files_below_it_sorted_without_hidden_ones(tmp_path):
    _tree(tmp_path, {"b.txt": b"b", "a/z.txt": b"z", "a/c.txt": b"c", ".hidden": b"h",
                     ".git/config": b"x", "a/.swp": b"s"})
    root, files = resolve_data_files(tmp_path)
    assert root == tmp_path
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["a/c.txt", "a/z.txt", "b.txt"]


def test_a_file_resolves_to_itself_and_a_glob_to_its_matches(tmp_path):
    _tree(tmp_path, {"x/a.txt": b"a", "x/b.md": b"b", "x/y/c.txt": b"c"})
    assert resolve_data_files(tmp_path / "x" / "a.txt") == (tmp_path / "x", [tmp_path / "x/a.txt"])
    root, files = resolve_data_files(str(tmp_path / "x" / "**" / "*.txt"))
    assert root == tmp_path / "x"
    assert files == [tmp_path / "x/a.txt", tmp_path / "x/y/c.txt"]


def test_accept_filters_a_folder_and_names_the_kind_when_nothing_is_left(tmp_path):
    _tree(tmp_path, {"a.txt": b"a", "b.png": b"b"})
    _, files = resolve_data_files(tmp_path, accept=lambda p: p.suffix == ".png")
    assert files == [tmp_path / "b.png"]
    with pytest.raises(DataError, match="holds no image files"):
        resolve_data_files(tmp_path, accept=lambda p: p.suffix == ".jpg", kinds="image files")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.txt", "no such file or folder"),
        (lambda d: str(d / "*.nothing"), "matches nothing"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "the folder holds no files"),
        (lambda d: os.mkfifo(d / "fifo") or d / "fifo", "not a regular file or folder"),
    ],
)
def test_a_path_that_names_no_files_is_one_data_error_naming_it(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(DataError, match=message) as info:
        resolve_data_files(path, what="--data")
    assert str(info.value).startswith(f"--data {path}:")


def test_unchanged_files_give_the_same_fingerprint_and_a_copy_too(tmp_path):
    files = {"a.txt": b"alpha " * 5000, "b/c.txt": b"gamma"}
    first = _fingerprint(_tree(tmp_path / "one", files))
    assert _fingerprint(tmp_path / "one") == first
    copy = _fingerprint(_tree(tmp_path / "two", files))  # other mtimes, same content
    assert copy == first
    assert first.n_files == 2 and first.size == 30005


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: (d / "a.txt").write_bytes(b"x" * 10), "a.txt: 30000 -> 10 bytes"),
        (lambda d: (d / "b.txt").unlink(), "b.txt: removed"),
        (lambda d: (d / "c.txt").write_bytes(b"new"), "c.txt: added"),
        (lambda d: _poke(d / "a.txt", 0), "a.txt: content changed, same size"),
        (lambda d: _poke(d / "a.txt", 29999), "a.txt: content changed, same size"),
    ],
)
def test_a_change_is_named_file_by_file(tmp_path, change, named):
    _tree(tmp_path, {"a.txt": b"abcdef" * 5000, "b.txt": b"b"})
    before = _fingerprint(tmp_path)
    change(tmp_path)
    after = _fingerprint(tmp_path)
    assert named in before.changes(after)
    record = DataRecord(str(tmp_path), "text", before)
    with pytest.raises(DataChangedError, match=named.split(":")[0]):
        record.check_unchanged(after)
    record.check_unchanged(before)  # the same files pass


def _poke(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_large_file_is_fingerprinted_from_a_bounded_sample(tmp_path, monkeypatch):
    """A 4 MiB file with a budget of 64 KiB: at most the budget is read, its first and last
    blocks among it, so a change at either end is seen."""
    big = tmp_path / "big.txt"
    big.write_bytes(os.urandom(4 * 2**20))
    read = []
    real_open = builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(builtins, "open", lambda *a, **k: Counting(real_open(*a, **k)))
    before = fingerprint_files([big], tmp_path)
    monkeypatch.undo()
    assert sum(read) <= fp.MAX_FILE_SAMPLE
    _poke(big, 4 * 2**20 - 1)
    assert fingerprint_files([big], tmp_path).digest != before.digest


def test_many_files_keep_only_totals_and_still_see_a_change(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "MAX_LISTED_FILES", 3)
    _tree(tmp_path, {f"{i}.txt": bytes([65 + i]) for i in range(5)})
    before = _fingerprint(tmp_path)
    assert before.files == ()
    _poke(tmp_path / "2.txt", 0)
    assert before.changes(_fingerprint(tmp_path)) == [
        "the content of its 5 files changed (same names and sizes)"
    ]
    (tmp_path / "5.txt").write_bytes(b"more")
    assert before.changes(_fingerprint(tmp_path)) == ["5 files of 5 bytes -> 6 files of 9 bytes"]


def test_a_record_survives_json_and_reads_back_equal(tmp_path):
    _tree(tmp_path, {"a.txt": b"a"})
    record = DataRecord(str(tmp_path), "text", _fingerprint(tmp_path),
                        split={"val_fraction": 0.05}, tokenizer={"kind": "char"},
                        details={"bytes_entropy": 1.5})
    assert DataRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    with pytest.raises(ValueError, match="not a data record|not a data fingerprint"):
        DataRecord.from_dict({"path": "x"})


@examples(25)
@given(
    names=st.lists(st.text("abc/", min_size=1, max_size=6), min_size=1, max_size=4, unique=True),
    sizes=st.lists(st.integers(0, 3000), min_size=4, max_size=4),
)
def test_fingerprints_of_different_listings_differ_and_changes_name_each_file(names, sizes):
    """Two listings with the same names and sizes fingerprint alike; changing one size is
    one change naming that file."""
    a = [fp.FileEntry(n, s, "h") for n, s in zip(names, sizes, strict=False)]
    one = DataFingerprint(len(a), sum(e.size for e in a), "d1", tuple(a))
    b = [*a[:-1], fp.FileEntry(a[-1].name, a[-1].size + 1, "h")]
    two = DataFingerprint(len(b), sum(e.size for e in b), "d2", tuple(b))
    assert one.changes(two) == [f"{a[-1].name}: {a[-1].size} -> {a[-1].size + 1} bytes"]


def _record(tmp_path) -> DataRecord:
    root = _tree(tmp_path / "d", {"a.txt": b"alpha\n"})
    return DataRecord(str(root), "text", fingerprint_files([root / "a.txt"], root))


def test_reopening_names_the_recorded_path_when_the_files_are_gone_or_the_record_is_damaged(
        tmp_path):
    record = _record(tmp_path)
    with pytest.raises(DataChangedError, match="cannot be read any more") as gone:
        with reopening(record):
            raise DataError("no such file")
    assert str(gone.value).startswith(f"{record.path}: ")
    for damaged in (KeyError("val_fraction"), TypeError("float(None)"), ValueError("x")):
        with pytest.raises(DataChangedError, match="the run's data record is damaged"):
            with reopening(record):
                raise damaged


def test_reopening_lets_a_change_and_other_errors_through_as_they_are(tmp_path):
    record = _record(tmp_path)
    change = DataChangedError("a.txt: 6 -> 7 bytes")
    with pytest.raises(DataChangedError) as raised:
        with reopening(record):
            raise change
    assert raised.value is change
    with pytest.raises(OSError):  # a read failing midway is not a change of the data
        with reopening(record):
            raise OSError("disk")
    with reopening(record):
        pass  # nothing raised, nothing changed
