"""The ``addnorm`` command given hostile run files and inputs: text that is not UTF-8 or has no
end, a closed stdin, a resealed checkpoint whose optimizer tensor has the wrong shape, junk in
``metrics.jsonl``, a user's folders named like checkpoints, lock files from other hosts or with
impossible pids, an ``--out`` that cannot be written, a ``--config`` that never ends, and two
writers racing for one folder.

Each case must end in a clear one-line error (exit 2 for flags and folders, 1 for inputs and
checkpoints) before any work, or in a run that goes on without losing anything; never a
traceback, a hang or a deleted file addnorm did not write.

Provenance: the folder's contents before and after (what addnorm did not write is still there,
byte for byte), the records written compared with those read back, the rules in the docstrings
of ``addnorm.training.run_dir`` (locks), ``addnorm.training.checkpoint`` (what is deleted) and
``addnorm.training.metrics`` (what a record is), and the exit codes ``addnorm.cli.parser``
documents. Property tests use hypothesis with a small, derandomized budget.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from properties import examples
from safetensors.torch import load_file, save_file

from addnorm.cli import embed as embed_cli
from addnorm.cli import train as train_command
from addnorm.cli.checks import MAX_CONFIG_BYTES
from addnorm.cli.parser import main
from addnorm.cli.translate_input import stdin_inputs
from addnorm.tasks.translate import TranslateTask
from addnorm.training import run_dir as run_dir_module
from addnorm.training.checkpoint import (
    CheckpointWriteError,
    find_checkpoint,
    save_checkpoint,
)
from addnorm.training.metrics import MAX_LINE_BYTES, MetricsLog, read_metrics
from addnorm.training.run_dir import LOCK, MARKER, RunDirError, RunLock, check_unlocked, clear_run
from addnorm.training.state import optimizer_from_parts, optimizer_to_parts

TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--d-ff", "64",
    "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--batch-size", "4",
    "--eval-size", "4", "--log-every", "1", "--quiet", "--device", "cpu", "--threads", "1",
]
# A small, fixed budget: the default suite stays deterministic and takes seconds.
PROPERTY = examples(40)


def tree(folder) -> dict[str, bytes | str | None]:
    """Every path under ``folder`` with its bytes (None for a folder, "-> target" for a
    link, which is not followed)."""
    def content(p: Path) -> bytes | str | None:
        if p.is_symlink():
            return f"-> {os.readlink(p)}"
        return None if p.is_dir() else p.read_bytes()

    return {str(p.relative_to(folder)): content(p) for p in sorted(folder.rglob("*"))}


def skip_evaluation(monkeypatch) -> None:
    """Skip the held-out scoring (seconds of decoding; not what is tested here)."""
    scores = {"test_exact_match": 0.0}
    monkeypatch.setattr(TranslateTask, "evaluate_run", lambda self, model, cfg: scores)
    monkeypatch.setattr(TranslateTask, "run_samples", lambda self, model: [])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 2-step translate run with checkpoints of steps 1 and 2."""
    out = tmp_path_factory.mktemp("hostile_run_files") / "translate"
    with pytest.MonkeyPatch.context() as patch:
        skip_evaluation(patch)
        argv = ["train", "translate", *TINY, "--max-steps", "2", "--checkpoint-every", "1"]
        assert main([*argv, "--out", str(out)]) == 0
    return out


@pytest.fixture
def copy(run, tmp_path, monkeypatch):
    """A copy of ``run`` to tamper with, evaluation skipped for the runs that follow."""
    skip_evaluation(monkeypatch)
    target = tmp_path / "copy"
    shutil.copytree(run, target)
    return target


def resume(out, *flags: str) -> int:
    return main(["train", "translate", "--resume", "--out", str(out), "--quiet", "--threads",
                 "1", *flags])


