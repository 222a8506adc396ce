"""Eval results: the EvalResult that evaluate(), probe(), evaluate_cases() and load_results()
return, and the results JSON evaluate() writes.

A results file is the run's summary (name, model, checkpoint, engine, parameters, data path and
sha256, accuracy, cost, times) plus one record per row. evaluate.py writes it; compare.py,
pairs.py and the CompareView read it (as_eval_result takes any of the forms a result travels
in). A result also travels as an Inspect AI log: `EvalResult.write_inspect_log` writes one and
load_results reads any (the conversion is inspect_logs.py's), so Inspect's viewer and compare()
meet on the same files. pandas loads only when a result is built or a file is read.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MachineFormatError

if TYPE_CHECKING:
    import pandas as pd

RESULTS_DIR = "eval_results"  # Machine's `/train eval` writes here too

RESULT_COLUMNS = ["row", "prompt", "expected", "match", "output", "correct", "format_ok",
                  "prompt_tokens", "output_tokens", "latency_s", "stop_reason", "error"]
"""Columns of evaluate()'s frame: row (0-based position in the eval file), prompt (the last user
message's text), expected, match, output (the parsed reply text), correct (bool), format_ok (bool,
or None when the row has no "format"), prompt_tokens / output_tokens (exact, from the renderer
and the sampler), latency_s (one request), stop_reason ("stop" | "length" | None), error (None, or why the
row could not be scored in full: its request failed, or a regex ran past patterns.REGEX_TIMEOUT_S;
a failed request or a timed-out "regex" match counts as wrong, a timed-out "format" gives
format_ok False). Rows that share a case (evaluate_cases, trials) add a "case" column."""

PROBE_COLUMNS = ["prompt", "baseline_output", "checkpoint_output", "bled", "error"]
"""Columns of probe()'s rows: prompt (the last user message's text), baseline_output and
checkpoint_output (the two parsed replies), bled (True: the checkpoint's reply matches the format
while the base model's does not; None when the row has no format or its regex timed out), error
(None, or why a reply is missing or the format could not be checked)."""


def results_stem(label: str, empty: str = "results") -> str:
    """A results name as a file name: each run of characters other than letters, digits, ".", "_"
    and "-" written as "_" (no folders, nothing Windows refuses); `empty` for an empty name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label) or empty


def results_name(checkpoint: str | None) -> str:
    """The results file's name for a model or checkpoint.

    Args:
        checkpoint: a sampler path, or None for the base model.

    Returns:
        "baseline" for a base model, else the checkpoint's last path segment
        ("tinker://…/sampler_weights/final" -> "final"), made safe for a file name.
    """
    if not checkpoint:
        return "baseline"
    last = [p for p in re.split(r"[/\\]+", str(checkpoint).split("://", 1)[-1]) if p]
    return results_stem(last[-1] if last else "checkpoint", "checkpoint")


def free_results_path(label: str, model: str | None, checkpoint: str | None, *, suffix: str = ".json",
                      folder: str | os.PathLike = RESULTS_DIR, run_of: Callable[[Path], Any] | None = None,
                      option: str = "out= or name=", warn: bool = True) -> Path:
    """`<folder>/<label><suffix>`, unless that file holds the results of another model or
    checkpoint (two runs' `…/sampler_weights/final` share a label) or is not a file of this
    toolkit's: then the first free `<label>-<n><suffix>`, said in a warning. A file of the same
    model and checkpoint is replaced.

    Args:
        label: the results' name.
        model: the base model sampled.
        checkpoint: the checkpoint sampled, or None for the base model.
        suffix: the file's suffix (default ".json"; EvalResult.write_inspect_log's is ".eval").
        folder: the folder (default RESULTS_DIR).
        run_of: what a file there holds: a dict with its "model" and "checkpoint", or anything
            else for a file this toolkit did not write (default None: the file read as a results JSON).
        option: the argument that chooses the path, named in the warning (default "out= or name=").
        warn: warn when the path is not `<label><suffix>` (default True).

    Returns:
        The path to write. Another evaluation may take it before it is written: choose it
        again, and write, in `results_folder_held`.
    """
    import warnings

    from ..core.jsonl import open_regular
    from ..errors import user_stacklevel

    def results_json(path: Path) -> Any:
        try:  # a folder, a FIFO or a device there is not a results file: refused without reading it
            with open_regular(path) as fh:
                return json.loads(fh.read().decode("utf-8"))
        except (OSError, ValueError):  # MachineFormatError and UnicodeDecodeError are ValueErrors
            return None

    first = path = Path(folder) / f"{label}{suffix}"
    n, whose = 1, None
    while path.exists():
        held = (run_of or results_json)(path)
        if isinstance(held, dict) and held.get("model") == model and held.get("checkpoint") == checkpoint:
            break
        if whose is None:  # what the first file holds, for the warning
            whose = (f"the results of {held.get('checkpoint') or held.get('model')}" if isinstance(held, dict)
                     else "a file that is not results of this model")
        n += 1
        path = first.with_name(f"{label}-{n}{suffix}")
    if n > 1 and warn:
        warnings.warn(f"{first} holds {whose}: these results of {checkpoint or model} are written to {path} "
                      f"instead (pass {option} to choose)", stacklevel=user_stacklevel())
    return path


