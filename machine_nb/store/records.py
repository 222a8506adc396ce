"""Records on demand: DataFrame columns whose values are parsed JSON records read from disk when
a value is asked for, so a frame of a million runs holds where each record lives, not the record.

`RunRecords` is the `run` column of an indexed `load_runs` frame (a run file per row); `TagRows`
is the `row` column of `tagged()` (a line of a tag-store file per row). Both are pandas extension
arrays: `frame["run"].iloc[i]`, `list(frame["run"])`, `frame.iloc[rows]`, sorting, filtering and
concatenation work as on a column of dicts; only the values actually read are parsed (each time:
nothing is cached, so memory stays flat). Which frames get a lazy column is decided in
`frames.load_runs` and `tags.tagged`. Importing this module registers the `.mnb` DataFrame accessor.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pandas.api.extensions import ExtensionArray, ExtensionDtype, register_extension_dtype

from ..errors import MachineFormatError


class _LazyDtype(ExtensionDtype):
    type = dict
    na_value = None
    _is_numeric = False

    @classmethod
    def construct_from_string(cls, string: str) -> _LazyDtype:
        if string == cls.name:
            return cls()
        raise TypeError(f"Cannot construct a {cls.__name__} from {string!r}")


class _LazyRecords(ExtensionArray):
    """Per row: a locator (`_locators`, a pyarrow string array; null = missing) or, for values set
    from Python, the value itself (`_set`: position -> value, which wins over the locator). The
    name is not `_where`: pandas calls an array's `_where` method (Series.where, mask, fillna)."""

    _dtype_cls: type[_LazyDtype]

    def __init__(self, where: pa.Array | pa.ChunkedArray, extra: pa.Array | pa.ChunkedArray | None = None,
                 overrides: dict[int, Any] | None = None):
        # kept as given (a chunked array is not combined: that would copy a million paths)
        self._locators = where
        self._extra = extra
        self._set = overrides or {}

    # -- reading one value (subclasses)
    def _load(self, i: int) -> Any:
        raise NotImplementedError

    def map(self, mapper: Any, na_action: Any = None) -> Any:
        """`Series.map` on a lazy column: the mapped values with their own dtype (booleans stay
        booleans, so `tags[tags["row"].map(lambda r: …)]` filters as it would on plain records)."""
        import pandas as pd

        values = [None if (na_action == "ignore" and v is None) else
                  (mapper.get(v) if isinstance(mapper, dict) else mapper(v)) for v in self]
        return pd.array(values) if values else np.array([], dtype=object)

    def _value(self, i: int) -> Any:
        if i in self._set:
            return self._set[i]
        if not self._locators[i].is_valid:
            return None
        return self._load(i)

    # -- the ExtensionArray interface
    @property
    def dtype(self) -> _LazyDtype:
        return self._dtype_cls()

    def __len__(self) -> int:
        return len(self._locators)

    @property
    def nbytes(self) -> int:
        return self._locators.nbytes + (self._extra.nbytes if self._extra is not None else 0)

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, (int, np.integer)):
            i = int(item)
            if i < 0:
                i += len(self)
            if not 0 <= i < len(self):
                raise IndexError(f"index {item} is out of bounds for {len(self)} records")
            return self._value(i)
        item = pd.api.indexers.check_array_indexer(self, item) if not isinstance(item, slice) else item
        if isinstance(item, slice):
            positions = np.arange(len(self))[item]
        elif item.dtype == bool:
            positions = np.flatnonzero(item)
        else:
            positions = np.asarray(item, dtype=np.int64)
        return self.take(positions)

    def __iter__(self):
        for i in range(len(self)):
            yield self._value(i)

    def __setitem__(self, key: Any, value: Any) -> None:
        positions = np.arange(len(self))[key] if not isinstance(key, (int, np.integer)) else [int(key)]
        positions = np.atleast_1d(positions)
        values = value if (isinstance(value, (list, tuple, np.ndarray, ExtensionArray))
                           and len(value) == len(positions)) else [value] * len(positions)
        for p, v in zip(positions.tolist(), values):
            self._set[p % len(self)] = None if _is_na(v) else v  # NaN, NA, NaT: missing, as isna says

    def isna(self) -> np.ndarray:
        missing = np.asarray(self._locators.is_null().to_numpy(zero_copy_only=False), dtype=bool).copy()
        for i, v in self._set.items():
            missing[i] = v is None
        return missing

    def take(self, indices: Any, *, allow_fill: bool = False, fill_value: Any = None) -> _LazyRecords:
        idx = np.asarray(indices, dtype=np.int64)
        if allow_fill:
            if ((idx < -1)).any():
                raise ValueError("negative indices other than -1 with allow_fill")
            mask = idx == -1
            safe = np.where(mask, 0, idx)
        else:
            safe = np.where(idx < 0, idx + len(self), idx)
            mask = None
        if len(self) == 0 and len(safe):
            if mask is not None and mask.all():
                return type(self)(pa.nulls(len(safe), pa.large_string()),
                                  None if self._extra is None else pa.nulls(len(safe), self._extra.type))
            raise IndexError("cannot take from an empty array")
        if len(safe) and (safe.max() >= len(self) or safe.min() < 0):
            raise IndexError("index out of bounds")
        pa_idx = pa.array(safe, mask=mask) if mask is not None else pa.array(safe)
        where = self._locators.take(pa_idx)
        extra = None if self._extra is None else self._extra.take(pa_idx)
        moved: dict[int, Any] = {}
        if self._set:
            for new, old in enumerate(safe.tolist()):
                if old in self._set and not (mask is not None and mask[new]):
                    moved[new] = self._set[old]
        if mask is not None and not _is_na(fill_value):
            for new in np.flatnonzero(mask).tolist():
                moved[new] = fill_value
        return type(self)(where, extra, moved)

    def copy(self) -> _LazyRecords:
        return type(self)(self._locators, self._extra, dict(self._set))

    @classmethod
    def _concat_same_type(cls, to_concat: Any) -> _LazyRecords:
        arrays = list(to_concat)
        where = _concat([a._locators for a in arrays]) if arrays else pa.array([], pa.large_string())
        extra = None
        if arrays and all(a._extra is not None for a in arrays):
            extra = _concat([a._extra for a in arrays])
        moved, base = {}, 0
        for a in arrays:
            moved.update({base + i: v for i, v in a._set.items()})
            base += len(a)
        return cls(where, extra, moved)

    @classmethod
    def _from_sequence(cls, scalars: Any, *, dtype: Any = None, copy: bool = False) -> _LazyRecords:
        if isinstance(scalars, cls):
            return scalars.copy() if copy else scalars
        values = list(scalars)
        return cls(pa.nulls(len(values), pa.large_string()), None,
                   {i: v for i, v in enumerate(values) if not _is_na(v)})

    @classmethod
    def _from_factorized(cls, values: Any, original: Any) -> _LazyRecords:
        # `values` are the distinct keys of _values_for_factorize: each is the row it came from
        first = original._first_positions()
        return original.take([first[v] for v in values])

    def _first_positions(self) -> dict[Any, int]:
        """{factorize key: the first position holding it}, in order of first appearance."""
        keys, _ = self._values_for_factorize()
        first: dict[Any, int] = {}
        for i, key in enumerate(keys.tolist()):
            first.setdefault(key, i)
        return first

    def unique(self) -> _LazyRecords:
        """The distinct rows, in order of first appearance (told apart as factorize does: by where
        each record lives, a missing value being one of them)."""
        return self.take(list(self._first_positions().values()))

    def _values_for_factorize(self) -> tuple[np.ndarray, Any]:
        # rows are told apart by where their record lives (reading every record to hash it would
        # defeat the point)
        where = self._locators.to_numpy(zero_copy_only=False).astype(object)
        for i, v in self._set.items():
            where[i] = f"<value {id(v)}>"
        return where, None

    def __eq__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        if isinstance(other, _LazyRecords) and len(other) == len(self):
            return np.array([a == b for a, b in zip(self, other)], dtype=bool)
        return np.array([v == other for v in self], dtype=bool)

    def __arrow_array__(self, type: Any = None) -> pa.Array:
        # written out (to_parquet, from_pandas) as the locators: a file path per row
        return self._locators

    def _formatter(self, boxed: bool = False):
        return lambda v: "" if v is None else repr(v)


