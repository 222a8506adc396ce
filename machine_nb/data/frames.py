"""Machine's runs and their messages as pandas DataFrames with stable, documented columns, so a
user can filter, group and plot without writing a loop. Files are found and checked in
`store/workspace.py`; tags come from `store/tags.py`; conversion to training data is `export.py`.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from typing import TYPE_CHECKING, Any

from .export import (FailedPredicate, run_records, default_failed, is_tool_call, result_after, result_positions,
                     run_case)
from ..errors import MachineFormatError, user_stacklevel
from ..store.workspace import (check_run, iter_named_files, loads_json, machine_dir, name_segments, on_error_policy,
                              read_json, shown_name, utf8_name, warn_skipped, workspace_root)

if TYPE_CHECKING:
    import pandas as pd

RUN_COLUMNS = [
    "id", "machine", "model", "harness", "input", "output", "case", "score", "rubric",
    "started_at", "finished_at", "duration_s", "n_messages", "n_tool_calls", "n_failed_tool_calls",
    "input_tokens", "output_tokens", "cost_usd", "version", "instructions", "final", "path", "run",
]
"""Columns of `load_runs` (plus `tags` when a store is given):

id, machine (nested names with "/"), model, harness, input, output: the Run's own fields.
case: `run.case` if present, else `run.input` (see export.run_case).
score: scorecard.total (NaN when unscored). rubric: scorecard.rubric (the rubric fingerprint).
started_at, finished_at: UTC datetimes (NaT when empty or unparseable). duration_s: their gap.
n_messages: history + trajectory messages (the rows `messages()` gives for the run).
n_tool_calls: assistant tool-call messages; n_failed_tool_calls: those whose result failed
(store.messages.default_failed unless `failed=` is given).
input_tokens, output_tokens, cost_usd: from `usage` (NaN when absent).
version, instructions: what the run was made under (None when not recorded).
final: False only for a non-final turn of a conversation (`conversation.final` false).
path: the run file (absolute). run: the parsed Run record itself (read on demand from `path` when the
frame comes from the run index: see load_runs and load_records).
"""

MESSAGE_COLUMNS = [
    "run_id", "machine", "index", "role", "content", "reasoning", "tool_name", "tool_call_id",
    "tool_input", "is_tool_call", "failed", "in_history",
]


INDEX_MIN_RUNS = 5_000
"""load_runs(index=None) keeps a run index for workspaces with at least this many run files
(below it, parsing every file takes well under a second and the frame holds the records)."""


def load_runs(workspace: str | os.PathLike, machine: str | None = None, *, on_error: str = "warn",
              store: str | os.PathLike | None = None, failed: FailedPredicate | None = None,
              index: bool | None = None, check: str = "dirs") -> pd.DataFrame:
    """All runs of a workspace as a DataFrame, one row per run, newest first (started_at, then id).

    Args:
        workspace: the workspace root (holding `.machine/`) or the `.machine` directory itself.
        machine: only this machine and its nested machines (default None: all).
        on_error: what a bad or misplaced run file does: "warn" (default: skipped, with one
            SkippedFiles warning that lists each file and why), "skip" (skipped silently) or
            "raise" (MachineFormatError naming the file and field).
        store: a tag store directory; when given, adds a `tags` column (the tags whose rows name
            the run, matched by machine and id; see `attach_tags`). Default None keeps loading fast.
        failed: the failed-tool predicate for n_failed_tool_calls (default None:
            store.messages.default_failed). Another predicate parses every file (the index holds
            counts by the default rule).
        index: keep the run table in the run index (`store/index.py`: an Arrow IPC file in the
            user's cache folder, memory-mapped when read) and parse only new or changed files on
            the next load; a first load of many files is parsed by worker processes too. Default
            None: yes when the workspace has an index already or holds at least INDEX_MIN_RUNS run
            files; True: always; False: parse every file, keep nothing.
        check: how an indexed reload finds changed files: "dirs" (default; folder times, which
            every file created, deleted or renamed into place changes, plus a stat of unfinished
            runs and bad files) or "files" (stat every file; also sees files rewritten in place).
            See `store.index.update_index`.

    Returns:
        A DataFrame with RUN_COLUMNS (and `tags` with a store). With the index, `run` is filled on
        demand (a lazy column: each value is read from its run file when asked for, see
        `load_records`); without it, `run` holds the parsed records. `attrs["workspace"]` records
        the workspace root; `attrs["index"]` what the index did (an IndexReport: IndexStats'
        fields files, parsed, reused, removed, …, as keys or attributes) or None. Both are JSON, so
        `to_parquet` keeps them.
    """
    on_error = on_error_policy(on_error)
    failed_rule = failed or default_failed
    if check not in ("dirs", "files"):
        raise ValueError(f"check must be one of ('dirs', 'files'), not {check!r}")
    if not os.path.isdir(os.path.expanduser(workspace)):
        raise MachineFormatError(workspace, "no such workspace directory")
    root = machine_dir(workspace) / "runs"
    if not root.parent.is_dir():
        import warnings

        warnings.warn(f"no runs in {workspace}: {root.parent} does not exist (is this a Machine workspace?)",
                      stacklevel=user_stacklevel())
    scope = name_segments(machine, "machine name") if machine is not None else []
    gc_was_on = gc.isenabled()
    # Parsed runs hold no reference cycles; with the collector on, each collection re-walks every
    # object kept so far, a cost that grows with the workspace and buys nothing here.
    gc.disable()
    try:
        use_index = index
        listed = None
        if failed is not None and failed is not default_failed:
            use_index = False
        if use_index is None:
            from ..store.index import run_index_path

            use_index = run_index_path(workspace).exists()
            if not use_index:
                listed = list(iter_named_files(root.joinpath(*scope), within=root))
                use_index = len(listed) >= INDEX_MIN_RUNS
        if use_index:
            from ..store.index import update_index

            table, stats, problems = update_index(workspace, RunParser(default_failed), machine=machine, check=check)
            return runs_frame(table, workspace, store, on_error, problems, None, stats)
        if listed is None:
            listed = list(iter_named_files(root.joinpath(*scope), within=root))
        entries, problems = [], []
        for path, folder, problem in listed:
            if not utf8_name(path):  # no string column holds it: named, as the indexed load names it
                problems.append(MachineFormatError(shown_name(path), "its name is not valid UTF-8: skipped; rename it "
                                                                     "(e.g. with convmv) to load it"))
                continue
            if machine is not None:
                folder = machine if folder is None else f"{machine}/{folder}"
                problem = None if problem and problem.startswith("file directly") else problem
            if problem and os.path.isdir(path):  # a folder that could not be entered (a symlink loop)
                problems.append(MachineFormatError(path, problem))
                continue
            entries.append((path, folder or "", os.path.basename(path), problem))
        records: list = []
        table = RunParser(failed_rule, records)(entries)
        from ..store.index import sort_table

        table = table.append_column("_pos", _arange(table.num_rows))
        table = sort_table(_with_file_fields(table, entries))
        return runs_frame(table, workspace, store, on_error, problems, records, None)
    finally:
        if gc_was_on:
            gc.enable()


def _arange(n: int):
    import numpy as np
    import pyarrow as pa

    return pa.array(np.arange(n, dtype=np.int64))


def _with_file_fields(table, entries):
    """The parser's rows plus dir/name (size and mtime unknown: -1) for the unindexed path."""
    import pyarrow as pa

    table = table.append_column("dir", pa.array([e[1] for e in entries], pa.large_string()))
    return table.append_column("name", pa.array([e[2] for e in entries], pa.large_string()))


class RunParser:
    """The index's parser: `[(path, dir, name, problem)]` -> a table of the run columns (plus
    error, recheck and bad_time), reading each file with `read(k)` when given (the index's reader,
    which notes the file's size and mtime), else by path; when `records` is a list, each parsed
    Run (None for a bad file) is appended to it in row order. An object, not a closure, so the
    index can hand it to its worker processes (it pickles when `failed` is a module-level function
    and `records` is None)."""

    def __init__(self, failed: FailedPredicate, records: list | None = None):
        self.failed = failed
        self.records = records

    def __call__(self, entries: list[tuple[str, str, str, str | None]], read=None):
        failed, records = self.failed, self.records
        rows: list[tuple] = []
        keep = records is not None
        for k, (path, folder, _name, problem) in enumerate(entries):
            calls: list = []
            try:
                if problem:
                    raise MachineFormatError(path, problem, field="machine")
                run = check_run(read_json(path) if read is None else loads_json(read(k), path), path,
                                folder or None, calls, {})
            except MachineFormatError as exc:
                rows.append(_error_row(exc))
                if keep:
                    records.append(None)
                continue
            n_failed = 0
            for c, r in calls:
                if r is not None and failed(c, r):
                    n_failed += 1
            card = run.get("scorecard") or _EMPTY
            usage = run.get("usage") or _EMPTY
            conv = run.get("conversation")
            get = run.get
            case = get("case")
            finished = get("finishedAt") or None
            rows.append((  # one tuple per run, in _ROW_FIELDS order; columns are made once per batch
                None, None, None, finished is None,  # recheck: an unfinished run is still being written
                run["id"], run["machine"], get("model"), get("harness"), get("input"), get("output"),
                case if case.__class__ is str else run_case(run), card.get("total"), card.get("rubric"),
                get("startedAt") or None, finished,
                len(get("history") or ()) + len(get("trajectory") or ()), len(calls), n_failed,
                usage.get("inputTokens"), usage.get("outputTokens"), usage.get("costUsd"),
                get("version"), get("instructions"), not (conv.__class__ is dict and not conv.get("final"))))
            if keep:
                records.append(run)
        return _rows_table(rows)


_ROW_FIELDS = ("error", "error_line", "error_field", "recheck", "id", "machine", "model", "harness", "input",
               "output", "case", "score", "rubric", "started_at", "finished_at", "n_messages", "n_tool_calls",
               "n_failed_tool_calls", "input_tokens", "output_tokens", "cost_usd", "version", "instructions",
               "final")


def _error_row(exc: MachineFormatError) -> tuple:
    # a bad file is re-checked on every load, so fixing it in place is seen
    return (exc.reason, exc.line, exc.field, True) + (None,) * (len(_ROW_FIELDS) - 4)


def _rows_table(rows: list[tuple]):
    """Row tuples (in _ROW_FIELDS order) as an arrow table: typed times and numbers, a `bad_time`
    note for times that do not parse (kept as null, as pandas' ISO 8601 parser decides; a batch
    whose times pyarrow parses is not handed to pandas)."""
    import numpy as np
    import pyarrow as pa

    from ..store.index import INDEX_SCHEMA

    columns = list(zip(*rows)) if rows else [()] * len(_ROW_FIELDS)
    cols = dict(zip(_ROW_FIELDS, columns))
    out: dict[str, Any] = {}
    bad = [None] * len(rows)
    for c in ("started_at", "finished_at"):
        kind = INDEX_SCHEMA.field(c).type
        raw = pa.array(cols[c], pa.large_string())
        try:  # pyarrow parses the usual ISO 8601 forms at C speed…
            out[c] = raw.cast(kind)
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        # … and pandas' ISO 8601 parser decides the batches with other forms (or bad values)
        import pandas as pd  # only here: a parse worker that never needs it starts faster

        series = pd.Series(cols[c], dtype=object)
        ts = pd.to_datetime(series, utc=True, errors="coerce", format="ISO8601").dt.as_unit("us")
        for i in np.flatnonzero((series.notna() & ts.isna()).to_numpy()).tolist():
            note = f"field {c!r}: {series.iloc[i]!r}"[:200]
            bad[i] = note if bad[i] is None else f"{bad[i]}; {note}"
        out[c] = pa.Array.from_pandas(ts, type=kind)
    import pyarrow.compute as pc

    gap = pc.subtract(out["finished_at"], out["started_at"])  # a duration in µs, null where either is
    out["duration_s"] = pc.divide(pc.cast(gap, pa.int64()).cast(pa.float64()), 1e6)
    out["bad_time"] = pa.array(bad, pa.large_string())
    for name in _ROW_FIELDS:
        if name in out:
            continue
        out[name] = pa.array(cols[name], INDEX_SCHEMA.field(name).type)
    return pa.table(out)


_EMPTY: dict = {}
_STR_DTYPE = None


def _str_dtype():
    """pandas' default string dtype (pyarrow-backed `str`, NaN for missing), as load_runs has always had."""
    global _STR_DTYPE
    if _STR_DTYPE is None:
        import numpy as np
        import pandas as pd

        _STR_DTYPE = pd.StringDtype("pyarrow", na_value=np.nan)
    return _STR_DTYPE


def runs_frame(table: Any, workspace: Any, store: Any, on_error: str, problems: list, records: list | None,
               stats: Any):
    """The runs DataFrame from index rows (sorted): bad files warned about (or raised), times
    warned about, `path` and `run` added, tags attached."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..store.records import RunRecords

    root = os.path.abspath(machine_dir(workspace) / "runs")  # the run column reads it after a chdir too
    is_bad = pc.is_valid(table["error"])
    skipped = list(problems)
    if pc.any(is_bad).as_py():
        bad = table.filter(is_bad).select(["dir", "name", "error", "error_line", "error_field"]).to_pylist()
        for b in sorted(bad, key=lambda b: (b["dir"].split("/"), b["name"])):
            path = os.path.join(root, *([b["dir"]] if b["dir"] else []), b["name"]) if os.sep == "/" else \
                os.path.join(root, *b["dir"].split("/"), b["name"])
            skipped.append(MachineFormatError(path, b["error"], line=b["error_line"], field=b["error_field"]))
        table = table.filter(pc.invert(is_bad))
    if on_error == "raise" and skipped:
        raise skipped[0]
    if any(c.num_chunks > 1 for c in table.columns):
        table = table.combine_chunks()  # the picker takes pages of rows: one chunk each keeps that fast
    sep = os.sep
    dirs = table["dir"] if sep == "/" else pc.replace_substring(table["dir"], "/", sep)
    path = pc.binary_join_element_wise(pa.scalar(root, pa.large_string()), dirs, table["name"],
                                       pa.scalar(sep, pa.large_string()))
    cols = [c for c in RUN_COLUMNS if c not in ("path", "run")]
    df = table.select(cols).to_pandas(types_mapper=lambda t: _str_dtype() if t in (pa.large_string(), pa.string()) else None)
    df["path"] = path.to_pandas(types_mapper=lambda t: _str_dtype())
    if records is None:
        df["run"] = RunRecords(path)
    else:
        df["run"] = [records[i] for i in table["_pos"].to_pylist()]
    notes = table["bad_time"]
    if pc.any(pc.is_valid(notes)).as_py():
        import warnings

        from ..store.workspace import SkippedFiles

        has = pc.is_valid(notes).to_numpy(zero_copy_only=False)
        listed = [f"  {p} ({n})" for p, n in zip(df["path"][has], notes.filter(pc.is_valid(notes)).to_pylist())]
        fields = sorted({f for n in notes.filter(pc.is_valid(notes)).to_pylist() for f in ("started_at", "finished_at")
                         if f"'{f}'" in n})
        warnings.warn(SkippedFiles(f"{len(listed)} run(s) have an unparseable {' / '.join(fields)}; kept with NaT:\n"
                                   + "\n".join(listed[:20]) + (f"\n  … and {len(listed) - 20} more" if len(listed) > 20 else "")),
                      stacklevel=user_stacklevel())
    if store is not None:
        df["tags"] = attach_tags(df, store)
    df.attrs["workspace"] = str(workspace_root(workspace))
    df.attrs["index"] = None if stats is None else IndexReport(dataclasses.asdict(stats))
    if on_error == "warn":
        warn_skipped("run file(s)", skipped)
    return df


class IndexReport(dict):
    """What the run index did for one load_runs call: store.index.IndexStats' fields (files, parsed,
    reused, removed, stats, rebuilt, written, workers, path, check), read as keys or attributes. A
    dict, so a frame's attrs stay JSON: to_parquet writes them."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def attach_tags(runs: Any, store: str | os.PathLike) -> list[list[str]]:
    """The `tags` column for a runs frame: per row, the tags of the store rows that name it.

    A row written by `tag()` names its run by `machine` and `run` (the id), and tags only that run:
    run ids are unique within a machine, not across machines. A row without `machine` (as Machine
    itself writes them: only `source`, `<id>.json`) tags the run with that id when exactly one
    run among `runs` has it; when several machines have a run with that id, it tags none of them
    and a warning lists it, since it cannot say which.

    Args:
        runs: a load_runs frame (its `machine` and `id` columns).
        store: the tag store directory.

    Returns:
        One list of tags per row, in row order.

    Raises:
        ValueError: the frame lacks a `machine` or `id` column.
    """
    import warnings

    from ..store.tags import run_tags

    missing = [c for c in ("machine", "id") if c not in runs.columns]
    if missing:
        raise ValueError(f"attach_tags needs the columns 'machine' and 'id' of a load_runs frame; missing "
                         f"{' and '.join(repr(c) for c in missing)} (columns: {list(runs.columns)})")

    by_key, by_id = run_tags(store)
    machines = runs["machine"].tolist()
    ids = runs["id"].tolist()
    counts: dict = {}
    if by_id:
        for i in ids:
            if i in by_id:
                counts[i] = counts.get(i, 0) + 1
    ambiguous = sorted(i for i, n in counts.items() if n > 1)
    if ambiguous:
        listed = []
        for i in ambiguous[:20]:
            ms = sorted({m for m, j in zip(machines, ids) if j == i})
            listed.append(f"  {i} (machines {', '.join(ms)}): {len(by_id[i])} row(s)")
        warnings.warn(f"{len(ambiguous)} tagged run id(s) without a machine match runs of several machines; "
                      "those rows tag none of them (re-tag with mnb.tag to record the machine):\n"
                      + "\n".join(listed), stacklevel=user_stacklevel())
    out = []
    for m, i in zip(machines, ids):
        tags = by_key.get((m, i))
        loose = by_id.get(i) if by_id and counts.get(i) == 1 else None
        out.append(list(tags or ()) + list(loose or ()))
    return out


