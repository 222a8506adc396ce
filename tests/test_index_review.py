"""The run index, its parse pool and the folder watch when the workspace or the machine
misbehaves: a run file deleted between the listing and its read, an index written by a newer
machine_nb, a batch of run files that kills the worker parsing it, a watch given another spelling
of the workspace's path, a long workspace folder name, a file copied over in place keeping its
size and time (`cp -p`), file names that are not UTF-8."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import pyarrow as pa
import pytest

import workers
from machine_nb.data import frames
from machine_nb.store import index as run_index
from machine_nb.store.messages import default_failed
from machine_nb.store.parse_pool import ParsePool

from scratch import SAMPLE, copy_runs


@pytest.fixture(autouse=True)
def cache(isolated_run_index):
    return isolated_run_index


@pytest.fixture
def ws(tmp_path):
    return copy_runs(tmp_path / "ws")


def run_names(table: pa.Table) -> set[str]:
    return {f"{d}/{n}" for d, n in zip(table["dir"].to_pylist(), table["name"].to_pylist())}


class DeletingParser:
    """The index's parser, which first deletes one of the files it is handed (as a user or a
    cleanup job would, between the index's listing and its read)."""

    def __init__(self, victim: str):
        self.victim = victim
        self.inner = frames.RunParser(default_failed)

    def __call__(self, chunk, read):
        for path, *_ in chunk:
            if os.path.basename(path) == self.victim and os.path.exists(path):
                os.unlink(path)
        return self.inner(chunk, read)


def test_a_run_file_deleted_between_listing_and_reading_is_no_row_and_no_bad_file(ws):
    files = sorted((ws / ".machine" / "runs").rglob("*.json"))
    victim = files[0]
    table, stats, problems = run_index.update_index(ws, DeletingParser(victim.name), workers=1)
    rel = victim.relative_to(ws / ".machine" / "runs")
    assert rel.as_posix() not in run_names(table)
    assert table.num_rows == len(files) - 1
    errors = [e for e in table["error"].to_pylist() if e]
    assert not any("cannot" in e for e in errors), errors  # not named as a file that cannot be read
    again, stats, _ = run_index.update_index(ws, frames.RunParser(default_failed))
    assert again.num_rows == len(files) - 1 and stats.parsed == 0


# ---------------------------------------------------------------------------------------------
# An index written by a newer machine_nb


def _set_version(path: Path, version: int) -> None:
    with pa.OSFile(str(path), "rb") as f:
        table = pa.ipc.open_file(f).read_all()
    meta = json.loads(table.schema.metadata[b"machine_nb"])
    meta["version"] = version
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema.with_metadata(
            {b"machine_nb": json.dumps(meta).encode()})) as writer:
        writer.write_table(table.replace_schema_metadata(None))


def _version(path: Path) -> int:
    with pa.OSFile(str(path), "rb") as f:
        return json.loads(pa.ipc.open_file(f).schema.metadata[b"machine_nb"])["version"]


def test_an_index_from_a_newer_machine_nb_is_left_as_it_is_with_one_warning(ws):
    """Two versions sharing a cache folder must not rebuild each other's index on every load."""
    import machine_nb as mnb

    good = mnb.load_runs(ws, index=False).drop(columns="run")
    mnb.load_runs(ws, index=True)
    path = run_index.run_index_path(ws)
    newer = run_index.SCHEMA_VERSION + 1
    _set_version(path, newer)
    before = path.read_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = mnb.load_runs(ws, index=True)
    said = [str(w.message) for w in caught if "newer" in str(w.message)]
    assert len(said) == 1 and str(path) in said[0] and f"schema version {newer}" in said[0]
    assert path.read_bytes() == before and _version(path) == newer  # not written over
    assert not df.attrs["index"].written
    import pandas as pd

    pd.testing.assert_frame_equal(df.drop(columns="run"), good)


def test_an_index_from_an_older_machine_nb_is_still_rebuilt(ws):
    import machine_nb as mnb

    mnb.load_runs(ws, index=True)
    path = run_index.run_index_path(ws)
    _set_version(path, run_index.SCHEMA_VERSION - 1)
    stats = mnb.load_runs(ws, index=True).attrs["index"]
    assert stats.written and _version(path) == run_index.SCHEMA_VERSION


# ---------------------------------------------------------------------------------------------
# A call that kills its worker


def test_a_call_that_kills_a_fresh_worker_too_is_handed_to_crashed_not_made_here(tmp_path):
    me = os.getpid()
    marks = str(tmp_path)
    with ParsePool(1) as pool:
        got = sorted(pool.run(workers.twice_or_die, [(me, marks, x) for x in range(8)],
                              crashed=lambda parent, m, x: -x))
    assert got == sorted([2 * x for x in range(8) if x != 3] + [-3])
    assert len(list(tmp_path.glob("worker-*"))) == 2  # tried in a second, fresh worker before giving up


