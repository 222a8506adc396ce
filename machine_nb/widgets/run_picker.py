"""RunPicker: filter, sort and select runs from a `load_runs` DataFrame; `.selected` hands them back.

All filtering, sorting and selection logic runs on the Python side (pure functions below, over
arrays computed once per frame by `FilterIndex`: a filter change is array work, and the text
search scans each distinct text once through pyarrow, not a Python loop); the browser view
(`table.js`, an anywidget) receives one formatted page at a time and sends clicks back, so a
million runs stay responsive. Tagging the chosen runs is `tagger.py`'s job.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anywidget
import ipywidgets as w
import numpy as np
import pandas as pd
import traitlets

from ._base import NoMathHTML, close_widgets, style_sheet, StaticFallback, escape

# Columns shown by default, in this order, when the frame has them (`run`, `instructions` and
# `final` are left out: nested or long, and `output` already carries the answer). The texts come
# right after the run's name, so they are on screen beside an open file browser at 1400 px; every
# column can be chosen in the view.
DEFAULT_COLUMNS = ("id", "machine", "input", "output", "score", "tags", "model", "harness", "case", "started_at",
                   "duration_s", "n_messages", "n_tool_calls", "cost_usd")
# Columns never offered in the column chooser (nested records).
HIDDEN_COLUMNS = ("run",)
# Columns offered as multi-select filters when present.
CHOICE_COLUMNS = ("machine", "model", "harness")
# A multi-select is offered for 2 to MAX_CHOICES distinct values (beyond that free text serves better).
MAX_CHOICES = 500
# Cell text longer than this is cut with "…" (the page stays small; the full value is in `.selected`).
MAX_CELL_CHARS = 120
# The full text a cell shows on hover (its `title`) is cut at this length.
MAX_TITLE_CHARS = 2000
# A cell's text is redacted this far (past the title's cut, so a secret across it is found whole).
_REDACTED_CHARS = MAX_TITLE_CHARS + 4096
ANY_TAG, UNTAGGED = "(any)", "(untagged)"
# The search box filters once typing pauses this long (seconds).
SEARCH_DEBOUNCE_S = 0.25



# ---------------------------------------------------------------- pure helpers over plain data

def row_keys(frame: pd.DataFrame) -> list[str]:
    """Selection keys, one per row.

    Args:
        frame: a runs DataFrame with an `id` column.

    Returns:
        `id` as text; `machine/id` when ids repeat across machines.

    Raises:
        ValueError: the frame has no `id` column, or the keys are still not unique (selection
            by key would otherwise be ambiguous).
    """
    if "id" not in frame.columns:
        raise ValueError(f"RunPicker needs an 'id' column; the frame has {list(frame.columns)}")
    keys = frame["id"].astype(str)
    if keys.duplicated().any() and "machine" in frame.columns:
        keys = frame["machine"].astype(str) + "/" + keys
    dup = keys[keys.duplicated()]
    if len(dup):
        raise ValueError(f"RunPicker needs unique run ids; repeated: {sorted(set(dup))[:5]}")
    return keys.tolist()


def text_columns_of(frame: pd.DataFrame) -> list[str]:
    """The columns the picker's search box scans: every column of text (`tags` has its own filter,
    which follows the tag store; the nested run records and file paths are left out).

    Args:
        frame: a runs DataFrame.

    Returns:
        Column names in the frame's order.
    """
    out = []
    for c in frame.columns:
        if c in HIDDEN_COLUMNS or c in ("path",):
            continue
        col = frame[c]
        if pd.api.types.is_string_dtype(col.dtype) and not col.dtype == object:
            out.append(c)
            continue
        if col.dtype == object:
            sample = col.dropna().head(50).tolist()
            if sample and all(isinstance(v, str) for v in sample):
                out.append(c)
    return out


def _as_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value if isinstance(value, str) else str(value)


def text_haystack(frame: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """The text a search scans, computed once so a search is one vectorised scan.

    Args:
        frame: a runs DataFrame.
        columns: the text columns to join (those the frame lacks are skipped).

    Returns:
        One lower-cased string per row (the columns joined by newlines), indexed 0..n-1.
    """
    present = [c for c in columns if c in frame.columns]
    if not present:
        return pd.Series([""] * len(frame), dtype="str")
    parts = [frame[c].map(_as_text).astype("str") for c in present]
    joined = parts[0]
    for p in parts[1:]:
        joined = joined + "\n" + p
    return joined.str.lower().reset_index(drop=True)


def tag_masks(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Which rows carry each tag.

    Args:
        frame: a runs DataFrame; its `tags` column holds lists of strings (arrays too, as parquet
            reads them back; a string is one tag).

    Returns:
        tag -> boolean array over the rows, tags sorted, plus UNTAGGED; {} without a `tags` column.
    """
    if "tags" not in frame.columns:
        return {}
    rows: dict[str, list[int]] = {}
    untagged = np.ones(len(frame), dtype=bool)
    for i, tags in enumerate(frame["tags"].tolist()):
        if isinstance(tags, np.ndarray):
            tags = tags.tolist()
        if tags is None or isinstance(tags, float) or not len(tags):  # empty, None, NaN
            continue
        if isinstance(tags, str):
            tags = [tags]
        untagged[i] = False
        for t in tags:
            rows.setdefault(str(t), []).append(i)
    masks: dict[str, np.ndarray] = {}
    for t in sorted(rows):
        masks[t] = np.zeros(len(frame), dtype=bool)
        masks[t][rows[t]] = True
    masks[UNTAGGED] = untagged
    return masks


def _utc(ts: pd.Series) -> pd.Series:
    ts = pd.to_datetime(ts, errors="coerce", utc=True)
    return ts


