"""JSONL files as Machine writes them: read line by line with errors that name file and line,
write whole files atomically (temp file + rename), append under a lock so several writers
never interleave or lose a row.

Reading streams (one line in memory at a time), so a 100,000-row file costs no more than its
longest line. A value nested deeper than MAX_DEPTH is a bad line like any other (the same on every
call stack, where Python's own recursion limit would depend on how deep the caller already is).
The lock is a sidecar file (`.<name>.lock`) rather than the data file itself, so a rewrite
(atomic_replace, e.g. undoing a tag) and appends exclude each other too.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import re
import stat
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from ..errors import MachineFormatError, user_stacklevel

OnError = Literal["raise", "warn", "skip"]

MAX_DEPTH = 512
"""Deepest nesting of arrays and objects a line may have. Machine's records nest about 10 deep;
json.loads itself fails near 1,000 levels minus the caller's stack, and code that walks the value
afterwards needs headroom below Python's recursion limit (1,000)."""


class SkippedLines(UserWarning):
    """Lines a tolerant reader left out, each with its file, line and reason."""


def json_error_reason(exc: json.JSONDecodeError) -> str:
    """The reason of a JSON syntax error in one phrase.

    The parser's messages may end in "at" already ("Unterminated string starting at"), so the
    column is appended without doubling the word.

    Args:
        exc: the json module's error.

    Returns:
        "invalid JSON: <what> at column <n>".
    """
    if exc.msg.startswith("Unexpected UTF-8 BOM"):  # an editor's "UTF-8 with BOM"
        return ("invalid JSON: the line starts with a UTF-8 byte order mark (BOM), which JSONL readers (sft, evaluate, "
                "Machine) refuse: save the file as UTF-8 without a BOM")
    what = exc.msg.rstrip(": ")
    what = what[:-3] if what.endswith(" at") else what
    return f"invalid JSON: {what[:1].lower()}{what[1:]} at column {exc.colno}"


_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(_BRACKETS)))
_STEPS = bytes.maketrans(_BRACKETS, b"\x01\xff\x01\xff")  # open +1, close -1 (as signed bytes)


