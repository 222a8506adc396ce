"""Machine's runs and their messages as pandas DataFrames with stable, documented columns, so a
user can filter, group and plot without writing a loop. Files are found and checked in
`store/workspace.py`; tags come from `store/tags.py`; conversion to training data is `export.py`.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from .export import FailedPredicate, run_records, default_failed, is_tool_call, run_case, tool_results
from .errors import MachineFormatError
from .store.workspace import (check_run, iter_named_files, machine_dir, name_segments, read_json, warn_skipped,
                              workspace_root)

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
(export.default_failed unless `failed=` is given).
input_tokens, output_tokens, cost_usd: from `usage` (NaN when absent).
version, instructions: what the run was made under (None when not recorded).
final: False only for a non-final turn of a conversation (`conversation.final` false).
path: the run file. run: the parsed Run record itself.
"""

MESSAGE_COLUMNS = [
    "run_id", "machine", "index", "role", "content", "reasoning", "tool_name", "tool_call_id",
    "tool_input", "is_tool_call", "failed", "in_history",
]


def load_runs(workspace: str | os.PathLike, machine: str | None = None, *, strict: bool = False,
              store: str | os.PathLike | None = None, failed: FailedPredicate | None = None):
    """All runs of a workspace as a DataFrame, one row per run, newest first (started_at, then id).

    workspace: the workspace root (holding `.machine/`) or the `.machine` directory itself.
    machine: only this machine and its nested machines (default None: all).
    strict: False (default) skips bad or misplaced run files with one SkippedFiles warning that
            lists each file and why; True raises MachineFormatError naming file and field.
    store: a tag store directory; when given, adds a `tags` column (list of the tags whose rows
           name the run). Default None keeps loading fast.
    failed: the failed-tool predicate for n_failed_tool_calls (default export.default_failed).
    Columns: see RUN_COLUMNS. `attrs["workspace"]` records the workspace root.
    """
    failed = failed or default_failed
    skipped: list = []
    rows: list[tuple] = []
    root = machine_dir(workspace) / "runs"
    if not os.path.isdir(workspace):
        raise MachineFormatError(workspace, "no such workspace directory")
    if not root.parent.is_dir():
        import warnings

        warnings.warn(f"no runs in {workspace}: {root.parent} does not exist (is this a Machine workspace?)",
                      stacklevel=2)
    if machine is not None:
        root = root.joinpath(*name_segments(machine, "machine name"))
    gc_was_on = gc.isenabled()
    # Parsed runs hold no reference cycles; with the collector on, each collection re-walks every
    # object kept so far (measured: about a third of load_runs' time over 10,000 runs).
    gc.disable()
    try:
        _collect(root, machine, strict, failed, skipped, rows)
        return _frame(rows, workspace, store, skipped)
    finally:
        if gc_was_on:
            gc.enable()


def _collect(root: Any, machine: str | None, strict: bool, failed: FailedPredicate, skipped: list,
             rows: list[tuple]) -> None:
    """Read, check and flatten every run file under `root` into `rows` (tuples in RUN_COLUMNS order)."""
    for path, folder, problem in iter_named_files(root):
        # iter_runs's loop, inlined so tool calls are counted while the messages are checked
        if machine is not None:
            folder = machine if folder is None else f"{machine}/{folder}"
            problem = None if problem and problem.startswith("file directly") else problem
        calls: list = []
        results: dict = {}
        try:
            if problem:
                raise MachineFormatError(path, problem, field="machine")
            run = check_run(read_json(path), path, folder, calls, results)
        except MachineFormatError as exc:
            if strict:
                raise
            skipped.append(exc)
            continue
        n_failed = 0
        for c in calls:
            r = results.get(c.get("toolCallId"))
            if r is not None and failed(c, r):
                n_failed += 1
        card = run.get("scorecard") or _EMPTY
        usage = run.get("usage") or _EMPTY
        conv = run.get("conversation")
        get = run.get
        case = get("case")
        rows.append((  # one tuple per run, in RUN_COLUMNS order; columns are made once at the end
            run["id"], run["machine"], get("model"), get("harness"), get("input"), get("output"),
            case if case.__class__ is str else run_case(run), card.get("total"), card.get("rubric"),
            get("startedAt") or None, get("finishedAt") or None, None,
            len(get("history") or ()) + len(get("trajectory") or ()), len(calls), n_failed,
            usage.get("inputTokens"), usage.get("outputTokens"), usage.get("costUsd"),
            get("version"), get("instructions"), not (conv.__class__ is dict and not conv.get("final")),
            path, run))