class FilterIndex:
    """The arrays `filter_mask` works on, computed once per frame, so a filter change is array
    work on a million rows: choice columns as integer codes, scores as floats, start times as
    datetime64, one boolean array per tag, and each text column as codes into its distinct
    lower-cased texts (a search scans each distinct text once, in pyarrow, and maps the hits
    back through the codes; the last TERMS_KEPT terms' results are kept).

    Args:
        frame: the runs DataFrame.
        text_columns: the columns the `text` filter searches (default ("input", "output")).
    """

    TERMS_KEPT = 16

    def __init__(self, frame: pd.DataFrame, text_columns: Sequence[str] = ("input", "output")) -> None:
        self.n = len(frame)
        self.choices: dict[str, tuple[np.ndarray, pd.Index]] = {}
        for col in CHOICE_COLUMNS:
            if col in frame.columns:
                codes, uniques = _factorize(frame[col])
                self.choices[col] = (codes, pd.Index(uniques, dtype=object))
        self.score = (pd.to_numeric(frame["score"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
                      if "score" in frame.columns else None)
        self.started = (_utc(frame["started_at"]).dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
                        if "started_at" in frame.columns else None)
        self.tags = tag_masks(frame)
        self.texts = [_lowered(frame[col]) for col in text_columns if col in frame.columns]
        self._terms: dict[str, np.ndarray] = {}

    def term_mask(self, term: str) -> np.ndarray:
        """Rows where a term appears in any text column.

        Args:
            term: the term, already lower-cased.

        Returns:
            A boolean array over the rows (kept for the next search of the same term).
        """
        hit = self._terms.get(term)
        if hit is not None:
            return hit
        hit = np.zeros(self.n, dtype=bool)
        for codes, lowered in self.texts:
            found = _match(lowered, term)
            hit |= found if codes is None else np.append(found, False)[codes]  # code -1 (missing): False
        if len(self._terms) >= self.TERMS_KEPT:
            self._terms.pop(next(iter(self._terms)))
        self._terms[term] = hit
        return hit

    def text_mask(self, text: str) -> np.ndarray:
        """Rows whose text columns contain every term of a text, in any case.

        Args:
            text: whitespace-separated terms.

        Returns:
            A boolean array over the rows.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        mask = np.ones(self.n, dtype=bool)
        for term in text.split():
            mask &= self.term_mask(pc.utf8_lower(pa.scalar(term, pa.large_string())).as_py())
        return mask

    def choice_mask(self, col: str, values: Sequence[Any]) -> np.ndarray:
        """Rows whose value in a choice column is one of some values.

        Args:
            col: a choice column (machine, model, harness) the frame has.
            values: the values to keep.

        Returns:
            A boolean array over the rows.
        """
        codes, uniques = self.choices[col]
        lut = np.zeros(len(uniques) + 1, dtype=bool)
        where = uniques.get_indexer(list(values))
        lut[where[where >= 0]] = True
        return lut[codes]

    def mask(self, filters: dict[str, Any]) -> np.ndarray:
        """The rows that pass some filters.

        Args:
            filters: as in filter_mask (an absent or empty filter keeps all).

        Returns:
            A boolean array over the frame's rows (positional).
        """
        mask = np.ones(self.n, dtype=bool)
        for col in CHOICE_COLUMNS:
            values = filters.get(col)
            if values and col in self.choices:
                mask &= self.choice_mask(col, values)
        score = filters.get("score")
        if score is not None and self.score is not None:
            with np.errstate(invalid="ignore"):
                mask &= (self.score >= score[0]) & (self.score <= score[1])
        date = filters.get("date")
        if date is not None and self.started is not None and any(d is not None for d in date):
            ts = self.started
            keep = ~np.isnat(ts)
            if date[0] is not None:
                keep &= ts >= np.datetime64(pd.Timestamp(date[0]).to_datetime64(), "ns")
            if date[1] is not None:
                keep &= ts < np.datetime64((pd.Timestamp(date[1]) + pd.Timedelta(days=1)).to_datetime64(), "ns")
            mask &= keep
        tag = filters.get("tag")
        if tag and tag != ANY_TAG:
            mask &= self.tags.get(tag, np.zeros(self.n, dtype=bool))
        if (filters.get("text") or "").strip():
            mask &= self.text_mask(filters["text"])
        return mask


# A text column whose sample is at least this distinct is searched row by row (encoding it would
# cost more than it saves); below it, through its distinct values.
DISTINCT_SEARCH_RATIO = 0.5
# Searches over more texts than this are split across threads (pyarrow releases the GIL).
PARALLEL_TEXTS = 200_000


def _lowered(col: pd.Series) -> tuple[np.ndarray | None, Any]:
    """(codes or None, lower-cased texts as a pyarrow array) for one text column: codes into its
    distinct texts when they repeat (then each distinct text is searched once), else every row's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col.dtype, pd.StringDtype) or str(col.dtype).endswith("[pyarrow]"):
        arr = pa.array(col.array)  # pandas' arrow strings, as they are
        arr = pc.fill_null((arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr).cast(pa.large_string()), "")
    else:
        arr = pa.array(col.map(_as_text).tolist(), pa.large_string())
    n = len(arr)
    sample = arr if n <= 20_000 else arr.take(pa.array(np.random.default_rng(0).choice(n, 20_000, replace=False)))
    if n and pc.count_distinct(sample).as_py() / len(sample) < DISTINCT_SEARCH_RATIO:
        enc = pc.dictionary_encode(arr)
        return enc.indices.to_numpy(zero_copy_only=False).astype(np.intp), pc.utf8_lower(enc.dictionary)
    return None, pc.utf8_lower(arr)


def _match(texts: Any, term: str) -> np.ndarray:
    """Which of these pyarrow texts contain `term`, as a numpy bool array (in threads when many)."""
    import pyarrow.compute as pc

    n = len(texts)
    if n <= PARALLEL_TEXTS:
        return pc.match_substring(texts, term).to_numpy(zero_copy_only=False)
    import os
    from concurrent.futures import ThreadPoolExecutor

    parts = max(2, min(8, os.cpu_count() or 2))
    step = -(-n // parts)
    with ThreadPoolExecutor(parts) as pool:
        found = pool.map(lambda i: pc.match_substring(texts.slice(i, step), term).to_numpy(zero_copy_only=False),
                         range(0, n, step))
        return np.concatenate(list(found))


def _factorize(col: pd.Series) -> tuple[np.ndarray, Any]:
    """Integer codes (-1 for missing) and the distinct values, in order of appearance."""
    try:
        return pd.factorize(col, use_na_sentinel=True)
    except TypeError:  # unhashable values (lists): by their text
        return pd.factorize(col.map(_as_text), use_na_sentinel=True)


def filter_mask(frame: pd.DataFrame, filters: dict[str, Any], *, haystack: pd.Series | None = None,
                tags: dict[str, np.ndarray] | None = None, started: pd.Series | None = None,
                index: FilterIndex | None = None) -> np.ndarray:
    """The rows of a runs frame that pass some filters; an absent or empty filter keeps all.

    Args:
        frame: the runs DataFrame.
        filters: `machine`/`model`/`harness` (a list of values: keep rows with any of them),
            `score` ((lo, hi) inclusive; rows without a score are dropped once a range is set),
            `date` ((start, end) `datetime.date`s or None, on `started_at` in UTC, both days
            inclusive), `tag` (a tag name, or UNTAGGED), `text` (whitespace-separated terms,
            each must appear, case-insensitive, in the input or output).
        haystack: a precomputed `text_haystack` to search instead (default None).
        tags: precomputed `tag_masks` (default None).
        started: `started_at` in UTC, precomputed (default None).
        index: a FilterIndex of this frame (default None: built here; the picker keeps one).

    Returns:
        A boolean array over the frame's rows (positional).
    """
    if index is None:
        index = FilterIndex(frame, () if haystack is not None else ("input", "output"))
        if tags is not None:
            index.tags = tags
        if started is not None:
            index.started = pd.to_datetime(started, utc=True).dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    text = (filters.get("text") or "").strip()
    mask = index.mask({k: v for k, v in filters.items() if k != "text"} if haystack is not None else filters)
    if haystack is not None and text:
        mask &= text_mask(haystack, text)
    return mask


def text_mask(haystack: pd.Series, text: str) -> np.ndarray:
    """Rows whose haystack contains every term of a text.

    Args:
        haystack: a `text_haystack` (lower-cased).
        text: whitespace-separated terms (lower-cased here).

    Returns:
        A boolean array over the rows.
    """
    mask = np.ones(len(haystack), dtype=bool)
    for term in text.lower().split():
        mask &= haystack.str.contains(term, regex=False).to_numpy(dtype=bool, na_value=False)
    return mask


# What a cell holding several values is: a list, or the array parquet reads a list column back as.
_LISTS = (list, tuple, np.ndarray)


def _sort_key(col: pd.Series) -> pd.Series:
    if col.dtype == object:
        if col.map(lambda v: isinstance(v, (list, dict, tuple, np.ndarray))).any():  # tags: sort as shown
            return col.map(lambda v: ", ".join(map(_as_text, v)) if isinstance(v, _LISTS) else _as_text(v))
        kinds = {type(v) for v in col.dropna()}
        if len(kinds) > 1:
            return col.map(_as_text)
    return col


def sort_order(frame: pd.DataFrame, column: str | None, ascending: bool = True) -> np.ndarray:
    """The frame's row positions in a sort order.

    Args:
        frame: the runs DataFrame.
        column: the column to sort by (None: the frame's order).
        ascending: the direction (default True).

    Returns:
        Row positions, sorted stably with missing values last (lists and mixed types by their
        text).

    Raises:
        ValueError: no such column.
    """
    if column is None:
        return np.arange(len(frame))
    if column not in frame.columns:
        raise ValueError(f"cannot sort by {column!r}: no such column (have {list(frame.columns)})")
    key = _sort_key(frame[column]).reset_index(drop=True)
    try:
        order = key.sort_values(ascending=ascending, kind="stable", na_position="last").index
    except TypeError:  # mixed types that do not compare: sort by their text
        order = key.map(_as_text).sort_values(ascending=ascending, kind="stable").index
    return order.to_numpy()


def format_cell(value: Any) -> str:
    """A value as a table cell shows it.

    Args:
        value: a cell's value.

    Returns:
        Short text: times to the minute (UTC), floats to 3 significant digits, lists joined by
        ", ", missing values as "", long text on one line and cut to MAX_CELL_CHARS.
    """
    if value is None:
        return ""
    if isinstance(value, _LISTS):
        text = ", ".join(_as_text(v) for v in value)
    elif isinstance(value, (pd.Timestamp, _dt.datetime)):
        text = "" if pd.isna(value) else pd.Timestamp(value).strftime("%Y-%m-%d %H:%M")
    elif isinstance(value, (float, np.floating)):
        text = "" if math.isnan(value) else f"{value:.3g}"
    elif isinstance(value, (bool, np.bool_)):
        text = str(bool(value))
    else:
        try:
            if pd.isna(value):
                return ""
        except (TypeError, ValueError):
            pass
        text = _as_text(value)
    text = " ".join(text.split()) if len(text) > 40 else text  # long text: one line
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


def full_text(value: Any) -> str:
    """The whole text of a cell, for its hover title.

    Args:
        value: a cell's value.

    Returns:
        The text (lists joined, other values as format_cell shows them), cut at MAX_TITLE_CHARS.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, _LISTS):
        text = ", ".join(_as_text(v) for v in value)
    else:
        return format_cell(value)
    return text if len(text) <= MAX_TITLE_CHARS else text[: MAX_TITLE_CHARS - 1] + "…"


def page_rows(frame: pd.DataFrame, positions: np.ndarray, keys: Sequence[str],
              columns: Sequence[str]) -> list[dict[str, Any]]:
    """The view model of one page.

    Args:
        frame: the runs DataFrame.
        positions: the page's row positions, in view order.
        keys: every row's selection key (row_keys).
        columns: the columns shown.

    Returns:
        A dict per row: the formatted cells, its key under `__key__` and, under `__full__`, the
        whole text of the cells whose shown text is cut or reflowed; text redacted
        (core/redact.py: a run's output may quote a key, and the page reaches the saved notebook).
    """
    from ..core.redact import scrub, secret_values

    secrets = secret_values()
    part = frame.iloc[positions, [frame.columns.get_loc(c) for c in columns]]
    rows = []
    cols = {c: part[c].tolist() for c in columns}
    for i, pos in enumerate(positions.tolist()):
        row: dict[str, Any] = {}
        full: dict[str, str] = {}
        for c in columns:
            value = cols[c][i]
            if isinstance(value, str) and value:
                # only what a cell or its title can show is read (a secret across the cut is read whole)
                value = scrub(value[:_REDACTED_CHARS], secrets)[0] + ("…" if len(value) > _REDACTED_CHARS else "")
            shown = format_cell(value)
            row[c] = shown
            if isinstance(value, (str, *_LISTS)):
                whole = full_text(value)
                if whole != shown:
                    full[c] = whole
        row["__key__"] = keys[pos]
        if full:
            row["__full__"] = full
        rows.append(row)
    return rows


def click_selection(selected: Sequence[str], view_keys: Sequence[str], key: str, anchor: str | None,
                    *, shift: bool = False, toggle: bool = False) -> tuple[list[str], str | None]:
    """The selection after clicking a row, as a file browser does.

    Args:
        selected: the selected keys now.
        view_keys: the keys in the current view order (for a shift-range).
        key: the clicked row's key.
        anchor: the row a shift-range starts from (the last plain or toggle click), or None.
        shift: the range from the anchor to this row replaces the selection (added to it with
            toggle too); the anchor stays. Without an anchor in the view, a plain click.
            Default False.
        toggle: ctrl/cmd-click or the row's checkbox: add or remove this row (default False).
            Neither: only this row.

    Returns:
        (the new selection, the new anchor).
    """
    if shift and anchor is not None and anchor in view_keys and key in view_keys:
        view = list(view_keys)
        a, b = sorted((view.index(anchor), view.index(key)))
        span = view[a:b + 1]
        if toggle:
            have = set(selected)
            return list(selected) + [k for k in span if k not in have], anchor
        return span, anchor
    if toggle:
        if key in selected:
            return [k for k in selected if k != key], key
        return list(selected) + [key], key
    return [key], key


# ---------------------------------------------------------------- the browser table (anywidget)

class RunTable(anywidget.AnyWidget):
    """The table view: one page of pre-formatted rows; clicks, sort and paging come back as messages.

    Messages from the view: {"event": "click", "key", "shift", "toggle"}, {"event": "sort",
    "column"}, {"event": "page", "page"}. The owning RunPicker handles them.

    Args:
        columns, rows, page_selected, sort, page, n_pages, scroll: the synced traits (the
            RunPicker sets them; see each trait).
    """

    _esm = pathlib.Path(__file__).with_name("table.js")
    _css = pathlib.Path(__file__).with_name("table.css")
    columns = traitlets.List(traitlets.Unicode()).tag(sync=True)
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    page_selected = traitlets.List(traitlets.Unicode()).tag(sync=True)  # keys on this page only
    sort = traitlets.Dict({"column": None, "ascending": True}).tag(sync=True)
    page = traitlets.Int(0).tag(sync=True)
    n_pages = traitlets.Int(1).tag(sync=True)
    # where the view is scrolled ({"left", "top"} in px), set by the view, so a view re-created
    # for the same picker opens where the last one was
    scroll = traitlets.Dict({"left": 0, "top": 0}).tag(sync=True)


# ---------------------------------------------------------------- the widget

class RunPicker(StaticFallback, w.VBox):
    """Filter, sort and select runs; `.selected` is a DataFrame of the chosen runs.

    Args:
        runs: any DataFrame with an `id` column (`load_runs` output: machine, model, harness,
            score, started_at, tags, input and output feed the filters when present).
        columns: columns shown. Default None: DEFAULT_COLUMNS that the frame has (nested `run`
            left out). The view's "columns" chooser (or `show_columns`) changes them; the
            selection column and the first column stay pinned when the table scrolls sideways.
        sort_by: the initial sort column. Default None: the frame's order.
        ascending: the initial sort direction (default True).
        page_size: rows per page. Default 25: the view model carries one page only.
        text_columns: searched by the free-text box. Default None: every text column shown or
            offered (id, machine, input, output, model, harness, case, …), so an id such
            as "e6effc" or a machine name finds its runs. The box filters as you type (debounced).
        store: a tag store the `tags` column follows (default None: the frame's `tags` as they
            are). The column is read from the store, and every `tag()` / `untag()` in this
            process (a Tagger's buttons included) updates it and the tag filter at once; a Tagger
            linked to this picker lends it its store when none is given. `reload_tags()` reads
            the store again (rows written by another process).
        **kwargs: passed to ipywidgets.VBox.

    Raises:
        TypeError: `runs` is not a DataFrame. ValueError: no `id` column, repeated ids, unknown
            columns, or page_size below 1.

    Observe selection with `observe_selection(callback)` (called with the selected DataFrame) or
    `observe(handler, names="selected_ids")`.

    Shown as a cell's result (or with `display(picker)`), the output's static `text/html` is
    replaced with the current state (filters, sort, page, selection) after each change, so a saved
    notebook or its HTML export shows what the user last saw, not the first page. The table shows
    text redacted (see page_rows); `.selected` and `.filtered` hold the frame's own values.
    """

    # row keys (see row_keys), Python-side only; items checked in _check_selected (a per-item
    # trait would re-validate 100,000 keys on every change)
    selected_ids = traitlets.List()

    def __init__(self, runs: pd.DataFrame, *, columns: Sequence[str] | None = None,
                 sort_by: str | None = None, ascending: bool = True, page_size: int = 25,
                 text_columns: Sequence[str] | None = None, store: Any = None, **kwargs: Any) -> None:
        if not isinstance(runs, pd.DataFrame):
            raise TypeError(f"RunPicker needs a pandas DataFrame (load_runs output), got {type(runs).__name__}")
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        self._keys = row_keys(runs)
        self.store = None
        self._stop_following: Callable | None = None
        if store is not None:
            runs = runs.copy(deep=False)  # the caller's frame is left as it is
            runs["tags"] = self._read_tags(runs, store)
            self._follow(store)
        self.runs = runs
        self._given = runs if store is None else None
        if text_columns is None:
            text_columns = text_columns_of(runs)
        self._key_pos = {k: i for i, k in enumerate(self._keys)}
        self._columns = [c for c in (columns or DEFAULT_COLUMNS) if c in runs.columns]
        if columns is not None and len(self._columns) != len(columns):
            missing = [c for c in columns if c not in runs.columns]
            raise ValueError(f"RunPicker: no such columns {missing} (have {list(runs.columns)})")
        self.page_size = page_size
        self._index = FilterIndex(runs, text_columns)
        self._text_columns = tuple(text_columns)  # add_runs rebuilds the index with them
        self._anchor: str | None = None
        self._sort = (sort_by, ascending)
        self._order = sort_order(runs, sort_by, ascending)
        self._mask = np.ones(len(runs), dtype=bool)
        self._view = self._order
        self._table = RunTable(columns=self._columns)
        self._table.on_msg(self._on_table_msg)
        self.controls = self._make_controls()
        self._count = NoMathHTML()
        select_all = w.Button(description="Select all filtered", icon="check-square")
        clear = w.Button(description="Clear", icon="times")
        select_all.on_click(lambda _: self.select_all_filtered())
        clear.on_click(lambda _: self.clear_selection())
        self._buttons = (select_all, clear)
        shown = [c for c in runs.columns if c not in HIDDEN_COLUMNS]
        self._column_choice = w.SelectMultiple(
            options=shown, value=tuple(self._columns), rows=min(8, max(1, len(shown))),
            description="columns", layout=w.Layout(width="22em"))
        # a column ticked in the chooser joins at the end; the others keep their order
        self._column_choice.observe(lambda ch: self.show_columns(
            [c for c in self._columns if c in ch["new"]] + [c for c in shown if c in ch["new"] and c not in self._columns]),
            names="value")
        super().__init__(children=self._layout(), **kwargs)
        self.add_class("mnb-strong-titles")
        self._sel_mask = np.zeros(len(runs), dtype=bool)  # selected_ids as a mask over positions
        self._refresh(reset_page=True)
        self.observe(self._on_selection, names="selected_ids")

    # ------------------------------------------------------------ the tag store it follows

    @staticmethod
    def _read_tags(runs: pd.DataFrame, store: Any) -> list[list[str]]:
        """The `tags` column from a store (empty lists where the store does not exist yet)."""
        from ..data.frames import attach_tags
        from ..store.tags import resolve_store

        root = resolve_store(store)
        if not root.is_dir() or "machine" not in runs.columns:
            return [[] for _ in range(len(runs))]
        return attach_tags(runs, root)

    def _follow(self, store: Any) -> None:
        from ..store.tags import observe_store

        if self._stop_following is not None:
            self._stop_following()
        self.store = store
        self._stop_following = observe_store(self._on_store)

    def follow_store(self, store: Any) -> None:
        """Follow a tag store from now on: its tags fill the `tags` column, and every `tag()` /
        `untag()` in this process updates the column and the tag filter.

        Args:
            store: the store folder (None: `store_dir()`, the default `tag()` writes to).
        """
        from ..store.tags import resolve_store

        self._follow(resolve_store(store))
        self.reload_tags()

    def reload_tags(self) -> None:
        """Read the followed store again (rows another process wrote) and redraw.

        Raises:
            ValueError: the picker follows no store.
        """
        if self.store is None:
            raise ValueError("this RunPicker follows no tag store: pass store= or call follow_store()")
        added = "tags" not in self.runs.columns
        if added or self.runs is self._given:
            self.runs = self.runs.copy(deep=False)  # the caller's frame is left as it is
        self.runs["tags"] = self._read_tags(self.runs, self.store)
        if added:  # a new column: offered, shown, and filtered on
            self._column_choice.options = [*self._column_choice.options, "tags"]
            self._index.tags = tag_masks(self.runs)
            self.controls["tag"] = w.Dropdown(options=[ANY_TAG, *self._index.tags], value=ANY_TAG, description="tag")
            self.controls["tag"].observe(lambda _: self._refilter(), names="value")
            old, self.children = self.children, self._layout()
            if getattr(self, "_mnb_hider", None) is not None:
                self._ensure_hider()  # shown already: its static twin stays hidden under the live view
            close_widgets(old, keep=self.children)  # the rows and boxes replaced, not the controls in them
            self.show_columns([*self._columns, "tags"])
        self._tags_changed()

    def _on_store(self, store: Any, event: str, row: dict) -> None:
        """A row was written to or removed from some store: follow it when it is ours."""
        from ..store.tags import same_store
        from .tagger import row_run

        if self.store is None or not same_store(store, self.store) or not isinstance(row.get("tag"), str):
            return
        machine, rid = row_run(row)
        if rid is None:
            return
        ids = self.runs["id"].astype(str).to_numpy()
        hit = ids == str(rid)
        if machine is not None and "machine" in self.runs.columns:
            hit &= self.runs["machine"].astype(str).to_numpy() == str(machine)
        elif hit.sum() > 1:
            return  # an id of several machines and a row without one: it tags none (as attach_tags)
        col = self.runs.columns.get_loc("tags")
        for pos in np.flatnonzero(hit).tolist():
            now = self.runs.iat[pos, col]
            now = list(now) if isinstance(now, _LISTS) else []  # a row added without tags (NaN): none yet
            if event == "tag":
                now.append(row["tag"])
            elif row["tag"] in now:
                now.remove(row["tag"])
            self.runs.iat[pos, col] = now
        self._tags_changed()

    def _tags_changed(self) -> None:
        """The `tags` column changed: the tag filter's masks and choices follow, then the view."""
        self._index.tags = tag_masks(self.runs)
        ctl = self.controls.get("tag")
        if ctl is not None:
            options = [ANY_TAG, *self._index.tags]
            if list(ctl.options) != options:
                keep = ctl.value if ctl.value in options else ANY_TAG
                self._hold = True
                try:
                    ctl.options = options
                    ctl.value = keep
                finally:
                    self._hold = False
        if self._sort[0] == "tags":  # a view sorted by its tags is sorted again
            self._order = sort_order(self.runs, *self._sort)
        self._refilter(reset_page=False)

    def close(self) -> None:
        """Stop following the tag store, drop a search still waiting for typing to pause, and
        close the widget with its controls and table (`tag()` calls stop redrawing a closed picker)."""
        if getattr(self, "_stop_following", None) is not None:  # also called for a half-made picker
            self._stop_following()
            self._stop_following = None
        timer, self._search_timer = getattr(self, "_search_timer", None), None
        if timer is not None:
            timer.cancel()
        super().close()

    @traitlets.validate("selected_ids")
    def _check_selected(self, proposal: Any) -> list[str]:
        keys = list(dict.fromkeys(proposal["value"]))  # no duplicates
        unknown = set(keys) - self._key_pos.keys()  # a set difference: fast for 100,000 keys
        if unknown:
            raise traitlets.TraitError(f"RunPicker: no runs with keys {sorted(map(str, unknown))[:5]}")
        return keys

    def _on_selection(self, _change: Any) -> None:
        self._sel_mask = np.zeros(len(self.runs), dtype=bool)
        self._sel_mask[[self._key_pos[k] for k in self.selected_ids]] = True
        self._refresh()

    # ------------------------------------------------------------ controls

    def _make_controls(self) -> dict[str, w.Widget]:
        runs, c = self.runs, {}
        for col in CHOICE_COLUMNS:
            if col in runs.columns:
                counts = runs[col].dropna().value_counts()  # values as stored, so isin() matches them
                if 2 <= len(counts) <= MAX_CHOICES:  # one value filters nothing
                    items = sorted(counts.items(), key=lambda kv: str(kv[0]))
                    c[col] = w.SelectMultiple(
                        options=[(f"{v} ({n:,})", v) for v, n in items], rows=min(4, len(counts)),
                        description=col, layout=w.Layout(width="auto", min_width="14em"))
        if "score" in runs.columns:
            s = pd.to_numeric(runs["score"], errors="coerce").astype(float)
            # the slider spans the finite scores (a range to inf has no step); a handle left at an
            # end keeps the infinite scores beyond it (see filters)
            self._score_open = (bool((s == -np.inf).any()), bool((s == np.inf).any()))
            s = s[np.isfinite(s)]
            lo, hi = s.min(), s.max()
            if pd.notna(lo) and hi > lo:
                c["score"] = w.FloatRangeSlider(value=(float(lo), float(hi)), min=float(lo), max=float(hi),
                                                step=(float(hi) - float(lo)) / 100, description="score",
                                                readout_format=".2f", continuous_update=False)
        if self._index.started is not None and (~np.isnat(self._index.started)).any():
            c["date_from"] = w.DatePicker(description="from", layout=w.Layout(width="auto"))
            c["date_to"] = w.DatePicker(description="to", layout=w.Layout(width="auto"))
        if self._index.tags:
            c["tag"] = w.Dropdown(options=[ANY_TAG, *self._index.tags], value=ANY_TAG, description="tag")
        # each keystroke reaches Python; the search waits SEARCH_DEBOUNCE_S for the typing to pause
        c["text"] = w.Text(placeholder="search every text column", description="search",
                           continuous_update=True)
        for name, ctl in c.items():
            if name != "text":
                ctl.observe(lambda _: self._refilter(), names="value")
        c["text"].observe(lambda _: self._search_soon(), names="value")
        return c

    def _search_soon(self) -> None:
        """Search once typing pauses for SEARCH_DEBOUNCE_S (a keystroke restarts the wait); from
        Python (`set_filters`, no running event loop) at once."""
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or getattr(self, "_hold", False):
            self._refilter()
            return
        if getattr(self, "_search_timer", None) is not None:
            self._search_timer.cancel()
        self._search_timer = loop.call_later(SEARCH_DEBOUNCE_S, self._refilter)

    def _layout(self) -> list[w.Widget]:
        c = self.controls
        choices = [c[k] for k in CHOICE_COLUMNS if k in c]
        others = [c[k] for k in ("score", "date_from", "date_to", "tag", "text") if k in c]
        rows: list[w.Widget] = []
        if choices:
            rows.append(w.HBox(choices, layout=w.Layout(flex_flow="row wrap")))
        rows.append(w.HBox(others, layout=w.Layout(flex_flow="row wrap")))
        rows.append(w.HBox([*self._buttons, self._count]))
        columns = w.Accordion(children=[self._column_choice], titles=("columns",), selected_index=None)
        rows.append(columns)
        rows.append(self._table)
        rows.append(style_sheet())
        return rows

    @property
    def filters(self) -> dict[str, Any]:
        """The current filters as plain data (the `filter_mask` shape)."""
        c, f = self.controls, {}
        for col in CHOICE_COLUMNS:
            if col in c and c[col].value:
                f[col] = list(c[col].value)
        if "score" in c and tuple(c["score"].value) != (c["score"].min, c["score"].max):
            lo, hi = c["score"].value
            below, above = getattr(self, "_score_open", (False, False))
            f["score"] = (-math.inf if below and lo <= c["score"].min else lo,
                          math.inf if above and hi >= c["score"].max else hi)
        if "date_from" in c and (c["date_from"].value or c["date_to"].value):
            f["date"] = (c["date_from"].value, c["date_to"].value)
        if "tag" in c and c["tag"].value != ANY_TAG:
            f["tag"] = c["tag"].value
        if c["text"].value.strip():
            f["text"] = c["text"].value
        return f

    def set_filters(self, **values: Any) -> None:
        """Set filter controls from Python; the view updates once.

        Args:
            **values: machine=[...], model=[...], harness=[...] (one value may be given alone),
                score=(lo, hi), date=(start, end), tag="good", text="..." (None clears one).

        Raises:
            ValueError: an unknown filter, one this frame has no control for, or a machine, model,
                harness or tag the frame does not have (then no filter changes).
        """
        unknown = set(values) - {*CHOICE_COLUMNS, "score", "date", "tag", "text"}
        if unknown:
            raise ValueError(f"unknown filters {sorted(unknown)}")
        values = {k: (v,) if k in CHOICE_COLUMNS and isinstance(v, str) else v for k, v in values.items()}
        for name in (*CHOICE_COLUMNS, "tag"):
            given = values.get(name)
            if given is None or len(given) == 0:  # cleared
                continue
            have = [o[1] if isinstance(o, tuple) else o for o in self._control(name).options]  # (label, value) or value
            wanted = [values[name]] if name == "tag" else list(values[name])
            missing = [v for v in wanted if v not in have]
            if missing:
                raise ValueError(f"RunPicker: no {name} {', '.join(map(repr, missing))} to filter on "
                                 f"(have {', '.join(map(str, have[:20]))}{', …' if len(have) > 20 else ''})")
        self._hold = True
        try:
            for name, value in values.items():
                if name == "date":
                    start, end = value if value is not None else (None, None)
                    self._control("date_from").value, self._control("date_to").value = start, end
                elif name in CHOICE_COLUMNS:
                    self._control(name).value = tuple(value or ())
                elif name == "tag":
                    self._control("tag").value = value or ANY_TAG
                else:
                    self._control(name).value = value if value is not None else (
                        (self.controls["score"].min, self.controls["score"].max) if name == "score" else "")
        finally:
            self._hold = False
        self._refilter()

    def _control(self, name: str) -> w.Widget:
        if name not in self.controls:
            raise ValueError(f"no {name!r} filter for this frame (its column is missing or has no values)")
        return self.controls[name]

    # ------------------------------------------------------------ state → view

    def _refilter(self, reset_page: bool = True) -> None:
        timer, self._search_timer = getattr(self, "_search_timer", None), None
        if timer is not None:
            timer.cancel()
        if getattr(self, "_hold", False):
            return
        self._mask = self._index.mask(self.filters)
        self._view = self._order[self._mask[self._order]]
        self._refresh(reset_page=reset_page)

    def _refresh(self, reset_page: bool = False) -> None:
        t = self._table
        n_pages = max(1, math.ceil(len(self._view) / self.page_size))
        page = 0 if reset_page else min(t.page, n_pages - 1)
        positions = self._view[page * self.page_size:(page + 1) * self.page_size]
        rows = page_rows(self.runs, positions, self._keys, self._columns)
        with t.hold_sync():
            t.page, t.n_pages = page, n_pages
            t.sort = {"column": self._sort[0], "ascending": self._sort[1]}
            t.page_selected = [self._keys[p] for p in positions.tolist() if self._sel_mask[p]]
            t.rows = rows
        self._count.value = html.escape(self.count_line())
        self._publish()

    # ------------------------------------------------------------ the display and its static fallback

    def _publish(self) -> None:
        """Bring the displayed static fallback (what a saved notebook, nbviewer or GitHub shows) up
        to the current filters, sort, page and selection. It is the widget's static twin output, so
        updating it leaves the live view as it is (no re-created view, no lost focus or scroll)."""
        self._static_changed()

    # ------------------------------------------------------------ columns

    @property
    def columns(self) -> list[str]:
        """The columns shown, in order."""
        return list(self._columns)

    def show_columns(self, columns: Sequence[str]) -> None:
        """Show these columns; the view and the chooser follow.

        Args:
            columns: column names, in the order shown (one may be given alone).

        Raises:
            ValueError: a column the frame lacks (or the nested `run`).
        """
        if isinstance(columns, str):
            columns = [columns]
        missing = [c for c in columns if c not in self.runs.columns or c in HIDDEN_COLUMNS]
        if missing:
            raise ValueError(f"RunPicker: cannot show columns {missing} (have {list(self.runs.columns)})")
        self._columns = list(dict.fromkeys(columns))
        if tuple(self._column_choice.value) != tuple(c for c in self._column_choice.options if c in self._columns):
            self._column_choice.value = tuple(c for c in self._column_choice.options if c in self._columns)
        self._table.columns = self._columns
        self._refresh()

    def count_line(self) -> str:
        """The count line above the table.

        Returns:
            e.g. "312 runs · 40 match · 2 selected", plus how many selected rows the filters hide.
        """
        n_sel = len(self.selected_ids)
        hidden = int((self._sel_mask & ~self._mask).sum())
        line = f"{len(self.runs):,} runs · {len(self._view):,} match · {n_sel:,} selected"
        return line + (f" ({hidden:,} hidden by filters)" if hidden else "")

    # ------------------------------------------------------------ actions

    def _view_keys(self) -> list[str]:
        return [self._keys[p] for p in self._view.tolist()]

    def click(self, key: str, *, shift: bool = False, toggle: bool = False) -> None:
        """Click a row as the view does (see click_selection).

        Args:
            key: the row's key.
            shift: extend a range from the anchor (default False).
            toggle: add or remove the row (default False).

        Raises:
            KeyError: no row has the key.
        """
        if key not in self._key_pos:
            raise KeyError(f"no run with key {key!r}")
        view = self._view_keys() if shift else []
        self.selected_ids, self._anchor = click_selection(self.selected_ids, view, key, self._anchor,
                                                          shift=shift, toggle=toggle)

    def select(self, keys: Sequence[str]) -> None:
        """Replace the selection.

        Args:
            keys: row keys (see row_keys); one key may be given alone.

        Raises:
            KeyError: a key no row has.
        """
        if isinstance(keys, str):
            keys = [keys]
        bad = [k for k in keys if k not in self._key_pos]
        if bad:
            raise KeyError(f"no runs with keys {bad[:5]}")
        self.selected_ids = list(dict.fromkeys(keys))

    def select_all_filtered(self) -> None:
        """Add every run that matches the filters (all pages) to the selection."""
        have = set(self.selected_ids)
        self.selected_ids = list(self.selected_ids) + [k for k in self._view_keys() if k not in have]

    def clear_selection(self) -> None:
        """Select nothing."""
        self.selected_ids, self._anchor = [], None

    def sort_by(self, column: str | None, ascending: bool | None = None) -> None:
        """Sort the view.

        Args:
            column: the column (None: the frame's order).
            ascending: the direction. Default None: flipped when re-sorting the same column (a
                header click), else True.
        """
        if ascending is None:
            ascending = not self._sort[1] if column == self._sort[0] else True
        self._order = sort_order(self.runs, column, ascending)
        self._sort = (column, ascending)
        self._view = self._order[self._mask[self._order]]
        self._refresh(reset_page=True)

    def go_to_page(self, page: int) -> None:
        """Show one page.

        Args:
            page: 0-based, clamped to the pages there are.
        """
        self._table.page = max(0, int(page))
        self._refresh()

    def observe_selection(self, callback: Callable[[pd.DataFrame], Any]) -> Callable:
        """Call a function whenever the selection changes.

        Args:
            callback: called with the selected DataFrame (`.selected`).

        Returns:
            The handler; pass it to `unobserve(handler, names="selected_ids")` to stop.
        """
        def handler(_change: Any) -> None:
            callback(self.selected)
        self.observe(handler, names="selected_ids")
        return handler

    def _on_table_msg(self, _widget: Any, content: dict, _buffers: Any) -> None:
        event = content.get("event") if isinstance(content, dict) else None
        if event == "click" and content.get("key") in self._key_pos:
            self.click(content["key"], shift=bool(content.get("shift")), toggle=bool(content.get("toggle")))
        elif event == "sort" and content.get("column") in self._columns:
            self.sort_by(content["column"])
        elif event == "page":
            self.go_to_page(int(content.get("page", 0)))

    def prepare_runs(self, runs: pd.DataFrame) -> "AddedRuns":
        """The slow part of `add_runs` (the new frame, its keys and filter arrays), which reads the
        picker but changes nothing, so a follower can run it in its own thread and hand the result
        to `add_runs` on the kernel's thread (which then only swaps it in).

        Args:
            runs: as in add_runs.

        Returns:
            What add_runs takes (made again there if the picker's runs changed meanwhile).
        """
        old = self.runs

        def ident(frame: pd.DataFrame) -> pd.Series:
            ids = frame["id"].astype(str)
            return frame["machine"].astype(str) + "/" + ids if "machine" in frame.columns else ids

        new_id = ident(runs)
        runs = runs[~new_id.duplicated(keep="last").to_numpy()]
        new_id = new_id[runs.index]
        if self.store is not None:  # the followed store's tags, as the picker's own rows have them
            runs = runs.copy(deep=False)
            runs["tags"] = self._read_tags(runs, self.store)
        maybe = np.flatnonzero(old["id"].astype(str).isin(set(runs["id"].astype(str))).to_numpy())
        replaced = maybe[ident(old.iloc[maybe]).isin(set(new_id)).to_numpy()] if len(maybe) else maybe
        frame = pd.concat([runs, old.drop(old.index[replaced]) if len(replaced) else old],
                          ignore_index=isinstance(old.index, pd.RangeIndex))
        frame.attrs = dict(old.attrs)
        # new rows' keys before the old ones when they keep the key scheme (ids, or machine/id once
        # ids repeat) and clash with none (positions then shift, no rebuild); else all keys again
        keys = pos = None
        if not len(replaced) and self._keys:
            by_id = self._keys[0] == str(old["id"].iloc[0])
            top = runs["id"].astype(str).tolist() if by_id else new_id.tolist()
            if len(set(top)) == len(top) and not any(k in self._key_pos for k in top):
                keys = top + self._keys
                pos = _Positions.on_top(self._key_pos, top)
        if keys is None:
            keys = row_keys(frame)
            pos = {k: i for i, k in enumerate(keys)}
        # where each old row is now (a replaced row: at its new row)
        stay = np.ones(len(old), dtype=bool)
        stay[replaced] = False
        moved = np.empty(len(old), dtype=np.int64)
        moved[stay] = len(runs) + np.arange(int(stay.sum()))
        if len(replaced):
            moved[replaced] = pd.Index(new_id.tolist()).get_indexer(ident(old.iloc[replaced]).tolist())
        return AddedRuns(old, frame, keys, pos, FilterIndex(frame, self._text_columns), moved,
                         len(runs) - len(replaced), len(runs))

    def add_runs(self, runs: "pd.DataFrame | AddedRuns") -> int:
        """Put runs that landed since the picker was made at the top of its frame (a Dashboard of
        the same workspace calls this as run files land); a run the picker has already (same
        machine and id: its file written again) is replaced by its new row. Filters, sort, page
        and selection stay; the count line and the page follow.

        Args:
            runs: rows with the picker's columns (`load_runs` rows of the same workspace), or
                what `prepare_runs` made of them. A picker that follows a tag store reads their
                `tags` from it.

        Returns:
            How many of the rows were runs the picker did not have.
        """
        if not isinstance(runs, AddedRuns):
            if not len(runs):
                return 0
            runs = self.prepare_runs(runs)
        elif runs.old is not self.runs:  # the picker changed since it was prepared
            return self.add_runs(runs.frame.iloc[:runs.n_top])
        moved = runs.moved
        selected = [int(moved[self._key_pos[k]]) for k in self.selected_ids]
        anchor = None if self._anchor not in self._key_pos else int(moved[self._key_pos[self._anchor]])
        self.runs, self._keys, self._key_pos, self._index = runs.frame, runs.keys, runs.positions, runs.index
        self._order = sort_order(self.runs, *self._sort)
        self._mask = self._index.mask(self.filters)
        self._view = self._order[self._mask[self._order]]
        self._anchor = None if anchor is None else self._keys[anchor]
        keys = list(dict.fromkeys(self._keys[p] for p in selected))
        self._sel_mask = np.zeros(len(self.runs), dtype=bool)
        if keys != list(self.selected_ids):
            self.selected_ids = keys  # observers hear of it; _on_selection redraws
        else:
            self._sel_mask[selected] = True
            self._refresh()
        return runs.added

    # ------------------------------------------------------------ results

    @property
    def selected(self) -> pd.DataFrame:
        """The chosen runs: original columns and index, in the frame's order."""
        return self.runs.iloc[np.flatnonzero(self._sel_mask)]

    @property
    def filtered(self) -> pd.DataFrame:
        """The runs matching the filters, in the view's sort order."""
        return self.runs.iloc[self._view]

    @property
    def page_keys(self) -> list[str]:
        """Keys of the rows on the current page, in view order."""
        return [r["__key__"] for r in self._table.rows]

    # ------------------------------------------------------------ static fallback

    def summary(self) -> str:
        """The saved notebook's text/plain.

        Returns:
            One line: runs, matches and selected.
        """
        return (f"RunPicker: {len(self.runs):,} runs, {len(self._view):,} match, "
                f"{len(self.selected_ids):,} selected")

    def static_html(self) -> str:
        """The picker as it stands, for the saved notebook and HTML exports.

        Returns:
            The count line, filters, sort and page, then the current page as a table.
        """
        t = self._table
        sel = set(t.page_selected)
        filters = self.filters
        ftext = "; ".join(f"{k}: {v}" for k, v in filters.items()) or "none"
        sort = self._sort[0] and f"{self._sort[0]} {'↑' if self._sort[1] else '↓'}"
        head = "".join(f"<th>{escape(c)}</th>" for c in ["✓", *self._columns])
        body = "".join(
            "<tr>" + f"<td>{'✓' if r['__key__'] in sel else ''}</td>"
            + "".join(f"<td>{escape(r[c])}</td>" for c in self._columns) + "</tr>"
            for r in t.rows)
        return (f'<div class="mnb-run-picker"><p><b>{escape(self.count_line())}</b> · filters: '
                f'{escape(ftext)} · sort: {escape(sort or "frame order")} · page {t.page + 1} of {t.n_pages}</p>'
                f'<table class="dataframe"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')


# ---------------------------------------------------------------- runs added to a picker (add_runs)

class AddedRuns:
    """What `RunPicker.prepare_runs` made: the picker's next frame, keys, key positions and filter
    arrays, for `add_runs` to swap in.

    Attributes:
        old: the frame it was made from. frame: the new frame (new rows on top). keys, positions,
        index: its row keys, key -> position, FilterIndex. moved: each old row's position in the
        new frame. added: how many rows are new runs. n_top: how many rows were put on top.
    """

    def __init__(self, old: pd.DataFrame, frame: pd.DataFrame, keys: list[str], positions: Any,
                 index: FilterIndex, moved: np.ndarray, added: int, n_top: int) -> None:
        self.old, self.frame, self.keys, self.positions = old, frame, keys, positions
        self.index, self.moved, self.added, self.n_top = index, moved, added, n_top


class _Positions(Mapping):
    """Key -> row position after rows were put on top of a frame, without a new dict of every key:
    the old positions stay as they were (`base`, shifted by the rows on top), and each key put on
    top keeps a stamp (counting up, newest highest): its position is the rows on top minus it."""

    def __init__(self, base: Mapping, top: dict[str, int], n: int) -> None:
        self._base, self._top, self._n = base, top, n

    @classmethod
    def on_top(cls, before: Mapping, keys: list[str]) -> "_Positions":
        """`before`'s positions with `keys` (none of them in `before`) put on top, in this order;
        `before` is left as it is."""
        if isinstance(before, _Positions):
            base, top, n = before._base, before._top.copy(), before._n
        else:
            base, top, n = before, {}, 0
        m = len(keys)
        for i, k in enumerate(keys):
            top[k] = n + m - i
        return cls(base, top, n + m)

    def __getitem__(self, key: str) -> int:
        stamp = self._top.get(key)
        return self._n - stamp if stamp is not None else self._base[key] + self._n

    def __contains__(self, key: object) -> bool:
        return key in self._top or key in self._base

    def __iter__(self):
        yield from self._top
        yield from self._base

    def __len__(self) -> int:
        return len(self._top) + len(self._base)
