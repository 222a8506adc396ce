"""Eval results on disk: the results JSON evaluate() writes, read back as the same DataFrame.

A results file is the run's summary (name, model, checkpoint, engine, parameters, data path and
sha256, accuracy, cost, times) plus one record per row. evaluate.py writes it, compare.py,
pairs.py and the CompareView read it; pandas loads only when a file is read.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
from typing import Any

from .errors import MachineFormatError

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
    return re.sub(r"[^A-Za-z0-9._-]+", "_", last[-1] if last else "checkpoint") or "checkpoint"


def utc_now() -> str:
    """The time now in UTC, ISO 8601 to the second (results' started_at / finished_at)."""
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


def load_results(path: str | os.PathLike) -> Any:
    """Read a results JSON written by evaluate() back as the same DataFrame.

    Args:
        path: the results file.

    Returns:
        A DataFrame with RESULT_COLUMNS (and "case" where the rows have one); `attrs["summary"]`
        holds the file without its rows and `attrs["path"]` the path.

    Raises:
        MachineFormatError: the file is missing or is not such a result, naming the file and field.
    """
    import pandas as pd

    from .jsonl import parse_json

    try:
        with open(path, "rb") as fh:
            data = parse_json(fh.read(), path)
    except FileNotFoundError:
        raise MachineFormatError(path, "file not found") from None
    except MachineFormatError as exc:
        raise MachineFormatError(path, f"not a results JSON: {exc.reason}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise MachineFormatError(path, "not an eval results file: no list of per-row results", field="rows")
    for i, row in enumerate(data["rows"]):
        for key in ("prompt", "expected", "output", "correct"):
            if not isinstance(row, dict) or key not in row:
                raise MachineFormatError(path, "missing in a per-row result", field=f"rows.{i}.{key}")
    df = pd.DataFrame.from_records(data["rows"])
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = range(len(df)) if col == "row" else None
    df = df[RESULT_COLUMNS + (["case"] if "case" in df.columns else [])]
    df.attrs["summary"] = {k: v for k, v in data.items() if k != "rows"}
    df.attrs["path"] = os.fspath(path)
    return df


__all__ = ["RESULTS_DIR", "RESULT_COLUMNS", "results_name", "utc_now", "file_sha256", "load_results"]
