"""Running a check where a read-only folder is read-only: here, or, when the tests run as root
(whom file permissions do not stop), in a forked child that has given up root for
``nobody``. Used by the tests of a read-only token cache and of an unwritable TensorBoard
folder (issue 41)."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

NOBODY = 65534


def read_only(path: Path) -> None:
    """Make ``path`` and everything below it read-only (folders 0o555, files 0o444)."""
    for folder, _, files in os.walk(path):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)


def as_a_reader(fn: Callable[[], Any]) -> Any:
    """``fn()`` where read-only folders cannot be written (see the module docstring). Its
    result (which must pickle), or its exception re-raised as ``RuntimeError(type name,
    message)``."""
    if os.geteuid() != 0:
        try:
            return fn()
        except Exception as err:
            raise RuntimeError(type(err).__name__, str(err)) from None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = ("ok", fn())
        except BaseException as err:
            result = ("error", (type(err).__name__, str(err)))
        with os.fdopen(write, "wb") as out:
            pickle.dump(result, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        kind, value = pickle.load(pipe)
    os.waitpid(pid, 0)
    if kind == "error":
        raise RuntimeError(*value)
    return value


@contextlib.contextmanager
def shared_folder() -> Iterator[Path]:
    """A folder every user can read (``tmp_path`` is root's alone when root runs the tests);
    made writable again and removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="addnorm-readonly-"))
    folder.chmod(0o755)
    yield folder
    for sub, _, _ in os.walk(folder):
        os.chmod(sub, 0o755)
    shutil.rmtree(folder)