def _is_na(value: Any) -> bool:
    """Whether a value set into a lazy column is a missing-value marker (None, NaN, pd.NA, NaT)."""
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and value != value)


def _concat(arrays: list) -> pa.ChunkedArray:
    chunks = []
    for a in arrays:
        chunks.extend(a.chunks if isinstance(a, pa.ChunkedArray) else [a])
    return pa.chunked_array(chunks, type=pa.large_string())


@register_extension_dtype
class RunRecordDtype(_LazyDtype):
    """The dtype of a lazy `run` column: a Run record read from its run file on access."""

    name = "run_record"

    @classmethod
    def construct_array_type(cls) -> type[RunRecords]:
        """The array type of this dtype (pandas' extension interface).

        Returns:
            RunRecords.
        """
        return RunRecords


class RunRecords(_LazyRecords):
    """A `run` column whose values are read (and checked, see workspace.check_run) from their run
    files on access. A file changed since the index was read gives its new content; a file gone
    or broken since gives MachineFormatError naming it."""

    _dtype_cls = RunRecordDtype

    def _load(self, i: int) -> dict:
        from .workspace import read_run

        return read_run(self._locators[i].as_py())


@register_extension_dtype
class TagRowDtype(_LazyDtype):
    """The dtype of tagged()'s lazy `row` column: a tag row read from its store file on access."""

    name = "tag_row"

    @classmethod
    def construct_array_type(cls) -> type[TagRows]:
        """The array type of this dtype (pandas' extension interface).

        Returns:
            TagRows.
        """
        return TagRows