def test_a_call_that_killed_its_worker_is_tried_once_more_in_a_fresh_one(tmp_path):
    me = os.getpid()
    marks = str(tmp_path)
    with ParsePool(1) as pool:
        got = sorted(pool.run(workers.twice_or_die, [(me, marks, x) for x in range(8)]))
    assert got == [2 * x for x in range(8)]  # with no crashed handler, made here at last
    assert len(list(tmp_path.glob("worker-*"))) == 2


class DyingParser:
    """The index's parser, which ends any worker process it runs in (as the kernel's out-of-memory
    killer would), and in the test's process waits until a worker has taken a batch, so a worker
    surely meets one."""

    def __init__(self, parent: int, marks: str):
        self.parent, self.marks = parent, marks
        self.inner = frames.RunParser(default_failed)

    def __call__(self, chunk, read):
        if os.getpid() != self.parent:
            Path(self.marks, f"worker-{os.getpid()}").touch()
            os._exit(9)
        end = time.monotonic() + 60
        while not list(Path(self.marks).glob("worker-*")) and time.monotonic() < end:
            time.sleep(0.01)
        return self.inner(chunk, read)


def test_a_batch_that_kills_two_workers_is_reported_skipped_not_parsed_here(ws, tmp_path, monkeypatch):
    """A batch that exhausts a worker's memory would exhaust this process's too: after a second,
    fresh worker dies of it, its files are named as skipped (and kept so, until they change)."""
    monkeypatch.setattr(run_index, "TASK", 200)  # two batches: one a worker takes, one this process takes
    marks = tmp_path / "marks"
    marks.mkdir()
    files = sorted((ws / ".machine" / "runs").rglob("*.json"))
    table, stats, _ = run_index.update_index(ws, DyingParser(os.getpid(), str(marks)), workers=2)
    assert table.num_rows == len(files)  # every file a row: parsed here, or skipped by name
    errors = [e for e in table["error"].to_pylist() if e and "worker" in e]
    assert errors and all("out of memory" in e for e in errors)
    assert len(list(marks.glob("worker-*"))) >= 2
    skipped = pa.compute.filter(table, pa.compute.match_substring(table["error"], "worker"))
    assert all(skipped["recheck"].to_pylist()) and all(m > 0 for m in skipped["mtime_ns"].to_pylist())
    # not tried again (in this process) until they change
    again, stats, _ = run_index.update_index(ws, frames.RunParser(default_failed), workers=1)
    assert stats.parsed == 0 and run_names(again) == run_names(table)


# ---------------------------------------------------------------------------------------------
# Following a workspace given by another spelling of its path


def _known(ws: Path) -> list[str]:
    import machine_nb as mnb

    return mnb.load_runs(ws, index=False)["path"].tolist()


def test_a_watch_of_a_relative_runs_folder_knows_the_runs_load_runs_listed(ws, monkeypatch):
    """load_runs gives absolute paths; a dashboard opened on "ws" watches "ws/.machine/runs"."""
    from machine_nb.store.follow import RunFolderWatch

    known = _known(ws)
    monkeypatch.chdir(ws.parent)
    watch = RunFolderWatch(os.path.join("ws", ".machine", "runs"), known=known, events=False)
    assert watch.files == len(known)
    changes = watch.poll()
    assert changes.added == [] and changes.removed == []


def test_a_watch_through_a_symlinked_workspace_knows_the_runs_of_its_real_path(ws, tmp_path):
    from machine_nb.store.follow import RunFolderWatch

    link = tmp_path / "link"
    link.symlink_to(ws, target_is_directory=True)
    known = _known(ws)
    watch = RunFolderWatch(link / ".machine" / "runs", known=known, events=False)
    changes = watch.poll()
    assert changes.added == [] and changes.removed == []
    new = ws / ".machine" / "runs" / "support" / "20991231t000000-abcdef.json"
    new.write_text(Path(known[0]).read_text())
    assert [name for _, _, name in watch.poll().added] == [new.name]


def test_a_workspace_with_a_long_folder_name_gets_an_index(tmp_path):
    """The index's file name (and its temporary files' names) must fit the file system's limit
    of 255 bytes a name, whatever the workspace folder is called."""
    import machine_nb as mnb

    ws = tmp_path / ("w" * 240)
    shutil.copytree(SAMPLE / ".machine" / "runs" / "support", ws / ".machine" / "runs" / "support")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not write the run index"
        stats = mnb.load_runs(ws, index=True).attrs["index"]
    assert stats.written and run_index.run_index_path(ws).exists()
    assert len(run_index.run_index_path(ws).name) <= 100


