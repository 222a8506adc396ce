"""The run index: one Arrow IPC file (Feather v2) per workspace holding its run table (one row per
run file), kept in step with `.machine/runs/` from file sizes and modification times, so a second
`load_runs` maps the table instead of reading every run file, and parses only new or changed files
(a first load of many files parses them in several processes: see PARALLEL_MIN).

It lives outside the workspace, in a per-user cache folder (`cache_dir()`), named after the real
path of the workspace's `runs/` folder. Writes are atomic (temp file + rename; the temp files of
a write killed midway are removed by the next write); an index that cannot be read, has another
schema version or workspace, or whose bytes were damaged since (a checksum of each column and
of the folder list, checked on every load), is rebuilt, never trusted. What a
row holds is `INDEX_SCHEMA` (documented in the README, for DuckDB or Polars); how a run file
becomes a row is decided in `frames.py`, which hands `update_index` its parser.

Why Arrow IPC and not Parquet: the file is the table's own memory layout, uncompressed, so a
reload memory-maps it and hands its strings to pandas without decoding or copying them (measured
at a million runs: benchmarks/bench_run_index.py); Parquet stores less but decodes every string.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import MachineFormatError, user_stacklevel
from ..core.jsonl import atomic_replace, held_folder, remove_stale_temporaries
from .workspace import (folder_chain, folder_problem, follow_problem, foreign_problem, machine_dir, name_segments,
                        shown_name, utf8_name,
                        outside, read_file)

SCHEMA_VERSION = 5
"""Bumped whenever INDEX_SCHEMA, the meaning of a column or the file's metadata changes (3: column
checksums; 4: n_failed_tool_calls judges each call by the result after it when a call id is
reused; 5: a checksum of the folder list): an older index is rebuilt. A metadata key whose absence
reads as a safe default (`files_checked_ns`: 0, so a "files" check parses every file once) needs
no new version."""

_STR = pa.large_string()
_TS = pa.timestamp("us", tz="UTC")
INDEX_SCHEMA = pa.schema([
    # the file a row comes from, and what it looked like when parsed
    ("dir", _STR),           # folder under .machine/runs/ ("chatbot/triage"); "" for a file directly in it
    ("name", _STR),          # file name ("<id>.json")
    ("size", pa.int64()),    # bytes, when parsed
    ("mtime_ns", pa.int64()),  # modification time in ns when parsed; -1: re-read next time (see RACY_NS)
    ("recheck", pa.bool_()),  # stat this file on every load (unfinished runs, bad files; see update_index)
    ("error", _STR),         # why the file is skipped (null for a good run); then the run columns are null
    ("error_line", pa.int64()),
    ("error_field", _STR),
    ("bad_time", _STR),      # startedAt/finishedAt values that do not parse (kept as null times)
    # the run table (frames.RUN_COLUMNS without path and run)
    ("id", _STR), ("machine", _STR), ("model", _STR), ("harness", _STR), ("input", _STR), ("output", _STR),
    ("case", _STR), ("score", pa.float64()), ("rubric", _STR), ("started_at", _TS), ("finished_at", _TS),
    ("duration_s", pa.float64()), ("n_messages", pa.int64()), ("n_tool_calls", pa.int64()),
    ("n_failed_tool_calls", pa.int64()), ("input_tokens", pa.float64()), ("output_tokens", pa.float64()),
    ("cost_usd", pa.float64()), ("version", _STR), ("instructions", _STR), ("final", pa.bool_()),
])
FILE_FIELDS = ("dir", "name", "size", "mtime_ns")

# A file or folder changed this close to a scan may change again within the same timestamp tick
# (filesystems keep mtimes from 1 ns to 2 s apart): such entries are re-read next time.
RACY_NS = 2_000_000_000
# Rows per parsed batch: the Python objects of one batch are all that is held besides the table.
BATCH = 20_000
# A load with at least this many files to parse shares them with worker processes (up to one per
# CPU beyond the first, so long as each process has half this many files): a worker costs about
# half a second to start (it imports pandas and pyarrow), which a share of this size repays.
PARALLEL_MIN = 20_000
# Files per batch handed to a worker (small enough to keep every process busy to the end).
TASK = 4_000

CHECKS = ("dirs", "files")
# Characters of the workspace folder's name kept in the index file's name (see run_index_path).
SLUG_MAX = 48
# How read_index's reason starts for an index of a later schema version. Such an index is left as
# it is (a load parses every file): two versions sharing a cache folder would otherwise rebuild
# each other's index on every load.
NEWER = "written by a newer machine_nb"

# A parser turns `[(path, dir, name, problem)]` into a table of INDEX_SCHEMA without the
# FILE_FIELDS (the index adds those), reading entry k's bytes with `read(k)` (which raises
# MachineFormatError for a file that cannot be read): frames.py's is the one used.
Parser = Callable[[list[tuple[str, str, str, str | None]], Callable[[int], bytes]], pa.Table]


def cache_dir() -> Path:
    """The folder for machine_nb's caches.

    Returns:
        `$MACHINE_NB_CACHE_DIR` when set (tests point it at a temporary folder; a relative one is
        taken from the current folder once, here), else the platform's user cache folder:
        `$XDG_CACHE_HOME/machine_nb` or `~/.cache/machine_nb` (Linux and other Unix),
        `~/Library/Caches/machine_nb` (macOS), `%LOCALAPPDATA%\\machine_nb\\Cache` (Windows). A
        relative `XDG_CACHE_HOME` or `LOCALAPPDATA` is ignored (the XDG rules call it invalid), so
        a cache never lands in whatever folder a notebook happens to run in.
    """
    env = os.environ.get("MACHINE_NB_CACHE_DIR", "").strip()
    if env:
        return Path(env).expanduser().absolute()

    def absolute(name: str) -> Path | None:
        value = os.environ.get(name, "").strip()
        return Path(value) if value and os.path.isabs(value) else None

    if sys.platform == "win32":
        return (absolute("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "machine_nb" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "machine_nb"
    return (absolute("XDG_CACHE_HOME") or Path.home() / ".cache") / "machine_nb"


def runs_root(workspace: str | os.PathLike) -> Path:
    """The folder the index covers.

    Args:
        workspace: the workspace (or its `.machine` folder).

    Returns:
        `<workspace>/.machine/runs`.
    """
    return machine_dir(workspace) / "runs"


def run_index_path(workspace: str | os.PathLike) -> Path:
    """Where the run index of a workspace lives.

    Args:
        workspace: the workspace (or its `.machine` folder).

    Returns:
        `<cache_dir()>/runs/<folder>-<16 hex>.arrow`, keyed by the real (symlink-resolved) path of
        its `.machine/runs` folder (`<folder>`: the workspace folder's name in lower-case letters,
        digits and dashes, at most SLUG_MAX of them).
    """
    real = os.path.realpath(runs_root(workspace))
    ws_name = os.path.basename(os.path.dirname(os.path.dirname(real)))
    # the name shortened, so the file's name and its temporary files' fit a file system's 255 bytes
    slug = re.sub(r"[^a-z0-9]+", "-", ws_name.lower())[:SLUG_MAX].strip("-") or "workspace"
    return cache_dir() / "runs" / f"{slug}-{hashlib.sha256(real.encode('utf-8')).hexdigest()[:16]}.arrow"


@dataclass
class IndexStats:
    """What one `update_index` did: how many run files it saw, parsed, reused and dropped."""

    path: str
    check: str
    files: int = 0       # run files in the table returned (the machine's, when one is given)
    parsed: int = 0      # files read and parsed this time (new, changed, or not yet indexed)
    reused: int = 0      # rows taken from the index unchanged
    removed: int = 0     # rows of files that are gone
    stats: int = 0       # files stat-ed
    rebuilt: str | None = None  # why an existing index was not used (unreadable, other version…)
    written: bool = False
    workers: int = 1     # processes that parsed (this one and the worker processes it started)


# ---------------------------------------------------------------------------------------------
# Reading and writing the index file


def read_index(path: str | os.PathLike, root_real: str) -> tuple[pa.Table | None, dict, str | None]:
    """An index file's table, if it can be trusted.

    The file is memory-mapped (except on Windows, where a mapped file cannot be replaced, and where
    the file system cannot map it: then it is read): the table's columns are views of it, and pages
    are read as they are used.

    Args:
        path: the index file.
        root_real: the real path of the runs folder it must index.

    Returns:
        (table, metadata, None); (None, {}, None) when there is no file; (None, {}, why) when it
        must be rebuilt (unreadable, an older schema version, another workspace, other columns),
        or when a newer machine_nb wrote it (`why` then starts with NEWER: it is not written over).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return None, {}, None
    try:
        reader = pa.ipc.open_file(_open(path))
        raw = (reader.schema.metadata or {}).get(b"machine_nb")
        meta = json.loads(raw) if raw else {}
        version = meta.get("version")
        if type(version) is int and version > SCHEMA_VERSION:
            return None, {}, f"{NEWER} (schema version {version}; this one reads {SCHEMA_VERSION})"
        if version != SCHEMA_VERSION:
            return None, {}, f"schema version {version!r}, not {SCHEMA_VERSION}"
        if meta.get("runs_root") != root_real:
            return None, {}, "it indexes another workspace"
        if not reader.schema.remove_metadata().equals(INDEX_SCHEMA):
            return None, {}, "its columns differ"
        why = _dirs_problem(meta.get("dirs"), meta.get("dirs_checksum"))  # checked before the table is read
        if why:
            return None, {}, why
        sums = meta.get("checksums")
        if not isinstance(sums, dict) or set(sums) != set(INDEX_SCHEMA.names):
            return None, {}, "its column checksums are missing"
        table = reader.read_all()
        # bytes damaged since the write (a flipped bit in `score`, an invalid UTF-8 byte in
        # `output`) change a column's checksum: the index is rebuilt, never trusted
        for name, col in zip(table.column_names, table.columns):
            if column_checksum(col) != sums[name]:
                return None, {}, f"column {name!r} is damaged (its checksum differs from the one written)"
        # every offset and length checked against its buffers, so a damaged file is an error here,
        # never a read out of bounds later
        for col in table.columns:
            for chunk in col.chunks:
                chunk.validate(full=not pa.types.is_large_string(chunk.type))
                if pa.types.is_large_string(chunk.type):
                    _check_offsets(chunk)
        # one chunk a column: taking rows from many chunks copies them all first, so a lookup of
        # a few rows would cost as much as a copy of the whole column
        if any(c.num_chunks > 1 for c in table.columns):
            table = table.combine_chunks()
        return table.replace_schema_metadata(None), meta, None
    except Exception as exc:  # any unreadable index (truncated, not Arrow, damaged, wrong types) is rebuilt
        return None, {}, f"unreadable ({type(exc).__name__}: {str(exc)[:120]})"