@contextlib.contextmanager
def results_folder_held(folder: str | os.PathLike) -> Iterator[None]:
    """Hold a results folder (an flock of the folder itself: it gains no lock file; created if
    missing) while a free name is chosen in it and written, so that two evaluations under one name
    at once, in threads or processes, never write the same file. Where the folder cannot be made or
    held, the block runs unheld (the write then says what is wrong).

    Args:
        folder: the results folder.

    Returns:
        A context manager.
    """
    from ..core.jsonl import held_folder

    with contextlib.ExitStack() as hold:
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            hold.enter_context(held_folder(folder))
        except OSError:
            pass
        yield


def write_free_results(chosen: Path, label: str, summary: dict, rows: list[dict]) -> str | None:
    """write_results at the results path `chosen` at an evaluation's start (free_results_path), or,
    where another evaluation under the same name wrote it meanwhile, at the next free
    `<label>-<n>.json`, said in a warning; chosen again and written while the folder is held.

    Args:
        chosen: the path free_results_path chose at the start.
        label: the name it was chosen for.
        summary: the run's summary (its "model" and "checkpoint" say whose results these are).
        rows: the per-row results.

    Returns:
        The path written, or None when it could not be written (warned).
    """
    import warnings

    from ..errors import user_stacklevel

    model, checkpoint = summary.get("model"), summary.get("checkpoint")
    with results_folder_held(chosen.parent):
        path = free_results_path(label, model, checkpoint, folder=chosen.parent, warn=False)
        if path.name != chosen.name:
            warnings.warn(f"{chosen} was written meanwhile by another evaluation named {label!r}: these results of "
                          f"{checkpoint or model} are written to {path} instead", stacklevel=user_stacklevel())
        return write_results(path, summary, rows)


