"""Machine's per-project tag store: the rows `/good`, `/good --as`, `/good --trace` and `/bad` write
(`train.jsonl`, `traces.jsonl`, `observed.jsonl`, `rejected.jsonl`), and `/tagged` to read them.

Appends go through `machine_nb.core.jsonl.append_jsonl` (one locked, synced write per row), so several
writers never interleave or lose a row; `untag` rewrites a file atomically under the same lock.
Where the store lives is `store_dir`; its project key is the one uncertain part (see there).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.chat import content_text
from ..errors import MachineFormatError, user_stacklevel
from .messages import is_tool_call, to_chat, without_thinking

if TYPE_CHECKING:
    import pandas as pd

DATA_FILES = {"train": "train.jsonl", "traces": "traces.jsonl", "observed": "observed.jsonl",
              "rejected": "rejected.jsonl"}
#: The key of a rewrite row that keeps the reply the rewrite replaced (ours: Machine's rows lack it).
REPLACED = "replaced"
TAGGED_COLUMNS = ["id", "file", "line", "tag", "kind", "note", "source", "machine", "run", "n_messages",
                  "last_user", "last_assistant", "created_at", "row"]


def project_key(project: str | os.PathLike | None = None) -> str:
    """The store key of a project directory.

    UNCERTAIN: Machine's `machineProjectKey` hashes the canonical (symlink-resolved) project path,
    but its exact format was not seen; this shape is our choice. If your Machine store lives
    under another name, pass `store=` (an explicit path always wins).

    Args:
        project: the project directory (default None: the current directory).

    Returns:
        `<slug of its basename>-<first 12 hex of sha256(realpath)>`.
    """
    path = Path(project or os.getcwd()).resolve()
    try:
        path = Path(os.path.realpath(path))
    except OSError:
        pass
    slug = re.sub(r"[^a-z0-9]+", "-", path.name.lower()).strip("-") or "project"
    return f"{slug}-{hashlib.sha256(str(path).encode('utf-8')).hexdigest()[:12]}"


def store_dir(project: str | os.PathLike | None = None, base: str | os.PathLike | None = None) -> Path:
    """The tag store directory of a project.

    The project key format is the one uncertain part (see project_key); pass `store=` to the tag
    functions to use any directory.

    Args:
        project: the project directory (default None: the current directory, as Machine uses its cwd).
        base: the folder of stores (default None: `$MACHINE_DATA_DIR`, resolved against the project
            directory as Machine does, when set and non-blank; else `~/.machine` on every platform:
            Machine ignores XDG).

    Returns:
        `<base>/<project_key(project)>`.
    """
    proj = Path(project or os.getcwd())
    if base is None:
        env = os.environ.get("MACHINE_DATA_DIR", "").strip()
        base = (proj / env).resolve() if env else Path.home() / ".machine"
    return Path(base) / project_key(proj)


def resolve_store(store: str | os.PathLike | None) -> Path:
    """The folder a `store=` argument names.

    Args:
        store: a folder; "~" at its start is the home folder, as a shell reads it (Machine's stores
            live under ~/.machine). None: `store_dir()` of the current directory.

    Returns:
        The folder (not checked to exist).
    """
    return Path(store).expanduser() if store is not None else store_dir()



def extract_text(content: Any) -> str:
    """Machine's extractMessageText: the text parts joined by newlines, trimmed."""
    return content_text(content, sep="\n", strip=True)


def item_messages(item: Any) -> tuple[list[dict], dict | None]:
    """(messages, run record or None) from a load_runs row, a Run dict, or a list of messages."""
    if hasattr(item, "to_dict") and not isinstance(item, dict):
        item = item.to_dict()
    if isinstance(item, dict):
        run = item["run"] if isinstance(item.get("run"), dict) else item
        if "trajectory" not in run and "history" not in run:
            raise ValueError("tag() needs a run (a load_runs row or a Run dict with 'trajectory') or a list of messages")
        return list(run.get("history") or []) + list(run.get("trajectory") or []), run
    if isinstance(item, list) and all(isinstance(m, dict) for m in item):
        return item, None
    raise TypeError(f"tag() takes a run row, a Run dict or a list of messages, not {type(item).__name__}")