def dirs_checksum(dirs: dict) -> str:
    """A checksum of the index's folder list (its metadata, which the column checksums do not cover).

    Args:
        dirs: folder -> [mtime_ns, inode, subfolders].

    Returns:
        16 hex digits.
    """
    text = json.dumps(dirs, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def _dirs_problem(dirs: object, checksum: object) -> str | None:
    """Why an index's folder list cannot be trusted, else None. A damaged list would make a reload
    skip a folder whose runs then drop out of every load until that folder changes again."""
    if not isinstance(dirs, dict):
        return "its folder list is missing"
    if not isinstance(checksum, str):
        return "its folder list has no checksum"
    if checksum != dirs_checksum(dirs):
        return "its folder list is damaged (its checksum differs from the one written)"
    for d, entry in dirs.items():
        if not (isinstance(entry, list) and len(entry) == 3 and all(type(v) is int for v in entry[:2])
                and isinstance(entry[2], list) and all(isinstance(s, str) for s in entry[2])):
            return f"its folder list has a bad entry for {d!r}"
    return None


def _open(path: str) -> pa.NativeFile:
    """The index file, memory-mapped; read through a plain file on Windows (a mapped file cannot be
    replaced there) and where the file system cannot map it."""
    if os.name != "nt":
        try:
            return pa.memory_map(path)
        except OSError:
            pass
    return pa.OSFile(path)


def _check_offsets(arr: pa.Array) -> None:
    """A string array's offsets are non-decreasing and end inside its data buffer (ValueError if not)."""
    bufs = arr.buffers()
    n = len(arr) + arr.offset
    if bufs[1] is None:
        if len(arr):
            raise ValueError("a string column has no offsets")
        return
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1)[arr.offset:]
    data = 0 if bufs[2] is None else bufs[2].size
    if len(offsets) and (offsets[0] < 0 or offsets[-1] > data or (np.diff(offsets) < 0).any()):
        raise ValueError("a string column's offsets are out of order or past its data")