def utc_now() -> str:
    """The time now in UTC, for results' started_at / finished_at.

    Returns:
        ISO 8601 to the second, e.g. "2025-01-31T12:00:00+00:00".
    """
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def file_sha256(path: str | os.PathLike | None) -> str | None:
    """The SHA-256 of a file's bytes, read in blocks (the eval data a result was measured on).

    Args:
        path: the file, or None for in-memory rows.

    Returns:
        The hex digest, or None for no path or a file that is not there.
    """
    if path is None or not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_results(path: str | os.PathLike) -> EvalResult:
    """Read a results JSON written by evaluate() (or evaluate_cases), or any Inspect AI log, back
    as an EvalResult.

    An Inspect log (`.eval`, or a `.json` log Inspect wrote; needs `pip install
    "machine_nb[inspect]"`) gives one row per sample and epoch, in dataset order: evaluate()'s
    columns (correct: the first scorer gave full marks) plus sample_id, epoch, score, scorer and
    messages (inspect_logs.read_log), so compare() pairs two logs by sample id.

    Args:
        path: the results file or Inspect log.

    Returns:
        An EvalResult: `rows` with RESULT_COLUMNS first, then every other column the file's rows
        carry, in the order they first appear (evaluate() writes "line", "messages" (the exact
        prompt) and "format"; evaluate_cases "case", "trial", "input" and "messages"; a column
        some rows lack is empty on those), `summary` the file without its rows, `path` the file.

    Raises:
        MachineFormatError: the file is missing, unreadable or not a regular file (a folder, a
            FIFO), is not JSON (naming the line and field where the parser stopped) or is not
            such a result (naming the field).
        ImportError: an Inspect log without inspect_ai installed (saying how to install it).
    """
    import pandas as pd

    from .inspect_logs import is_inspect_log
    from ..core.jsonl import open_regular, parse_json

    if is_inspect_log(path):
        return from_inspect_log(path)
    with open_regular(path) as fh:  # a folder, a FIFO or an unreadable file: an error naming it
        raw = fh.read()
    try:
        data = parse_json(raw, path)
    except MachineFormatError as exc:
        raise MachineFormatError(path, f"not a results JSON: {exc.reason}", line=exc.line, field=exc.field) from None
    if isinstance(data, dict) and "rows" not in data and isinstance(data.get("eval"), dict) and "task" in data["eval"]:
        return from_inspect_log(path)  # an Inspect log in its JSON format
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise MachineFormatError(path, "not an eval results file: no list of per-row results", field="rows")
    for i, row in enumerate(data["rows"]):
        for key in ("prompt", "expected", "output", "correct"):
            if not isinstance(row, dict) or key not in row:
                raise MachineFormatError(path, "missing in a per-row result", field=f"rows.{i}.{key}")
        if not isinstance(row["correct"], bool):  # "false" or null would be counted as right, or fail later
            raise MachineFormatError(path, f"a per-row result's correct must be true or false, got "
                                           f"{json.dumps(row['correct'])[:40]}", field=f"rows.{i}.correct")
    df = pd.DataFrame.from_records(data["rows"])
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = range(len(df)) if col == "row" else None
    df = df[RESULT_COLUMNS + [c for c in df.columns if c not in RESULT_COLUMNS]]
    return EvalResult(df, {k: v for k, v in data.items() if k != "rows"}, os.fspath(path))


def from_inspect_log(source: Any) -> EvalResult:
    """An Inspect log (any, not only ours) as an EvalResult (inspect_logs.read_log).

    Args:
        source: the log file, or an inspect_ai EvalLog in memory.

    Returns:
        The EvalResult: rows with RESULT_COLUMNS (a probe's log: PROBE_COLUMNS), then
        inspect_logs.SAMPLE_COLUMNS, then the rest; path the log's file (None for a log never
        written).
    """
    import pandas as pd

    from .inspect_logs import SAMPLE_COLUMNS, read_log

    records, summary = read_log(source)
    first = (PROBE_COLUMNS if records and "baseline_output" in records[0] else RESULT_COLUMNS) + SAMPLE_COLUMNS
    extra = [c for c in dict.fromkeys(k for r in records for k in r) if c not in first]
    path = source if isinstance(source, (str, os.PathLike)) else source.location
    return EvalResult(pd.DataFrame.from_records(records, columns=first + extra), summary,
                      os.fspath(path) if path else None)


def as_eval_result(value: Any, what: str = "results") -> EvalResult:
    """An EvalResult from any form a result travels in.

    Args:
        value: an EvalResult (returned as is); a results JSON path (read with load_results); a
            DataFrame of per-row results (no summary, no path); or a loaded results dict
            (`{..., "rows": [...]}`, the shape of the results JSON and of `EvalResult.to_dict()`).
        what: the value's role, named in errors (default "results").

    Returns:
        The EvalResult.

    Raises:
        TypeError: any other value. MachineFormatError: a path that is not a results JSON.
    """
    import pandas as pd

    if isinstance(value, EvalResult):
        return value
    if isinstance(getattr(type(value), "eval_result", None), property):  # an InspectRun of one task
        return value.eval_result
    if isinstance(value, (str, os.PathLike)):
        return load_results(value)
    if isinstance(value, pd.DataFrame):
        return EvalResult(value)
    if isinstance(value, dict) and isinstance(value.get("rows"), list):
        summary = {k: v for k, v in value.items() if k not in ("rows", "path")}
        path = value.get("path")
        return EvalResult(pd.DataFrame.from_records(value["rows"]), summary, None if path is None else str(path))
    raise TypeError(f"{what}: expected an EvalResult, a results JSON path, a DataFrame of results or a results "
                    f"dict, got {type(value).__name__}")


