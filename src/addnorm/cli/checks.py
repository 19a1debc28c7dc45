"""Checks of the ``addnorm`` command's argument values that argparse cannot make: --device and
--threads (against the machine), --out (a non-empty path to a directory that can be written),
--config (a JSON file of ``{"model": {...}, "train": {...}}``, without the fields a task
owns), read by ``read_small_file``: a regular file of at most ``MAX_CONFIG_BYTES`` (never a
device such as /dev/zero, a FIFO or a folder, which could be read forever or block), and a
training run's sizes (:func:`addnorm.tasks.plan.check_run_fits`, its refusal naming the flag).

A bad value raises ``UsageError``, which ``addnorm.cli.parser.main`` reports like argparse's
own errors: one line on stderr, exit code 2; ``as_flags`` writes a config's error in flags.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from addnorm.utils.files import UnsafeFileError, parse_json, read_bytes

if TYPE_CHECKING:
    from addnorm.tasks.plan import RunPlan

__all__ = [
    "MAX_CONFIG_BYTES",
    "UsageError",
    "apply_runtime_flags",
    "as_flags",
    "check_out_dir",
    "check_out_file",
    "check_run_sizes",
    "out_dir",
    "read_config",
    "read_small_file",
    "resolve_device",
    "seed",
]

# The largest --config file read: a config of every field is a few kilobytes.
MAX_CONFIG_BYTES = 2**20
# --threads above this is refused when os.cpu_count() is unknown.
_MAX_THREADS = 1024


class UsageError(Exception):
    """A bad value found after parsing; reported like argparse's errors (exit code 2)."""


def apply_runtime_flags(args) -> str:
    """Check and apply --threads, and check and resolve --device to a device string."""
    import torch

    limit = os.cpu_count() or _MAX_THREADS
    if not 0 <= args.threads <= limit:
        raise UsageError(f"--threads must be between 0 and {limit} (the CPUs), got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    return resolve_device(args.device)


def resolve_device(name: str) -> str:
    """The device --device names: auto (cuda if available, else cpu), or cpu, cuda, cuda:N or
    mps when that device is present."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    match = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+))?", name)
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise UsageError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {name!r}")
    kind, index = match.groups()
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: CUDA is not available")
        count = torch.cuda.device_count()
        if index is not None and int(index) >= count:
            raise UsageError(f"--device {name}: there are {count} CUDA devices (0 to {count - 1})")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {name}: MPS is not available")
    return name


def out_dir(text: str) -> Path:
    """The argparse type of a run folder flag: a path, never the empty string (which would
    silently mean the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError(
            "must name a folder, got an empty string (use . for the current folder)"
        )
    return Path(text)


def seed(text: str) -> int:
    """The argparse type of a ``--seed`` flag: an integer from 0 to 2**64 - 1, the range every
    generator it seeds (torch's, NumPy's, Python's) takes."""
    from addnorm.training.config import MAX_SEED

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2**64 - 1, got {value}")
    return value


def check_out_dir(out: Path, flag: str = "--out") -> None:
    """``out`` must be a directory, or a path where one can be made."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out}: exists and is not a directory")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {out}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: cannot create or write in {parent}")


def check_out_file(path: Path, flag: str = "--out", *, make_parents: bool = False) -> None:
    """Raise ``UsageError`` unless the command can write a file at ``path`` (given as ``flag``)
    when its work is done, minutes later: ``path`` names a file, is missing or a regular file
    that can be replaced (not a folder, a FIFO or a device, which would block or fail), and
    its folder exists (or, with ``make_parents``, its nearest existing ancestor) and takes a
    new file. That last is tried for real, with an empty file created and removed, since the
    permission bits say nothing of ``/proc``, read-only mounts or full quotas."""
    import stat
    import tempfile

    where = f"{flag} {path}"
    if not str(path) or path.name in ("", ".", ".."):
        raise UsageError(f"{where}: must name a file")
    try:
        parent = path.parent
        if not make_parents and not parent.is_dir():
            what = "does not exist" if not parent.exists() else "is not a folder"
            raise UsageError(f"{where}: its folder {parent} {what}")
        while make_parents and not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise UsageError(f"{where}: {parent} is not a folder")
        mode = path.stat().st_mode if path.exists() else None
    except OSError as err:  # a name too long for the file system, a loop of links
        raise UsageError(f"{where}: {err.strerror or err}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"{where}: is a folder; name the file to write in it")
    if mode is not None and not stat.S_ISREG(mode):
        raise UsageError(f"{where}: exists and is not a regular file")
    if mode is not None and not os.access(path, os.W_OK):
        raise UsageError(f"{where}: exists and cannot be replaced (no write permission)")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".addnorm-probe-"):
            pass
    except OSError as err:
        reason = err.strerror or err
        raise UsageError(f"{where}: cannot create a file in {parent} ({reason})") from None


def read_config(path: Path, task_name: str) -> tuple[dict, dict]:
    """The "model" and "train" objects of a ``--config`` file, after checking its shape."""
    from addnorm.tasks.registry import task_class

    where = f"--config {path}"
    text = read_small_file(path, "--config", MAX_CONFIG_BYTES)
    try:
        data = parse_json(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}: not valid JSON: {err}") from None
    except ValueError as err:  # nested too deeply
        raise UsageError(f"{where}: {err}") from None
    expected = '{"model": {...}, "train": {...}}'
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object {expected}, got {_json_type(data)}")
    unknown = sorted(set(data) - {"model", "train"})
    if unknown:
        raise UsageError(f"{where}: expected {expected}, got the keys {unknown}")
    parts = {}
    for key in ("model", "train"):
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise UsageError(f'{where}: "{key}" must be a JSON object, got {_json_type(value)}')
        parts[key] = value
    owned = sorted(set(parts["model"]) & task_class(task_name).owned_fields)
    if owned:
        raise UsageError(
            f"{where}: {', '.join(owned)} are set by the {task_name} task (its tokenizers), "
            "not by a config"
        )
    return parts["model"], parts["train"]


def read_small_file(path: Path, flag: str, limit: int) -> str:
    """The UTF-8 text of the regular file ``path`` (given as ``flag``) of at most ``limit``
    bytes, read by :func:`addnorm.utils.files.read_bytes`; anything else (a device, a FIFO, a
    folder, a larger file, bytes that are not UTF-8, a read error) raises ``UsageError``
    starting with the flag and its value."""
    try:
        data = read_bytes(path, max_bytes=limit, what=flag)
    except UnsafeFileError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"{flag} {path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{flag} {path}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def check_run_sizes(plan: RunPlan, device: str) -> None:
    """Refuse (``UsageError``, naming the flag, the estimate and the limit) a training run
    whose model, batches or evaluation cannot fit in the memory ``device`` has now, before
    anything is allocated: :func:`addnorm.tasks.plan.check_run_fits`."""
    from addnorm.tasks.plan import RunSizeError, check_run_fits

    try:
        check_run_fits(plan, device)
    except RunSizeError as err:
        blame = "these settings" if err.setting is None else f"{_flag(err.setting)} {err.value}"
        raise UsageError(f"{blame}: {err.reason}") from None


def as_flags(message: str, fields) -> str:
    """``message`` (a config's error) with each of ``fields`` written as the flag that set it:
    ``lr must be finite, got nan`` -> ``--lr must be finite, got nan``."""
    for name in sorted(fields, key=len, reverse=True):  # max_len before len-like prefixes
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?!\w)", _flag(name), message)
    return message


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")
