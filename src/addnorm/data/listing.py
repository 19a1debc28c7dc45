"""The files a user's data path names: a file, a folder (searched recursively) or a glob, as
a sorted list of regular files, with symbolic links followed only where they stay inside it.

:func:`resolve_data_files` (and :func:`resolve_data_listing`, which also names the links left
out): a path as a user gives it, a file (its folder is the root), a folder (names starting
with "." skipped at every level) or a glob (its longest part without wildcards is the root).
A file or folder name that is not UTF-8 is refused, naming its bytes.

A link inside ``--data pics/`` that leads outside the folder (``secret.txt -> /etc/passwd``,
``more -> ../other``) is not read unless the user asks (``follow_links``): the files a run
trains on are the folder's own, and the record names what was left out. A link to a file
inside the folder is read; a link to a folder inside it is not walked (the walk reaches that
folder itself). With ``follow_links`` every link is followed, each real folder walked once
(a link to a parent does not loop). Names starting with "." are skipped at every level.

:func:`walk_folder` and :func:`filter_glob`, the two ways of listing, return a :class:`Walk`:
the regular files found (not yet sorted) and the links skipped, each by its name relative to
the root; they raise nothing, and :func:`resolve_data_listing` turns an empty one into its
:class:`~addnorm.data.data_errors.DataError`.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from addnorm.data.data_errors import DataError, data_note

__all__ = [
    "DataListing",
    "Walk",
    "absolute_path",
    "filter_glob",
    "inside",
    "is_glob",
    "note_skipped_links",
    "relative_name",
    "resolve_data_files",
    "resolve_data_listing",
    "walk_folder",
]

_GLOB_CHARS = frozenset("*?[")


@dataclass
class Walk:
    """What a walk found: ``files`` (regular files, links to them included where followed)
    and ``skipped_links`` (names below the root of links leading out of it, not followed)."""

    files: list[Path] = field(default_factory=list)
    skipped_links: list[str] = field(default_factory=list)


def inside(path: str | os.PathLike, real_root: str) -> bool:
    """Whether ``path``'s real location (links resolved) is ``real_root`` or below it."""
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def walk_folder(
    root: Path, *, follow_links: bool = False, accept: Callable[[Path], bool] | None = None
) -> Walk:
    """Every regular file below ``root`` that ``accept`` takes (all if None), hidden names
    skipped, links treated as the module docstring says."""
    real_root = os.path.realpath(root)
    walk = Walk()
    seen = {real_root}
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue  # an unreadable folder holds nothing a run could read
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            link = entry.is_symlink()
            if link and not follow_links and not inside(path, real_root):
                if _is_dir(path) or accept is None or accept(path):
                    walk.skipped_links.append(relative_name(path, root))
                continue
            if _is_dir(path):
                if link and not follow_links:
                    continue  # inside the root: the walk reaches its target itself
                real = os.path.realpath(path)
                if real not in seen:
                    seen.add(real)
                    pending.append(path)
            elif _is_regular(path) and (accept is None or accept(path)):
                walk.files.append(path)
    walk.skipped_links.sort()
    return walk