# --------------------------------------------------------------------------- the result object

HTML_ROWS = 10  # rows of the table the notebook view shows (the whole frame is `.rows`)


def correct_values(rows: "pd.DataFrame", label: str = "results") -> list[bool]:
    """The rows' `correct` scores as bools, refusing a row whose score is not True or False.

    A frame built by hand can hold None or NaN there (a merge that missed a row), text ("False",
    from a CSV read as strings) or a partial score (0.5); `bool()` of each of those but None is
    True, so such a row is an error naming it, never counted as correct. Bools (numpy's too) and
    the numbers 0 and 1 are accepted.

    Args:
        rows: per-row results with a `correct` column.
        label: what the results are, for the message (default "results").

    Returns:
        One bool per row, in order.

    Raises:
        ValueError: naming the row (its `row` number where the frame has one) and its value.
    """
    import numbers

    import numpy as np
    import pandas as pd

    row_numbers = list(rows["row"]) if "row" in rows.columns else range(len(rows))
    out = []
    for number, value in zip(row_numbers, rows["correct"]):
        if value is None or (not isinstance(value, (list, tuple, dict)) and pd.isna(value)):
            raise ValueError(f"{label}: row {number} has no 'correct' value (None or NaN); every scored row "
                             "needs True or False")
        if isinstance(value, (numbers.Number, np.bool_)) and value in (0, 1):  # bools, 0/1 as int or float
            out.append(bool(value))
            continue
        hint = (" (a partial score: decide what counts as correct, e.g. rows['correct'] = rows['score'] >= 1)"
                if isinstance(value, numbers.Number) else
                " (text: convert the column, e.g. rows['correct'] = rows['correct'].map({'True': True, "
                "'False': False}))" if isinstance(value, str) else "")
        raise ValueError(f"{label}: row {number} has 'correct' {value!r} ({type(value).__name__}); every scored "
                         f"row needs True or False{hint}")
    return out


def write_results(path: str | os.PathLike, summary: dict, rows: list[dict]) -> str | None:
    """Write a results JSON (the summary and its per-row results) atomically, after the rows were
    sampled and paid for: a write that fails (a full disk, a folder made read-only meanwhile) warns
    and leaves the results to the caller, rather than losing them with the error.

    Args:
        path: the results file.
        summary: the run's summary.
        rows: the per-row results.

    Returns:
        The path written, or None when it could not be written (warned).
    """
    import warnings

    from ..core.jsonl import atomic_write_text
    from ..errors import user_stacklevel

    try:
        atomic_write_text(path, json.dumps({**summary, "rows": rows}, ensure_ascii=False, indent=1) + "\n")
    except OSError as exc:
        warnings.warn(f"{path}: the results could not be written ({exc.strerror or exc}); they are returned "
                      "unsaved: write them with json.dump(result.to_dict(), open(PATH, 'w'))",
                      stacklevel=user_stacklevel())
        return None
    return str(path)


def format_rate(rows: "pd.DataFrame", label: str = "results") -> float | None:
    """The share of rows whose `format_ok` is true, over the rows that have a format.

    None, NaN and pandas' NA mean the row has no format; bools (numpy's too) and the numbers 0
    and 1 count; anything else (text such as "False", from a CSV read as strings) is an error
    naming the row, never counted as true.

    Args:
        rows: per-row results.
        label: what the results are, for the message (default "results").

    Returns:
        The share, or None when there is no `format_ok` column or no row has a format.

    Raises:
        ValueError: naming the row (its `row` number where the frame has one) and its value.
    """
    import numbers

    import numpy as np
    import pandas as pd

    if "format_ok" not in rows.columns:
        return None
    row_numbers = list(rows["row"]) if "row" in rows.columns else range(len(rows))
    vals = []
    for number, value in zip(row_numbers, rows["format_ok"].tolist()):
        if not isinstance(value, (list, tuple, dict)) and pd.isna(value):
            continue
        if not (isinstance(value, (numbers.Number, np.bool_)) and value in (0, 1)):
            raise ValueError(f"{label}: row {number} has 'format_ok' {value!r} ({type(value).__name__}); it needs "
                             "True, False or None (no format)")
        vals.append(bool(value))
    return sum(vals) / len(vals) if vals else None