def reseal(checkpoint) -> None:
    """Rewrite the manifest's sizes and hashes for the files it lists (a careful forger)."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (checkpoint / name).read_bytes()
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"addnorm {command}: error: "), err
    return err[0]


# 1. embed reads its inputs as translate does ---------------------------------------------------


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to load the model fails the test: refusals must come before it."""

    def refuse():
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(embed_cli, "_model_dir", refuse)


def test_embed_refuses_undecodable_stdin_lines_by_number_before_loading(
    no_model, monkeypatch, capsys
):
    data = b"A man eats.\n\xff\xfe not text\nThe sky is blue.\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    assert main(["embed"]) == 1
    out, err = capsys.readouterr()
    # 0xff cannot start a UTF-8 sequence: the decoder's own reason, at the line's byte 0.
    assert out == "" and err.splitlines() == [
        "addnorm embed: error: line 2: not UTF-8 text (invalid start byte at byte 0)"
    ]


def test_embed_refuses_an_argument_with_undecodable_bytes(no_model, capsys):
    # Python hands argv bytes that are not UTF-8 over as lone surrogates (surrogateescape).
    assert main(["embed", "fine", os.fsdecode(b"caf\xe9")]) == 1
    assert "argument 2: not UTF-8 text" in one_error_line(capsys, "embed")


@pytest.mark.parametrize("stdin", [None, "closed"])
def test_embed_with_a_closed_stdin_exits_2_with_one_line(stdin, no_model, monkeypatch, capsys):
    stream = None
    if stdin == "closed":
        stream = io.StringIO()
        stream.close()
    monkeypatch.setattr(sys, "stdin", stream)
    assert main(["embed"]) == 2
    assert one_error_line(capsys, "embed").endswith(
        "no texts given and stdin is closed; pass texts as arguments or lines"
    )


class EndlessLine(io.RawIOBase):
    """``n`` bytes of "x", then "\\n" and ``tail``, made as they are read (never held)."""

    def __init__(self, n: int, tail: bytes) -> None:
        self.left, self.tail = n, b"\n" + tail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.left > 0:
            size = min(len(buffer), self.left)
            buffer[:size] = b"x" * size
            self.left -= size
            return size
        size = min(len(buffer), len(self.tail))
        buffer[:size], self.tail = self.tail[:size], self.tail[size:]
        return size


class Recording(io.BufferedReader):
    """Remembers the size of every ``readline``."""

    asked: list[int]

    def readline(self, size: int | None = -1) -> bytes:
        self.asked.append(-1 if size is None else size)
        return super().readline(size)


def test_embed_skips_a_200_mb_line_in_blocks_and_refuses_it(no_model, monkeypatch, capsys):
    n = 200 * 2**20
    stream = Recording(EndlessLine(n, b"A man eats.\n"), buffer_size=1 << 16)
    stream.asked = []
    stdin = io.TextIOWrapper(stream, encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["embed"]) == 1
    line = one_error_line(capsys, "embed")
    assert f"line 1: over {embed_cli.MAX_CHARS} characters ({n + 1} bytes or more)" in line
    # Never asked for more than one line's limit: the line was never held whole.
    assert stream.asked and max(stream.asked) <= 4 * embed_cli.MAX_CHARS + 2
    assert min(stream.asked) > 0


def test_embed_inputs_are_the_lines_translate_reads():
    # The same reader: lines without their ends, each checked, with no vocabulary (None).
    items = list(stdin_inputs(io.BytesIO(b"a\r\n\n\xc3\xa9t\xc3\xa9\n"), None, 10))
    assert [(i.where, i.text, i.problem) for i in items] == [
        ("line 1", "a", None), ("line 2", "", None), ("line 3", "été", None)
    ]


# 2. a resealed optimizer tensor of the wrong shape -------------------------------------------


