"""The run index behind load_runs: the same frame as parsing every file, a reload that parses only
what changed (new, changed, deleted files; both check modes), a corrupt or stale index rebuilt (for
every reason read_index knows), records read on demand (and only those asked for: run files opened
are counted), the README's schema table the code's, and the index kept outside the workspace,
private to the user."""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pytest

import machine_nb as mnb
from machine_nb.data import frames
from machine_nb.store import index as run_index
from machine_nb.store.workspace import SkippedFiles

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"


@pytest.fixture(autouse=True)
def cache(isolated_run_index):
    return isolated_run_index


@pytest.fixture
def ws(tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / ".machine", ws / ".machine")
    shutil.copytree(SAMPLE / "machines", ws / "machines")
    return ws


def age(ws: Path, seconds: float = 3600) -> None:
    """Set every run file's and folder's times into the past, as in a workspace not written lately."""
    t = time.time() - seconds
    for dirpath, _, files in os.walk(ws / ".machine" / "runs"):
        for f in files:
            os.utime(os.path.join(dirpath, f), (t, t))
        os.utime(dirpath, (t, t))


def run_files(ws: Path) -> list[Path]:
    return sorted((ws / ".machine" / "runs").rglob("*.json"))


def rewrite(path: Path, change, *, atomic: bool) -> None:
    run = json.loads(path.read_text())
    change(run)
    if atomic:  # as Machine writes (temp file + rename): the folder's time changes
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(run))
        os.replace(tmp, path)
    else:  # rewritten in place: only the file's time changes
        path.write_text(json.dumps(run))


def test_indexed_frame_is_the_parsed_frame(ws, cache):
    plain = mnb.load_runs(ws, index=False)
    first = mnb.load_runs(ws, index=True)
    second = mnb.load_runs(ws)  # an index exists: used by default
    for df in (first, second):
        pd.testing.assert_frame_equal(df.drop(columns="run"), plain.drop(columns="run"))
        assert list(df["run"]) == list(plain["run"])  # every record, read on demand
        assert str(df["run"].dtype) == "run_record" and df.attrs["workspace"] == plain.attrs["workspace"]
    assert first.attrs["index"].parsed == len(plain) and second.attrs["index"].parsed == 0
    assert second.attrs["index"].reused == len(plain) and plain.attrs["index"] is None
    one = mnb.load_runs(ws, "chatbot", index=True)
    pd.testing.assert_frame_equal(one.drop(columns="run"),
                                  plain[plain["machine"] == "chatbot/triage"].reset_index(drop=True).drop(columns="run"))
    # the index lives in the cache folder, not in the workspace, private to the user
    path = run_index.run_index_path(ws)
    assert path.is_relative_to(cache) and path.exists() and not any(ws.rglob("*.arrow"))
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_reload_parses_only_new_changed_and_drops_deleted(ws):
    age(ws)
    n = len(mnb.load_runs(ws, index=True))
    files = run_files(ws)
    rewrite(files[0], lambda r: r.update(output="changed answer"), atomic=True)
    files[1].unlink()
    new = files[2].with_name("20991231t000000-abcdef.json")
    run = json.loads(files[2].read_text())
    new.write_text(json.dumps({**run, "id": new.stem, "startedAt": "2099-12-31T00:00:00.000Z"}))
    past = time.time() - 60
    for p in (files[0], new):  # written a minute ago: outside the racy window (see the next test)
        os.utime(p, (past, past))
    df = mnb.load_runs(ws)
    stats = df.attrs["index"]
    assert (stats.parsed, stats.removed, len(df)) == (2, 1, n)
    assert df.iloc[0]["id"] == new.stem  # newest first
    assert files[1].stem not in set(df["id"])
    assert df.set_index("id").loc[files[0].stem, "output"] == "changed answer"
    assert mnb.load_runs(ws).attrs["index"].parsed == 0