def _is_call(m: dict) -> bool:
    return bool(m.get("tool_calls")) or is_tool_call(m)


def latest_turn(msgs: list[dict], *, answered: bool = True) -> tuple[int, int | None]:
    """The latest user/assistant turn of a conversation.

    Args:
        msgs: the messages (Machine or chat).
        answered: the turn must have a reply (default True); False accepts a turn without one.

    Returns:
        (index of the latest user message, index of the last assistant reply after it that is
        not a tool call and has text; None when there is none and `answered` is False).

    Raises:
        ValueError: no user message, or (answered) no reply after it.
    """
    last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=-1)
    if last_user < 0:
        raise ValueError("no user message to tag: a tagged turn is the latest user/assistant turn")
    reply = max((i for i in range(last_user + 1, len(msgs))
                 if msgs[i].get("role") == "assistant" and not _is_call(msgs[i]) and extract_text(msgs[i].get("content"))),
                default=-1)
    if reply < 0:
        if answered:
            raise ValueError("no assistant reply after the latest user message to tag")
        return last_user, None
    return last_user, reply


def _trace(msgs: list[dict], start: int, reasoning: bool, stamp: str) -> tuple[list[dict], list[dict]]:
    """(chat messages, Letta-style trajectory records) for the turn starting at user message `start`."""
    turn = msgs[start:]
    chat_shaped = any("tool_calls" in m or "tool_call_id" in m for m in turn)
    chat = turn if chat_shaped else to_chat(turn, reasoning=reasoning)[0]
    if not reasoning:
        chat = [without_thinking(m) for m in chat]
    records: list[dict] = []
    for n, m in enumerate(chat):
        for k, tc in enumerate(m.get("tool_calls") or []):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"message {start + n} of the turn: tool_calls[{k}] is not an OpenAI chat tool call "
                                 "({'id', 'type': 'function', 'function': {'name', 'arguments'}}), so no trace "
                                 "row can be made of it; nothing written")
        role = m["role"]
        content = m.get("content")
        if role == "assistant":
            if reasoning and isinstance(content, list):
                for p in content:
                    if p.get("type") == "thinking":
                        records.append({"role": "reasoning", "content": p["thinking"], "timestamp": stamp})
            text = extract_text(content)
            if text:
                records.append({"role": "assistant", "content": text, "timestamp": stamp})
            if m.get("tool_calls"):
                records.append({"role": "assistant", "content": None, "timestamp": stamp, "tool_calls": [
                    {"id": tc.get("id"), "name": tc["function"]["name"], "args": tc["function"]["arguments"]}
                    for tc in m["tool_calls"]]})
        elif role == "tool":
            records.append({"role": "tool", "tool_call_id": m.get("tool_call_id"), "content": extract_text(content),
                            "timestamp": stamp})
        else:
            records.append({"role": role, "content": extract_text(content), "timestamp": stamp})
    return chat, records