def depth_bound(raw: bytes) -> int:
    """An upper bound on the nesting depth of a JSON text, at C speed: the deepest run of unclosed
    brackets, strings included (a bracket inside a string can only raise the bound). A text with
    no more brackets than MAX_DEPTH gets that count, without the scan.

    Args:
        raw: the JSON text.

    Returns:
        The bound.
    """
    opened = raw.count(b"[") + raw.count(b"{")
    if opened <= MAX_DEPTH:
        return opened
    steps = raw.translate(None, _NOT_BRACKETS).translate(_STEPS)
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0)


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether arrays/objects nest more than `limit` levels deep in a parsed value (a loop, not
    recursion: brackets inside strings can make depth_bound pass the limit; this tells without a
    re-parse).

    Args:
        value: the value.
        limit: the deepest nesting allowed.

    Returns:
        True when some array or object is nested deeper.
    """
    stack = [(value, 1)] if isinstance(value, (list, dict)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return False


_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]')  # strings, brackets, commas, colons


def _too_deep_at(raw: bytes) -> tuple[int, str | None]:
    """(1-based line, top-level field) where a JSON text's nesting first passes MAX_DEPTH: the
    field is the key of the top-level object's member (or the index of the top-level array's
    element) it happens in, None when that cannot be told. Only called on the error path."""
    depth, field, top_is_object, index, last_string = 0, None, True, 0, b""
    for m in _TOKENS.finditer(raw):
        token = m.group()
        first = token[:1]
        if first == b'"':
            last_string = token
        elif first in b"[{":
            if depth == 0:
                top_is_object = first == b"{"
            elif depth == 1 and not top_is_object:
                field = str(index)
            depth += 1
            if depth > MAX_DEPTH:
                return raw.count(b"\n", 0, m.start()) + 1, field
        elif first in b"]}":
            depth -= 1
        elif depth == 1 and first == b":" and top_is_object:
            try:
                field = json.loads(last_string)
            except ValueError:
                field = last_string[1:-1].decode("utf-8", "replace")
        elif depth == 1 and first == b",":
            index += 1
    return raw.count(b"\n") + 1, field


def parse_json(text: str | bytes, path: str | os.PathLike | None = None, line: int | None = None) -> Any:
    """One JSON value, or MachineFormatError (a ValueError) naming `path`, the line and the field.

    Besides syntax errors, a value nested deeper than MAX_DEPTH is refused, so no caller ever sees
    a RecursionError, here or while walking the value later; its error names the top-level field
    the nesting is in.

    Args:
        text: the JSON text (bytes must be UTF-8).
        path: the file it came from, named in errors (default None: in-memory text).
        line: the text's line in its file (a JSONL row's number). Default None: for a document
            of several lines, errors name the line within it (a syntax error's, or the one where
            the nesting passes MAX_DEPTH); a one-line text gets none.

    Returns:
        The value.

    Raises:
        MachineFormatError: not UTF-8, invalid JSON, or nested too deep.
    """
    raw = text if isinstance(text, bytes) else None
    if raw is not None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = line
            if where is None and b"\n" in raw[:exc.start]:
                where = raw.count(b"\n", 0, exc.start) + 1
            raise MachineFormatError(path, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                                     line=where) from None
    several = line is None and "\n" in text.rstrip()
    too_deep = f"nested deeper than {MAX_DEPTH} levels of arrays/objects"

    def deep_error() -> MachineFormatError:
        at, field = _too_deep_at(raw if raw is not None else text.encode("utf-8"))
        return MachineFormatError(path, too_deep, line=at if several else line, field=field)

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MachineFormatError(path, json_error_reason(exc), line=exc.lineno if several else line) from None
    except ValueError as exc:  # an integer too long for Python to convert (sys.get_int_max_str_digits)
        raise MachineFormatError(path, f"a number too long to read: {exc}".split("; use sys.")[0],
                                 line=line) from None
    except RecursionError:
        raise deep_error() from None
    # cheap bounds first: only a line with that many brackets, unclosed at once, can nest that deep
    if (text.count("[") + text.count("{") > MAX_DEPTH
            and depth_bound(raw if raw is not None else text.encode("utf-8")) > MAX_DEPTH
            and nested_deeper(value, MAX_DEPTH)):
        raise deep_error()
    return value


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> str | None:
    """What a file that is not a regular file is ("a FIFO (named pipe)", …), else None."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def open_regular_fd(path: str | os.PathLike) -> tuple[int, os.stat_result]:
    """`path` opened read-only as an os-level descriptor, with its stat, when it is a regular file.

    A FIFO, a device or a socket (or a symlink to one, such as `/dev/zero`) is refused without
    blocking: it is opened non-blocking (a FIFO would otherwise wait for a writer) and checked on
    the open descriptor. The caller closes the descriptor; it is left non-blocking.

    Raises:
        MachineFormatError: naming the file when it is missing, unreadable or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise MachineFormatError(path, "file not found") from None
    except OSError as exc:
        raise MachineFormatError(path, f"cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        what = not_regular(st.st_mode)
        if what is not None:
            raise MachineFormatError(path, f"{what}, not a regular file: not read")
        return fd, st
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise MachineFormatError(path, f"cannot read: {exc.strerror}") from None
        raise


def open_regular(path: str | os.PathLike) -> Any:
    """`path` opened for binary reading, when it is a regular file (see open_regular_fd).

    Raises:
        MachineFormatError: naming the file when it is missing, unreadable or not a regular file.
    """
    fd, _ = open_regular_fd(path)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def iter_jsonl(path: str | os.PathLike, *, on_error: OnError = "raise",
               skipped: list[MachineFormatError] | None = None) -> Iterator[tuple[int, Any]]:
    """The values of a JSONL file, one line at a time, numbered.

    Bad lines are non-UTF-8 bytes, invalid JSON, values nested deeper than MAX_DEPTH, and a
    truncated last line (no newline at the end and not valid JSON). Blank lines are skipped.

    Args:
        path: the JSONL file.
        on_error: "raise" (default) raises MachineFormatError at the first bad line; "warn" skips
            bad lines and issues one SkippedLines warning listing them at the end; "skip" skips them
            silently.
        skipped: a list each skipped line's MachineFormatError is appended to (default None).

    Returns:
        An iterator of (1-based line number, value).

    Raises:
        MachineFormatError: a missing file, or (on_error "raise") the first bad line.
    """
    path = Path(path)
    errors: list[MachineFormatError] = [] if skipped is None else skipped
    start = len(errors)
    with open_regular(path) as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                value = parse_json(raw, path, number)
            except MachineFormatError as err:
                if not raw.endswith(b"\n") and (err.reason.startswith("invalid JSON") or _ends_inside_character(raw)):
                    err = MachineFormatError(path, "truncated last line (no newline, incomplete JSON)", line=number)
                if on_error == "raise":
                    raise err from None
                errors.append(err)
                continue
            yield number, value
    if on_error == "warn" and len(errors) > start:
        listed = "\n".join(f"  {e}" for e in errors[start:start + 20])
        more = f"\n  … and {len(errors) - start - 20} more" if len(errors) - start > 20 else ""
        warnings.warn(SkippedLines(f"skipped {len(errors) - start} unreadable line(s) of {path}:\n{listed}{more}"), stacklevel=user_stacklevel())


def read_jsonl(path: str | os.PathLike, *, on_error: OnError = "raise") -> list[Any]:
    """All values of a JSONL file, in order.

    Args:
        path: the JSONL file.
        on_error: what a bad line does (default "raise"; see iter_jsonl).

    Returns:
        The values.
    """
    return [value for _, value in iter_jsonl(path, on_error=on_error)]


def dumps_line(value: Any) -> str:
    """One JSONL line, as JSON.stringify writes it: compact separators, non-ASCII kept as is.

    Args:
        value: a JSON-able value.

    Returns:
        The line, without its newline.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@contextlib.contextmanager
