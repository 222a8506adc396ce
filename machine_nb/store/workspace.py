"""Machine's workspace files as plain records: runs, sessions, events and machine definitions.

Layout: runs at `<ws>/.machine/runs/<machine segments>/<id>.json`,
sessions at `<ws>/.machine/sessions/<machine segments>/<name>.json`, the event stream at
`<ws>/.machine/events.jsonl`, definitions at `<ws>/machines/<name>/…`. The DataFrames over runs
and messages are built in `frames.py`; this module only finds, parses and checks files.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MachineFormatError, user_stacklevel
from ..core.jsonl import MAX_DEPTH as MAX_NESTING, depth_bound, nested_deeper, not_regular, open_regular_fd, parse_json

if TYPE_CHECKING:
    import pandas as pd

# Machine's rule for each "/"-separated segment of a machine, run or session name.
SEGMENT = re.compile(r"[a-z0-9][a-z0-9._-]*")  # a whole segment: fullmatch
SEGMENT_NAME = re.compile(rf"{SEGMENT.pattern}(?:/{SEGMENT.pattern})*")  # a whole name: fullmatch

# Files a machine definition directory may hold (any one marks a directory as a machine).
DEFINITION_FILES = ("machine.ts", "instructions.md", "model.json", "rubric.ts", "rubric.json",
                    "versions.json", "cases.json", "holdout.json", "tools.json")


class SkippedFiles(UserWarning):
    """Files (or records) a tolerant reader left out, each with its path and reason."""


def name_segments(name: str, what: str = "name") -> list[str]:
    """Split a Machine name ("chatbot/triage") into segments, each checked against SEGMENT.

    Args:
        name: the name.
        what: what it names, for the message (default "name").

    Returns:
        The segments.

    Raises:
        ValueError: with Machine's own wording, when a segment is invalid.
    """
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or not all(SEGMENT.fullmatch(p) for p in parts):
        raise ValueError(f'Invalid {what} "{name}": use lowercase letters, digits, ".", "_" and "-", '
                         'with "/" between nested names.')
    return parts


def machine_dir(workspace: str | os.PathLike) -> Path:
    """The `.machine` store directory of a workspace.

    Args:
        workspace: the workspace root, or its `.machine` folder itself.

    Returns:
        The `.machine` folder.
    """
    ws = Path(workspace).expanduser()  # "~/ws" is the home folder's, as a shell reads it
    if ws.name == ".machine":
        return ws
    return ws / ".machine"


def utf8_name(name: str) -> bool:
    """Whether a name read from the file system is valid UTF-8 (Python holds the bytes of one that
    is not as lone surrogates, which no Arrow string column can hold).

    Args:
        name: a file or folder name, or a path.

    Returns:
        True when it encodes as UTF-8.
    """
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def shown_name(path: str) -> str:
    """A path whose name is not valid UTF-8 as text a message can hold (its odd bytes as \\xNN).

    Args:
        path: the path.

    Returns:
        The text.
    """
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def workspace_root(workspace: str | os.PathLike) -> Path:
    """The workspace root (the folder holding `machines/` and `.machine/`).

    Args:
        workspace: the workspace root, or its `.machine` folder.

    Returns:
        The root.
    """
    ws = Path(workspace).expanduser()
    return ws.parent if ws.name == ".machine" else ws


def warn_skipped(what: str, errors: list[MachineFormatError]) -> None:
    """One SkippedFiles warning listing what was left out and why (first 20, then a count); none
    when nothing was.

    Args:
        what: what the errors are about ("run file(s)", …).
        errors: the MachineFormatErrors.
    """
    if not errors:
        return
    listed = "\n".join(f"  {e}" for e in errors[:20])
    more = f"\n  … and {len(errors) - 20} more" if len(errors) > 20 else ""
    warnings.warn(SkippedFiles(f"skipped {len(errors)} {what}:\n{listed}{more}"), stacklevel=user_stacklevel())


ON_ERROR = ("raise", "warn", "skip")


def on_error_policy(on_error: str) -> str:
    """A reader's bad-file policy, checked: "raise", "warn" or "skip" (ValueError otherwise)."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, not {on_error!r}")
    return on_error


def parse_times(values: list, where: list[str], what: str) -> pd.Series:
    """ISO time strings as UTC datetimes; a value that does not parse becomes NaT with one warning.

    Args:
        values: the raw values (None for absent).
        where: for each value, its file, line and field as text ("events.jsonl:3 (field 'at')";
            used only when the value is bad).
        what: the records, for the warning ("session file(s)", "event line(s)").

    Returns:
        A pandas Series of datetime64 UTC.
    """
    import pandas as pd

    raw = pd.Series([v if isinstance(v, str) and v.strip() else None for v in values], dtype=object)
    times = pd.to_datetime(raw, utc=True, errors="coerce", format="ISO8601")
    missing = times.isna().to_numpy()  # one array: a per-row lookup into the Series costs more than the parse
    bad = []
    for i in missing.nonzero()[0].tolist():
        v = values[i]
        if v is None or (isinstance(v, str) and not v.strip()):
            continue
        if not isinstance(v, str):
            bad.append(f"{where[i]}: {v!r} is not an ISO time string"[:300])
        else:
            bad.append(f"{where[i]}: {v!r} does not parse as an ISO time"[:300])
    if bad:
        listed = "\n".join(f"  {b}" for b in bad[:20])
        more = f"\n  … and {len(bad) - 20} more" if len(bad) > 20 else ""
        warnings.warn(SkippedFiles(f"{len(bad)} {what} have a time that does not parse; kept with NaT:\n"
                                   f"{listed}{more}"), stacklevel=user_stacklevel())
    return times


UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
UTF16_TEXT = "UTF-16 text (it starts with a UTF-16 byte-order mark): save it as UTF-8"
NON_FINITE = re.compile(rb"-?(?:NaN|Infinity)")  # at an error's position: what orjson stopped at