_EMPTY: dict = {}


def _frame(rows: list[tuple], workspace: Any, store: Any, skipped: list):
    """The runs DataFrame from the row tuples: typed times and numbers, newest first, tags."""
    import pandas as pd

    columns = list(zip(*rows)) if rows else [()] * len(RUN_COLUMNS)
    df = pd.DataFrame({c: list(v) for c, v in zip(RUN_COLUMNS, columns)}, columns=RUN_COLUMNS)
    for c in ("started_at", "finished_at"):
        raw = df[c]
        df[c] = pd.to_datetime(raw, utc=True, errors="coerce", format="ISO8601")
        bad = raw.notna() & df[c].isna()
        if bad.any():
            import warnings

            from .store.workspace import SkippedFiles

            listed = "\n".join(f"  {p} (field {c!r}): {v!r}" for p, v in list(zip(df.loc[bad, "path"], raw[bad]))[:20])
            warnings.warn(SkippedFiles(f"{int(bad.sum())} run(s) have an unparseable {c}; kept with NaT:\n{listed}"),
                          stacklevel=3)
    df["duration_s"] = (df["finished_at"] - df["started_at"]).dt.total_seconds()
    for c in ("score", "input_tokens", "output_tokens", "cost_usd"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    df["final"] = df["final"].astype(bool)
    df = df.sort_values(["started_at", "id"], ascending=False, na_position="last", kind="stable")
    df = df.reset_index(drop=True)
    if store is not None:
        from .store.tags import run_tags

        by_run = run_tags(store)
        df["tags"] = [list(by_run.get(i, [])) for i in df["id"]]
    df.attrs["workspace"] = str(workspace_root(workspace))
    warn_skipped("run file(s)", skipped, stacklevel=4)
    return df


def messages(runs: Any, *, failed: FailedPredicate | None = None):
    """One row per message of the given runs (history first, then trajectory), in order.

    runs: a load_runs DataFrame, one of its rows, a Run dict, or a list of Run dicts.
    Columns: run_id, machine, index (0-based within the run), role, content, reasoning,
    tool_name (`name`), tool_call_id, tool_input (the call's arguments, as stored),
    is_tool_call (an assistant tool-call message), failed (for a tool call: its result failed;
    for a tool result: it is a failure; judged by `failed`, default export.default_failed;
    False otherwise), in_history (the message came from `history`, an earlier turn).
    """
    import pandas as pd

    failed = failed or default_failed
    rows: list[tuple] = []
    for run in run_records(runs):
        hist = run.get("history") or []
        msgs = list(hist) + list(run.get("trajectory") or [])
        results = tool_results(msgs)
        calls = {m.get("toolCallId"): m for m in msgs if is_tool_call(m)}
        for i, m in enumerate(msgs):
            call = is_tool_call(m)
            if call:
                r = results.get(m.get("toolCallId"))
                bad = r is not None and failed(m, r)
            elif m.get("role") == "tool":
                bad = failed(calls.get(m.get("toolCallId"), {}), m)
            else:
                bad = False
            rows.append((run.get("id"), run.get("machine"), i, m.get("role"), m.get("content"),
                         m.get("reasoning"), m.get("name"), m.get("toolCallId"), m.get("toolInput"),
                         call, bool(bad), i < len(hist)))
    return pd.DataFrame.from_records(rows, columns=MESSAGE_COLUMNS)


__all__ = ["load_runs", "messages", "RUN_COLUMNS", "MESSAGE_COLUMNS"]