def load_records(runs: Any) -> list[dict]:
    """The Run records of a runs frame's rows (or of one row), in row order, read on demand.

    Rows of an indexed frame are read from their run files by this call (their `run` column is lazy);
    otherwise the records the frame holds are returned. A frame without a `run` column is read
    from its `path` column.

    Args:
        runs: a load_runs DataFrame (or any selection of one, e.g. `picker.selected`), a row, or
            Run dicts.

    Returns:
        A list of Run dicts.
    """
    from ..store.records import load_run_records

    if hasattr(runs, "columns"):
        return load_run_records(runs)
    return run_records(runs)


def messages(runs: Any, *, failed: FailedPredicate | None = None) -> pd.DataFrame:
    """One row per message of the given runs (history first, then trajectory), in order.

    Args:
        runs: a load_runs DataFrame, one of its rows, a Run dict, or a list of Run dicts.
        failed: the failed-tool predicate (default None: store.messages.default_failed).

    Returns:
        A DataFrame with MESSAGE_COLUMNS: run_id, machine, index (0-based within the run), role,
        content, reasoning, tool_name (`name`), tool_call_id, tool_input (the call's arguments, as
        stored), is_tool_call (an assistant tool-call message), failed (for a tool call: its result
        failed; for a tool result: it is a failure; judged by `failed`; False otherwise),
        in_history (the message came from `history`, an earlier turn).
    """
    import pandas as pd

    failed = failed or default_failed
    rows: list[tuple] = []
    for run in run_records(runs):
        hist = run.get("history") or []
        msgs = list(hist) + list(run.get("trajectory") or [])
        positions = result_positions(msgs)
        calls: dict = {}  # the latest call by id: the one a tool result answers
        for i, m in enumerate(msgs):
            call = is_tool_call(m)
            if call:
                calls[m.get("toolCallId")] = m
                r = result_after(msgs, positions, m.get("toolCallId"), i)
                bad = r is not None and failed(m, r)
            elif m.get("role") == "tool":
                bad = failed(calls.get(m.get("toolCallId"), {}), m)
            else:
                bad = False
            rows.append((run.get("id"), run.get("machine"), i, m.get("role"), m.get("content"),
                         m.get("reasoning"), m.get("name"), m.get("toolCallId"), m.get("toolInput"),
                         call, bool(bad), i < len(hist)))
    return pd.DataFrame.from_records(rows, columns=MESSAGE_COLUMNS)


__all__ = ["load_runs", "load_records", "attach_tags", "messages", "RUN_COLUMNS", "MESSAGE_COLUMNS",
           "INDEX_MIN_RUNS"]