# line offsets of tag-store files, by (path, size, mtime_ns): a file rewritten since gets new ones
_LINE_STARTS: dict[tuple, np.ndarray] = {}


def _line_starts(path: str) -> tuple[np.ndarray, tuple]:
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    starts = _LINE_STARTS.get(key)
    if starts is None:
        parts, base = [np.zeros(1, dtype=np.int64)], 0
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 24):  # 16 MB at a time: memory stays flat for any file
                parts.append(np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10).astype(np.int64) + base + 1)
                base += len(chunk)
        starts = np.concatenate(parts)
        for old in [k for k in _LINE_STARTS if k[0] == path]:
            del _LINE_STARTS[old]
        _LINE_STARTS[key] = starts
    return starts, key


def _loads_as_tagged(raw: bytes) -> Any:
    """A line orjson refuses, parsed as tagged() parsed it (Python's json: NaN, Infinity and
    integers beyond 64 bits are JSON to it); None when it is not JSON at all."""
    from ..core.jsonl import parse_json

    try:
        return parse_json(raw)
    except MachineFormatError:
        return None


#: How a tag row without a string id is told apart in TagRows: this, then a digest of its content.
DIGEST_MARK = "\x00sha256:"


def row_digest(row: dict) -> str:
    """What stands for the id of a tag row that has none (DIGEST_MARK and a digest of its content),
    so a lazy `row` column never takes another row at its line for it.

    Args:
        row: the parsed tag row.

    Returns:
        The marker text.
    """
    import hashlib
    import json

    text = json.dumps(row, sort_keys=True, ensure_ascii=False)  # any row json reads: NaN, big integers
    return DIGEST_MARK + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class TagRows(_LazyRecords):
    """tagged()'s `row` column: per row the store file and line (`"<path>:<line>"`) and the row id
    (for a row without one, `row_digest`); the row is re-read from that line on access. MachineFormatError when the line no longer holds
    that row, or the file is gone or unreadable (the store changed since: call tagged() again)."""

    _dtype_cls = TagRowDtype

    def _load(self, i: int) -> dict:
        import orjson

        where = self._locators[i].as_py()
        path, _, line = where.rpartition(":")
        number = int(line)
        try:
            starts, _ = _line_starts(path)
            if number > len(starts) or number < 1:
                raise MachineFormatError(path, "the store changed since tagged() read it: call tagged() again",
                                         line=number)
            with open(path, "rb") as fh:
                fh.seek(int(starts[number - 1]))
                raw = fh.readline()
        except OSError as exc:  # the file is gone or cannot be read any more
            raise MachineFormatError(path, f"the store changed since tagged() read it ({exc.strerror or exc}): "
                                           "call tagged() again", line=number) from None
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError:
            row = _loads_as_tagged(raw)
        want = None if self._extra is None else self._extra[i].as_py()
        if isinstance(row, dict) and want is not None and want.startswith(DIGEST_MARK):
            same = row_digest(row) == want
        else:
            same = isinstance(row, dict) and (want is None or row.get("id") == want)
        if not same:
            raise MachineFormatError(path, "the store changed since tagged() read it: call tagged() again", line=number)
        return row