def column_checksum(col: pa.ChunkedArray | pa.Array) -> str:
    """A cheap checksum of a column's buffers: per buffer, its size and the wrapping sum of its
    64-bit words (which any damaged word changes) and its last bytes, hashed together.

    A pass over the column's bytes at memory speed (numpy), where a CRC or a cryptographic hash
    would cost several times the whole reload (benchmarks/bench_hardening.py measures it).

    Args:
        col: a column (its chunks' buffers, as laid out in the index file).

    Returns:
        16 hex digits.
    """
    parts = []
    for chunk in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]):
        for buf in chunk.buffers():
            if buf is None:
                parts.append("-")
                continue
            words = buf.size // 8
            total = int(np.frombuffer(buf, dtype=np.uint64, count=words).sum(dtype=np.uint64)) if words else 0
            parts.append(f"{buf.size:x}.{total:x}.{bytes(buf[words * 8:]).hex()}")
    return hashlib.blake2b("|".join(parts).encode("ascii"), digest_size=8).hexdigest()


def write_index(path: str | os.PathLike, table: pa.Table, meta: dict) -> None:
    """Write the index atomically (jsonl.atomic_replace), private to the user, with a checksum of
    each column (column_checksum) and of its folder list (dirs_checksum) in its metadata.

    The checksums are of the buffers as the file lays them out (the writer drops unused bitmaps
    and rebases sliced arrays), so the table is written once, read back mapped, its checksums
    taken, and written again with them. An index of the older format (a `.parquet` file beside
    it) is removed once this one is written, and so are the temporary files of a write of this
    index that was killed midway (see _writing).

    Args:
        path: the index file.
        table: the rows (INDEX_SCHEMA).
        meta: the metadata kept beside them (folder times, the runs folder); the schema version and
            the checksums are added.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)

    def write(dest: Path, rows: pa.Table, extra: dict) -> None:
        schema = INDEX_SCHEMA.with_metadata(
            {b"machine_nb": json.dumps({**meta, **extra, "version": SCHEMA_VERSION}).encode("utf-8")})
        with pa.OSFile(os.fspath(dest), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(rows.replace_schema_metadata(schema.metadata), max_chunksize=max(1, rows.num_rows))

    with _writing(path), atomic_replace(path) as tmp:
        laid_out = tmp.with_name(tmp.name + ".1")
        try:
            write(laid_out, table, {})
            source = _open(os.fspath(laid_out))
            try:
                rows = pa.ipc.open_file(source).read_all()
                write(tmp, rows, {"checksums": {name: column_checksum(col)
                                                for name, col in zip(rows.column_names, rows.columns)},
                                  "dirs_checksum": dirs_checksum(meta.get("dirs", {}))})
                del rows
            finally:
                source.close()
        finally:
            try:
                os.unlink(laid_out)
            except OSError:
                pass
    if path.suffix == ".arrow":
        try:
            path.with_suffix(".parquet").unlink()  # the same workspace's index of schema version 1
        except OSError:
            pass


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Hold the lock every index write in `path`'s folder holds (an flock on the folder itself,
    so the cache folder gains no lock file), and remove the temporary files of `path` that a
    write killed midway left (`.<name>.<random>.tmp`, `.tmp.1`): while the lock is held no
    other write has one open. Where the folder cannot be locked (some network file systems),
    nothing is removed.
    """
    with contextlib.ExitStack() as hold:
        try:
            held = hold.enter_context(held_folder(path.parent))
        except OSError:  # the folder cannot be opened
            held = False
        if held:  # else another write may be under way, so no temporary file is removed
            remove_stale_temporaries(path, suffixes=(".tmp", ".tmp.1"))
        yield