def tag(run: Any, tag: str = "good", note: str | None = None, rewrite: str | None = None,
        trace: bool = False, store: str | os.PathLike | None = None, *, reasoning: bool = False,
        source: str | None = None, id: str | None = None, created_at: str | datetime | None = None,
        replaced: str | None = None) -> dict:
    """Save the latest user/assistant turn of a run (or message list) as a tag row, like Machine's
    /good, /good --as, /good --trace and /bad.

    Args:
        run: a load_runs row (Series or dict), a Run dict, or a list of messages (Machine or chat).
        tag: "good" (default; to train.jsonl, like /good), "bad" (to rejected.jsonl, like /bad) or
            "observed" (to observed.jsonl).
        note: free text kept on the row (default None: no note key).
        rewrite: replaces the assistant answer with this text (/good --as); the note is kept.
            A turn with no reply yet can be tagged with a rewrite (its answer to learn); default
            None: the turn's own reply, which it must have.
        trace: True writes the whole last turn (user, assistant prose, OpenAI tool_calls, tool
            results) to traces.jsonl with kind "trace" and Letta-style `trajectory` records
            (/good --trace). Default False: the [user, assistant] pair, kind "final".
        store: the store directory; default None: `store_dir()` for the current directory.
        reasoning: keep reasoning in a trace (default False, as Machine omits it unless --reasoning).
        source: where the turn came from; default None: `<run id>.json` for runs (the basename of
            the run file, as Machine records its session file), else no source key.
        id: the row's id, a string (default None: 12 random hex digits; fixtures pass one).
        created_at: when it was recorded: ISO 8601 text, kept as given, or a datetime, written as
            UTC ISO 8601 (a naive one is read as local time). Default None: now, UTC ISO 8601.
        replaced: with `rewrite`, the text of the reply the rewrite replaces (default None: the
            turn's own reply when it has one; a turn without one records none).

    Returns:
        The row written. Keys: id, messages, tag, kind, note?, source?, trajectory? (traces),
        machine? and run? (runs), rewritten? (true with rewrite), replaced? (with rewrite: the text
        of the reply it replaced, which a preference pair rejects; rows Machine writes lack it),
        created_at. Appended under the file's lock: never lost or half-written with several writers.

    Raises:
        ValueError: an unknown tag, rewrite with trace, an empty or whitespace rewrite, replaced
            without rewrite, no user message,
            or no reply to tag (and no rewrite), or (trace) a chat tool call not in OpenAI's shape.
        TypeError: an id that is not a string.
        MachineFormatError: naming the store, when it is a file and not a folder, or the store
            file, when it cannot be written (no permission, a file where a folder should be);
            nothing is written.
    """
    from ..core.jsonl import append_jsonl

    if tag not in ("good", "bad", "observed"):
        raise ValueError(f"tag must be 'good', 'bad' or 'observed', not {tag!r}")
    if trace and rewrite is not None:
        raise ValueError("rewrite (/good --as) replaces a final answer; it cannot be combined with trace=True")
    if replaced is not None and rewrite is None:
        raise ValueError("replaced= names the reply a rewrite replaces: give rewrite= too")
    if id is not None and not isinstance(id, str):
        raise TypeError(f"tag(id=...): id must be a string (untag() finds a row by it), "
                        f"not {type(id).__name__} {id!r}")
    if rewrite is not None and (not isinstance(rewrite, str) or not rewrite.strip()):
        what = f"a {type(rewrite).__name__}" if not isinstance(rewrite, str) else "empty" if not rewrite else "only whitespace"
        raise ValueError(f"rewrite= is {what}: it is the answer the model learns, so give the text of that answer "
                         "(or leave rewrite= out to keep the run's own reply)")
    msgs, record = item_messages(run)
    user_i, reply_i = latest_turn(msgs, answered=rewrite is None)
    if isinstance(created_at, datetime):  # a naive datetime is local time, as Python's astimezone reads it
        created_at = _utc_iso(created_at.astimezone(timezone.utc))
    stamp = created_at or _utc_iso(datetime.now(timezone.utc))
    row: dict[str, Any] = {"id": id or secrets.token_hex(6)}
    trajectory = None
    if trace:
        row["messages"], trajectory = _trace(msgs, user_i, reasoning, stamp)
        kind, fname = "trace", DATA_FILES["traces"]
    else:
        answer = rewrite if rewrite is not None else extract_text(msgs[reply_i].get("content"))
        row["messages"] = [{"role": "user", "content": extract_text(msgs[user_i].get("content"))},
                           {"role": "assistant", "content": answer}]
        kind = "final"
        fname = {"good": DATA_FILES["train"], "bad": DATA_FILES["rejected"], "observed": DATA_FILES["observed"]}[tag]
    row["tag"] = tag
    row["kind"] = kind
    if note is not None:
        row["note"] = note
    if source is None and record is not None and record.get("id"):
        source = f"{record['id']}.json"
    if source is not None:
        row["source"] = source
    if trajectory is not None:
        row["trajectory"] = trajectory
    if record is not None:
        row["machine"] = record.get("machine")
        row["run"] = record.get("id")
    if rewrite is not None:
        row["rewritten"] = True
        if replaced is None and reply_i is not None:
            replaced = extract_text(msgs[reply_i].get("content"))
        if replaced is not None:
            row[REPLACED] = replaced  # the reply a preference pair sets against the rewrite
    row["created_at"] = stamp
    root = resolve_store(store)
    if root.exists() and not root.is_dir():
        raise MachineFormatError(root, "not a folder: a tag store is a folder holding train.jsonl, traces.jsonl, "
                                       "observed.jsonl and rejected.jsonl; nothing written")
    try:
        append_jsonl([row], root / fname)
    except OSError as exc:  # a folder that cannot be made or written (a file on the way, no permission)
        raise MachineFormatError(root / fname, f"cannot write the tag row: {exc.strerror or exc}; nothing "
                                               "written") from None
    _notify(root, "tag", row)
    return row