def test_a_run_file_copied_over_in_place_keeping_size_and_time_is_seen_by_a_files_check(ws):
    """`cp -p` (or an editor that keeps the modification time) writes a run file in place and sets
    its old size and time back: only its change time (st_ctime) says it changed."""
    import machine_nb as mnb

    mnb.load_runs(ws, index=True)
    path = next(p for p in sorted((ws / ".machine" / "runs").rglob("*.json"))
                if json.loads(p.read_text()).get("finishedAt"))
    run = json.loads(path.read_text())
    st = path.stat()
    text = path.read_text()
    assert run["input"] in text and run["input"].swapcase() != run["input"]
    path.write_text(text.replace(run["input"], run["input"].swapcase()))  # same length, other words
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    df = mnb.load_runs(ws, check="files")
    assert df.attrs["index"].parsed == 1
    assert df.set_index("id").loc[path.stem, "input"] == run["input"].swapcase()
    assert mnb.load_runs(ws, check="files").attrs["index"].parsed == 0  # seen once, then settled


@pytest.mark.skipif(os.name == "nt" or sys.platform == "darwin", reason="file names there are always Unicode")
def test_a_run_file_whose_name_is_not_utf8_is_named_on_every_load_not_a_crash(ws):
    """A file named in another encoding (copied from an old system or a zip archive) cannot be a
    string column's value: it is skipped by name, and the other runs load."""
    import machine_nb as mnb
    from machine_nb.store.workspace import SkippedFiles

    n = len(mnb.load_runs(ws, index=False))
    folder = ws / ".machine" / "runs" / "support"
    src = next(folder.glob("*.json"))
    try:
        os.link(src, os.fsencode(folder) + b"/caf\xe9.json")
        os.mkdir(os.fsencode(folder) + b"/old-\xe9")
    except OSError as exc:  # a file system that takes only UTF-8 names
        pytest.skip(f"no non-UTF-8 names here: {exc}")
    for _ in range(2):  # named on every load
        with pytest.warns(SkippedFiles, match="not valid UTF-8") as caught:
            df = mnb.load_runs(ws, index=True)
        assert len(df) == n
        said = "\n".join(str(w.message) for w in caught)
        assert "caf\\xe9.json" in said and "old-\\xe9" in said


@pytest.mark.skipif(os.name == "nt" or sys.platform == "darwin", reason="file names there are always Unicode")
def test_a_followed_run_file_whose_name_is_not_utf8_is_named_once_not_handed_on(ws):
    """The dashboard parses what a watch reports into string columns: such a name would end its poll."""
    from machine_nb.store.follow import RunFolderWatch

    folder = ws / ".machine" / "runs" / "support"
    watch = RunFolderWatch(ws / ".machine" / "runs", events=False)
    n = len(watch.poll().added)
    try:
        os.link(next(folder.glob("*.json")), os.fsencode(folder) + b"/caf\xe9.json")
    except OSError as exc:
        pytest.skip(f"no non-UTF-8 names here: {exc}")
    os.utime(folder, (time.time() - 60, time.time() - 60))  # the folder changed since it was listed
    changes = watch.poll()
    assert changes.added == [] and len(changes.notes) == 1 and "caf\\xe9.json" in changes.notes[0]
    assert "UTF-8" in changes.notes[0]
    os.utime(folder)
    again = watch.poll(full=True)
    assert again.added == [] and again.notes == []  # said once
    assert watch.files == n


def test_a_run_file_whose_name_is_not_utf8_is_named_by_the_unindexed_load_too(tmp_path):
    """load_runs(index=False) failed with a bare UnicodeEncodeError where the indexed load names the file."""
    import os
    import warnings as _warnings

    import machine_nb as mnb

    folder = tmp_path / "ws" / ".machine" / "runs" / "m"
    folder.mkdir(parents=True)
    (folder / "ok.json").write_text('{"id": "ok", "machine": "m", "input": "q", "output": "a", "trajectory": []}')
    os.close(os.open(os.fsencode(str(folder)) + b"/caf\xe9.json", os.O_CREAT | os.O_WRONLY))
    with _warnings.catch_warnings(record=True) as said:
        _warnings.simplefilter("always")
        runs = mnb.load_runs(tmp_path / "ws", index=False)
    assert list(runs["id"]) == ["ok"]
    assert any("caf\\xe9.json" in str(w.message) and "not valid UTF-8" in str(w.message) for w in said), said