def empty_table() -> pa.Table:
    """An index with no rows.

    Returns:
        An empty table of INDEX_SCHEMA.
    """
    return INDEX_SCHEMA.empty_table()


# ---------------------------------------------------------------------------------------------
# Keeping it in step


def update_index(workspace: str | os.PathLike, parse: Parser, *, machine: str | None = None,
                 check: str = "dirs", workers: int | None = None) -> tuple[pa.Table, IndexStats, list[MachineFormatError]]:
    """Bring the workspace's run index up to date and return its rows.

    Args:
        workspace: the workspace (or its `.machine` folder).
        parse: turns `[(path, dir, name, problem)]` into rows, reading files through the `read(k)`
            it is given (frames.py's parser; see Parser).
        machine: scan and refresh only this machine's folders (default None: all); the other rows
            of the index are kept as they are.
        check: how a reload finds what changed. "dirs" (default): stat every folder; a folder whose
            modification time is unchanged has the same files (creating, deleting or renaming a
            file into place, as an atomic write does, changes its folder's time), so only its rows
            marked `recheck` (runs without finishedAt, which a writer is still updating, and bad
            files) are stat-ed; files of changed folders are compared by size and mtime. "files":
            stat every run file, which also sees a file rewritten in place, even one whose size
            and mtime were set back (`cp -p`): a file changed (its st_ctime) since the last
            "files" scan is parsed again (what it costs: benchmarks/bench_run_index.py).
        workers: processes that parse, this one included (default None: one per CPU when there
            are at least PARALLEL_MIN files to parse, else this process alone). The parser must
            pickle for more than one.

    An index written by a newer machine_nb (a later SCHEMA_VERSION) is neither used nor written
    over: every file is parsed, with a warning that says so.

    Returns:
        (table of INDEX_SCHEMA: the rows of `machine` and its nested machines when given, sorted
        newest first (started_at, then id, descending); IndexStats; problems: a MachineFormatError
        per folder that could not be entered, such as a symlink loop).
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, not {check!r}")
    root = os.fspath(runs_root(workspace))
    root_real = os.path.realpath(root)
    ipath = run_index_path(workspace)
    stats = IndexStats(path=str(ipath), check=check)
    problems: list[MachineFormatError] = []  # folders that could not be entered (symlink loops)
    scope = name_segments(machine, "machine name") if machine is not None else []
    prefix = "/".join(scope)
    cached, meta, why = read_index(ipath, root_real)
    stats.rebuilt = why
    if cached is None:
        cached, meta = empty_table(), {"dirs": {}}
    old_dirs: dict[str, list] = meta.get("dirs", {})
    now = time.time_ns()
    # every file whose change time (ctime) is before this was compared at a "files" scan
    files_checked = meta.get("files_checked_ns")
    files_checked = files_checked if type(files_checked) is int else 0

    groups = _groups(cached["dir"])
    in_scope = (lambda d: True) if not prefix else (lambda d: d == prefix or d.startswith(prefix + "/"))
    keep: list[np.ndarray] = []
    # files to parse, by folder: (dirpath, dir, segments, names); paths are made a batch at a time
    todo: list[tuple[str, str, list[str], list[str]]] = []
    new_dirs: dict[str, list] = {d: v for d, v in old_dirs.items() if not in_scope(d)}
    for d, pos in groups.items():
        if not in_scope(d):
            keep.append(pos)  # outside the machine asked for: untouched
    seen_dirs: set[str] = set()
    sizes = cached["size"].to_numpy()
    mtimes = cached["mtime_ns"].to_numpy()
    recheck = cached["recheck"].to_numpy(zero_copy_only=False)
    names_col = cached["name"]

    start = os.path.join(root, *scope) if scope else root
    try:
        st0 = os.stat(start)
    except OSError:
        st0 = None
    above = folder_chain(root, start) if scope else ()
    # the walk's bounds are walk_folders': each real folder once, loops and links to system
    # folders reported, folders outside the workspace read only when they hold run files alone
    visited = set() if st0 is None else {(st0.st_dev, st0.st_ino)}
    stack = [] if st0 is None or not os.path.isdir(start) else [
        (start, list(scope), (*above, (st0.st_dev, st0.st_ino)), st0, outside(start, root_real))]
    while stack:
        dirpath, segments, ancestors, st, far = stack.pop()
        d = "/".join(segments)
        seen_dirs.add(d)
        sig = [st.st_mtime_ns, st.st_ino]
        old = old_dirs.get(d)
        pos = groups.get(d, np.empty(0, dtype=np.int64))
        unchanged = check == "dirs" and old is not None and old[0] != -1 and old[:2] == sig
        relist = False  # list this folder again on the next load
        if unchanged:
            subdirs = [s for s in old[2] if not s.startswith(".")]  # an index written before hidden ones were left out
            if len(pos):
                watched = np.flatnonzero(recheck[pos])
                ok = np.ones(len(pos), dtype=bool)
                names = names_col.take(pa.array(pos[watched])).to_pylist() if len(watched) else []
                for j, name in zip(watched.tolist(), names):
                    p = pos[j]
                    stats.stats += 1
                    fsig = _file_sig(os.path.join(dirpath, name))
                    if fsig is None:
                        ok[j] = False  # gone
                        stats.removed += 1
                        continue
                    if fsig[0] != sizes[p] or fsig[1] != mtimes[p] or mtimes[p] == -1:
                        ok[j] = False
                        todo.append((dirpath, d, segments, [name]))
                keep.append(pos[ok])
        else:
            try:
                with os.scandir(dirpath) as it:
                    entries = list(it)
            except OSError as exc:
                problems.append(MachineFormatError(dirpath, f"cannot list folder: {exc.strerror}"))
                continue
            foreign = foreign_problem(entries, far) if far is not None else None
            if foreign:
                problems.append(MachineFormatError(dirpath, foreign))
                entries = []
            subdirs, files = [], []
            for e in entries:
                if e.name.startswith("."):
                    continue  # hidden files and folders are not Machine's (walk_folders)
                try:
                    is_dir = e.is_dir()
                except OSError:
                    is_dir = False
                if not (is_dir or e.name.endswith(".json")):
                    continue  # a file that is not a run file
                if not utf8_name(e.name):  # no string column holds it: named on every load (the folder is listed again)
                    problems.append(MachineFormatError(os.path.join(dirpath, shown_name(e.name)), "its name is not valid UTF-8: "
                                                       "skipped; rename it (e.g. with convmv) to load it"))
                    relist = True
                elif is_dir:
                    subdirs.append(e.name)
                else:
                    files.append(e.name)
            subdirs.sort()
            if not len(pos):  # nothing indexed here: every file is new (stat-ed as it is read)
                todo.append((dirpath, d, segments, files))
            else:
                fsizes, fmtimes, fctimes, present = [], [], [], []
                base = dirpath + os.sep
                for name in files:
                    fsig = _file_sig(base + name)
                    if fsig is None:
                        continue  # vanished while listing
                    present.append(name)
                    fsizes.append(fsig[0])
                    fmtimes.append(fsig[1])
                    fctimes.append(fsig[2])
                stats.stats += len(present)
                import pandas as pd

                old_names = pd.Index(names_col.take(pa.array(pos)).to_numpy(zero_copy_only=False))
                hit = old_names.get_indexer(present) if present else np.empty(0, dtype=np.int64)
                fs, fm = np.asarray(fsizes, dtype=np.int64), np.asarray(fmtimes, dtype=np.int64)
                same = hit >= 0
                stats.removed += len(pos) - int(same.sum())  # indexed files no longer listed
                if same.any():
                    same_idx = np.flatnonzero(same)
                    old_pos = pos[hit[same_idx]]
                    fresh = (sizes[old_pos] == fs[same_idx]) & (mtimes[old_pos] == fm[same_idx]) \
                        & (mtimes[old_pos] != -1)
                    if check == "files":  # changed since the last "files" scan, its size and mtime kept
                        fresh &= np.asarray(fctimes, dtype=np.int64)[same_idx] < files_checked
                    same[same_idx[~fresh]] = False
                    keep.append(old_pos[fresh])
                todo.append((dirpath, d, segments, [present[i] for i in np.flatnonzero(~same).tolist()]))
        new_dirs[d] = [-1 if relist or sig[0] > now - RACY_NS else sig[0], sig[1], subdirs]
        for name in reversed(subdirs):
            path = os.path.join(dirpath, name)
            problem, key, sub_far = follow_problem(path, name, segments, ancestors, visited, root_real, far)
            if problem:
                problems.append(MachineFormatError(path, problem))
                continue
            try:
                sub = os.stat(path)
            except OSError as exc:
                problems.append(MachineFormatError(path, f"cannot read folder: {exc.strerror}"))
                continue
            stack.append((path, [*segments, name], (*ancestors, key), sub, sub_far))
    for d, pos in groups.items():  # folders in scope that are gone
        if in_scope(d) and d not in seen_dirs:
            stats.removed += len(pos)

    parts = []
    if keep:
        kept = np.concatenate(keep)
        stats.reused = len(kept)
        if len(kept) != cached.num_rows:
            parts.append(cached.take(pa.array(np.sort(kept))))
        else:
            parts.append(cached)
    for table in _parse_all(todo, parse, now, workers, stats):
        parts.append(table)
        stats.parsed += table.num_rows
    stats.stats += stats.parsed  # each parsed file is stat-ed as it is read
    changed = stats.parsed > 0 or stats.removed > 0 or why is not None or new_dirs != old_dirs \
        or not os.path.exists(ipath)
    if changed:
        del cached  # parts hold what is kept of it
        table = sort_table(parts)  # consumes parts: memory holds the table once, plus the columns being sorted
        if why is not None and why.startswith(NEWER):
            import warnings

            warnings.warn(f"the run index {ipath} was {why}: it is left as it is, and every "
                          "run file is parsed on each load; upgrade machine_nb, or set MACHINE_NB_CACHE_DIR "
                          "to another folder to keep an index for this version", stacklevel=user_stacklevel())
        elif os.path.isdir(root) or os.path.exists(ipath):  # no index for a folder that holds no runs
            try:
                checked = now if (check == "files" and not prefix) or stats.reused == 0 else files_checked
                write_index(ipath, table, {"runs_root": root_real, "dirs": new_dirs, "written_ns": now,
                                           "files_checked_ns": checked})
                stats.written = True
            except OSError as exc:  # a cache that cannot be written costs speed, never the result
                import warnings

                warnings.warn(f"could not write the run index {ipath} ({exc.strerror or exc}): the next load parses "
                              "every run file again; set MACHINE_NB_CACHE_DIR to a writable folder", stacklevel=user_stacklevel())
    else:
        table = cached
    if prefix:
        mask = pc.or_(pc.equal(table["dir"], prefix), pc.starts_with(table["dir"], prefix + "/"))
        table = table.filter(mask)
    stats.files = table.num_rows
    return table, stats, problems


def parse_batch(parse: Parser, chunk: list[tuple[str, str, str, str | None]], now: int) -> pa.Table:
    """Read and parse one batch of run files into index rows (INDEX_SCHEMA), here or in a worker.

    Args:
        parse: the parser (see Parser).
        chunk: `[(path, dir, name, problem)]`.
        now: the scan's time in ns: a file modified within RACY_NS of it is marked to be read again.

    Returns:
        The rows, sorted (sort_table), with each file's size and mtime as seen through the handle
        it was read by; a file that is gone when read (deleted since its folder was listed) has
        no row.
    """
    seen: list = [None] * len(chunk)  # (size, mtime_ns) of each file, taken from the handle it is read through

    def read(k: int) -> bytes:
        data, st = read_file(chunk[k][0])  # stat before reading: a later write changes the mtime seen next time
        seen[k] = (st.st_size, st.st_mtime_ns)
        return data

    rows = parse(chunk, read)
    here = np.ones(len(chunk), dtype=bool)
    for k, got in enumerate(seen):
        if got is None:  # not read (misplaced) or unreadable: its stat now, or "re-read next time"
            sig = _file_sig(chunk[k][0])
            here[k] = sig is not None  # deleted since the folder was listed: no row, not a bad file
            seen[k] = sig[:2] if sig else (-1, -1)
    mt = np.array([m for _, m in seen], dtype=np.int64)
    racy = (mt > now - RACY_NS) | (mt == -1)
    table = pa.table({
        "dir": pa.array([c[1] for c in chunk], _STR),
        "name": pa.array([c[2] for c in chunk], _STR),
        "size": pa.array([sz for sz, _ in seen], pa.int64()),
        "mtime_ns": pa.array(np.where(racy, -1, mt)),
        "recheck": pc.or_(rows["recheck"], pa.array(racy)),
        **{f.name: rows[f.name] for f in INDEX_SCHEMA if f.name not in FILE_FIELDS + ("recheck",)},
    }, schema=INDEX_SCHEMA)
    if not here.all():
        table = table.filter(pa.array(here))
    return sort_table(table)  # sorted here (in the workers): the final sort then reads runs of rows in order


def _file_sig(path: str) -> tuple[int, int, int] | None:
    """(size, mtime_ns, ctime_ns) of a run file, or of the symlink itself when it leads nowhere
    (dangling, a loop), so such a file keeps its row (its error named on every load) without being
    read again each time; None when nothing is there. ctime_ns is the time of the last change to
    the file or its metadata, which setting the modification time back also changes (0 on
    Windows, where st_ctime is the creation time)."""
    try:
        st = os.stat(path)
    except OSError:
        try:
            st = os.lstat(path)
        except OSError:
            return None
    return st.st_size, st.st_mtime_ns, 0 if os.name == "nt" else st.st_ctime_ns


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _parse_all(todo: list[tuple[str, str, list[str], list[str]]], parse: Parser, now: int, workers: int | None,
               stats: IndexStats):
    """The parsed batches of every file in `todo`, in no particular order (they are sorted later).

    With at least PARALLEL_MIN files (and more than one CPU), worker processes parse batches of
    TASK files while this process parses batches too (`workers`: processes in all, this one
    included; default None: one per CPU, each with at least PARALLEL_MIN // 2 files). A worker
    that cannot start leaves its batches to this process; a batch whose worker dies is tried in
    a fresh worker once more, and when that one dies too its files are named as skipped
    (skipped_batch), not parsed here; Ctrl-C stops the workers.
    `stats.workers` is set to the processes started, this one included.
    """
    total = sum(len(names) for *_, names in todo)
    if workers is None:
        workers = min(_cpus(), total // max(1, PARALLEL_MIN // 2)) if total >= PARALLEL_MIN else 1
    if workers <= 1 or not sys.executable:
        for chunk in _batches(todo, BATCH):
            yield parse_batch(parse, chunk, now)
        return
    from .parse_pool import ParsePool

    with ParsePool(workers - 1) as pool:
        stats.workers = 1 + pool.started
        yield from pool.run(parse_batch, ((parse, chunk, now) for chunk in _batches(todo, TASK)),
                            crashed=skipped_batch)


def skipped_batch(parse: Parser, chunk: list[tuple[str, str, str, str | None]], now: int) -> pa.Table:
    """Index rows naming each file of a batch that ended two worker processes (out of memory,
    most likely) as skipped, not parsed: this process would run out of memory too.

    Each row keeps the file's size and mtime and is rechecked on every load, so it is named on
    every load and parsed again once the file changes (or after `remove_index`).

    Args:
        parse: the batch's parser (unused: the call's arguments are parse_batch's).
        chunk: `[(path, dir, name, problem)]`.
        now: the scan's time in ns (a file modified within RACY_NS of it is read again next time).

    Returns:
        The rows (INDEX_SCHEMA), one per file still there.
    """
    sigs = [_file_sig(c[0]) for c in chunk]
    kept = [(c, s) for c, s in zip(chunk, sigs) if s is not None]
    mt = np.array([s[1] for _, s in kept], dtype=np.int64)
    n = len(kept)
    why = (f"a parse worker process ended twice while reading the batch of {len(chunk):,} run files this one "
           "is in (out of memory?): skipped; it is read again when it changes, or once the index is removed "
           "(machine_nb.store.index.remove_index)")
    cols = {
        "dir": pa.array([c[1] for c, _ in kept], _STR),
        "name": pa.array([c[2] for c, _ in kept], _STR),
        "size": pa.array([s[0] for _, s in kept], pa.int64()),
        "mtime_ns": pa.array(np.where(mt > now - RACY_NS, -1, mt), pa.int64()),
        "recheck": pa.array([True] * n, pa.bool_()),
        "error": pa.array([why] * n, _STR),
    }
    return sort_table(pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in INDEX_SCHEMA},
                               schema=INDEX_SCHEMA))


def _batches(todo: list[tuple[str, str, list[str], list[str]]], size: int = BATCH):
    """`[(path, dir, name, problem)]` lists of up to `size` files, folder by folder."""
    batch: list[tuple[str, str, str, str | None]] = []
    for dirpath, d, segments, names in todo:
        base = dirpath + os.sep
        misplaced = folder_problem(segments, "x", "runs") is not None  # once per folder, not per file
        for name in names:
            batch.append((base + name, d, name, folder_problem(segments, name, "runs") if misplaced else None))
            if len(batch) >= size:
                yield batch
                batch = []
    if batch:
        yield batch


def sort_table(table: pa.Table | list[pa.Table]) -> pa.Table:
    """Rows newest first: started_at, then id, both descending, missing last; then dir and name.

    Args:
        table: a table, or a list of tables: the list is concatenated and emptied, so this holds
            the only reference to the rows and each column is freed as soon as its sorted copy is made.

    Returns:
        The sorted table.
    """
    if isinstance(table, list):
        parts = table
        table = pa.concat_tables(parts) if parts else empty_table()
        parts.clear()
    if table.num_rows < 2:
        return table
    order = pc.sort_indices(table, sort_keys=[("started_at", "descending", "at_end"), ("id", "descending", "at_end"),
                                              ("dir", "ascending", "at_end"), ("name", "ascending", "at_end")])
    # a few columns at a time, so only those are held twice (table.take would copy all at once),
    # in threads, since pyarrow releases the GIL while it copies
    schema, cols = table.schema, table.columns
    del table
    def sort_column(i: int) -> None:
        cols[i] = cols[i].take(order)  # the unsorted column is freed as its sorted copy replaces it

    if len(order) < 100_000:
        for i in range(len(cols)):
            sort_column(i)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(4, _cpus())) as pool:
            list(pool.map(sort_column, range(len(cols))))
        pa.default_memory_pool().release_unused()  # hand the freed columns back to the system
    return pa.table(cols, schema=schema)


def _groups(dirs: pa.ChunkedArray) -> dict[str, np.ndarray]:
    """Row positions per folder (one pass: dictionary codes, then a stable argsort)."""
    if len(dirs) == 0:
        return {}
    enc = pc.dictionary_encode(dirs).combine_chunks()
    codes = enc.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(enc.dictionary) + 1))
    return {enc.dictionary[k].as_py(): order[bounds[k]:bounds[k + 1]] for k in range(len(enc.dictionary))
            if bounds[k + 1] > bounds[k]}


def remove_index(workspace: str | os.PathLike) -> bool:
    """Delete a workspace's run index (the next load_runs rebuilds it).

    Args:
        workspace: the workspace.

    Returns:
        True when there was one.
    """
    path = run_index_path(workspace)
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


__all__ = ["INDEX_SCHEMA", "SCHEMA_VERSION", "IndexStats", "cache_dir", "parse_batch", "run_index_path",
           "update_index", "read_index", "remove_index", "runs_root", "sort_table"]