def tamper_optimizer(checkpoint, key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Replace optimizer tensor ``key`` by zeros of ``shape``; reseal; return the old shape."""
    tensors = load_file(checkpoint / "optimizer.safetensors")
    old = tuple(tensors[key].shape)
    tensors[key] = torch.zeros(shape)
    save_file(tensors, checkpoint / "optimizer.safetensors")
    reseal(checkpoint)
    return old


@pytest.mark.parametrize("name", ["exp_avg", "exp_avg_sq"])
def test_resume_refuses_an_optimizer_moment_of_the_wrong_shape_naming_it(
    name, copy, capsys
):
    checkpoint = find_checkpoint(copy)
    key = f"0.{name}"
    old = tamper_optimizer(checkpoint, key, (3, 5))
    before = tree(copy)
    assert resume(copy, "--max-steps", "4") == 1
    line = one_error_line(capsys, "train")
    assert "optimizer.safetensors" in line and repr(key) in line
    assert f"shape (3, 5), expected {old}" in line
    assert tree(copy) == before  # not a step trained, not a line logged


def shapes_other_than(shape: tuple[int, ...]):
    dims = st.lists(st.integers(0, 6), max_size=3).map(tuple)
    return dims.filter(lambda s: s != shape)


@PROPERTY
@given(data=st.data())
def test_optimizer_parts_of_any_wrong_shape_are_refused_naming_the_tensor(data):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    tensors, skeleton = optimizer_to_parts(optimizer)
    key = data.draw(st.sampled_from(sorted(tensors)), label="tensor")
    tensors[key] = torch.zeros(data.draw(shapes_other_than(tuple(tensors[key].shape))))
    fresh = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=f"optimizer tensor {key!r} has shape"):
        optimizer_from_parts(fresh, tensors, skeleton)
    assert fresh.state_dict()["state"] == {}  # refused before anything was loaded


BAD_MOMENTS = [
    (torch.zeros((3,), dtype=torch.int32), "dtype torch.int32"),
    (torch.zeros((3,), dtype=torch.bool), "dtype torch.bool"),
    (torch.tensor([0.0, float("nan"), 0.0]), "nan; its values must be finite"),
    (torch.tensor([0.0, 0.0, float("inf")]), "inf; its values must be finite"),
]


@pytest.mark.parametrize(("bad", "match"), BAD_MOMENTS)
@pytest.mark.parametrize("name", ["exp_avg", "exp_avg_sq"])
def test_optimizer_moments_of_a_float_parameter_must_be_finite_floats(name, bad, match):
    # An integer moment would round every update; NaN or inf would reach the weights at the
    # first resumed step. The bias of Linear(4, 3) is parameter 1, of shape (3,).
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    tensors, skeleton = optimizer_to_parts(optimizer)
    key = f"1.{name}"
    assert tensors[key].shape == bad.shape
    tensors[key] = bad
    fresh = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=f"optimizer tensor {key!r} (has|holds) .*{match}"):
        optimizer_from_parts(fresh, tensors, skeleton)
    assert fresh.state_dict()["state"] == {}


# 3. junk in metrics.jsonl --------------------------------------------------------------------

RECORD = st.builds(
    lambda step, loss: {"step": step, "loss": loss, "lr": 1e-3, "tokens_per_s": 1.0,
                        "elapsed_s": 0.5},
    st.integers(0, 10**6), st.floats(0, 100, allow_nan=False),
)
# Lines that are no record: bytes (mostly not JSON, some not UTF-8), JSON that is not an
# object, and objects whose step, loss or lr is missing or of the wrong type.
NOT_A_RECORD = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"\n" not in b and b.strip() != b""),
    st.sampled_from([b"[1, 2]", b"null", b"3", b'"step"', b"{}", b'{"step": "1"}',
                     b'{"step": true, "loss": 1, "lr": 1}', b'{"step": -1, "loss": 1, "lr": 1}',
                     b'{"step": 1, "loss": "x", "lr": 1}', b'{"step": 1.5, "loss": 1, "lr": 1}',
                     b"[" * 100_000, b"\xff\xfe\xfd"]),
    st.just(b"{" + b" " * (MAX_LINE_BYTES + 10) + b"}"),
)


@PROPERTY
@given(lines=st.lists(st.one_of(RECORD, NOT_A_RECORD), max_size=8))
def test_read_metrics_keeps_exactly_the_records_between_any_junk(lines, caplog):
    path = Path(tempfile.mkdtemp()) / "metrics.jsonl"
    path.write_bytes(
        b"".join((json.dumps(x).encode() if isinstance(x, dict) else x) + b"\n" for x in lines)
    )
    records = [x for x in lines if isinstance(x, dict)]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert read_metrics(path) == records
    junk = len(lines) - len(records)
    assert (f"skipped {junk} line(s)" in caplog.text) == (junk > 0)
    shutil.rmtree(path.parent)


def test_a_torn_last_line_is_skipped_quietly_and_dropped_on_resume(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    record = {"step": 1, "loss": 2.0, "lr": 0.1}
    path.write_text(json.dumps(record) + '\n{"step": 2, "lo')  # killed mid-line
    with caplog.at_level(logging.WARNING):
        MetricsLog(path, resume_from_step=1)
    assert caplog.text == "" and path.read_text() == json.dumps(record) + "\n"


def test_resume_goes_on_past_bad_metrics_lines_and_keeps_only_records(copy, capsys, caplog):
    path = copy / "metrics.jsonl"
    good = path.read_bytes().splitlines(keepends=True)
    assert [json.loads(x)["step"] for x in good] == [1, 2]
    path.write_bytes(good[0] + b"\xff\xfe\n" + b'{"step": "two"}\n' + good[1] + b"[]\n")
    with caplog.at_level(logging.WARNING):
        assert resume(copy, "--max-steps", "3") == 0
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    assert path.read_bytes().startswith(good[0] + good[1])  # the records, as they were
    assert "skipped 3 line(s)" in caplog.text and "line 2: not UTF-8" in caplog.text


def test_a_metrics_log_that_is_a_fifo_is_replaced_not_waited_on(tmp_path):
    path = tmp_path / "metrics.jsonl"
    os.mkfifo(path)
    with deadline(10):
        MetricsLog(path, resume_from_step=3)
    assert path.is_file() and path.read_text() == ""


# 4. a user's folders named like checkpoints --------------------------------------------------


def user_folders(root: Path, link_to: Path) -> None:
    """What a user might keep in checkpoints/: names addnorm uses, contents it never wrote."""
    (root / "step-00000005").mkdir()
    (root / "step-00000005" / "notes.txt").write_text("mine")
    (root / "step-00000006").mkdir()  # a manifest, but not an addnorm checkpoint's
    (root / "step-00000006" / "manifest.json").write_text('{"format": "mine"}')
    (root / "step-00000006" / "model.safetensors").write_bytes(b"my weights")
    (root / ".tmp-step-00000001-mine").mkdir()
    (root / ".tmp-step-00000001-mine" / "data.csv").write_text("1,2\n")
    (root / "step-00000009").symlink_to(link_to)


def test_overwrite_deletes_only_checkpoints_addnorm_wrote(copy, tmp_path, caplog):
    elsewhere = tmp_path / "elsewhere"  # a real checkpoint outside the run, behind a link
    save_checkpoint(tmp_path / "other", 7, {"model": {"w": torch.zeros(2)}}, {})
    shutil.copytree(tmp_path / "other" / "checkpoints" / "step-00000007", elsewhere)
    outside = tree(elsewhere)
    root = copy / "checkpoints"
    user_folders(root, elsewhere)
    (root / "step-00000002" / "my-notes.txt").write_text("inside a real checkpoint")
    with caplog.at_level(logging.WARNING):
        assert main(["train", "translate", *TINY, "--max-steps", "1", "--overwrite",
                     "--out", str(copy)]) == 0
    assert tree(root / "step-00000005") == {"notes.txt": b"mine"}
    assert tree(root / "step-00000006") == {
        "manifest.json": b'{"format": "mine"}', "model.safetensors": b"my weights"
    }
    assert tree(root / ".tmp-step-00000001-mine") == {"data.csv": b"1,2\n"}
    assert (root / "step-00000009").is_symlink() and tree(elsewhere) == outside
    # The old checkpoint's own files went; the note put in it kept its folder, with a warning.
    assert tree(root / "step-00000002") == {"my-notes.txt": b"inside a real checkpoint"}
    assert "my-notes.txt, which addnorm did not write" in caplog.text
    assert json.loads((root / "step-00000001" / "manifest.json").read_text())["step"] == 1


def test_pruning_never_counts_or_deletes_a_folder_addnorm_did_not_write(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "step-99999999").mkdir()  # the highest name, with a manifest of its own
    (root / "step-99999999" / "manifest.json").write_text('{"format": "mine", "step": 1}')
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"model": {"w": torch.full((2,), step)}}, {}, keep=2)
    assert sorted(p.name for p in root.iterdir()) == [
        "step-00000002", "step-00000003", "step-99999999"
    ]
    assert (root / "step-99999999" / "manifest.json").read_text() == (
        '{"format": "mine", "step": 1}'
    )


def test_a_save_onto_a_users_folder_of_that_name_fails_and_keeps_it(tmp_path):
    mine = tmp_path / "checkpoints" / "step-00000004"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointWriteError, match="not a checkpoint addnorm wrote"):
        save_checkpoint(tmp_path, 4, {"model": {"w": torch.zeros(1)}}, {})
    assert tree(mine) == {"notes.txt": b"mine"}
    assert sorted(p.name for p in mine.parent.iterdir()) == ["step-00000004"]


def test_clear_run_leaves_user_folders_in_checkpoints(tmp_path):
    run_dir_module.write_marker(tmp_path, "translate")
    save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(1)}}, {})
    (tmp_path / "elsewhere").mkdir()
    user_folders(tmp_path / "checkpoints", tmp_path / "elsewhere")
    ours = (MARKER, "checkpoints/step-00000001")
    before = {k: v for k, v in tree(tmp_path).items() if not k.startswith(ours)}
    clear_run(tmp_path)
    assert tree(tmp_path) == before


# 5. lock files from elsewhere, or naming no process ------------------------------------------

HOST = socket.gethostname()
PIDS = st.one_of(
    st.integers(-(2**70), 2**70), st.just(2**31), st.just(2**31 - 1), st.just(0),
    st.just(-1), st.booleans(), st.floats(allow_nan=True), st.text(max_size=8), st.none(),
    st.lists(st.integers(), max_size=2),
)
HOSTS = st.one_of(st.just(HOST), st.just("elsewhere.invalid"), st.text(max_size=80))
RECORDS = st.fixed_dictionaries(
    {"pid": PIDS, "host": HOSTS},
    optional={"since": st.one_of(st.text(max_size=80), st.integers()), "started": st.text()},
).map(json.dumps)
JUNK = st.one_of(st.text(max_size=200), st.binary(max_size=200).map(
    lambda b: b.decode("utf-8", "replace")))


def valid_pid(pid) -> bool:
    return type(pid) is int and 0 < pid < 2**31


@PROPERTY
@given(text=st.one_of(RECORDS, JUNK))
def test_any_lock_file_is_taken_over_or_refused_in_one_line_never_a_traceback(text):
    folder = Path(tempfile.mkdtemp())
    try:
        (folder / LOCK).write_text(text, encoding="utf-8")
        try:
            holder = json.loads(text)
        except ValueError:
            holder = None
        is_record = isinstance(holder, dict) and "pid" in holder and isinstance(
            holder.get("host"), str)
        try:
            with RunLock(folder):
                assert json.loads((folder / LOCK).read_text())["pid"] == os.getpid()
            taken = True
        except RunDirError as err:
            taken, message = False, str(err)
            assert "\n" not in message and str(folder / LOCK) in message
        assert (folder / LOCK).exists() == (not taken)
        if not is_record:  # damaged (or empty but new): someone else's, never taken over
            assert not taken and "delete" in message
        elif holder["host"] != HOST:  # cannot be judged from here: never taken over
            assert not taken and "on another host" in message and "delete" in message
        elif not valid_pid(holder["pid"]):  # no process can have it: stale
            assert taken
        if not taken and is_record:
            assert "pid " in message and " on host " in message
    finally:
        shutil.rmtree(folder)


def test_a_lock_from_another_host_names_it_and_how_to_clear_it(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    record = {"pid": 4242, "host": "container-1f2e", "since": "2026-11-20T10:00:00+00:00"}
    (out / LOCK).write_text(json.dumps(record))
    assert main(["train", "translate", "--out", str(out), "--quiet"]) == 2
    line = one_error_line(capsys, "train")
    assert "pid 4242 on host container-1f2e, since 2026-11-20T10:00:00+00:00" in line
    assert f"delete {out / LOCK} and try again" in line
    assert sorted(p.name for p in out.iterdir()) == [LOCK]


@pytest.mark.parametrize("pid", [2**31, 2**64, -5, "123", 1.5])
def test_a_lock_naming_no_possible_pid_on_this_host_is_stale(pid, tmp_path, caplog):
    (tmp_path / LOCK).write_text(json.dumps({"pid": pid, "host": HOST}))
    check_unlocked(tmp_path)
    with caplog.at_level(logging.WARNING), RunLock(tmp_path):
        pass
    assert "stale lock" in caplog.text and "names no process" in caplog.text
    assert not (tmp_path / LOCK).exists()


def test_a_lock_with_a_newline_in_its_host_still_gives_one_line(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": 7, "host": "evil\nhost" + "x" * 500}))
    with pytest.raises(RunDirError) as caught:
        check_unlocked(tmp_path)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 600


# 6. export checks --out before loading -------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: d / "missing" / "m.onnx", "its folder"),
        (lambda d: (d / "file").write_text("") or d / "file" / "m.onnx", "is not a folder"),
        (lambda d: (d / "dir").mkdir() or d / "dir", "is a folder"),
        (lambda d: Path("/dev/null"), "not a regular file"),
        (lambda d: Path(""), "must name a file"),
        # A folder whose permission bits allow writing (to root) but that takes no file.
        pytest.param(lambda d: Path("/proc/m.onnx"), "cannot create a file in /proc",
                     marks=pytest.mark.skipif(not Path("/proc/self").is_dir(),
                                              reason="needs Linux's /proc")),
    ],
)
def test_export_refuses_an_unusable_out_before_loading(make, why, tmp_path, capsys):
    out = make(tmp_path)
    # The checkpoint does not exist: had it been loaded first, the exit code would be 1.
    assert main(["export", str(tmp_path / "no-such-run"), "--out", str(out)]) == 2
    assert why in one_error_line(capsys, "export")


# 7. two writers racing for one folder --------------------------------------------------------


def test_a_writer_that_loses_the_race_for_the_lock_prints_one_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    sleeper = subprocess.Popen(["sleep", "60"])
    real_check = train_command.check_run_sizes

    def winner_starts_meanwhile(*args):  # the other writer takes the lock after our checks
        real_check(*args)
        out.mkdir(parents=True, exist_ok=True)
        record = {"pid": sleeper.pid, "host": HOST,
                  "started": run_dir_module._process_start(sleeper.pid)}
        (out / LOCK).write_text(json.dumps(record))

    monkeypatch.setattr(train_command, "check_run_sizes", winner_starts_meanwhile)
    try:
        assert main(["train", "translate", *TINY, "--max-steps", "1", "--out", str(out)]) == 2
    finally:
        sleeper.kill()
        sleeper.wait()
    line = one_error_line(capsys, "train")  # no "training translate into ..." before it
    assert f"pid {sleeper.pid} on host {HOST}" in line
    assert sorted(p.name for p in out.iterdir()) == [LOCK]


def test_a_run_finished_by_another_writer_meanwhile_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    real_check = train_command.check_run_sizes

    def other_run_written_meanwhile(*args):  # started and ended between our checks and lock
        real_check(*args)
        out.mkdir(parents=True, exist_ok=True)
        run_dir_module.write_marker(out, "translate")

    monkeypatch.setattr(train_command, "check_run_sizes", other_run_written_meanwhile)
    assert main(["train", "translate", *TINY, "--max-steps", "1", "--out", str(out)]) == 2
    assert "now holds a run" in one_error_line(capsys, "train")
    assert sorted(p.name for p in out.iterdir()) == [MARKER]


# 8. --config files that never end -------------------------------------------------------------


class deadline:
    """Fail (instead of hanging) if the block takes more than ``seconds``."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self):
        def hung(signum, frame):
            raise AssertionError(f"still running after {self.seconds} s: it blocked")

        self.previous = signal.signal(signal.SIGALRM, hung)
        signal.alarm(self.seconds)

    def __exit__(self, *exc_info):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def fifo(d: Path) -> Path:
    os.mkfifo(d / "config.json")
    return d / "config.json"


def big(d: Path) -> Path:
    path = d / "config.json"
    path.write_text('{"model": {}, "train": {}}' + " " * MAX_CONFIG_BYTES)
    return path


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: Path("/dev/zero"), "must be a regular file, but it is a character device"),
        (lambda d: (d / "zero").symlink_to("/dev/zero") or d / "zero", "a character device"),
        (fifo, "must be a regular file, but it is a FIFO (named pipe)"),
        (lambda d: d, "must be a regular file, but it is a directory"),
        (big, f"more than the {MAX_CONFIG_BYTES} it may have"),
        (lambda d: d / "missing.json", "No such file or directory"),
    ],
)
def test_a_config_that_is_no_small_regular_file_exits_2_at_once(make, why, tmp_path, capsys):
    config = make(tmp_path)
    out = tmp_path / "out"
    with deadline(20):
        assert main(["train", "translate", "--config", str(config), "--out", str(out)]) == 2
    line = one_error_line(capsys, "train")
    assert f"--config {config}: " in line and why in line
    assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_manifest_that_never_ends_exits_1_at_once(kind, run, tmp_path, capsys):
    checkpoint = tmp_path / "step-00000002"
    shutil.copytree(find_checkpoint(run), checkpoint)
    (checkpoint / "manifest.json").unlink()
    if kind == "fifo":
        os.mkfifo(checkpoint / "manifest.json")
    else:
        (checkpoint / "manifest.json").symlink_to(kind)
    with deadline(20):
        assert main(["info", str(checkpoint)]) == 1
    line = one_error_line(capsys, "info")
    assert "manifest.json" in line and "must be a regular file" in line


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_run_files_that_never_end_are_no_marker_and_no_lock(kind, tmp_path, capsys):
    for name in (MARKER, LOCK):
        folder = tmp_path / name
        folder.mkdir()
        if kind == "fifo":
            os.mkfifo(folder / name)
        else:
            (folder / name).symlink_to(kind)
        with deadline(20):
            assert main(["train", "translate", "--out", str(folder), "--quiet"]) == 2
        line = one_error_line(capsys, "train")
        if name == MARKER:  # proves no run: the folder is refused as someone else's
            assert f"holds no addnorm run (no {MARKER})" in line
        else:  # no lock addnorm wrote: named, with what to do
            assert f"the lock file {folder / name}: must be a regular file" in line
            assert "delete it" in line
        assert sorted(p.name for p in folder.iterdir()) == [name]