def loads_json(data: bytes, path: str | os.PathLike) -> Any:
    """Parse one JSON document (orjson).

    A value nested deeper than the JSONL readers' limit (core.jsonl.MAX_DEPTH) is refused as
    they refuse it, so code that walks a run afterwards (json.dumps of a tool input, a deep copy)
    never meets a RecursionError.

    Args:
        data: the document's bytes.
        path: the file it came from, named in errors.

    Returns:
        The value.

    Raises:
        MachineFormatError: naming the file, line and column (or the top-level field a value
            nested too deep is in); UTF-16 text, a UTF-8 byte-order mark and NaN/Infinity (not
            JSON) are named as such.
    """
    import orjson

    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc).lower():
            parse_json(data, path)  # raises the error naming the line and field; orjson's limit is higher
        if data[:2] in UTF16_BOMS:
            raise MachineFormatError(path, UTF16_TEXT) from None
        if data.startswith(UTF8_BOM):  # an editor's "UTF-8 with BOM"; JSON.parse refuses it too
            raise MachineFormatError(path, "starts with a UTF-8 byte-order mark, which JSON does not allow: "
                                           "save it as UTF-8 without one") from None
        if "utf-8" in str(exc).lower():
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as bad:
                line = data.count(b"\n", 0, bad.start) + 1
                col = bad.start - (data.rfind(b"\n", 0, bad.start) + 1) + 1
                raise MachineFormatError(path, f"not UTF-8 (byte 0x{data[bad.start]:02x} at column {col})",
                                         line=line) from None
            raise MachineFormatError(path, f"not valid UTF-8 text: {exc.msg}") from None
        at = exc.pos - 1 if 0 < exc.pos <= len(data) and data[exc.pos - 1:exc.pos] == b"-" else exc.pos
        word = NON_FINITE.match(data, at) if 0 <= at < len(data) else None
        if word:  # Python's json.dump writes these; JSON.stringify writes null
            col = exc.colno - (exc.pos - at)
            raise MachineFormatError(path, f"invalid JSON: {word.group().decode()} is not a JSON value (at column "
                                           f"{col}): write null instead", line=exc.lineno) from None
        raise MachineFormatError(path, f"invalid JSON: {exc.msg} at column {exc.colno}", line=exc.lineno) from None
    if depth_bound(data) > MAX_NESTING and nested_deeper(value, MAX_NESTING):
        parse_json(data, path)  # raises the error naming the line and the top-level field
    return value


#: The largest file a workspace reader reads (run, session and definition files): a larger one is
#: skipped as a bad file, so a symlink to a huge file cannot exhaust memory.
MAX_FILE_BYTES = 64 << 20

def read_file(path: str | os.PathLike, max_bytes: int | None = None) -> tuple[bytes, os.stat_result]:
    """A regular file's bytes and its stat, taken before reading from the same open file.

    Only regular files are read: a FIFO, a device or a socket (or a symlink to one, such as
    `/dev/zero`) is refused without blocking, and so is a file larger than `max_bytes`. Through
    the os-level calls: for small run files, Python's buffered file objects cost more than the read.

    Args:
        path: the file.
        max_bytes: the largest size read (default None: MAX_FILE_BYTES, 64 MiB).

    Returns:
        (bytes, os.stat_result).

    Raises:
        MachineFormatError: naming the file when it cannot be read, is not a regular file, or is
            larger than `max_bytes`.
    """
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    fd, st = open_regular_fd(path)
    try:
        if st.st_size > max_bytes:
            raise MachineFormatError(path, f"{st.st_size:,} bytes, larger than the {max_bytes:,} bytes a workspace "
                                           "file may hold: not read")
        data = os.read(fd, st.st_size + 1)
        if len(data) != st.st_size:  # grew since the stat, or a short read (some network filesystems)
            chunks, total = [data], len(data)
            while total <= max_bytes and (chunk := os.read(fd, 1 << 20)):
                chunks.append(chunk)
                total += len(chunk)
            if total > max_bytes:
                raise MachineFormatError(path, f"grew past the {max_bytes:,} bytes a workspace file may hold while "
                                               "read: not read")
            data = b"".join(chunks)
        return data, st
    except OSError as exc:
        raise MachineFormatError(path, f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike) -> Any:
    """One JSON file (orjson).

    Args:
        path: the file.

    Returns:
        The value.

    Raises:
        MachineFormatError: naming the file and line when it is missing or unreadable.
    """
    return loads_json(read_file(path)[0], path)


#: How deep a walk goes below its top folder (machine names nest a few levels).
MAX_DEPTH = 32


def outside(path: str, top_real: str) -> str | None:
    """The real path of a folder when it lies outside `top_real` (reached through a symlink), else None."""
    real = os.path.realpath(path)
    return None if real == top_real or real.startswith(top_real.rstrip(os.sep) + os.sep) else real


def link_problem(name: str, real: str, top_real: str) -> str | None:
    """Why a symlinked folder leading outside the walk's top folder is not followed, else None: a
    file system's root or a mount point (`/`, `/proc`), or a folder holding the top folder."""
    if real == os.path.dirname(real) or os.path.ismount(real):
        return f"symlink {name!r} leads to {real}, a file system's root or mount point, not a machine's folder: not followed"
    if top_real.startswith(real.rstrip(os.sep) + os.sep):
        return f"symlink {name!r} leads to {real}, a folder holding this one: not followed"
    return None


def _json_name(name: str) -> bool:
    return name.endswith(".json")