def test_check_modes_for_a_file_rewritten_in_place(ws):
    age(ws)
    mnb.load_runs(ws, index=True)
    done = next(p for p in run_files(ws) if "finishedAt" in (r := json.loads(p.read_text())) and r.get("scorecard"))
    rewrite(done, lambda r: r.update(output="edited in place"), atomic=False)
    # "dirs" trusts an unchanged folder: a finished, scored run rewritten in place is not seen…
    assert mnb.load_runs(ws).set_index("id").loc[done.stem, "output"] != "edited in place"
    # … "files" stats every file and sees it
    df = mnb.load_runs(ws, check="files")
    assert df.attrs["index"].parsed == 1 and df.set_index("id").loc[done.stem, "output"] == "edited in place"
    # an unfinished run is what a writer still updates: "dirs" re-checks those files too
    path = run_files(ws)[5]
    rewrite(path, lambda r: r.pop("finishedAt"), atomic=True)
    mnb.load_runs(ws)
    age(ws)
    mnb.load_runs(ws)  # folder times are settled again
    rewrite(path, lambda r: r.update(finishedAt="2026-11-02T10:00:00.000Z", output="finished now"), atomic=False)
    df = mnb.load_runs(ws)
    assert df.attrs["index"].parsed == 1 and df.set_index("id").loc[path.stem, "output"] == "finished now"
    with pytest.raises(ValueError, match="check must be"):
        mnb.load_runs(ws, check="inode")


