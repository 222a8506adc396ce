"""Reading a workspace that is messy or written to while it is read: the run index's folder list
damaged in its file, a relative cache folder setting, a worker that stops while its pipe is small,
a run file written in place and found half-written, a followed file that cannot be opened or holds
a line longer than one read."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

import machine_nb as mnb
from machine_nb.store import follow
from machine_nb.store import index as run_index
from machine_nb.store.follow import LineTail, RunFolderWatch
from machine_nb.store.parse_pool import ParsePool

from scratch import copy_runs


@pytest.fixture(autouse=True)
def cache(isolated_run_index):
    return isolated_run_index


@pytest.fixture
def ws(tmp_path):
    return copy_runs(tmp_path / "ws")


def _rewrite_meta(ws: Path, change, *, damaged: bool = False) -> None:
    """Write the workspace's index again with its folder list changed by `change` (columns and
    their checksums intact). `damaged`: the file keeps the folder list's checksum of before the
    change, as bytes damaged after the write would leave it."""
    path = run_index.run_index_path(ws)
    with pa.OSFile(str(path), "rb") as f:
        table = pa.ipc.open_file(f).read_all()
    meta = json.loads(table.schema.metadata[b"machine_nb"])
    before = meta.get("dirs_checksum")
    change(meta["dirs"])
    meta = {k: v for k, v in meta.items() if k not in ("version", "checksums", "dirs_checksum")}
    run_index.write_index(path, table.replace_schema_metadata(None), meta)
    if damaged:
        data = path.read_bytes()
        written = run_index.dirs_checksum(meta["dirs"]).encode()
        assert before and data.count(written) >= 1
        path.write_bytes(data.replace(written, before.encode()))


def test_a_damaged_folder_list_in_the_index_is_rebuilt_not_trusted(ws):
    good = mnb.load_runs(ws, index=False).drop(columns="run")
    mnb.load_runs(ws, index=True)
    # a subfolder gone from the root's entry: it would never be walked again, its runs silently
    # missing from every load until the root folder changes
    _rewrite_meta(ws, lambda dirs: dirs[""].__setitem__(2, dirs[""][2][:1]), damaged=True)
    df = mnb.load_runs(ws, index=True)
    assert df.attrs["index"].rebuilt is not None and "folder list" in df.attrs["index"].rebuilt
    assert len(df) == len(good) and sorted(df["path"]) == sorted(good["path"])


@pytest.mark.parametrize("entry", [5, "x", [1], [1, 2, 3], [1, 2, [3]], None],
                         ids=["number", "text", "short", "subdirs-not-a-list", "subdir-not-a-name", "null"])
def test_a_folder_list_of_the_wrong_shape_is_rebuilt_not_a_crash(ws, entry):
    good = mnb.load_runs(ws, index=False)
    mnb.load_runs(ws, index=True)
    _rewrite_meta(ws, lambda dirs: dirs.__setitem__("", entry))
    df = mnb.load_runs(ws, index=True)
    assert df.attrs["index"].rebuilt is not None and len(df) == len(good)


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    # a relative XDG path is invalid (the XDG base directory rules): the index must not land in
    # whatever folder the notebook runs in
    monkeypatch.delenv("MACHINE_NB_CACHE_DIR")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert run_index.cache_dir() == tmp_path / "home" / ".cache" / "machine_nb"
    assert run_index.cache_dir().is_absolute()


def test_a_relative_cache_dir_setting_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MACHINE_NB_CACHE_DIR", "cache-here")
    assert run_index.cache_dir() == tmp_path / "cache-here"


# ---------------------------------------------------------------------------------------------
# parse pool


def _double(x: str) -> int:
    return 2 * len(x)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes are set with Linux's F_SETPIPE_SZ")
def test_a_stopped_worker_with_a_small_pipe_is_replaced_not_waited_on():
    """A worker stopped while idle never drains its pipe: a call larger than what the pipe holds
    must time out, not block in the write. The pipe is shrunk to one page (as Linux does for a
    user over its pipe-buffer allowance). The pool runs in a thread, so a pool that waits forever
    fails this test instead of hanging it."""
    import fcntl

    F_SETPIPE_SZ = 1031
    pool = ParsePool(1, answer_timeout=1.0)
    out: list = []
    pids: list = []

    def go() -> None:
        with pool:
            proc = pool._procs[0]
            pids.append(proc.pid)
            fcntl.fcntl(proc.stdin.fileno(), F_SETPIPE_SZ, 4096)
            os.kill(proc.pid, signal.SIGSTOP)
            out.extend(pool.run(_double, [("x" * 200_000,)]))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    try:
        assert not t.is_alive(), "the pool blocked writing to a stopped worker"
        assert out == [400_000]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ---------------------------------------------------------------------------------------------
# following


def test_a_run_file_listed_half_written_is_reported_again_when_it_grows(tmp_path):
    root = tmp_path / ".machine" / "runs"
    (root / "support").mkdir(parents=True)
    watch = RunFolderWatch(root, events=False)
    try:
        assert watch.poll().added == []
        path = root / "support" / "r1.json"
        path.write_text('{"id": "r1", "machine": "supp')  # written in place, its writer mid-file
        (got, d, name), = watch.poll().added
        assert got == str(path)
        with open(path, "a") as fh:
            fh.write('ort", "output": "done"}')
        assert [c[0] for c in watch.poll().changed] == [str(path)]
        assert watch.poll().changed == []  # once per change
        t = time.time() - 3600  # quiet since: reported once more (its time changed), then no longer stat-ed
        os.utime(path, (t, t))
        assert [c[0] for c in watch.poll().changed] == [str(path)]
        assert watch.poll().changed == [] and str(path) not in watch._watched
    finally:
        watch.close()


def test_a_line_longer_than_one_read_is_skipped_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(follow, "MAX_READ", 64)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": "' + b"x" * 200 + b'"}\n{"b": 1}\n')
    tail = LineTail(path)
    lines, notes = [], []
    for _ in range(10):
        got = tail.read()
        lines += got.lines
        notes += got.notes
        if not got.more and not got.lines and not got.notes:
            break
    assert [(x.line, x.value, x.error) for x in lines] == [(2, {"b": 1}, None)]
    assert len(notes) == 1 and ":1:" in notes[0]


def test_a_followed_file_that_cannot_be_opened_is_named_once(tmp_path, monkeypatch):
    from machine_nb.errors import MachineFormatError

    path = tmp_path / "events.jsonl"
    path.write_text('{"a": 1}\n')

    def refuse(p):
        raise MachineFormatError(p, "cannot read: Permission denied")

    monkeypatch.setattr(follow, "open_regular", refuse)
    tail = LineTail(path)
    first, second = tail.read(), tail.read()
    assert first.lines == [] and len(first.notes) == 1 and "Permission denied" in first.notes[0]
    assert str(path) in first.notes[0] and second.notes == []
    monkeypatch.undo()
    monkeypatch.setenv("MACHINE_NB_CACHE_DIR", str(tmp_path / "cache"))
    assert [x.value for x in tail.read().lines] == [{"a": 1}]


# ---------------------------------------------------------------------------------------------
# run files that cannot be stat-ed


def _skipped(ws: Path) -> tuple[int, str]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = mnb.load_runs(ws, index=True)
    return len(df), "\n".join(str(w.message) for w in caught)


def test_a_dangling_or_looping_symlink_run_file_is_named_on_every_load(ws):
    folder = ws / ".machine" / "runs" / "support"
    os.symlink("nowhere.json", folder / "dangling.json")
    os.symlink("loop.json", folder / "loop.json")
    t = time.time() - 3600
    os.utime(folder, (t, t))
    n, said = _skipped(ws)
    for _ in range(2):  # the index reused: the folder unchanged, then changed by another run
        again, said_again = _skipped(ws)
        assert again == n
        assert "dangling.json: file not found" in said_again and "loop.json: cannot read" in said_again
        (folder / "other.json").write_text("{}")
        os.utime(folder, (t + 1, t + 1))
    assert "dangling.json" in said


def test_a_dangling_symlink_run_file_does_not_rewrite_the_index_on_every_load(ws):
    folder = ws / ".machine" / "runs" / "support"
    os.symlink("nowhere.json", folder / "dangling.json")
    t = time.time() - 3600
    os.utime(folder / "dangling.json", (t, t), follow_symlinks=False)  # made a while ago
    os.utime(folder, (t, t))
    mnb.load_runs(ws, index=True)
    mnb.load_runs(ws, index=True)
    stats = mnb.load_runs(ws, index=True).attrs["index"]
    assert stats.parsed == 0 and not stats.written


def test_a_folder_that_cannot_be_listed_is_named_once_and_read_when_it_can_be(tmp_path, monkeypatch):
    """A machine's folder the user cannot list (permission denied) is said once, not every poll,
    and its runs come in once it can be listed; the dashboard shows the note."""
    from machine_nb.widgets.dashboard import DashboardState

    root = tmp_path / ".machine" / "runs"
    (root / "support").mkdir(parents=True)
    (root / "support" / "r1.json").write_text(json.dumps({"id": "r1", "machine": "support", "output": "ok"}))
    locked = {str(root / "support")}
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) in locked:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(follow.os, "scandir", scandir)
    watch = RunFolderWatch(root, events=False)
    try:
        first = watch.poll()
        assert first.added == [] and len(first.notes) == 1
        assert str(root / "support") in first.notes[0] and "Permission denied" in first.notes[0]
        assert watch.poll().notes == []  # said once
        locked.clear()
        again = watch.poll()
        assert [a[2] for a in again.added] == ["r1.json"] and again.notes == []
    finally:
        watch.close()
    locked.add(str(root / "support"))
    state = DashboardState(tmp_path)
    try:
        state.apply(state.read())
        assert any("Permission denied" in n for n in state.snapshot()["notes"])
    finally:
        state.close()