def _utc_iso(moment: datetime) -> str:
    """A UTC datetime as ISO 8601 text to the millisecond, ending in Z (as JavaScript's toISOString)."""
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _existing_store(store: str | os.PathLike | None) -> Path | None:
    """The store folder to read; None (with a warning) when there is none yet. A path that is a
    file is an error: it cannot be a store, and reading it as an empty one would hide the mistake."""
    import warnings

    root = resolve_store(store)
    if root.is_dir():
        return root
    if root.exists():
        raise MachineFormatError(root, "not a folder: a tag store is a folder holding train.jsonl, traces.jsonl, "
                                       "observed.jsonl and rejected.jsonl")
    warnings.warn(f"no tag store at {root} (nothing tagged there yet, or a wrong path?)", stacklevel=user_stacklevel())
    return None


def _iter_rows(store: Path | None, skipped: list):
    from ..core.jsonl import iter_jsonl

    if store is None:
        return
    for fname in DATA_FILES.values():
        path = store / fname
        if not path.exists():
            continue
        rows = iter_jsonl(path, on_error="skip", skipped=skipped)
        while True:
            try:
                line, row = next(rows)
            except StopIteration:
                break
            except MachineFormatError as exc:  # a file that cannot be read (a FIFO, no permission): the others still are
                skipped.append(exc)
                break
            if not isinstance(row, dict):
                skipped.append(MachineFormatError(path, f"a tag row must be a JSON object, got {type(row).__name__}", line=line))
                continue
            if not isinstance(row.get("messages"), list):
                skipped.append(MachineFormatError(path, "missing or not a list", line=line, field="messages"))
                continue
            yield fname, line, row


def tagged(store: str | os.PathLike | None = None) -> pd.DataFrame:
    """All tag rows of a store as a DataFrame, like `/tagged`, in file order (train, traces, observed,
    rejected; then line order).

    Unreadable lines, rows without `messages`, and store files that cannot be read (a FIFO, no
    permission) are skipped with one warning listing file and line; the rest is read.

    Args:
        store: the store directory (default None: `store_dir()` of the current directory).

    Returns:
        A DataFrame with TAGGED_COLUMNS: id ("(no id)" when a row has none, as Machine prints it),
        file, line, tag, kind (default "final"), note, source, machine and run (the run a row names,
        as `tag()` records it; None for rows Machine wrote), n_messages, last_user, last_assistant
        (the texts of the last user and assistant messages), created_at (when recorded; ours), row
        (the whole row, read from its line when asked for: a lazy column, so a big store is
        streamed, not held). A store folder that does not exist gives an empty frame and a warning.

    Raises:
        MachineFormatError: the store path is a file.
    """
    import pandas as pd
    import pyarrow as pa

    from .records import TagRows, row_digest
    from .workspace import warn_skipped

    root = _existing_store(store)
    base = os.path.abspath(root) if root is not None else ""  # the row column reads it after a chdir too
    skipped: list = []
    out, where, ids = [], [], []
    for fname, line, row in _iter_rows(root, skipped):
        msgs = row["messages"]
        last_user = next((extract_text(m.get("content")) for m in reversed(msgs) if isinstance(m, dict) and m.get("role") == "user"), None)
        last_asst = next((extract_text(m.get("content")) for m in reversed(msgs)
                          if isinstance(m, dict) and m.get("role") == "assistant" and extract_text(m.get("content"))), None)
        machine, run = row.get("machine"), row.get("run")
        out.append((row.get("id") or "(no id)", fname, line, row.get("tag"), row.get("kind", "final"),
                    row.get("note"), row.get("source"), machine if isinstance(machine, str) else None,
                    run if isinstance(run, str) else None, len(msgs), last_user, last_asst, row.get("created_at")))
        where.append(f"{base}{os.sep}{fname}:{line}")
        ids.append(row.get("id") if isinstance(row.get("id"), str) else row_digest(row))
    warn_skipped("tag row(s)", skipped)
    df = pd.DataFrame.from_records(out, columns=TAGGED_COLUMNS[:-1])
    df["row"] = TagRows(pa.array(where, pa.large_string()), pa.array(ids, pa.large_string()))
    return df