def test_a_change_within_the_timestamp_tick_is_not_missed(ws):
    age(ws)
    path = run_files(ws)[3]
    run = json.loads(path.read_text())
    path.write_text(json.dumps(run, indent=2) + "\n")  # written just now…
    mnb.load_runs(ws, index=True)  # … so within RACY_NS of this scan
    st = path.stat()
    path.write_text(json.dumps({**run, "output": run["output"].swapcase()}, indent=2) + "\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: a change in the same tick
    assert path.stat().st_size == st.st_size
    df = mnb.load_runs(ws, check="files")
    assert df.set_index("id").loc[path.stem, "output"] == run["output"].swapcase()


def test_corrupt_or_stale_index_is_rebuilt(ws):
    good = mnb.load_runs(ws, index=False).drop(columns="run")
    mnb.load_runs(ws, index=True)
    path = run_index.run_index_path(ws)
    path.write_bytes(b"ARROW1 not really an Arrow file")
    df = mnb.load_runs(ws)
    assert df.attrs["index"].rebuilt.startswith("unreadable") and df.attrs["index"].parsed == len(good)
    pd.testing.assert_frame_equal(df.drop(columns="run"), good)
    table = _read_arrow(path)
    meta = json.loads(table.schema.metadata[b"machine_nb"])
    _write_arrow(table.replace_schema_metadata({b"machine_nb": json.dumps({**meta, "version": 0}).encode()}), path)
    df = mnb.load_runs(ws)
    assert "schema version 0" in df.attrs["index"].rebuilt
    pd.testing.assert_frame_equal(df.drop(columns="run"), good)
    # the index of another workspace copied over this one's is not trusted either
    other = ws.parent / "other"
    shutil.copytree(ws, other)
    mnb.load_runs(other, index=True)
    shutil.copy(run_index.run_index_path(other), path)
    assert mnb.load_runs(ws).attrs["index"].rebuilt == "it indexes another workspace"
    assert run_index.remove_index(ws) and not path.exists()


def test_bad_files_are_reported_on_every_load(ws):
    bad = ws / ".machine" / "runs" / "support" / "broken.json"
    bad.write_text('{"id": "broken", "machine": "supp')
    (ws / ".machine" / "runs" / "loose.json").write_text("{}")
    for _ in range(2):  # first from parsing, then from the index
        with pytest.warns(SkippedFiles, match=r"(?s)skipped 2 run file\(s\).*loose.json.*broken.json:1"):
            mnb.load_runs(ws, index=True)
    with pytest.raises(mnb.MachineFormatError, match="loose.json"):  # the first, in folder order
        mnb.load_runs(ws, on_error="raise")
    some = next(p for p in run_files(ws) if p.parent.name == "support" and p != bad)
    bad.write_text(json.dumps({**json.loads(some.read_text()), "id": "broken"}))
    with pytest.warns(SkippedFiles, match="skipped 1 run file"):  # the fixed file is read again
        df = mnb.load_runs(ws)
    assert "broken" in set(df["id"])


def test_default_uses_the_index_from_a_size_on(ws, monkeypatch):
    assert mnb.load_runs(ws).attrs["index"] is None  # 312 runs: parsed, records held
    monkeypatch.setattr(frames, "INDEX_MIN_RUNS", 100)
    df = mnb.load_runs(ws)
    assert df.attrs["index"] is not None and str(df["run"].dtype) == "run_record"
    assert mnb.load_runs(ws, failed=lambda c, r: False).attrs["index"] is None  # own rule: parsed


def test_records_on_demand_feed_messages_export_and_tags(ws, tmp_path):
    plain = mnb.load_runs(ws, index=False)
    lazy = mnb.load_runs(ws, index=True)
    coder = lazy[lazy["machine"] == "coder"]
    pd.testing.assert_frame_equal(mnb.messages(coder), mnb.messages(plain[plain["machine"] == "coder"]))
    chosen = mnb.select_runs(lazy, "coder", workspace=ws)
    assert mnb.training_lines(chosen) == mnb.training_lines(mnb.select_runs(plain, "coder", workspace=ws))
    first = coder.iloc[0]
    assert first["run"] == json.loads(Path(first["path"]).read_text())
    assert lazy.mnb.record(first["id"]) == first["run"]
    assert mnb.load_records(coder.head(3)) == list(plain[plain["machine"] == "coder"].head(3)["run"])
    with pytest.raises(KeyError):
        lazy.mnb.record("nope")
    row = mnb.tag(coder.iloc[0], "good", store=tmp_path / "store")
    assert row["run"] == first["id"]
    tags = mnb.load_runs(ws, store=tmp_path / "store").set_index("id")["tags"]
    assert tags[first["id"]] == ["good"] and sum(map(len, tags)) == 1
    # a record whose file went away since says which file
    gone = coder["id"].iloc[1]
    Path(coder["path"].iloc[1]).unlink()
    with pytest.raises(mnb.MachineFormatError, match=f"{gone}.json: file not found"):
        coder["run"].iloc[1]


def test_symlinked_machine_folder_is_indexed(ws, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(ws / ".machine" / "runs" / "coder", elsewhere)
    (ws / ".machine" / "runs" / "coder").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "loop").symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(SkippedFiles, match="loop"):
        df = mnb.load_runs(ws, index=True)
    assert (df["machine"] == "coder").sum() == len(list(elsewhere.glob("*.json")))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        again = mnb.load_runs(ws)
    assert any("loop" in str(r.message) for r in rec) and len(again) == len(df)


def test_a_cache_that_cannot_be_written_costs_speed_not_the_result(ws, tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    monkeypatch.setenv("MACHINE_NB_CACHE_DIR", str(blocked))
    with pytest.warns(UserWarning, match="could not write the run index"):
        df = mnb.load_runs(ws, index=True)
    pd.testing.assert_frame_equal(df.drop(columns="run"), mnb.load_runs(ws, index=False).drop(columns="run"))
    empty = tmp_path / "empty"
    (empty / ".machine" / "runs").mkdir(parents=True)
    monkeypatch.setenv("MACHINE_NB_CACHE_DIR", str(tmp_path / "cache2"))
    assert len(mnb.load_runs(empty, index=True)) == 0
    with pytest.warns(UserWarning, match="is this a Machine workspace"):
        assert len(mnb.load_runs(tmp_path / "ws" / "machines", index=True)) == 0
    assert [p.name for p in (tmp_path / "cache2" / "runs").iterdir()] == [run_index.run_index_path(empty).name]


# ---------------------------------------------------------------------------------------------
# Records on demand read only the runs they are given


@pytest.fixture
def opened(ws, monkeypatch):
    """The run files of `ws` opened from now on, in order, by any reader (os.open, open(), Path.open)."""
    import builtins
    import io

    runs = (str(ws / ".machine" / "runs") + os.sep, os.path.realpath(ws / ".machine" / "runs") + os.sep)
    seen: list[str] = []

    def note(path):
        if isinstance(path, (str, os.PathLike)):
            p = os.fspath(path)
            if p.startswith(runs) and p.endswith(".json"):
                seen.append(os.path.realpath(p))

    def tracked(real):
        def open_(path, *args, **kwargs):
            note(path)
            return real(path, *args, **kwargs)
        return open_

    monkeypatch.setattr(os, "open", tracked(os.open))
    monkeypatch.setattr(io, "open", tracked(io.open))
    monkeypatch.setattr(builtins, "open", tracked(builtins.open))
    return seen


def paths_of(frame: pd.DataFrame) -> list[str]:
    return [os.path.realpath(p) for p in frame["path"]]


def test_records_on_demand_read_only_the_rows_asked_for(ws, tmp_path, opened):
    lazy = mnb.load_runs(ws, index=True)
    assert str(lazy["run"].dtype) == "run_record" and len(lazy) > 100
    opened.clear()
    mnb.load_runs(ws)  # a reload from the index opens no run file
    assert opened == []

    two = lazy.head(2)
    msgs = mnb.messages(two)
    assert sorted(opened) == sorted(paths_of(two)) and set(msgs["run_id"]) == set(two["id"])

    opened.clear()
    coder = mnb.select_runs(lazy, "coder", workspace=ws)
    selecting = list(opened)
    opened.clear()
    lines = mnb.training_lines(coder.head(2))
    assert sorted(opened) == sorted(paths_of(coder.head(2))) and {ln["run"] for ln in lines} == set(coder.head(2)["id"])
    # select_runs reads the machine's candidates (scored enough, under its rubric: from the index's
    # columns) once each, to check what the table does not hold; never another machine's runs
    coder_files = {os.path.realpath(p) for p in lazy.loc[lazy["machine"] == "coder", "path"]}
    assert set(selecting) <= coder_files and len(selecting) == len(set(selecting)) >= len(coder)

    row = lazy[["id", "machine", "path"]].iloc[7]  # (a whole row, `run` included, would read its record)
    opened.clear()
    assert lazy.mnb.record(row["id"], row["machine"])["id"] == row["id"]
    assert opened == [os.path.realpath(row["path"])]

    opened.clear()
    assert [r["id"] for r in mnb.load_records(lazy.iloc[[3, 9]])] == list(lazy.iloc[[3, 9]]["id"])
    assert sorted(opened) == sorted(paths_of(lazy.iloc[[3, 9]]))


def test_previewer_and_tagger_read_only_their_slice(ws, tmp_path, opened):
    lazy = mnb.load_runs(ws, index=True)
    coder = mnb.select_runs(lazy, "coder", workspace=ws)
    for frame, make in ((coder.iloc[2:4], lambda f: mnb.ExamplePreviewer(f)),
                        (lazy.iloc[5:7], lambda f: mnb.Tagger(f, store=tmp_path / "store"))):
        mine = set(paths_of(frame))
        opened.clear()
        widget = make(frame)
        widget.static_html()
        read, name = set(opened), type(widget).__name__
        assert read, f"{name} read no run"
        assert read <= mine, f"{name} read runs outside its 2 rows: {sorted(read - mine)}"


def test_the_tagger_reads_the_run_on_screen_once(ws, tmp_path, opened):
    """The Tagger keeps the record of the run it shows: opening it reads that run's file once,
    redrawing and the static view read none, and moving to the next run reads that one once."""
    lazy = mnb.load_runs(ws, index=True)
    frame = lazy.iloc[5:7]
    first, second = paths_of(frame)
    opened.clear()
    tagger = mnb.Tagger(frame, store=tmp_path / "store")
    assert opened == [first]
    opened.clear()
    tagger.static_html()
    tagger.existing_tags()
    assert tagger.current["run_id"] == frame["id"].iloc[0] and opened == []
    tagger.next_run()
    tagger.static_html()
    assert opened == [second]


# ---------------------------------------------------------------------------------------------
# The README's schema table is the code's


README = Path(__file__).resolve().parents[1] / "docs" / "guide" / "scale.md"  # the run index page of the docs
README_TYPES = {"string": ("string", "large_string"), "int64": ("int64",), "bool": ("bool",)}


def readme_index_table() -> tuple[int, list[tuple[list[str], list[str]]]]:
    """(schema version, [(column names, type words)]) from the README's run-index schema table."""
    import re

    text = README.read_text(encoding="utf-8")
    head = re.search(r"The index's schema \(`machine_nb\.store\.index\.INDEX_SCHEMA`, version (\d+)\)", text)
    assert head, "docs/guide/scale.md no longer introduces the index's schema table"
    rows = []
    for line in text[head.end():].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("column", "---") or set(cells[0]) <= {"-"}:
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        if "…" in cells[0]:
            names = [names[0], "…", names[-1]]
        rows.append((names, [t.strip() for t in cells[1].split(",")]))
    return int(head.group(1)), rows


def test_the_readme_schema_table_matches_index_schema():
    version, rows = readme_index_table()
    assert version == run_index.SCHEMA_VERSION
    schema = run_index.INDEX_SCHEMA
    names = [f.name for f in schema]
    documented: list[str] = []
    for cols, types in rows:
        if "…" in cols:  # `id` … `final`: the run table, typed as load_runs types it
            first, last = cols[0], cols[-1]
            assert first in names and last in names, f"README run-table span {first} … {last}"
            span = names[names.index(first):names.index(last) + 1]
            assert span == [c for c in frames.RUN_COLUMNS if c not in ("path", "run")], "the run table's columns"
            assert types == ["as `load_runs`"], f"README types of the run table: {types}"
            documented += span
            continue
        if len(types) == 1:
            types = types * len(cols)
        assert len(types) == len(cols), f"README row {cols}: {len(types)} types for {len(cols)} columns"
        for col, word in zip(cols, types):
            assert col in names, f"the README documents a column {col!r} that INDEX_SCHEMA does not have"
            assert word in README_TYPES, f"README type {word!r} of {col}"
            assert str(schema.field(col).type) in README_TYPES[word], f"{col}: README {word}, code {schema.field(col).type}"
        documented += cols
    assert documented == names, "the README's table and INDEX_SCHEMA list other columns (or another order)"
    # "as load_runs" holds: each run column converts to the dtype kind load_runs gives it, times as UTC timestamps
    plain = mnb.load_runs(SAMPLE, index=False)
    as_pandas = schema.empty_table().to_pandas()
    for col in names[names.index("id"):]:
        assert as_pandas[col].dtype.kind == plain[col].dtype.kind, f"{col}: index {as_pandas[col].dtype}, load_runs {plain[col].dtype}"
    for col in ("started_at", "finished_at"):
        assert str(schema.field(col).type.tz) == "UTC" and str(plain[col].dt.tz) == "UTC"


# ---------------------------------------------------------------------------------------------
# A stale index is rebuilt for every reason read_index knows


def _rewrite_index(ws: Path, change) -> None:
    """Rewrite the workspace's index file with `change(table, meta) -> (table, meta)` applied."""
    path = run_index.run_index_path(ws)
    table = _read_arrow(path)
    meta = json.loads(table.schema.metadata[b"machine_nb"])
    table, meta = change(table.replace_schema_metadata(None), meta)
    _write_arrow(table.replace_schema_metadata({b"machine_nb": json.dumps(meta).encode()}), path)


def _read_arrow(path: Path):
    """An index file's table, read whole (not mapped: the test rewrites the file next)."""
    import pyarrow as pa

    with pa.OSFile(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _write_arrow(table, path: Path) -> None:
    import pyarrow as pa

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


@pytest.mark.parametrize("change, reason", [
    (lambda t, m: (t.append_column("extra", t["name"]), m), "its columns differ"),
    (lambda t, m: (t.drop_columns(["bad_time"]), m), "its columns differ"),
    (lambda t, m: (t.rename_columns(["directory", *t.column_names[1:]]), m), "its columns differ"),
    (lambda t, m: (t.select([1, 0, *range(2, t.num_columns)]), m), "its columns differ"),
    (lambda t, m: (t, {k: v for k, v in m.items() if k != "dirs"}), "its folder list is missing"),
    (lambda t, m: (t, {**m, "dirs": ["chatbot"]}), "its folder list is missing"),
], ids=["extra", "missing", "renamed", "reordered", "no-dirs", "dirs-not-a-map"])
def test_an_index_of_other_columns_or_without_its_folder_list_is_rebuilt(ws, change, reason):
    good = mnb.load_runs(ws, index=False).drop(columns="run")
    mnb.load_runs(ws, index=True)
    _rewrite_index(ws, change)
    df = mnb.load_runs(ws)
    stats = df.attrs["index"]
    assert stats.rebuilt == reason and stats.parsed == len(good) and stats.reused == 0 and stats.written
    pd.testing.assert_frame_equal(df.drop(columns="run"), good)
    again = mnb.load_runs(ws).attrs["index"]  # the rebuilt index is trusted again
    assert again.rebuilt is None and again.parsed == 0 and again.reused == len(good)


# ---------------------------------------------------------------------------------------------
# A first load shares the parse with worker processes


def test_worker_processes_parse_the_same_rows(ws, monkeypatch):
    (ws / ".machine" / "runs" / "support" / "broken.json").write_text('{"id": "broken", "machine": "supp')
    (ws / ".machine" / "runs" / "chatbot" / "triage" / "elsewhere.json").write_text(
        json.dumps({"id": "elsewhere", "machine": "support"}))  # rows of bad files cross the pipe too
    alone, s1, _ = run_index.update_index(ws, frames.RunParser(frames.default_failed), workers=1)
    run_index.remove_index(ws)
    monkeypatch.setattr(run_index, "TASK", 3)  # many small batches, shared by three processes
    shared, s3, _ = run_index.update_index(ws, frames.RunParser(frames.default_failed), workers=3)
    assert (s1.workers, s3.workers) == (1, 3) and s1.parsed == s3.parsed == alone.num_rows
    assert shared.drop_columns(["mtime_ns"]).equals(alone.drop_columns(["mtime_ns"]))
    assert shared.filter(pc.is_valid(shared["error"])).num_rows == 2


def test_load_runs_starts_workers_for_a_large_first_load(ws, monkeypatch):
    plain = mnb.load_runs(ws, index=False, on_error="skip").drop(columns="run")
    monkeypatch.setattr(run_index, "PARALLEL_MIN", 4)  # "large": at least 4 files, 2 a process
    monkeypatch.setattr(run_index, "TASK", 2)
    monkeypatch.setattr(run_index, "_cpus", lambda: 2)
    first = mnb.load_runs(ws, index=True, on_error="skip")
    assert first.attrs["index"].workers == 2
    pd.testing.assert_frame_equal(first.drop(columns="run"), plain)
    again = mnb.load_runs(ws, on_error="skip")  # nothing to parse: no workers
    assert again.attrs["index"].parsed == 0 and again.attrs["index"].workers == 1


def test_an_index_with_damaged_string_offsets_is_rebuilt_not_read(ws):
    import pyarrow as pa

    good = mnb.load_runs(ws, index=False).drop(columns="run")
    mnb.load_runs(ws, index=True)

    def damage(table, meta):  # an offset of `input` out of order (a string of negative length), as a flipped bit makes
        col = table["input"].combine_chunks()
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int64, count=len(col) + 1).copy()
        offsets[1] = offsets[-1]
        bad = pa.Array.from_buffers(pa.large_string(), len(col), [None, pa.py_buffer(offsets), col.buffers()[2]])
        return table.set_column(table.schema.get_field_index("input"), "input", bad), meta

    path = run_index.run_index_path(ws)
    table = _read_arrow(path)
    meta = json.loads(table.schema.metadata[b"machine_nb"])
    table, meta = damage(table.replace_schema_metadata(None), meta)
    # written with checksums of the damaged bytes, so the offsets check is what catches it
    run_index.write_index(path, table, {k: v for k, v in meta.items() if k not in ("version", "checksums")})
    df = mnb.load_runs(ws)
    assert df.attrs["index"].rebuilt.startswith("unreadable") and df.attrs["index"].parsed == len(good)
    pd.testing.assert_frame_equal(df.drop(columns="run"), good)


def _flip(path: Path, column: str, row: int, width: int, byte: int | None = None) -> None:
    """Damage the index file in place: one byte of `column`'s data at `row` (fixed `width`) or,
    for a string column, the first byte of row `row`'s text set to `byte`."""
    import pyarrow as pa

    whole = pa.memory_map(str(path)).read_buffer()
    col = pa.ipc.open_file(pa.BufferReader(whole)).read_all()[column].chunk(0)
    if width:
        at = col.buffers()[1].address - whole.address + row * width
    else:
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int64, count=len(col) + 1)
        at = col.buffers()[2].address - whole.address + int(offsets[row])
    del col, whole
    data = bytearray(path.read_bytes())
    data[at] = data[at] ^ 0x40 if byte is None else byte
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("column, width, byte", [("score", 8, None), ("output", 0, 0xFF), ("output", 0, None)],
                         ids=["score-bit", "output-invalid-utf8", "output-bit"])
def test_damaged_column_bytes_are_detected_and_the_index_rebuilt(ws, column, width, byte):
    good = mnb.load_runs(ws, index=False).drop(columns="run")
    loaded = mnb.load_runs(ws, index=True)
    row = int(np.flatnonzero(loaded[column].notna().to_numpy() & (loaded[column].astype(str).str.len() > 0))[0])
    _flip(run_index.run_index_path(ws), column, row, width, byte)
    df = mnb.load_runs(ws)
    assert df.attrs["index"].rebuilt == f"column {column!r} is damaged (its checksum differs from the one written)"
    pd.testing.assert_frame_equal(df.drop(columns="run"), good)  # the values, not the damaged bytes
    df["output"].str.len().sum()  # every string reads
    assert mnb.load_runs(ws).attrs["index"].rebuilt is None  # the rebuilt index is trusted again


def test_the_older_parquet_index_is_replaced(ws, cache):
    old = run_index.run_index_path(ws).with_suffix(".parquet")
    old.parent.mkdir(parents=True)
    old.write_bytes(b"PAR1 an index of schema version 1")
    mnb.load_runs(ws, index=True)
    assert run_index.run_index_path(ws).exists() and not old.exists()


def test_the_readme_reads_the_index_with_pyarrow_and_copies_it_to_parquet(ws, tmp_path):
    """The README's lines for other engines: the mapped Arrow table, and a Parquet copy of it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = mnb.load_runs(ws, index=True, on_error="skip")
    runs = pa.ipc.open_file(pa.memory_map(str(mnb.run_index_path(ws)))).read_all()  # as in the README
    assert runs.schema.remove_metadata().equals(run_index.INDEX_SCHEMA)
    ok = runs.filter(pc.is_null(runs["error"]))
    assert sorted(ok["id"].to_pylist()) == sorted(good["id"])
    pq.write_table(runs, tmp_path / "runs.parquet", compression="zstd")
    assert pq.read_table(tmp_path / "runs.parquet").equals(runs)


def test_an_index_that_cannot_be_mapped_is_read_instead(ws, monkeypatch):
    import pyarrow as pa

    good = mnb.load_runs(ws, index=False).drop(columns="run")
    mnb.load_runs(ws, index=True)

    def no_mmap(path, *a, **k):  # as on a file system without mmap
        raise OSError(19, "No such device")

    monkeypatch.setattr(pa, "memory_map", no_mmap)
    df = mnb.load_runs(ws)
    stats = df.attrs["index"]
    assert stats.rebuilt is None and stats.parsed == 0 and stats.reused == len(good)
    pd.testing.assert_frame_equal(df.drop(columns="run"), good)


def test_a_write_killed_midway_leaves_no_temporary_file_behind(ws, cache):
    """A process killed while it writes the index (a kernel restarted during a first load) leaves
    its temporary files; the next write of that index removes them, so they do not pile up."""
    import signal
    import subprocess
    import sys

    script = ("import os, signal, sys\n"
              "import machine_nb as mnb\n"
              "os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # killed before the rename\n"
              "mnb.load_runs(sys.argv[1], index=True)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(ws)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    folder = run_index.run_index_path(ws).parent
    assert [p.name for p in folder.glob("*.tmp*")]  # what the killed write left
    df = mnb.load_runs(ws, index=True)
    assert df.attrs["index"].written
    assert sorted(p.name for p in folder.iterdir()) == [run_index.run_index_path(ws).name]
