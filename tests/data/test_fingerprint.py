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


class _CountingOpen:
    """``open`` that counts the bytes read through the files it opens."""

    def __init__(self, real):
        self.real, self.read = real, []

    def __call__(self, *args, **kwargs):
        counter, f = self, self.real(*args, **kwargs)

        class Counting:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def read(self, n=-1):
                data = f.read(n)
                counter.read.append(len(data))
                return data

            def __getattr__(self, name):
                return getattr(f, name)

        return Counting()


def _edit_middle(path, offset: int, new: bytes) -> None:
    """Overwrite bytes in place (same size), as an editor fixing a typo does."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(new)


def test_a_same_size_edit_anywhere_in_a_file_is_seen_and_named(tmp_path):
    """Issue 41's first finding: a 730 KB corpus with three letters changed. The version 1
    rule (a 64 KiB sample) gives the same fingerprint before and after (the failure); the
    file hashed whole gives another, and the change names the file."""
    text = tmp_path / "corpus.txt"
    line = b"the quick brown fox jumps over the lazy dog 0123456789\n"
    text.write_bytes(line * (730_000 // len(line)))
    old_before = fingerprint_files([text], tmp_path, version=1)
    before = fingerprint_files([text], tmp_path)
    offset = 400_003  # between the version 1 sample's blocks (every ~45.6 KB, 4 KB each)
    assert not any(start <= offset < start + 4096
                   for start in (i * (text.stat().st_size - 4096) // 15 for i in range(16)))
    _edit_middle(text, offset, b"XYZ")
    assert fingerprint_files([text], tmp_path, version=1) == old_before  # the old blind spot
    after = fingerprint_files([text], tmp_path)
    assert after.digest != before.digest
    assert before.changes(after) == ["corpus.txt: content changed, same size"]
    assert before.files[0].stamp is None  # hashed whole: a copy fingerprints alike


def test_a_file_past_the_budget_is_sampled_and_known_by_its_stamp(tmp_path, monkeypatch):
    """A 4 MiB file with a 1 MiB budget: at most ``MAX_FILE_SAMPLE`` bytes read, and its
    modification time and inode recorded, so an edit the sample misses is seen, and so is
    the same bytes put there as another file."""
    monkeypatch.setattr(fp, "HASH_BUDGET", 2**20)
    big = tmp_path / "big.txt"
    big.write_bytes(os.urandom(4 * 2**20))
    counting = _CountingOpen(builtins.open)
    monkeypatch.setattr(builtins, "open", counting)
    before = fingerprint_files([big], tmp_path)
    monkeypatch.setattr(builtins, "open", counting.real)
    assert sum(counting.read) <= fp.MAX_FILE_SAMPLE
    info = big.stat()
    assert before.files[0].stamp == (info.st_mtime_ns, info.st_ino)
    _edit_middle(big, 2 * 2**20 + 7, b"!")  # between the sample's blocks
    os.utime(big, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))
    after = fingerprint_files([big], tmp_path)
    assert after.digest != before.digest
    assert before.changes(after)[0].startswith("big.txt: modified or replaced, same size")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "big.txt").write_bytes(big.read_bytes())
    os.utime(copy / "big.txt", ns=(info.st_atime_ns, after.files[0].stamp[0]))
    assert fingerprint_files([copy / "big.txt"], copy).digest != after.digest  # another inode


def test_the_budget_takes_the_smallest_files_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "HASH_BUDGET", 3000)
    _tree(tmp_path, {"a.txt": b"a" * 2500, "b.txt": b"b" * 400, "c.txt": b"c" * 500})
    entries = {e.name: e for e in _fingerprint(tmp_path).files}
    assert [n for n, e in sorted(entries.items()) if e.stamp is None] == ["b.txt", "c.txt"]
    assert entries["a.txt"].stamp is not None


def test_an_older_record_reads_back_and_is_checked_by_its_own_rule(tmp_path):
    """A record written before version 2 (no ``fingerprint_version``, a 64 KiB sample) is a
    version 1 fingerprint: unchanged files pass its check, a change is named, and it cannot be
    checked against a version 2 fingerprint alone."""
    root = _tree(tmp_path / "d", {"a.txt": b"alpha\n" * 30000})
    files = [root / "a.txt"]
    old = fingerprint_files(files, root, version=1).to_dict()
    del old["fingerprint_version"]
    record = DataRecord.from_dict({"path": str(root), "kind": "text", **old, "split": {}})
    assert record.fingerprint.version == 1
    now = fingerprint_files(files, root)
    record.check_unchanged(now, files=files, root=root)
    with pytest.raises(ValueError, match="pass files and root"):
        record.check_unchanged(now)
    (root / "a.txt").write_bytes(b"alpha\n" * 30001)
    with pytest.raises(DataChangedError, match=r"a.txt: 180000 -> 180006 bytes"):
        record.check_unchanged(fingerprint_files(files, root), files=files, root=root)


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