# ---------------------------------------------------------------------------------------------
# The `.mnb` accessor on load_runs frames


@pd.api.extensions.register_dataframe_accessor("mnb")
class RunsAccessor:
    """`runs.mnb.record(id)` and `runs.mnb.records()`: Run records of a load_runs frame on demand."""

    def __init__(self, frame: pd.DataFrame):
        self._frame = frame

    def record(self, id: str, machine: str | None = None) -> dict:
        """The Run record of the run with this id.

        Args:
            id: the run id.
            machine: its machine, needed when ids repeat across machines (default None).

        Returns:
            The Run record, read from its file when the `run` column is lazy.

        Raises:
            KeyError: no row has this id (in this machine).
            ValueError: several machines have that id and `machine` is not given.
        """
        df = self._frame
        hit = np.flatnonzero((df["id"] == id).to_numpy(dtype=bool, na_value=False))
        if machine is not None and len(hit):
            hit = hit[(df["machine"].iloc[hit] == machine).to_numpy(dtype=bool, na_value=False)]
        if not len(hit):
            raise KeyError(f"no run with id {id!r}" + (f" in machine {machine!r}" if machine else ""))
        if len(hit) > 1:
            machines = sorted(map(str, df["machine"].iloc[hit]))
            raise ValueError(f"run id {id!r} is in several machines ({', '.join(machines)}): pass machine=")
        return load_run_records(df.iloc[hit])[0]

    def records(self) -> list[dict]:
        """Every row's Run record, in row order (reads the run files of a lazy `run` column).

        Returns:
            The Run records.
        """
        return load_run_records(self._frame)


def load_run_records(frame: pd.DataFrame) -> list[dict]:
    """Run records of a frame's rows.

    Args:
        frame: a load_runs frame or a selection of one (also one saved and read back: a CSV or
            Parquet file holds the `run` column as text, so those rows are read from `path`).

    Returns:
        Its `run` column's values (lazy or not), read from the `path` column where a value is not
        a Run record or there is no `run` column.

    Raises:
        ValueError: the frame has neither column, or a row's `run` is not a Run record and it has
            no `path` to read one from (naming the row).
        MachineFormatError: a run file read from `path` that is missing or bad.
    """
    from .workspace import read_run

    paths = list(frame["path"]) if "path" in frame.columns else None
    if "run" not in frame.columns:
        if paths is None:
            raise ValueError(f"no `run` or `path` column to read Run records from (columns: {list(frame.columns)})")
        return [read_run(p) for p in paths]
    records = list(frame["run"])
    for i, record in enumerate(records):
        if isinstance(record, dict):
            continue
        if paths is None or not isinstance(paths[i], str):
            raise ValueError(f"row {i} of the frame has a `run` that is not a Run record ({type(record).__name__}) "
                             "and no `path` to read it from: load the runs again with load_runs")
        records[i] = read_run(paths[i])
    return records
