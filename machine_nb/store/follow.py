"""Following a workspace while machines write to it: an append-only JSONL file read from where the
last read stopped (`LineTail`: `.machine/events.jsonl`, a training run's `metrics.jsonl`), and the
run files that land under `.machine/runs/` (`RunFolderWatch`).

Both poll: one `stat` per followed file and a few per run folder when nothing changed, so a view
that polls a few times a second costs next to nothing while machines are idle, and works the same on
every platform and file system (network mounts included). A folder that changed is listed again,
which for a machine with tens of thousands of runs costs tens of milliseconds each time; so where
the operating system reports file events (inotify, FSEvents, kqueue, Windows, through the
`watchdog` library) the run folders are listed only every FULL_LIST_S seconds, as a safety net,
and the runs renamed into place between two listings are taken from those events.

Writers are Machine's processes, which append one JSON line per event and write each run as a
temp file renamed into place; the rules here are what make a follower correct against them:

- a partial last line (a writer mid-line) is not read until its newline arrives;
- a file truncated or replaced (another inode, or other first bytes) is read again from its
  start, and the read says so in a note, so the caller can drop what it counted from the old file;
- a run file is seen once, when its name appears in its folder (temp files, which do not end in
  `.json` or start with ".", are never seen); one modified within RACY_NS of being seen may be a
  file still written in place, so it is watched and reported again when it changes (see
  `RunFolderWatch.watch`); a folder is listed again only when its
  modification time changed, or changed so recently that a later rename could share its
  timestamp tick (RACY_NS);
- nothing is read twice and nothing is skipped, however many lines or files arrive between
  polls: each poll returns all of them, and the caller shows totals of what it was handed.

What the rows mean (counts per machine, the event stream, loss curves) is decided by the
dashboard (`widgets/dashboard.py`); the run files found here are parsed as `load_runs` parses them.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.jsonl import not_regular, open_regular, parse_json
from ..errors import MachineFormatError
from .workspace import shown_name, utf8_name

# The first bytes of a followed file, kept to tell a file rewritten from its start (same inode,
# same or larger size) from one that only grew.
HEAD_BYTES = 64
# A folder modified this close to a poll may get another file within the same timestamp tick
# (file systems keep mtimes from 1 ns to 2 s apart): it is listed again on the next poll.
RACY_NS = 2_000_000_000
# With file events, every folder that changed is still listed this often (events can be lost: a
# kernel queue that overflowed, a folder created and filled before its watch was added).
FULL_LIST_S = 10.0
# File events kept between two polls; beyond it the folders are listed instead.
QUEUE_MAX = 100_000
# At most this many bytes are read in one poll (a huge backlog is read over several polls, so a
# view stays responsive while it catches up).
MAX_READ = 64 * 1024 * 1024


@dataclass
class TailLine:
    """One complete line of a followed JSONL file.

    Attributes:
        line: its 1-based line number in the file.
        text: the line as text (undecodable bytes replaced), without its newline.
        value: the parsed JSON value (None when it does not parse).
        error: why it does not parse (None when it does).
    """

    line: int
    text: str
    value: object = None
    error: str | None = None


@dataclass
class TailRead:
    """What one `LineTail.read` found.

    Attributes:
        lines: the lines completed since the last read, in order.
        reset: the file was truncated, replaced or removed: `lines` come from its start, and what
            was read before belongs to a file that is gone.
        notes: what happened, in words (e.g. "… was truncated: read again from the start").
        more: part of the file is still unread (a backlog over MAX_READ): read again soon.
    """

    lines: list[TailLine] = field(default_factory=list)
    reset: bool = False
    notes: list[str] = field(default_factory=list)
    more: bool = False


class LineTail:
    """Follow an append-only JSONL file: each `read()` returns the lines completed since the last.

    Args:
        path: the file (it may not exist yet: it is read once it appears).
        parse: parse each line as JSON (default True; False leaves `value` None).
    """

    def __init__(self, path: str | os.PathLike, *, parse: bool = True) -> None:
        self.path = os.fspath(path)
        self.parse = parse
        self.offset = 0      # bytes of whole lines read
        self.lines = 0       # lines read
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
        self._head = b""     # its first bytes (up to HEAD_BYTES)
        self._seen: tuple[int, int] | None = None   # (size, mtime_ns) at the last read
        self._refused: tuple[int, int] | None = None  # (st_dev, st_ino) of a non-regular file noted
        self._unreadable: str | None = None  # why the file could not be opened or read, once noted
        self._skipping = False  # inside a line longer than MAX_READ: bytes up to its newline are dropped

    def _restart(self) -> None:
        self.offset = self.lines = 0
        self._ident, self._head, self._seen = None, b"", None
        self._skipping = False

    def _cannot_read(self, out: TailRead, why: str) -> TailRead:
        """Note once (until it changes) that the file is there but cannot be read; the next poll tries again."""
        if why != self._unreadable:
            out.notes.append(f"{self.path}: {why}: not read (tried again on every poll)")
        self._unreadable = why
        self._seen = None
        return out

    def read(self) -> TailRead:
        """The lines completed since the last read.

        Returns:
            A TailRead; a partial last line stays unread until its newline is written. A path
            that is not a regular file (a FIFO, a device, a folder) is not read: one note says so.
        """
        out = TailRead()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._ident is not None:
                out.reset = True
                out.notes.append(f"{self.path} was removed: it is read from its start when it appears again")
                self._restart()
            return out
        ident = (st.st_dev, st.st_ino)
        if self._ident is not None and (st.st_size, st.st_mtime_ns) == self._seen and ident == self._ident:
            return out  # unchanged: the one stat is all an idle poll costs
        what = not_regular(st.st_mode)
        if what is not None:  # a FIFO would block the open, a device never end the read
            if self._ident is not None:
                out.reset = True
                self._restart()
            if self._refused != ident:  # said once, not on every poll
                out.notes.append(f"{self.path}: {what}, not a regular file: not read")
            self._refused = ident
            return out
        try:
            f = open_regular(self.path)
        except MachineFormatError as exc:
            if not os.path.lexists(self.path):  # removed between the stat and the open: next poll
                return out
            return self._cannot_read(out, exc.reason)  # permission denied, or replaced by a non-file
        self._refused = None
        try:
            with f:
                st = os.fstat(f.fileno())  # the file actually opened (a rename may have come between)
                ident = (st.st_dev, st.st_ino)
                why = None
                if self._ident is not None:
                    if ident != self._ident:
                        why = "was replaced by another file"
                    elif st.st_size < self.offset:
                        why = f"was truncated (to {st.st_size:,} bytes, {self.offset:,} had been read)"
                    elif self._head and f.read(len(self._head)) != self._head:
                        why = "was rewritten from its start"
                if why:
                    out.reset = True
                    out.notes.append(f"{self.path} {why}: read again from the start")
                    self._restart()
                self._ident = ident
                f.seek(self.offset)
                chunk = f.read(MAX_READ)
        except OSError as exc:  # an I/O error mid-read (a failing disk, a network mount gone)
            return self._cannot_read(out, f"cannot read: {exc.strerror or exc}")
        self._unreadable = None
        if self._skipping:  # the rest of an over-long line: dropped up to its newline
            nl = chunk.find(b"\n")
            drop = len(chunk) if nl < 0 else nl + 1
            self.offset += drop
            chunk = chunk[drop:]
            if nl >= 0:
                self._skipping = False
                self.lines += 1
        end = chunk.rfind(b"\n") + 1  # a partial last line waits for its newline
        if len(self._head) < HEAD_BYTES and self.offset == 0:
            self._head = chunk[:min(HEAD_BYTES, end)]
        if self.offset + len(chunk) < st.st_size:
            out.more = True
            self._seen = None  # read again next time even if nothing changes
        else:
            self._seen = (st.st_size, st.st_mtime_ns) if end == len(chunk) else None
        if end == 0:
            if len(chunk) >= MAX_READ:  # one line longer than a whole read: skip it, say so
                out.notes.append(f"{self.path}:{self.lines + 1}: a line longer than {MAX_READ:,} bytes, skipped")
                if self.offset == 0:
                    self._head = chunk[:HEAD_BYTES]
                self.offset += len(chunk)
                self._skipping = True
                out.more = out.more or self.offset < st.st_size
                self._seen = None
            return out
        self.offset += end
        path = self.path
        for raw in chunk[:end].split(b"\n")[:-1]:
            self.lines += 1
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw.strip():
                continue
            text = raw.decode("utf-8", errors="replace")
            item = TailLine(self.lines, text)
            if self.parse:
                try:
                    item.value = parse_json(raw, path, self.lines)
                except ValueError as exc:  # MachineFormatError is one
                    item.error = str(exc)
            out.lines.append(item)
        return out


@dataclass
class _Folder:
    sig: tuple[int, int] | None  # (mtime_ns, inode) when listed; None: list it next poll
    names: set[str]
    subdirs: set[str]


@dataclass
class FolderChanges:
    """What one `RunFolderWatch.poll` found.

    Attributes:
        added: run files that appeared, as (path, folder, name): folder is the machine name the
            folder spells ("chatbot/triage"; "" for a file directly in `runs/`).
        removed: paths of run files that are gone.
        changed: watched run files (see `RunFolderWatch.watch`) written again since.
        notes: folders that could not be listed (their runs are left out until they can be),
            each said once, and again only when the reason changes; files and folders whose names
            are not valid UTF-8 (left out), each said once.
    """

    added: list[tuple[str, str, str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _FileEvents:
    """The operating system's file events under a folder (watchdog's native observer), queued as
    ("file+" | "file-" | "dir" | "?", path) for RunFolderWatch."""

    def __init__(self, observer: object, queue: collections.deque) -> None:
        self.observer = observer
        self.queue = queue

    @classmethod
    def start(cls, root: str) -> "_FileEvents | None":
        """Watch `root` recursively; None where no native observer runs (or `root` is missing)."""
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
            from watchdog.observers.polling import PollingObserver
        except ImportError:
            return None
        if Observer is PollingObserver or not os.path.isdir(root):
            return None  # a polling observer lists folders too: our own listing does that
        queue: collections.deque = collections.deque(maxlen=QUEUE_MAX)

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: object) -> None:
                kind = event.event_type  # type: ignore[attr-defined]
                if event.is_directory:  # type: ignore[attr-defined]
                    if kind in ("created", "moved", "deleted"):
                        queue.append(("dir", ""))
                    return
                if kind == "created":  # written in place: read again once its writer is done
                    queue.append(("new", event.src_path))  # type: ignore[attr-defined]
                elif kind == "moved":
                    queue.append(("file-", event.src_path))  # type: ignore[attr-defined]
                    queue.append(("file+", event.dest_path))  # type: ignore[attr-defined]
                elif kind == "deleted":
                    queue.append(("file-", event.src_path))  # type: ignore[attr-defined]

        observer = Observer()
        try:
            observer.schedule(Handler(), root, recursive=True)
            observer.daemon = True
            observer.start()
        except Exception:  # out of inotify watches, permissions: fall back to listing
            return None
        return cls(observer, queue)

    def stop(self) -> None:
        try:
            self.observer.stop()  # type: ignore[attr-defined]
            self.observer.join(5)  # type: ignore[attr-defined]
        except Exception:
            pass

    def drain(self) -> list[tuple[str, str]]:
        if len(self.queue) >= QUEUE_MAX:  # events were dropped while nobody polled: list instead
            self.queue.clear()
            return [("dir", "")]
        out = []
        while self.queue:
            out.append(self.queue.popleft())
        return out


class RunFolderWatch:
    """The run files that land under a workspace's `.machine/runs/`, each reported once.

    Args:
        root: the `runs` folder.
        known: paths of run files already read (e.g. a `load_runs` frame's `path` column), under
            `root` however it is spelled (relative, absolute, through a symlink); their folders
            are listed on the first poll and only files not among these are reported.
            Default None: the first poll reports every run file there is.
        events: take new files from the operating system's file events where it reports them,
            listing folders only every FULL_LIST_S seconds (default True; False: list every
            folder that changed on every poll).

    `close()` stops the file events.
    """

    def __init__(self, root: str | os.PathLike, known: Iterable[str] | None = None, *, events: bool = True) -> None:
        self.root = os.fspath(root)
        self._folders: dict[str, _Folder] = {}
        self._unlisted: dict[str, str] = {}  # folder path -> why it could not be listed, as said
        self._misnamed: set[str] = set()  # paths whose names are not UTF-8, as said
        self._watched: dict[str, tuple[str, str, tuple[int, int, int]]] = {}
        self._watch_lock = threading.Lock()  # watch/unwatch may come from another thread than poll
        # files watched by this class, not the caller (created in place, or listed just after a
        # write): each is dropped once it has not changed for RACY_NS, so their stats stay few
        self._auto: set[str] = set()
        self._events = _FileEvents.start(self.root) if events else None
        self._listed_at = -math.inf
        if known is not None:
            # the paths may spell the folder otherwise (load_runs gives absolute paths, a watch
            # may be given a relative one or a symlink's): each spelling of the root is tried,
            # then the real path of a path's folder (once per folder)
            bases = list(dict.fromkeys(b + os.sep for b in (self.root, os.path.abspath(self.root),
                                                            os.path.realpath(self.root))))
            real_base = bases[-1]
            real_dirs: dict[str, str | None] = {}
            for path in known:
                path = os.fspath(path)
                for b in bases:
                    if path.startswith(b):
                        rel_path = path[len(b):]
                        break
                else:
                    folder, _, name = path.rpartition(os.sep)
                    if folder not in real_dirs:
                        real = os.path.realpath(folder) + os.sep
                        real_dirs[folder] = real[len(real_base):] if real.startswith(real_base) else None
                    if real_dirs[folder] is None:
                        continue
                    rel_path = real_dirs[folder] + name
                rel, _, name = rel_path.rpartition(os.sep)
                d = rel.replace(os.sep, "/")
                self._folders.setdefault(d, _Folder(None, set(), set())).names.add(name)
            for d in list(self._folders):  # the folders above, so nested machines are walked to
                parts = d.split("/") if d else []
                for i in range(len(parts)):
                    up = "/".join(parts[:i])
                    self._folders.setdefault(up, _Folder(None, set(), set())).subdirs.add(parts[i])

    @property
    def files(self) -> int:
        """How many run files are known now."""
        return sum(len(f.names) for f in self._folders.values())

    def watch(self, path: str, folder: str, name: str) -> None:
        """Also report this run file when it is written again (an unfinished run its writer will
        rewrite): each poll stats it until `unwatch` (watching it again changes nothing).

        Args:
            path, folder, name: as in FolderChanges.added.
        """
        # no signature yet: the next poll reports it once, so a rewrite that came between its read
        # and this call is not missed (reading an unchanged run again counts nothing twice)
        with self._watch_lock:
            if path not in self._watched or path in self._auto:
                self._watched[path] = (folder, name, (-1, -1, -1))
                self._auto.discard(path)

    def unwatch(self, path: str) -> None:
        """Stop reporting rewrites of a run file (it finished)."""
        with self._watch_lock:
            self._watched.pop(path, None)
            self._auto.discard(path)

    def close(self) -> None:
        """Stop following file events (polls list folders from then on)."""
        if self._events is not None:
            self._events.stop()
            self._events = None

    def poll(self, *, full: bool = False) -> FolderChanges:
        """What changed since the last poll: from file events, or by listing the folders that changed.

        File events arrive a moment after the write: a file renamed into place just before a poll
        may be reported by the next one (a listing, `full=True`, sees it at once).

        Args:
            full: list the folders that changed even when file events are followed (default False).

        Returns:
            FolderChanges: every file that appeared or went since the last poll, each once.
        """
        events = self._events
        if events is not None and not full and time.monotonic() - self._listed_at < FULL_LIST_S:
            out = self._from_events(events.drain())
            if out is not None:
                self._check_watched(out)
                return out
        if events is not None:
            events.drain()  # the listing below sees what they said; later ones stay queued
        self._listed_at = time.monotonic()
        out = self._list()
        self._check_watched(out)
        return out

    def _from_events(self, queued: list[tuple[str, str]]) -> FolderChanges | None:
        """The changes file events report; None when a folder came or went (then list instead)."""
        out = FolderChanges()
        base = self.root + os.sep
        files = []
        for kind, path in queued:  # decided before anything is changed: events, or a listing
            if kind == "dir":
                return None
            if not path.startswith(base):
                continue
            rel, _, name = path[len(base):].rpartition(os.sep)
            if not name.endswith(".json") or name.startswith(".") or not utf8_name(path):
                continue  # (a name that is not UTF-8 is named by the next listing)
            d = rel.replace(os.sep, "/")
            if d not in self._folders:
                return None  # a folder not listed yet
            files.append((kind, path, d, name))
        added: dict[str, tuple[str, str, str]] = {}
        for kind, path, d, name in files:
            folder = self._folders[d]
            if kind in ("file+", "new"):
                if name not in folder.names:
                    folder.names.add(name)
                    added[path] = (path, d, name)
                if kind == "new":
                    # written in place, so it may be read half-written: report it again if it grows
                    try:
                        st = os.stat(path)
                    except OSError:
                        continue
                    self._watch_auto(path, d, name, st)
            elif name in folder.names and not os.path.exists(path):
                folder.names.discard(name)
                if added.pop(path, None) is None:
                    out.removed.append(path)
        out.added = list(added.values())
        return out

    def _watch_if_recent(self, path: str, d: str, name: str, now: int) -> None:
        """Watch a listed run file modified within RACY_NS of the listing: a file written in place
        may be listed half-written, so it is reported again (as changed) once it is written on."""
        try:
            st = os.stat(path)
        except OSError:
            return
        if st.st_mtime_ns > now - RACY_NS:
            self._watch_auto(path, d, name, st)

    def _watch_auto(self, path: str, d: str, name: str, st: os.stat_result) -> None:
        with self._watch_lock:
            if path not in self._watched:
                self._watched[path] = (d, name, (st.st_ino, st.st_size, st.st_mtime_ns))
                self._auto.add(path)

    def _check_watched(self, out: FolderChanges) -> None:
        now = time.time_ns()
        with self._watch_lock:
            watched = list(self._watched.items())
        for path, (d, name, was) in watched:
            try:
                st = os.stat(path)
            except OSError:
                continue  # gone: reported by its folder
            now_sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            if now_sig != was:
                with self._watch_lock:
                    if path in self._watched:
                        self._watched[path] = (d, name, now_sig)
                out.changed.append((path, d, name))
            elif path in self._auto and st.st_mtime_ns <= now - RACY_NS:
                with self._watch_lock:  # written and quiet since: no longer watched
                    if path in self._auto and self._watched.get(path, (0, 0, None))[2] == was:
                        del self._watched[path]
                        self._auto.discard(path)

    def _list(self) -> FolderChanges:
        """List the folders that changed since they were last listed.

        The folders walked are the ones `load_runs` walks (store.workspace.follow_problem): each
        real folder once, symlink loops not entered, and links out of the workspace followed only
        to a machine's folder (not to a file system's root, a mount point or a folder holding
        the workspace; a folder out there is read only when it holds nothing but run files).
        """
        from .workspace import follow_problem, foreign_problem

        out = FolderChanges()
        now = time.time_ns()
        try:
            st0 = os.stat(self.root)
        except OSError:
            st0 = None
        root_real = os.path.realpath(self.root)
        top = () if st0 is None else ((st0.st_dev, st0.st_ino),)
        visited = set(top)
        # (folder, its path, identities of the folders it is inside of and its own, its real path
        # when outside the workspace)
        stack = [("", self.root, top, None)]
        seen: set[str] = set()
        while stack:
            d, dirpath, ancestors, far = stack.pop()
            try:
                st = os.stat(dirpath)
            except OSError:
                continue
            seen.add(d)
            folder = self._folders.get(d)
            sig = (st.st_mtime_ns, st.st_ino)
            if folder is None or folder.sig != sig:
                names, subdirs = set(), set()
                try:
                    with os.scandir(dirpath) as it:
                        entries = list(it)
                except OSError as exc:
                    why = exc.strerror or type(exc).__name__
                    if self._unlisted.get(dirpath) != why:
                        self._unlisted[dirpath] = why
                        out.notes.append(f"{dirpath}: could not list its run files ({why}); they are left out "
                                         "until it can be listed")
                    continue
                self._unlisted.pop(dirpath, None)
                if far is not None and foreign_problem(entries, far):
                    entries = []  # outside the workspace and not a machine's folder: not read
                for e in entries:
                    n = e.name
                    if not utf8_name(n):  # its rows could not be made (string columns): named once, not reported
                        if e.path not in self._misnamed:
                            self._misnamed.add(e.path)
                            out.notes.append(f"{shown_name(e.path)}: its name is not valid UTF-8: left out; rename it (e.g. with "
                                             "convmv) to follow it")
                        continue
                    if n.startswith("."):
                        continue  # hidden files and folders are not Machine's (walk_folders)
                    if n.endswith(".json"):
                        names.add(n)  # a folder named *.json is rare; is_dir() only if asked
                    else:
                        try:
                            if e.is_dir():
                                subdirs.add(n)
                        except OSError:
                            pass
                old = folder.names if folder is not None else set()
                base = dirpath + os.sep
                for n in sorted(names - old):
                    out.added.append((base + n, d, n))
                    self._watch_if_recent(base + n, d, n, now)
                out.removed.extend(base + n for n in old - names)
                folder = _Folder(None if sig[0] > now - RACY_NS else sig, names, subdirs)
                self._folders[d] = folder
            segments = d.split("/") if d else []
            for s in sorted(folder.subdirs, reverse=True):
                path = os.path.join(dirpath, s)
                problem, key, sub_far = follow_problem(path, s, segments, ancestors, visited, root_real, far)
                if problem is None:
                    stack.append((f"{d}/{s}" if d else s, path, (*ancestors, key), sub_far))
        for d in [d for d in self._folders if d not in seen]:  # folders that are gone
            gone = self._folders.pop(d)
            base = os.path.join(self.root, *d.split("/")) + os.sep if d else self.root + os.sep
            out.removed.extend(base + n for n in gone.names)
        return out


__all__ = ["FolderChanges", "LineTail", "RunFolderWatch", "TailLine", "TailRead"]