def run_tags(store: str | os.PathLike) -> tuple[dict[tuple[str, str], list[str]], dict[str, list[str]]]:
    """The tags of a store's rows by the run they name.

    Args:
        store: the store directory.

    Returns:
        ({(machine, run id): tags} for rows that name their machine, as `tag()` writes them;
        {run id: tags} for rows without one: Machine's own rows, the id from a `source` of
        `<id>.json`, which `frames.attach_tags` matches only where the id is unambiguous).
    """
    from .workspace import warn_skipped

    by_key: dict[tuple[str, str], list[str]] = {}
    by_id: dict[str, list[str]] = {}
    skipped: list = []
    for _, _, row in _iter_rows(_existing_store(store), skipped):
        rid = row.get("run")
        if not isinstance(rid, str):
            src = row.get("source")
            rid = src[:-5] if isinstance(src, str) and src.endswith(".json") else None
        if not rid or not isinstance(row.get("tag"), str):
            continue
        machine = row.get("machine")
        if isinstance(machine, str) and machine:
            by_key.setdefault((machine, rid), []).append(row["tag"])
        else:
            by_id.setdefault(rid, []).append(row["tag"])
    warn_skipped("tag row(s)", skipped)
    return by_key, by_id


def untag(id: str, store: str | os.PathLike | None = None) -> dict:
    """Remove the row with this id from whichever store file holds it, and every copy of it (a
    row copied into the store again, in the same file or another, is the same row).

    Each file is rewritten atomically under the same lock appends use, so no other row (not even
    an unreadable line, kept byte for byte) is lost. It is streamed: only lines that may hold the
    id are parsed, and memory does not grow with the file. A store file that is a symlink is
    rewritten where it points (the link stays a link), and the file keeps its permission bits.

    Args:
        id: the row's id.
        store: the store directory (default None: `store_dir()` of the current directory).

    Returns:
        The removed row (the first, in file order: train, traces, observed, rejected; then line).

    Raises:
        KeyError: no row has this id.
        TypeError: the id is not a string.
        MachineFormatError: naming the file, when one cannot be read or is not a regular file (a
            FIFO would block the read), or naming file and line, when a line that may hold the id
            cannot be parsed for being nested too deep (it cannot be told apart from the row asked for).
    """
    from ..core.jsonl import locked, remove_stale_temporaries

    if not isinstance(id, str):
        raise TypeError(f"untag(id): id must be a string (a tag row's `id`, as tagged() lists it), "
                        f"not {type(id).__name__} {id!r}")
    root = resolve_store(store)
    needles = _id_needles(id)
    removed: list[dict] = []
    try:
        for fname in DATA_FILES.values():
            path = root / fname
            if not path.exists():
                continue
            with locked(path):  # the lock beside the store's own name, the one tag() appends under
                real = Path(os.path.realpath(path))  # a symlinked store file is edited where it points
                remove_stale_temporaries(real)  # the copy an untag killed midway left, as big as the file
                found = _find_rows(real, id, needles)
                if found:
                    _rewrite_without(real, [(start, end) for start, end, _ in found])
            removed.extend(row for _, _, row in found)
    finally:
        for row in removed:  # what was removed is told, even when a later file could not be read
            _notify(root, "untag", row)  # outside the lock: a view may read the store
    if removed:
        return removed[0]
    where = f"in {root}" if root.is_dir() else f"(no tag store at {root})"
    raise KeyError(f"no tag row with id {id!r} {where}")