def _share(value: Any) -> float | None:
    """A summary's share (accuracy, format_rate) as a float in [0, 1]; None for anything else (a
    file from another version or a damaged one), so it is never shown as a share."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        return None
    return float(value)


@dataclass(repr=False, eq=False)
class EvalResult:
    """One eval's results: a row per sampled reply, the run's summary, and the file written.

    The rows are a DataFrame of their own (`res.rows["correct"]`, `len(res.rows)`); the run's
    numbers are `res.summary`, the file `res.path`.

    Args:
        rows: one row per reply. evaluate() and load_results(): RESULT_COLUMNS (plus "case" when
            rows share a case); evaluate_cases(): cases.CASE_RESULT_COLUMNS; probe():
            PROBE_COLUMNS.
        summary: the run as plain data: what the results JSON holds besides its rows (name,
            model, checkpoint, engine, renderer, parameters, data, n, correct, accuracy,
            format_rate, errors, tokens, cost, times; probe: model, checkpoint, engine, format, n,
            bled). Default {}.
        path: the results JSON written or read, or None when nothing was written (default).
    """

    rows: pd.DataFrame
    summary: dict = field(default_factory=dict)
    path: str | None = None

    # ------------------------------------------------------------------ the numbers

    @property
    def name(self) -> str | None:
        """The results' name (summary["name"]: "baseline", a checkpoint's last segment, ...), or None."""
        return self.summary.get("name")

    @property
    def accuracy(self) -> float | None:
        """The share of rows scored correct, counted from `rows` (so it always agrees with the rows
        shown, also for rows taken from a larger result); the summary's accuracy when there are no
        per-row scores and it is a number from 0 to 1; None for a probe, which scores no answers,
        and for a summary accuracy that is not such a number."""
        if "correct" in self.rows.columns and len(self.rows):
            scores = correct_values(self.rows, str(self.name or "results"))
            return sum(scores) / len(scores)
        return _share(self.summary.get("accuracy"))

    def accuracy_interval(self, level: float = 0.95) -> tuple[float, float] | None:
        """The Wilson score interval of the accuracy (stats.proportion_interval).

        Args:
            level: the confidence level (default 0.95).

        Returns:
            (low, high), or None when there is no accuracy (a probe, no rows), or no rows and a
            summary "n" that is not a positive whole number.

        Raises:
            ValueError: level is outside (0, 1).
        """
        import numbers

        from .stats import check_level, proportion_interval

        check_level(level)
        acc = self.accuracy
        if acc is None:
            return None
        n = len(self.rows) or self.summary.get("n")
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0:
            return None
        return proportion_interval(acc * int(n), int(n), level=level)

    def to_dict(self) -> dict:
        """The result as plain data, in the results JSON's shape (e.g. for a report's JSON).

        Returns:
            `{**summary, "path": path, "rows": [one dict per row]}`; compare() and
            as_eval_result() read it back.
        """
        return {**self.summary, "path": self.path, "rows": self.rows.to_dict("records")}

    def _headline(self) -> str:
        """One line: name, correct of n, accuracy with its Wilson interval and the format rate (both
        counted from the rows), or the probe's bled count."""
        n = len(self.rows)
        parts = [str(self.name) if self.name else "results"]
        acc = self.accuracy
        if acc is not None and n:
            low, high = self.accuracy_interval()
            correct = round(acc * n)  # the accuracy is counted from the rows: this is that count
            parts.append(f"{correct}/{n} correct, {acc:.1%} (95% CI {low:.1%} to {high:.1%}, Wilson)")
            rate = (format_rate(self.rows, str(self.name or "results")) if "format_ok" in self.rows.columns
                    else _share(self.summary.get("format_rate")))  # counted from the rows shown, as acc is
            if rate is not None:
                parts.append(f"format {rate:.1%}")
        elif "bled" in self.summary:
            parts.append(f"{self.summary['bled']} of {n} replies bled the format")
        else:
            parts.append(f"{n} rows")
        if self.summary.get("errors"):
            parts.append(f"{self.summary['errors']} failed request(s)")
        return parts[0] + ": " + "; ".join(parts[1:])

    def __repr__(self) -> str:
        acc = self.accuracy
        fields = [f"name={self.name!r}", f"n={len(self.rows)}"]
        if acc is not None:
            fields.append(f"accuracy={acc:.3f}")
        if "bled" in self.summary:
            fields.append(f"bled={self.summary['bled']}")
        fields.append(f"path={self.path!r}")
        return f"EvalResult({', '.join(fields)})"

    def _repr_html_(self) -> str:
        import pandas as pd

        from ..core.theme import FG, FG_MUTED, escape, no_math

        where = f" <span style='color:{FG_MUTED}'>· {escape(self.path)}</span>" if self.path else ""
        more = len(self.rows) - HTML_ROWS
        tail = (f"<p style='margin:2px 0;color:{FG_MUTED}'>… {more} more row(s) in <code>.rows</code></p>"
                if more > 0 else "")
        with pd.option_context("display.max_colwidth", 80):  # a long reply is cut in the view, not in .rows
            table = self.rows.head(HTML_ROWS).to_html(escape=True, border=0)
        return no_math(f"<div class='machine-nb-eval' style='color:{FG}'><p style='margin:2px 0'>"
                       f"{escape(self._headline())}{where}</p>{table.replace('$', '&#36;')}{tail}</div>")

    # ------------------------------------------------------------------ Inspect AI

    def write_inspect_log(self, path: str | os.PathLike | None = None) -> str:
        """Write these results as an Inspect AI eval log, for `inspect view` and Inspect's tools.

        One sample per row: its input (the row's messages, or its prompt), target (expected),
        the model's output, the score (C / I, named "match", its match mode and format check in
        the score's metadata; a probe's is "bled", 1 or 0, with the base model's reply in the
        sample's metadata), the token usage, and the row's other fields as sample metadata;
        evaluate_cases' trials are epochs of one sample per case. The run (model, checkpoint,
        engine, renderer, settings, data, times) is in the log's spec and, whole, in its
        metadata under "machine_nb". Written with inspect_ai's own log API
        (inspect_logs.build_log), atomically; load_results reads it back.

        Args:
            path: the log file, `.eval` (Inspect's format) or `.json`. Default None: beside the
                results JSON with the suffix `.eval` when there is one, else
                `eval_results/<name>.eval`; where that file holds another model's or
                checkpoint's log, or a file this toolkit did not write, the first free
                `<name>-<n>.eval`, said in a warning (free_results_path).

        Returns:
            The path written.

        Raises:
            ImportError: inspect_ai is not installed (`pip install "machine_nb[inspect]"`).
        """
        from .inspect_logs import build_log, log_run, require_inspect, write_log

        require_inspect("EvalResult.write_inspect_log")
        rows = self.rows
        if "correct" in rows.columns:  # text or a partial score is refused by its row, never written as C
            rows = rows.assign(correct=correct_values(rows, str(self.name or "results")))
        log = build_log(rows.to_dict("records"), self.summary)
        if path is not None:
            return write_log(log, path)
        if self.path and not self.path.endswith(".eval"):
            folder, label = Path(self.path).parent, Path(self.path).stem
        else:
            folder, label = Path(RESULTS_DIR), results_stem(str(self.name or "results"))
        with results_folder_held(folder):  # the name chosen and written with no other writer between
            path = free_results_path(label, self.summary.get("model"), self.summary.get("checkpoint"),
                                     suffix=".eval", folder=folder, run_of=log_run, option="path=")
            return write_log(log, path)


__all__ = ["RESULTS_DIR", "RESULT_COLUMNS", "PROBE_COLUMNS", "EvalResult", "correct_values", "format_rate", "write_results",
           "as_eval_result", "results_name", "results_stem", "free_results_path", "results_folder_held",
           "write_free_results", "utc_now", "file_sha256", "load_results", "from_inspect_log"]
