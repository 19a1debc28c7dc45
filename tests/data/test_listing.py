"""Listing a user's data folder: links that stay inside it are read, links that lead out of it
are skipped and named (unless the user asks to follow them), a loop of links ends, and a
name that is not UTF-8 is refused naming its bytes.

Provenance: each expected listing is the folder's own files, written by the test (an
identity: what the walk returns is exactly what was put inside), and each skipped name is a
link the test made to a place outside the folder.
"""

from __future__ import annotations

import os

import pytest

from addnorm.data.data_errors import DataError
from addnorm.data.listing import (
    filter_glob,
    inside,
    resolve_data_files,
    resolve_data_listing,
    walk_folder,
)


def _layout(tmp_path):
    """``data/`` with a file, a subfolder, a link to a file inside, a link to a secret file
    outside, a link to an outside folder and a link to its own parent (a loop)."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "sub").mkdir(parents=True)
    outside.mkdir()
    (data / "a.txt").write_text("a")
    (data / "sub" / "b.txt").write_text("b")
    (outside / "secret.txt").write_text("secret")
    (outside / "more.txt").write_text("more")
    os.symlink(data / "a.txt", data / "same.txt")
    os.symlink(outside / "secret.txt", data / "passwd.txt")
    os.symlink(outside, data / "elsewhere")
    os.symlink(data, data / "sub" / "loop")
    return data, outside


def _names(walk, root):
    return sorted(p.relative_to(root).as_posix() for p in walk.files)


def test_links_inside_are_read_and_links_outside_are_skipped_by_name(tmp_path):
    data, _ = _layout(tmp_path)
    walk = walk_folder(data)
    assert _names(walk, data) == ["a.txt", "same.txt", "sub/b.txt"]
    assert walk.skipped_links == ["elsewhere", "passwd.txt"]


def test_following_links_reads_outside_and_walks_each_real_folder_once(tmp_path):
    data, _ = _layout(tmp_path)
    walk = walk_folder(data, follow_links=True)
    assert _names(walk, data) == ["a.txt", "elsewhere/more.txt", "elsewhere/secret.txt",
                                  "passwd.txt", "same.txt", "sub/b.txt"]
    assert walk.skipped_links == []


def test_accept_filters_files_and_names_only_the_skipped_links_it_would_take(tmp_path):
    data, _ = _layout(tmp_path)
    walk = walk_folder(data, accept=lambda p: p.name == "b.txt")
    assert _names(walk, data) == ["sub/b.txt"]
    assert walk.skipped_links == ["elsewhere"]  # a folder might hold such files


def test_a_globs_matches_outside_its_root_are_skipped(tmp_path):
    data, outside = _layout(tmp_path)
    matches = sorted(data.glob("*.txt"))
    walk = filter_glob(matches, data)
    assert _names(walk, data) == ["a.txt", "same.txt"]
    assert walk.skipped_links == ["passwd.txt"]
    assert _names(filter_glob(matches, data, follow_links=True), data) == [
        "a.txt", "passwd.txt", "same.txt"]
    assert inside(data / "same.txt", os.path.realpath(data))
    assert not inside(data / "passwd.txt", os.path.realpath(data))
    assert not inside(outside, os.path.realpath(data))


def test_a_name_that_is_not_utf8_is_refused_naming_its_bytes(tmp_path):
    """Issue 41: a class folder named in Latin-1 gave a nameless UnicodeEncodeError; the
    listing refuses it, naming the bytes."""
    folder = os.fsencode(tmp_path / "pics" / "caf\xe9".encode("latin-1").decode("utf-8",
                                                                              "surrogateescape"))
    os.makedirs(folder)
    (tmp_path / "pics" / "ok").mkdir()
    (tmp_path / "pics" / "ok" / "1.txt").write_text("x")
    with open(os.path.join(folder, b"1.txt"), "wb") as f:
        f.write(b"y")
    with pytest.raises(DataError, match=r"the name caf\\xe9/1.txt is not UTF-8 text") as info:
        resolve_data_files(tmp_path / "pics", what="--data")
    assert str(info.value).startswith(f"--data {tmp_path / 'pics'}:")


def test_a_folders_links_outside_it_are_listed_as_skipped_unless_followed(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes(b"a")
    (tmp_path / "secret").write_bytes(b"s")
    os.symlink(tmp_path / "secret", tmp_path / "d" / "b.txt")
    listing = resolve_data_listing(tmp_path / "d")
    assert listing.names() == ["a.txt"] and listing.skipped_links == ("b.txt",)
    followed = resolve_data_listing(tmp_path / "d", follow_links=True)
    assert followed.names() == ["a.txt", "b.txt"] and followed.skipped_links == ()
    (tmp_path / "d" / "a.txt").unlink()
    with pytest.raises(DataError, match=r"holds no files \(it holds 1 link leading outside it, "
                                        r"not followed: b.txt; --follow-links reads them\)"):
        resolve_data_files(tmp_path / "d")