def filter_glob(
    matches: Iterable[Path], root: Path, *, follow_links: bool = False,
    accept: Callable[[Path], bool] | None = None,
) -> Walk:
    """A glob's ``matches`` as :func:`walk_folder` keeps a folder's: regular files that
    ``accept`` takes, and only those whose real location is below ``root`` (the glob's fixed
    part) unless ``follow_links``."""
    real_root = os.path.realpath(root)
    walk = Walk()
    for path in matches:
        if not _is_regular(path) or (accept is not None and not accept(path)):
            continue
        if not follow_links and not inside(path, real_root):
            walk.skipped_links.append(relative_name(path, root))
            continue
        walk.files.append(path)
    walk.skipped_links.sort()
    return walk


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except OSError:
        return False


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def absolute_path(path: str | os.PathLike) -> str:
    """``path`` with ``~`` expanded, made absolute (not resolved: links and globs stay)."""
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def is_glob(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a glob pattern rather than a file or folder that exists."""
    text = os.fspath(path)
    return not os.path.lexists(text) and any(c in _GLOB_CHARS for c in text)


@dataclass(frozen=True)
class DataListing:
    """The files a path names (:func:`resolve_data_listing`): their ``root``, the ``files``
    sorted by their names below it, and ``skipped_links``: the names of a folder's or glob's
    links that lead outside it, not followed (see :mod:`addnorm.data.file_walk`)."""

    root: Path
    files: list[Path]
    skipped_links: tuple[str, ...] = ()

    def names(self) -> list[str]:
        """Each file's name below the root, with "/"."""
        return [relative_name(p, self.root) for p in self.files]


def resolve_data_files(
    path: str | os.PathLike,
    *,
    what: str = "data",
    accept: Callable[[Path], bool] | None = None,
    kinds: str = "files",
    follow_links: bool = False,
) -> tuple[Path, list[Path]]:
    """``(root, files)`` of :func:`resolve_data_listing` (the same arguments)."""
    listing = resolve_data_listing(path, what=what, accept=accept, kinds=kinds,
                                   follow_links=follow_links)
    return listing.root, listing.files


def resolve_data_listing(
    path: str | os.PathLike,
    *,
    what: str = "data",
    accept: Callable[[Path], bool] | None = None,
    kinds: str = "files",
    follow_links: bool = False,
) -> DataListing:
    """The regular files ``path`` names, sorted by their name relative to the root. ``path``
    is a file (its folder is the root), a folder (every file below it, names starting with
    "." skipped at every level; the folder is the root) or a glob (``**`` for any depth; its
    longest part without wildcards is the root). A folder's or glob's links are followed
    only where they stay inside the root, unless ``follow_links``; the others are listed in
    ``skipped_links``.

    ``accept``: keep only the files it accepts (a folder's or glob's; ``kinds`` names them in
    messages, e.g. "image files"). Raises :class:`DataError` starting with ``what`` and the
    path: it does not exist, matches nothing, is not a regular file, holds no such files, or
    holds a file whose name below the root is not UTF-8.
    """
    text = absolute_path(path)
    where = f"{what} {os.fspath(path)}"
    if is_glob(text):
        root = Path(_glob_root(text))
        matches = sorted(Path(p) for p in glob.glob(text, recursive=True))
        walk = filter_glob(matches, root, follow_links=follow_links, accept=accept)
        if not walk.files:
            found = "matches nothing" if not matches else f"matches no {kinds}"
            raise DataError(f"{where}: {found}{_skipped_hint(walk.skipped_links)}")
        return _listing(where, root, walk.files, walk.skipped_links)
    target = Path(text)
    try:
        info = target.stat()
    except FileNotFoundError:
        raise DataError(f"{where}: no such file or folder") from None
    except OSError as err:
        raise DataError(f"{where}: {err.strerror or err}") from None
    if stat.S_ISDIR(info.st_mode):
        walk = walk_folder(target, follow_links=follow_links, accept=accept)
        if not walk.files:
            raise DataError(f"{where}: the folder holds no {kinds}"
                            f"{_skipped_hint(walk.skipped_links)}")
        return _listing(where, target, walk.files, walk.skipped_links)
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{where}: not a regular file or folder")
    return _listing(where, target.parent, [target], ())


def _listing(where: str, root: Path, files: list[Path], skipped: Sequence[str]) -> DataListing:
    """The listing, sorted by name, after refusing a name that is not UTF-8 (a file system
    hands such bytes to Python as lone surrogates, which no text format can hold)."""
    named = sorted((relative_name(p, root), p) for p in files)
    for name, _ in named:
        if not _is_utf8(name):
            shown = os.fsencode(name).decode("utf-8", "backslashreplace")
            raise DataError(f"{where}: the name {shown} is not UTF-8 text; rename it (a "
                            "name is recorded with the run, and a folder's names its class)")
    return DataListing(root, [p for _, p in named], tuple(skipped))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def note_skipped_links(where: str, skipped: Sequence[str]) -> None:
    """:func:`data_note` naming the links a listing left out, if any."""
    if skipped:
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3
                                          else "")
        data_note(f"{where}: skipped {len(skipped)} link{'s' if len(skipped) > 1 else ''} "
                  f"leading outside it ({shown}); --follow-links reads them")


def _skipped_hint(skipped: Sequence[str]) -> str:
    if not skipped:
        return ""
    return (f" (it holds {len(skipped)} link{'s' if len(skipped) > 1 else ''} leading outside "
            f"it, not followed: {', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''}; "
            "--follow-links reads them)")


def _glob_root(pattern: str) -> str:
    """The longest leading folder of ``pattern`` without wildcards."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts[:-1]:
        if any(c in _GLOB_CHARS for c in part):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else os.sep


def relative_name(path: Path, root: Path) -> str:
    """``path``'s name below ``root`` with "/" (its whole path when it is not below it)."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()