def _id_needles(id: str) -> tuple[bytes, ...]:
    """The byte strings a line holding this id contains: the id as it is, and as a JSON string
    spells it (a quote, a backslash or a control character is escaped there)."""
    plain = id.encode("utf-8")
    escaped = json.dumps(id, ensure_ascii=False)[1:-1].encode("utf-8")
    return (plain,) if escaped == plain else (plain, escaped)


def _find_rows(path: Path, id: str, needles: tuple[bytes, ...]) -> list[tuple[int, int, dict]]:
    """(start, end, row) of each line holding a row with this id, in order; one line in memory.
    Only a regular file is read (open_regular names any other, and a file it cannot read)."""
    import orjson

    from ..core.jsonl import open_regular

    offset = 0
    found = []
    with open_regular(path) as fh:
        for number, raw in enumerate(fh, start=1):
            start, offset = offset, offset + len(raw)
            if not any(n in raw for n in needles) and b"\\u" not in raw:  # the id, or an escape that could spell it
                continue
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                if "depth" in str(exc) or "recursion" in str(exc):
                    raise MachineFormatError(path, "JSON nested too deeply to read (over 1,024 levels); cannot tell "
                                                   "whether this line is the row asked for", line=number) from None
                continue  # a torn or broken line: never the row asked for, kept as it is
            if isinstance(row, dict) and row.get("id") == id:
                found.append((start, offset, row))
    return found


def _rewrite_without(path: Path, spans: list[tuple[int, int]]) -> None:
    """Replace a file by itself without the byte ranges [start, end) of `spans` (in order, not
    overlapping), streamed, atomically (jsonl.atomic_replace); every other byte, and the file's
    permission bits, are kept as they were."""
    import shutil
    import stat

    from ..core.jsonl import atomic_replace

    mode = stat.S_IMODE(os.stat(path).st_mode)
    with atomic_replace(path, mode=mode) as tmp, open(tmp, "wb") as out, open(path, "rb") as src:
        at = 0
        for start, end in spans:
            left = start - at
            while left > 0:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
            src.seek(end)
            at = end
        shutil.copyfileobj(src, out, 1 << 20)


# ---- views that follow a store: RunPicker and Tagger are told of each row written or removed here

_observers: list = []


def observe_store(callback: Any) -> Any:
    """Call `callback(store, event, row)` after every `tag()` ("tag") and `untag()` ("untag") in
    this process, so every view of a store follows it. A bound method is held weakly (a widget
    that is gone stops being called).

    Args:
        callback: a function or bound method taking (store folder as a resolved Path, event, row).

    Returns:
        A function that stops the calls.
    """
    import weakref

    ref = weakref.WeakMethod(callback) if hasattr(callback, "__self__") else (lambda: callback)
    _observers.append(ref)

    def stop() -> None:
        if ref in _observers:
            _observers.remove(ref)
    return stop


def same_store(a: str | os.PathLike | None, b: str | os.PathLike | None) -> bool:
    """Whether two store arguments name one folder (None is `store_dir()`)."""
    return os.path.realpath(resolve_store(a)) == os.path.realpath(resolve_store(b))


def _notify(store: Path, event: str, row: dict) -> None:
    import warnings

    store = Path(os.path.realpath(store))  # resolved, as observe_store promises: the same folder by any name
    for ref in list(_observers):
        callback = ref()
        if callback is None:
            _observers.remove(ref)
            continue
        try:
            callback(store, event, row)
        except Exception as exc:  # noqa: BLE001 - a broken view must not fail the write that was made
            warnings.warn(f"a view of the tag store failed to follow a {event}: {type(exc).__name__}: {exc}",
                          stacklevel=user_stacklevel())