def atomic_replace(path: str | os.PathLike, *, mode: int = 0o600) -> Iterator[Path]:
    """Replace a whole file so that readers see the old content or the new, never half of it.

    The one way machine_nb rewrites a file in place: the new content is written to a temporary
    file in the same folder (the caller writes it), synced to disk, given `mode` and renamed over
    `path`; if the block raises, the temporary file is removed and `path` is untouched. A `path`
    that is a symbolic link is written through: the file it leads to is replaced (its temporary
    file beside it), and the link stays, as an editor saving through a link leaves it.

    Args:
        path: the file to replace (created when missing; its folder too).
        mode: permission bits of the new file (default 0o600: private to the user).

    Returns:
        A context manager yielding the temporary file's path to write the new content to.
    """
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_stale_temporaries(path: str | os.PathLike, *, suffixes: tuple[str, ...] = (".tmp",)) -> int:
    """Remove the temporary files of `path` that a process killed inside `atomic_replace` left
    (`.<name>.<8 random characters><suffix>`, as it names them); nothing else is touched.

    Call it only while holding the lock that every writer of `path` holds (`locked`, or the
    caller's own): no writer can have one of these files open then.

    Args:
        path: the file whose temporary copies go (a link: the file it leads to, where
            atomic_replace writes them).
        suffixes: the endings of its temporary files (default (".tmp",): atomic_replace's own).

    Returns:
        How many were removed.
    """
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    ends = "|".join(re.escape(s) for s in suffixes)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}(?:{ends})")
    try:
        with os.scandir(path.parent) as entries:
            stale = [e.path for e in entries if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:  # no folder, or not readable: nothing to remove
        return 0
    removed = 0
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
            removed += 1
    return removed


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int = 0o600) -> Path:
    """Write a whole text file atomically (see atomic_replace).

    Args:
        path: the file to write (replaced whole; its folder created).
        text: the new content (UTF-8, "\\n" line ends).
        mode: permission bits (default 0o600).

    Returns:
        The path written.
    """
    with atomic_replace(path, mode=mode) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    return Path(path)


