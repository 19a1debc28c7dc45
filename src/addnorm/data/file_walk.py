"""The files below a user's data folder (or a glob's matches), with symbolic links followed
only where they stay inside it.

A link inside ``--data pics/`` that leads outside the folder (``secret.txt -> /etc/passwd``,
``more -> ../other``) is not read unless the user asks (``follow_links``): the files a run
trains on are the folder's own, and the record names what was left out. A link to a file
inside the folder is read; a link to a folder inside it is not walked (the walk reaches that
folder itself). With ``follow_links`` every link is followed, each real folder walked once
(a link to a parent does not loop). Names starting with "." are skipped at every level.

:func:`walk_folder` and :func:`filter_glob` return a :class:`Walk`: the regular files found
(not yet sorted) and the links skipped, each by its name relative to the root. Nothing here
raises for bad data: the caller (:func:`addnorm.data.fingerprint.resolve_data_listing`) turns
an empty result into its message.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Walk", "filter_glob", "inside", "walk_folder"]


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
                    walk.skipped_links.append(_name(path, root))
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
            walk.skipped_links.append(_name(path, root))
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


def _name(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()