def foreign_problem(entries: list, real: str | None, files_ok: Callable[[str], bool] = _json_name) -> str | None:
    """Why a folder outside the walk's top folder is not a machine's folder, else None.

    Such a folder is read only when it holds nothing but folders, hidden files and regular files
    whose names `files_ok` accepts (default: `*.json`, what a machine's folder of runs or sessions
    holds), so a link to a system folder is reported instead of walked.
    """
    for e in entries:
        if e.name.startswith("."):
            continue
        try:
            if e.is_dir():
                continue
            regular = e.is_file()
        except OSError:
            regular = False
        if not (regular and files_ok(e.name)):
            return (f"outside the workspace ({real}) and holds {e.name!r}, which a machine's folder does not: "
                    "not read")
    return None


def walk_folders(root: str | os.PathLike, within: str | os.PathLike | None = None,
                 files_ok: Callable[[str], bool] = _json_name
                 ) -> Iterator[tuple[str, list[str], list[str], list[str], str | None]]:
    """`root` and every folder below it, sorted, so readers are deterministic.

    Symlinked folders are followed (a machine folder may live elsewhere), but each real folder is
    walked once, at most MAX_DEPTH levels down, and one that leads back to a folder it is inside
    of (a loop) is not entered. A symlink to a folder inside the top folder (`within`, else
    `root`) is not followed: that folder is walked under its own name. A link leading outside the
    top folder is followed only to a machine's folder: not to a file system's root or mount point,
    not to a folder holding the top one, and every folder read out there must hold nothing but
    `*.json` files and folders (foreign_problem). A folder not entered is yielded once with
    `problem` saying why. A hidden folder (its name starts with ".", as JupyterLab's
    `.ipynb_checkpoints` does; no machine name segment does) is neither entered nor listed.

    Args:
        root: the top folder (nothing is yielded when it is not a folder).
        within: a folder `root` is inside of (e.g. `runs/` for `runs/<machine>`), whose folders
            down to `root` count as ones it is inside of too (default None).
        files_ok: which regular files a folder outside the top one may hold (default: `*.json`).

    Returns:
        An iterator of (dirpath, segments: the folder's names below `root`, as the link is named,
        not where it points; subfolders; file names; problem or None).
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        return
    try:
        st = os.stat(root)
    except OSError:
        return
    top_real = os.path.realpath(within if within is not None else root)
    ancestors = folder_chain(within, root) if within is not None else ()
    far = outside(root, top_real)
    stack: list[tuple[str, list[str], tuple, str | None]] = [(root, [], (*ancestors, (st.st_dev, st.st_ino)), far)]
    visited = {(st.st_dev, st.st_ino)}
    while stack:
        dirpath, segments, ancestors, far = stack.pop()
        try:
            with os.scandir(dirpath) as it:
                entries = list(it)
        except OSError as exc:
            yield dirpath, segments, [], [], f"cannot list folder: {exc.strerror}"
            continue
        if far is not None:
            problem = foreign_problem(entries, far, files_ok)
            if problem:
                yield dirpath, segments, [], [], problem
                continue
        subdirs, files = [], []
        for e in entries:
            try:
                is_dir = e.is_dir()  # follows a symlink
            except OSError:
                is_dir = False
            if is_dir and e.name.startswith("."):
                continue  # a hidden folder is not Machine's (JupyterLab's .ipynb_checkpoints): not entered
            (subdirs if is_dir else files).append(e.name)
        subdirs.sort()
        files.sort()
        yield dirpath, segments, subdirs, files, None
        for name in reversed(subdirs):  # a stack: reversed, so folders come out in sorted order
            path = os.path.join(dirpath, name)
            problem, key, sub_far = follow_problem(path, name, segments, ancestors, visited, top_real, far)
            if problem:
                yield path, [*segments, name], [], [], problem
                continue
            stack.append((path, [*segments, name], (*ancestors, key), sub_far))


def follow_problem(path: str, name: str, segments: list[str], ancestors: tuple, visited: set, top_real: str,
                   far: str | None) -> tuple[str | None, tuple | None, str | None]:
    """Whether a walk enters the subfolder `path` (see walk_folders): (problem or None, its
    (st_dev, st_ino), its real path when outside the top folder). Marks it visited when entered."""
    try:
        sub = os.stat(path)
    except OSError as exc:
        return f"cannot read folder: {exc.strerror}", None, None
    key = (sub.st_dev, sub.st_ino)
    if key in ancestors:
        return (f"symlink {name!r} leads back to a folder it is inside of ({os.path.realpath(path)}): "
                "a loop, not followed"), key, None
    is_link = os.path.islink(path)
    if is_link and outside(path, top_real) is None:
        # the folder it leads to is walked under its own name anyway; followed, the link could claim
        # it first (each real folder is walked once) and leave its runs under the link's name
        return (f"symlink {name!r} leads to {os.path.realpath(path)}, a folder read under its own name: "
                "not followed"), key, None
    if key in visited:
        return f"{os.path.realpath(path)} is read under another name already: not read twice", key, None
    if len(segments) >= MAX_DEPTH:
        return f"more than {MAX_DEPTH} folders deep: not read", key, None
    sub_far = far
    if far is None and is_link:
        sub_far = outside(path, top_real)
        if sub_far is not None:
            problem = link_problem(name, sub_far, top_real)
            if problem:
                return problem, key, None
    elif far is not None:
        sub_far = os.path.realpath(path)
        if os.path.ismount(sub_far):
            return link_problem(name, sub_far, top_real), key, None
    visited.add(key)
    return None, key, sub_far


def folder_chain(top: str | os.PathLike, down_to: str | os.PathLike) -> tuple:
    """The identities of the folders on the way from one folder down to another.

    Args:
        top: the upper folder.
        down_to: a folder below it (excluded).

    Returns:
        (st_dev, st_ino) of `top` and of each folder below it on the way to `down_to`.
    """
    top, down_to = os.fspath(top), os.fspath(down_to)
    rel = os.path.relpath(down_to, top)
    chain, path = [], top
    parts = [] if rel == "." else rel.split(os.sep)
    for part in [None, *parts[:-1]]:
        path = path if part is None else os.path.join(path, part)
        try:
            st = os.stat(path)
        except OSError:
            continue
        chain.append((st.st_dev, st.st_ino))
    return tuple(chain)


def folder_problem(segments: list[str], name: str, base: str) -> str | None:
    """Why a file at `<base>/<segments…>/<name>` is misplaced (see iter_named_files).

    Args:
        segments: the folders below `base`.
        name: the file name.
        base: the top folder's name ("runs", "sessions").

    Returns:
        The reason, or None when it is where it belongs.
    """
    if not segments:
        return f"file directly under {base}/ (expected {base}/<machine>/{name})"
    bad = [s for s in segments if not SEGMENT.fullmatch(s)]
    if bad:
        return (f"folder segment {bad[0]!r} is not a valid machine name segment "
                "(lowercase letters, digits, '.', '_', '-'; starting with a letter or digit)")
    return None


def iter_named_files(root: str | os.PathLike, suffix: str = ".json", within: str | os.PathLike | None = None
                     ) -> Iterator[tuple[str, str | None, str | None]]:
    """The `*.json` files under `root/<machine segments>/`, sorted, so readers are deterministic.

    A folder that cannot be entered (a symlink loop, no permission) is yielded once as `(folder,
    machine, problem)`, so it is reported rather than silently left out. Paths are strings:
    pathlib costs more than parsing small run files (see benchmarks/bench_load_runs.py).

    Args:
        root: the top folder (`.machine/runs`, `.machine/sessions`, or a machine's folder in one).
        suffix: the files' suffix (default ".json"; names starting with "." are never listed).
        within: see walk_folders (default None).

    Returns:
        An iterator of (path, machine: the folder path joined with "/", or None; problem: why the
        file is misplaced, a folder segment that breaks SEGMENT or a file directly under `root`,
        else None).
    """
    root = os.fspath(root)
    base = os.path.basename(root.rstrip(os.sep))
    for dirpath, segments, _, filenames, problem in walk_folders(root, within):
        folder = "/".join(segments)
        if problem:
            yield dirpath, folder or None, problem
            continue
        where = folder_problem(segments, "x", base)
        for name in filenames:
            if not name.endswith(suffix) or name.startswith("."):
                continue  # temp files of an atomic write, lock files
            path = os.path.join(dirpath, name)
            yield path, folder or None, (folder_problem(segments, name, base) if where else None)


# ---------------------------------------------------------------------------------------------
# Runs

_STR_FIELDS = ("input", "output", "model", "harness", "startedAt", "finishedAt", "version",
               "instructions", "workspace", "case")
_ROLES = {"system", "user", "assistant", "tool"}
_NUMBERS = {int, float}  # exact classes: a JSON true/false is a bool, which is not a number here


def check_messages(value: Any, path: str | os.PathLike, field: str, calls: list | None = None,
                   waiting: dict | None = None) -> None:
    """Check a list of Machine Messages (role, content string).

    When `calls`/`waiting` are given, also pairs each assistant tool-call message with its result
    in the same pass (load_runs counts failed tool calls without a second loop). A call's result
    is the first tool result after it that carries its id (store.messages.result_after's rule):
    harnesses that number calls per reply reuse an id in later steps.

    Args:
        value: the list.
        path: the file, named in errors.
        field: the list's field ("trajectory", "history", "messages").
        calls: a list each tool call is appended to as `[call message, result message or None]`
            (default None: not collected).
        waiting: the calls still without a result, by call id (default None; pass the same dict
            for history and trajectory, so a call in one finds its result in the other).

    Raises:
        MachineFormatError: naming the file and the first bad message's field.
    """
    if value.__class__ is not list:
        raise MachineFormatError(path, f"expected a list of messages, got {type(value).__name__}", field=field)
    roles = _ROLES
    collect = calls is not None
    for m in value:  # the hot loop of load_runs: plain class checks, no per-key loops
        if m.__class__ is not dict:
            break
        role = m.get("role")
        if role.__class__ is not str or role not in roles:
            break
        content = m.get("content")
        if content is not None and content.__class__ is not str:
            break
        name = m.get("name")
        if name is not None and name.__class__ is not str:
            break
        cid = m.get("toolCallId")
        if cid is not None and cid.__class__ is not str:
            break
        c = m.get("reasoning")
        if c is not None and c.__class__ is not str:
            break
        if collect:
            if role == "tool":
                if cid is not None:
                    for pair in waiting.pop(cid, ()):
                        pair[1] = m
            elif role == "assistant" and (cid is not None or m.get("toolInput") is not None
                                          or (name is not None and not content)):
                pair = [m, None]  # the rule of store.messages.is_tool_call
                calls.append(pair)
                if cid is not None:
                    waiting.setdefault(cid, []).append(pair)
    else:
        return
    _explain_messages(value, path, field)


def _explain_messages(value: list, path: str | os.PathLike, field: str) -> None:
    """The slow path of check_messages: find the first bad message and say what is wrong."""
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise MachineFormatError(path, f"expected a message object, got {type(m).__name__}", field=f"{field}[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise MachineFormatError(path, f"role must be one of system/user/assistant/tool, got {role!r}"[:160],
                                     field=f"{field}[{i}].role")
        for key in ("content", "name", "toolCallId", "reasoning"):
            v = m.get(key)
            if v is not None and not isinstance(v, str):
                raise MachineFormatError(path, f"{key} must be a string, got {type(v).__name__}",
                                         field=f"{field}[{i}].{key}")


def check_run(run: Any, path: str | os.PathLike, machine: str | None = None, calls: list | None = None,
              waiting: dict | None = None) -> dict:
    """Check one parsed Run record.

    Required: `id` and `machine` (strings; `machine` must match the folder the file is in, and
    `id` the file name). Typed when present: the string fields, `trajectory`/`history` (lists of
    Messages), `scorecard` (object with a numeric `total`, or null: how JSON.stringify writes a NaN
    total, read as no score), `usage` (numbers), `conversation`.

    Args:
        run: the parsed record.
        path: its file.
        machine: the machine its folder names (default None: not checked).
        calls: collects `[tool call, its result or None]` pairs (see check_messages; default None).
        waiting: the calls still without a result, by call id (see check_messages; default None).

    Returns:
        The record.

    Raises:
        MachineFormatError: naming the file and field.
    """
    if run.__class__ is not dict:
        raise MachineFormatError(path, f"a run must be a JSON object, got {type(run).__name__}")
    for key in ("id", "machine"):
        v = run.get(key)
        if v.__class__ is not str or not v:
            got = "missing" if key not in run else f"got {type(run[key]).__name__} {run[key]!r}"[:80]
            raise MachineFormatError(path, f"required string field ({got})", field=key)
    if machine is not None and run["machine"] != machine:
        raise MachineFormatError(path, f"run says machine {run['machine']!r} but is stored under "
                                       f"runs/{machine}/", field="machine")
    name = os.fspath(path).rpartition(os.sep)[2]
    if name.endswith(".json") and name[:-5] != run["id"]:
        raise MachineFormatError(path, f"run id {run['id']!r} does not match its file name {name!r}", field="id")
    for key in _STR_FIELDS:
        v = run.get(key)
        if v is not None and v.__class__ is not str:
            raise MachineFormatError(path, f"expected a string, got {type(v).__name__}", field=key)
    for key in ("history", "trajectory"):
        if run.get(key) is not None:
            check_messages(run[key], path, key, calls, waiting)
    card = run.get("scorecard")
    if card is not None:
        if not isinstance(card, dict):
            raise MachineFormatError(path, f"expected an object, got {type(card).__name__}", field="scorecard")
        total = card.get("total")
        if total is not None and total.__class__ not in _NUMBERS:  # null: JSON.stringify's NaN, no score
            raise MachineFormatError(path, f"expected a number, got {type(total).__name__}", field="scorecard.total")
        rubric = card.get("rubric")
        if rubric is not None and not isinstance(rubric, str):
            raise MachineFormatError(path, f"expected a string, got {type(rubric).__name__}", field="scorecard.rubric")
        crit = card.get("criteria")
        if crit is not None and not isinstance(crit, dict):
            raise MachineFormatError(path, f"expected an object, got {type(crit).__name__}", field="scorecard.criteria")
    usage = run.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            raise MachineFormatError(path, f"expected an object, got {type(usage).__name__}", field="usage")
        for key in ("inputTokens", "cachedInputTokens", "outputTokens", "costUsd"):
            v = usage.get(key)
            if v is not None and v.__class__ not in _NUMBERS:
                raise MachineFormatError(path, f"expected a number, got {type(v).__name__}", field=f"usage.{key}")
    conv = run.get("conversation")
    if conv is not None and not isinstance(conv, dict):
        raise MachineFormatError(path, f"expected an object, got {type(conv).__name__}", field="conversation")
    return run


def read_run(path: str | os.PathLike, machine: str | None = None) -> dict:
    """One run file, parsed and checked (see check_run).

    Args:
        path: the run file.
        machine: the machine its folder names (default None: not checked).

    Returns:
        The Run record.

    Raises:
        MachineFormatError: the file is missing or bad.
    """
    return check_run(read_json(path), path, machine)


def iter_runs(workspace: str | os.PathLike, machine: str | None = None, *, on_error: str = "warn",
              skipped: list[MachineFormatError] | None = None) -> Iterator[tuple[str, dict]]:
    """Every run file of a workspace (or of one machine and its nested machines), parsed and checked.

    Args:
        workspace: the workspace root (or its `.machine` folder).
        machine: only this machine and its nested machines (default None: all).
        on_error: what a bad or misplaced file does: "warn" (default: skipped, so one bad file
            does not hide hundreds of good ones, and listed in one SkippedFiles warning at the
            end), "skip" (skipped silently) or "raise" (the first one's MachineFormatError).
        skipped: a list that collects each skipped file's MachineFormatError (default None).

    Returns:
        An iterator of (path, run record).
    """
    on_error = on_error_policy(on_error)
    top = root = machine_dir(workspace) / "runs"
    if machine is not None:
        root = root.joinpath(*name_segments(machine, "machine name"))
    prefix = "" if machine is None else machine + "/"
    errors = [] if skipped is None else skipped
    start = len(errors)
    for path, folder, problem in iter_named_files(root, within=top):
        if machine is not None:
            folder = machine if folder is None else prefix + folder
            problem = None if problem and problem.startswith("file directly") else problem
        try:
            if problem:
                raise MachineFormatError(path, problem, field="machine")
            yield path, read_run(path, folder)
        except MachineFormatError as exc:
            if on_error == "raise":
                raise
            errors.append(exc)
    if on_error == "warn":
        warn_skipped("run file(s)", errors[start:])


# ---------------------------------------------------------------------------------------------
# Sessions and events


def load_sessions(workspace: str | os.PathLike, machine: str | None = None, *, on_error: str = "warn") -> pd.DataFrame:
    """Named chat sessions as a DataFrame, newest first.

    A Session is Machine's `{machine, name, messages, updatedAt}` record, stored as `<name>.json`
    under its machine's folder: a file whose `name` differs (a file manager's copy) is a bad file.

    Args:
        workspace: the workspace root (or its `.machine` folder).
        machine: only this machine's sessions and its nested machines' (default None: all).
        on_error: what a bad file does: "warn" (default: skipped, listed in one SkippedFiles
            warning), "skip" (skipped silently) or "raise" (its MachineFormatError).

    Returns:
        A DataFrame with columns machine, name, n_messages, updated_at (UTC datetime; NaT, with a
        warning naming the file, when `updatedAt` is not an ISO time string), messages (list of Machine
        Messages), path, session (the parsed record).
    """
    import pandas as pd

    on_error = on_error_policy(on_error)

    top = root = machine_dir(workspace) / "sessions"
    if machine is not None:
        root = root.joinpath(*name_segments(machine, "machine name"))
    rows, errors = [], []
    for path, folder, problem in iter_named_files(root, within=top):
        if machine is not None:
            folder = machine if folder is None else f"{machine}/{folder}"
            problem = None if problem and problem.startswith("file directly") else problem
        try:
            if problem:
                raise MachineFormatError(path, problem, field="machine")
            s = read_json(path)
            if not isinstance(s, dict):
                raise MachineFormatError(path, f"a session must be a JSON object, got {type(s).__name__}")
            if s.get("machine", folder) != folder:
                raise MachineFormatError(path, f"session says machine {s.get('machine')!r} but is stored under "
                                               f"sessions/{folder}/", field="machine")
            stem = os.path.basename(path)[:-5]
            name = s.get("name", stem)
            if not isinstance(name, str):
                raise MachineFormatError(path, "expected a string", field="name")
            if name != stem:  # Machine reads a session from <name>.json: another file is a copy
                raise MachineFormatError(path, f"session name {name!r} does not match its file name "
                                               f"{os.path.basename(path)!r}"[:200], field="name")
            check_messages(s.get("messages", []), path, "messages")
            updated = s.get("updatedAt")  # any type: one that is not an ISO string is NaT, with a warning
        except MachineFormatError as exc:
            if on_error == "raise":
                raise
            errors.append(exc)
            continue
        msgs = s.get("messages", [])
        rows.append({"machine": folder, "name": name, "n_messages": len(msgs), "updated_at": updated,
                     "messages": msgs, "path": str(path), "session": s})
    if on_error == "warn":
        warn_skipped("session file(s)", errors)
    cols = ["machine", "name", "n_messages", "updated_at", "messages", "path", "session"]
    df = pd.DataFrame(rows, columns=cols)
    df["updated_at"] = parse_times(list(df["updated_at"]),
                                   [f"{p} (field 'updatedAt')" for p in df["path"]],
                                   "session file(s)")
    return df.sort_values(["updated_at", "name"], ascending=False, na_position="last", kind="stable").reset_index(drop=True)


def load_events(workspace: str | os.PathLike, *, on_error: str = "warn") -> pd.DataFrame:
    """The workspace's live event stream `.machine/events.jsonl` as a DataFrame, in file order.

    The event schema is not known from Machine's sources, so only these common keys are lifted
    out and every record is kept whole in `event`. A missing file gives an empty frame: a
    workspace that never ran has no events.

    Args:
        workspace: the workspace (or its `.machine` folder).
        on_error: unreadable lines (a writer mid-line, invalid JSON, non-UTF-8), non-object
            events, and a stream that cannot be opened (another user's, a FIFO): "warn" (default:
            skipped with a warning naming file and line), "skip" (skipped silently) or "raise".

    Returns:
        A DataFrame with columns line (1-based), time (UTC datetime from the first of
        `time`/`at`/`timestamp`/`ts` present; one that is not an ISO time string becomes NaT, with a
        warning naming the line and key), type (`type`/`event`/`kind`), machine, run
        (`run`/`runId`), event (the parsed record).
    """
    import pandas as pd

    from ..core.jsonl import iter_jsonl

    path = machine_dir(workspace) / "events.jsonl"
    rows = []
    try:
        what = not_regular(os.stat(path).st_mode)
    except OSError:
        what = None
    if what is not None:  # a FIFO would block the read, a device never end it
        err = MachineFormatError(path, f"{what}, not a regular file: not read")
        if on_error == "raise":
            raise err
        if on_error == "warn":
            warn_skipped("event file(s)", [err])
    elif path.exists():
        skipped: list[MachineFormatError] = []  # unreadable lines and non-objects, one warning for all
        try:
            for line, ev in iter_jsonl(path, on_error="raise" if on_error == "raise" else "skip", skipped=skipped):
                if not isinstance(ev, dict):
                    err = MachineFormatError(path, f"an event must be a JSON object, got {type(ev).__name__}",
                                             line=line)
                    if on_error == "raise":
                        raise err
                    skipped.append(err)
                    continue
                key = next((k for k in EVENT_TIME_KEYS if ev.get(k) is not None), None)
                # the time as written, whatever its type, so a bad one is an error naming its field
                rows.append({**event_fields(ev), "line": line, "time": None if key is None else ev[key],
                             "time_field": key, "event": ev})
        except MachineFormatError as exc:  # bad lines are raised only under "raise": this is the file's
            if on_error == "raise":
                raise
            if on_error == "warn":
                warn_skipped("event file(s)", [exc])
        if on_error == "warn":
            warn_skipped("event line(s)", sorted(skipped, key=lambda e: e.line or 0))
    df = pd.DataFrame(rows, columns=["line", "time", "time_field", "type", "machine", "run", "event"])
    df["time"] = parse_times(list(df["time"]), [f"{path}:{line} (field {key!r})" for line, key in
                                                zip(df["line"], df["time_field"])], "event line(s)")
    return df.drop(columns="time_field")


#: The names an event line may give its time under, first found wins.
EVENT_TIME_KEYS = ("time", "at", "timestamp", "ts")
_EVENT_KEYS = {"type": ("type", "event", "kind"), "machine": ("machine",), "run": ("run", "runId", "run_id"),
               "time": EVENT_TIME_KEYS}


def event_fields(ev: dict) -> dict[str, Any]:
    """An event line's type, machine, run and time, each the first of its names that holds a
    string or a number (None where none does).

    Args:
        ev: the event line's JSON object.

    Returns:
        {"type", "machine", "run", "time"}.
    """
    def first(keys: tuple[str, ...]) -> Any:
        for k in keys:
            v = ev.get(k)
            if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                return v
        return None

    return {name: first(keys) for name, keys in _EVENT_KEYS.items()}


# ---------------------------------------------------------------------------------------------
# Machine definitions


def list_machines(workspace: str | os.PathLike) -> list[str]:
    """The machines defined under `<ws>/machines/`.

    A directory is a machine when it holds any definition file (machine.ts, instructions.md,
    cases.json, …) and every segment of its path is a valid name segment.

    Args:
        workspace: the workspace.

    Returns:
        Their names (nested ones as "chatbot/triage"), sorted.
    """
    root = workspace_root(workspace) / "machines"
    names, problems = [], []
    for dirpath, segments, _, filenames, problem in walk_folders(root, files_ok=lambda name: True):  # links followed
        if problem:
            problems.append(MachineFormatError(dirpath, problem))
            continue
        if segments and any(f in DEFINITION_FILES for f in filenames) and all(SEGMENT.fullmatch(p) for p in segments):
            names.append("/".join(segments))
    warn_skipped("machine folder(s)", problems)
    return sorted(names)


def read_cases(path: str | os.PathLike) -> list[dict]:
    """A cases.json / holdout.json file, in the format of Machine's cases: a non-empty JSON array of
    strings or `{input, files?}` objects.

    Args:
        path: the file.

    Returns:
        `[{"input": str, "files": {path: text}?, …}]`.

    Raises:
        MachineFormatError: in Machine's wording, naming the file and the case.
    """
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, list) or not data:
        raise MachineFormatError(path, f"{path.name} must be a non-empty JSON array of cases.")
    out = []
    for i, case in enumerate(data):
        if isinstance(case, str):
            out.append({"input": case})
            continue
        if not isinstance(case, dict) or not isinstance(case.get("input"), str):
            raise MachineFormatError(path, f"case {i + 1} must be a string or an object with a string \"input\".",
                                     field=f"[{i}].input")
        files = case.get("files")
        if files is not None:
            if not isinstance(files, dict):
                raise MachineFormatError(path, f'case {i + 1} has "files" that is not an object of path to text.',
                                         field=f"[{i}].files")
            for f, text in files.items():
                if not isinstance(text, str):
                    raise MachineFormatError(path, f'case {i + 1} file "{f}" is not text.', field=f"[{i}].files.{f}")
        out.append(dict(case))
    return out


def definition_present(path: Path) -> bool:
    """Whether a machine's definition file is there.

    Args:
        path: the file.

    Returns:
        True when it exists, False when there is none.

    Raises:
        MachineFormatError: it is a symlink to nothing (a missing target, or a loop): read as
            absent, a holdout.json would hand held-out cases to a trainer, an instructions.md
            would leave out the system prompt.
    """
    if path.exists():
        return True
    if os.path.islink(path):
        raise MachineFormatError(path, f"a symlink to {os.readlink(path)}, which does not exist (or loops): "
                                       "restore it, or remove the link")
    return False


def read_instructions(machine: Path) -> str | None:
    """A machine folder's instructions.md as text, or None when it has none.

    A UTF-8 byte-order mark (an editor's "UTF-8 with BOM") is not part of the text: it would
    otherwise open every system prompt made from it.

    Args:
        machine: the machine's folder.

    Returns:
        The text.

    Raises:
        MachineFormatError: UTF-16 text, or not UTF-8, naming the line and the byte; a symlink
            to nothing (definition_present).
    """
    path = machine / "instructions.md"
    if not definition_present(path):
        return None
    raw = read_file(path)[0]
    if raw[:2] in UTF16_BOMS:
        raise MachineFormatError(path, UTF16_TEXT)
    raw = raw[len(UTF8_BOM):] if raw.startswith(UTF8_BOM) else raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise MachineFormatError(path, f"not UTF-8 (byte 0x{raw[bad.start]:02x})",
                                 line=raw.count(b"\n", 0, bad.start) + 1) from None


def machine_folder(workspace: str | os.PathLike, name: str) -> Path:
    """The folder a machine's definition lives in: `<ws>/machines/<name segments…>`.

    Raises:
        ValueError: the name breaks Machine's naming rule (name_segments).
    """
    return workspace_root(workspace) / "machines" / Path(*name_segments(name, "machine name"))


def defines_machine(folder: Path) -> bool:
    """Whether a folder is a machine's: it holds a definition file (a link to one counts). A folder
    holding only nested machines' folders defines nothing, as list_machines has it."""
    return folder.is_dir() and any(os.path.lexists(folder / f) for f in DEFINITION_FILES)


def load_machine(workspace: str | os.PathLike, name: str) -> dict:
    """A machine's definition from `<ws>/machines/<name>/` as a plain dict.

    Rubric: Machine keeps its rubric in `rubric.ts` and fingerprints it with a function whose
    algorithm is not known. This project stores the fingerprint Machine records on scorecards in
    `rubric.json` = `{"fingerprint": "<string>", "criteria": [{id, description, weight, grader}]}`;
    without that file the fingerprint is taken from the latest versions.json entry's
    `rubricFingerprint`/`rubric` key, else None. `tools.json` is likewise ours (Machine's tools
    live in machine.ts code).

    Args:
        workspace: the workspace.
        name: the machine's name ("chatbot/triage").

    Returns:
        Keys: name, dir, instructions (instructions.md text, or None), model (model.json's "model",
        or None), model_config (model.json whole), rubric (the fingerprint), criteria, tools
        (`[{name, description, inputSchema}]` from tools.json, or []), cases and holdout (read_cases
        lists, [] when absent), versions (versions.json list, [] when absent), live_version.

    Raises:
        MachineFormatError: no such machine (no folder holding a definition file, as list_machines
            has it; listing the machines there are), or a bad definition file (naming it and the
            field; a symlink to nothing is one, see definition_present).
    """
    d = machine_folder(workspace, name)
    if not defines_machine(d):
        known = ", ".join(list_machines(workspace)) or "none"
        raise MachineFormatError(d, f"no machine {name!r} in this workspace (machines found: {known})")

    def opt_json(fname: str, kind: type, default: Any) -> Any:
        p = d / fname
        if not definition_present(p):
            return default
        value = read_json(p)
        if not isinstance(value, kind):
            raise MachineFormatError(p, f"expected a JSON {kind.__name__}, got {type(value).__name__}")
        return value

    instructions = read_instructions(d)
    model_config = opt_json("model.json", dict, {})
    model = model_config.get("model")
    if model is not None and not isinstance(model, str):
        raise MachineFormatError(d / "model.json", f"expected a model name string, got {type(model).__name__}",
                                 field="model")
    rubric_file = opt_json("rubric.json", dict, {})
    versions = opt_json("versions.json", list, [])
    fingerprint, source, field = rubric_file.get("fingerprint"), "rubric.json", "fingerprint"
    if fingerprint is None and versions and isinstance(versions[-1], dict):
        field = "rubricFingerprint" if "rubricFingerprint" in versions[-1] else "rubric"
        fingerprint, source = versions[-1].get(field), "versions.json"
        field = f"[{len(versions) - 1}].{field}"
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise MachineFormatError(d / source, f"expected a fingerprint string, got {type(fingerprint).__name__}",
                                 field=field)
    tools = opt_json("tools.json", list, [])
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise MachineFormatError(d / "tools.json", "each tool needs a string name", field=f"[{i}].name")
    live = None
    if versions:
        live = next((v.get("id") for v in reversed(versions) if isinstance(v, dict) and v.get("live")), None)
        live = live or (versions[-1].get("id") if isinstance(versions[-1], dict) else None)
    return {
        "name": name,
        "dir": str(d),
        "instructions": instructions,
        "model": model,
        "model_config": model_config,
        "rubric": fingerprint,
        "criteria": rubric_file.get("criteria", []),
        "tools": tools,
        "cases": read_cases(d / "cases.json") if definition_present(d / "cases.json") else [],
        "holdout": read_cases(d / "holdout.json") if definition_present(d / "holdout.json") else [],
        "versions": versions,
        "live_version": live,
    }


def runs_workspace(runs: Any) -> Path | None:
    """The workspace a load_runs frame was read from, found from its `path` column.

    Args:
        runs: a load_runs frame (or a selection of one); anything else gives None.

    Returns:
        The folder holding the `.machine` folder of the first run's path
        (`<ws>/.machine/runs/<machine…>/<id>.json`), or None when the frame has no such path.
    """
    if not (hasattr(runs, "columns") and "path" in runs.columns and len(runs)):
        return None
    first = runs["path"].iloc[0]
    if not isinstance(first, str):
        return None
    parts = os.path.normpath(first).split(os.sep)
    if ".machine" not in parts:
        return None
    return Path(os.sep.join(parts[:len(parts) - 1 - parts[::-1].index(".machine")]) or os.sep)


def _runs_machine(runs: Any) -> str | None:
    """The one machine every run of `runs` belongs to (None when they name several, or none)."""
    if hasattr(runs, "columns"):
        names = set(runs["machine"].dropna().tolist()) if "machine" in runs.columns else set()
    elif isinstance(runs, dict):
        names = {(runs["run"] if isinstance(runs.get("run"), dict) else runs).get("machine")}
    elif isinstance(runs, (list, tuple)):
        names = {(r["run"] if isinstance(r.get("run"), dict) else r).get("machine") for r in runs if isinstance(r, dict)}
    else:
        names = set()
    names.discard(None)
    return next(iter(names)) if len(names) == 1 and isinstance(next(iter(names)), str) else None


def resolve_machine(machine: dict | str | None, workspace: str | os.PathLike | None = None, *, runs: Any = None,
                    undefined: str = "raise") -> dict:
    """A machine's definition, resolved the one way every step resolves it (select_runs,
    training_lines, tagged_lines, preference_pairs).

    Args:
        machine: a definition dict (as load_machine returns it), a machine name, or None: the one
            machine all of `runs` belong to (none when they belong to several).
        workspace: where a named machine is defined. Default None: the workspace `runs` were read
            from (runs_workspace); with neither, only the name is known.
        runs: a load_runs frame, a Run dict or a list of them, consulted for what is not given
            (default None).
        undefined: what a name the workspace does not define gives: "raise" (default: the
            MachineFormatError of load_machine, which lists the machines there are) or "name"
            (`{"name": machine}`: runs of a machine without a checked-in definition).

    Returns:
        A copy of the definition dict; `{"name": machine}` when no workspace is known; `{}` when
        no machine is given or found.
    """
    if undefined not in ("raise", "name"):
        raise ValueError(f"undefined must be 'raise' or 'name', not {undefined!r}")
    if isinstance(machine, dict):
        return dict(machine)
    if machine is None:
        machine = _runs_machine(runs) if runs is not None else None
        if machine is None:
            return {}
    if not isinstance(machine, str):
        raise TypeError(f"machine must be a name or a definition dict, not {type(machine).__name__}")
    ws = workspace if workspace is not None else runs_workspace(runs)
    if ws is None or (undefined == "name" and not (SEGMENT_NAME.fullmatch(machine)
                                                   and defines_machine(machine_folder(ws, machine)))):
        return {"name": machine}
    return load_machine(ws, machine)
