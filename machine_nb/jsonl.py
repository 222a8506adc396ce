"""JSONL files as Machine writes them: read line by line with errors that name file and line,
write whole files atomically (temp file + rename), append under a lock so several writers
never interleave or lose a row.

Reading streams (one line in memory at a time), so a 100,000-row file costs no more than its
longest line. The lock is a sidecar file (`.<name>.lock`) rather than the data file itself, so a
rewrite (temp + rename, e.g. undoing a tag) and appends exclude each other too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from .errors import MachineFormatError

OnError = Literal["raise", "warn", "skip"]


class SkippedLines(UserWarning):
    """Lines a tolerant reader left out, each with its file, line and reason."""


def iter_jsonl(path: str | os.PathLike, *, on_error: OnError = "raise",
               skipped: list[MachineFormatError] | None = None) -> Iterator[tuple[int, Any]]:
    """Yield `(line_number, value)` for each non-blank line of a JSONL file (1-based).

    on_error: "raise" (default) raises MachineFormatError at the first bad line; "warn" skips bad
    lines and issues one SkippedLines warning listing them at the end; "skip" skips them silently
    but appends each error to `skipped` when given. Bad lines are non-UTF-8 bytes, invalid JSON, and
    a truncated last line (no newline at the end and not valid JSON).
    """
    path = Path(path)
    errors: list[MachineFormatError] = [] if skipped is None else skipped
    start = len(errors)
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise MachineFormatError(path, "file not found") from None
    with fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                err = MachineFormatError(path, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})", line=number)
            else:
                try:
                    yield number, json.loads(text)
                    continue
                except json.JSONDecodeError as exc:
                    truncated = not raw.endswith(b"\n")
                    what = "truncated last line (no newline, incomplete JSON)" if truncated else f"invalid JSON: {exc.msg} at column {exc.colno}"
                    err = MachineFormatError(path, what, line=number)
            if on_error == "raise":
                raise err
            errors.append(err)
    if on_error == "warn" and len(errors) > start:
        listed = "\n".join(f"  {e}" for e in errors[start:start + 20])
        more = f"\n  … and {len(errors) - start - 20} more" if len(errors) - start > 20 else ""
        warnings.warn(SkippedLines(f"skipped {len(errors) - start} unreadable line(s) of {path}:\n{listed}{more}"), stacklevel=2)


def read_jsonl(path: str | os.PathLike, *, on_error: OnError = "raise") -> list[Any]:
    """All values of a JSONL file, in order (see iter_jsonl for on_error)."""
    return [value for _, value in iter_jsonl(path, on_error=on_error)]


def dumps_line(value: Any) -> str:
    """One JSONL line (no newline): compact separators, non-ASCII kept as is, like JSON.stringify."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int = 0o600) -> Path:
    """Write a whole file so that readers see the old content or the new, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_jsonl(lines: Iterable[Any], path: str | os.PathLike) -> Path:
    """Write values as a JSONL file atomically (temp file + rename); returns the path.

    Accepts dicts or a DataFrame (one line per row)."""
    if hasattr(lines, "to_dict") and hasattr(lines, "columns"):  # a DataFrame
        lines = lines.to_dict("records")
    body = "".join(dumps_line(v) + "\n" for v in lines)
    return atomic_write_text(path, body)


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive lock that appends and rewrites of `path` share."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(f".{path.name}.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def append_jsonl(path: str | os.PathLike, rows: Iterable[Any], *, mode: int = 0o600) -> Path:
    """Append rows under the file's lock, in one write, synced to disk.

    If the file ends without a newline (a writer died mid-line), the new rows start on a fresh
    line, so the broken line stays visible on its own and no new row is merged into it.
    """
    data = "".join(dumps_line(r) + "\n" for r in rows).encode("utf-8")
    with locked(path) as path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
        try:
            size = os.fstat(fd).st_size
            if size:
                with open(path, "rb") as fh:
                    fh.seek(size - 1)
                    if fh.read(1) != b"\n":
                        data = b"\n" + data
            view = memoryview(data)
            while view:  # os.write may write less than asked
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    return path