def _ends_inside_character(raw: bytes) -> bool:
    """Whether bytes end part way through a UTF-8 character (a writer's append read mid-way), all
    before it being UTF-8."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data" and exc.end == len(raw)
    return False


def write_jsonl(rows: Iterable[Any], path: str | os.PathLike) -> Path:
    """Write values as a JSONL file atomically (see atomic_replace), as strict JSON.

    Args:
        rows: the values, one line each: dicts, or a DataFrame (one line per row, its missing
            cells left out: pandas gives every row every column, NaN where the row had none).
        path: the file (replaced whole; its folder created). A file already there keeps its
            permission bits; a new one is private to the user (0o600).

    Returns:
        The path written.

    Raises:
        ValueError: a NaN or infinite number (strict JSON readers refuse `NaN`), naming the file,
            line and field; nothing is written.
        IsADirectoryError: `path` is a folder.
    """
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # a DataFrame
        rows = [{k: v for k, v in row.items() if not _missing_cell(v)} for row in rows.to_dict("records")]
    lines = []
    for number, value in enumerate(rows, start=1):
        try:
            lines.append(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                                    default=_plain_number) + "\n")
        except ValueError:
            field = _non_finite_field(value)
            raise ValueError(f"{path}: line {number}: {field!r} is {_non_finite_at(value, field)}, which JSON cannot "
                             "hold: give a number or null; nothing written") from None
    if Path(path).is_dir():
        raise IsADirectoryError(f"{path}: a folder, not a file: nothing written")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        mode = 0o600
    return atomic_write_text(path, "".join(lines), mode=mode)


def _missing_cell(value: Any) -> bool:
    """A DataFrame cell that stands for no value: None, or a float NaN (pandas' NA and NaT too)."""
    if value is None or (isinstance(value, float) and value != value):
        return True
    return type(value).__name__ in ("NAType", "NaTType")


def _plain_number(value: Any) -> Any:
    """numpy's numbers and arrays as Python's, for json.dumps (a frame read back through pyarrow)."""
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _non_finite_field(value: Any, prefix: str = "") -> str | None:
    """The dotted path of the first NaN or infinite float in a value ("" for the value itself;
    None when it holds none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _non_finite_field(item, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


def _non_finite_at(value: Any, field: str | None) -> str:
    """The value at a dotted path `_non_finite_field` gave, as Python writes it (nan, inf)."""
    for key in field.split(".") if field else ():
        value = value[key] if isinstance(value, dict) else value[int(key)]
    return repr(value)


@contextlib.contextmanager
def held_folder(folder: str | os.PathLike, *, wait: bool = True, required: bool = False) -> Iterator[bool]:
    """Hold an exclusive flock on `folder` itself while the block runs (the folder gains no lock
    file); it is let go when the block ends or the process dies.

    Args:
        folder: an existing folder.
        wait: wait while another holds it (default True); False: BlockingIOError at once then.
        required: a file system without flock raises its OSError (default False: the block runs
            unheld).

    Returns:
        A context manager yielding whether the folder is held.
    """
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            held = True
        except BlockingIOError:
            raise
        except OSError:
            if required:
                raise
            held = False  # no flock on this file system
        yield held
    finally:
        os.close(fd)  # closing the folder lets the hold go


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive lock that appends and rewrites of a file share.

    Args:
        path: the data file (the lock is a sidecar `.<name>.lock` beside it; folders are created).

    Returns:
        A context manager yielding `path` as a Path while the lock is held.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(f".{path.name}.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _open_for_append(path: Path, mode: int) -> int:
    """`path` opened for appending (created with `mode`), when it is a regular file: a FIFO is
    opened non-blocking (with no reader it would wait for one without end) and refused, as is any
    other file that is not a regular one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), mode)
    except OSError as exc:
        try:
            what = not_regular(os.stat(path).st_mode)
        except OSError:
            what = None
        raise MachineFormatError(path, f"{what}, not a regular file: nothing appended" if what else
                                       f"cannot append: {exc.strerror}") from None
    what = not_regular(os.fstat(fd).st_mode)
    if what is not None:
        os.close(fd)
        raise MachineFormatError(path, f"{what}, not a regular file: nothing appended")
    os.set_blocking(fd, True)
    return fd


def append_jsonl(rows: Iterable[Any], path: str | os.PathLike, *, mode: int = 0o600) -> Path:
    """Append rows under the file's lock, in one write, synced to disk.

    If the file ends without a newline (a writer died mid-line), the new rows start on a fresh
    line, so the broken line stays visible on its own and no new row is merged into it.

    Args:
        rows: the values to append, one line each.
        path: the file (created with `mode` when missing).
        mode: permission bits of a new file (default 0o600: private to the user).

    Returns:
        The path appended to.

    Raises:
        TypeError: `rows` is a path (the rows come first, then the file, as in write_jsonl).
        MachineFormatError: naming the file, when it is not a regular file (a FIFO, a folder) or
            cannot be written; nothing is appended.
    """
    if isinstance(rows, (str, os.PathLike)):
        raise TypeError(f"append_jsonl(rows, path) takes the rows first and the file second, as write_jsonl does; "
                        f"got the path {os.fspath(rows)!r} as rows")
    data = "".join(dumps_line(r) + "\n" for r in rows).encode("utf-8")
    with locked(path) as path:
        fd = _open_for_append(path, mode)
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
