"""JSONL I/O: errors name file and line; writes are atomic; appends never interleave or merge."""

import json
import multiprocessing as mp
import os
import warnings

import pytest

from machine_nb.errors import MachineFormatError
from machine_nb.core.jsonl import SkippedLines, append_jsonl, iter_jsonl, read_jsonl, write_jsonl


def test_round_trip_and_blank_lines(tmp_path):
    path = write_jsonl([{"a": 1}, {"b": "é"}], tmp_path / "x.jsonl")
    path.write_text(path.read_text() + "\n\n")
    assert read_jsonl(path) == [{"a": 1}, {"b": "é"}]
    assert [n for n, _ in iter_jsonl(path)] == [1, 2]


@pytest.mark.parametrize("raw, line, words", [
    (b'{"a": 1}\n{"a": \n', 2, "invalid JSON"),
    (b'{"a": 1}\n{"a": 2', 2, "truncated last line"),
    (b'{"a": 1}\n{"a": "\xff"}\n', 2, "not UTF-8"),
])
def test_bad_lines_name_file_and_line(tmp_path, raw, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(raw)
    with pytest.raises(MachineFormatError) as err:
        read_jsonl(path)
    assert err.value.line == line and words in str(err.value) and str(path) in str(err.value)


def test_warn_mode_keeps_good_rows_and_lists_skipped(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"a": 1}\nnot json\n{"a": 3}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = read_jsonl(path, on_error="warn")
    assert rows == [{"a": 1}, {"a": 3}]
    assert any(issubclass(w.category, SkippedLines) and f"{path}:2" in str(w.message) for w in caught)


def test_write_is_atomic_on_failure(tmp_path):
    path = write_jsonl([{"keep": True}], tmp_path / "x.jsonl")

    def rows():
        yield {"partial": 1}
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError):
        write_jsonl(rows(), path)
    assert read_jsonl(path) == [{"keep": True}]
    assert [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]  # no temp file left behind


def test_one_atomic_replace_serves_every_rewrite(tmp_path, monkeypatch):
    """atomic_replace is the one rewrite: text files, the run index and a tag store's untag go
    through it, so a failure mid-write leaves the old file and no temp file, and the new file gets
    the mode asked for."""
    import machine_nb.core.jsonl as jsonl
    from machine_nb.core.jsonl import atomic_replace, atomic_write_text
    from machine_nb.store import index, tags

    path = atomic_write_text(tmp_path / "a.txt", "old\n", mode=0o640)
    assert path.read_text() == "old\n" and (path.stat().st_mode & 0o777) == 0o640
    with pytest.raises(RuntimeError):
        with atomic_replace(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("died mid-write")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]

    replaced = []

    def noting(target, **kw):
        replaced.append(os.path.basename(target))
        return atomic_replace(target, **kw)

    monkeypatch.setattr(jsonl, "atomic_replace", noting)
    monkeypatch.setattr(index, "atomic_replace", noting)
    index.write_index(tmp_path / "idx.arrow", index.empty_table(), {"dirs": {}})
    store = tmp_path / "store"
    append_jsonl([{"id": "a", "messages": []}, {"id": "b", "messages": []}], store / "train.jsonl")
    tags.untag("a", store=store)
    assert replaced == ["idx.arrow", "train.jsonl"]
    assert [r["id"] for r in read_jsonl(store / "train.jsonl")] == ["b"]
    assert (store / "train.jsonl").stat().st_mode & 0o777 == 0o600


def test_append_after_torn_line_starts_fresh_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": 1}\n{"torn": ')
    append_jsonl([{"b": 2}], path)
    lines = path.read_bytes().splitlines()
    assert lines == [b'{"a": 1}', b'{"torn": ', b'{"b":2}']


def _append_many(path, worker, n):
    for i in range(n):
        append_jsonl([{"worker": worker, "i": i, "pad": "x" * 5000}], path)


def test_concurrent_appends_lose_nothing(tmp_path):
    path = tmp_path / "c.jsonl"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, w, 100)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    rows = read_jsonl(path)
    assert len(rows) == 400
    assert {(r["worker"], r["i"]) for r in rows} == {(w, i) for w in range(4) for i in range(100)}
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_a_whole_file_document_names_the_line_of_its_error(tmp_path):
    """parse_json on a multi-line document (a results JSON, a manifest) names the line a syntax
    error is on and the line where nesting passes MAX_DEPTH, with the top-level field it is in; a
    single line (a JSONL row, numbered by its reader) gets no line of its own."""
    from machine_nb.core.jsonl import MAX_DEPTH, parse_json

    path = tmp_path / "doc.json"
    with pytest.raises(MachineFormatError, match="invalid JSON") as e:
        parse_json('{\n "model": "m",\n "rows": [\n  {"match": "exact",}\n ]\n}\n', path)
    assert e.value.line == 4 and e.value.path == str(path) and "column" in e.value.reason
    deep = "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)
    for depth_error in ("[" * 100_000 + "]" * 100_000, deep):  # past the recursion limit, and past MAX_DEPTH only
        with pytest.raises(MachineFormatError, match="nested deeper") as e:
            parse_json('{\n "model": "m",\n "rows": [\n  ' + depth_error + '\n ]\n}\n', path)
        assert e.value.line == 4 and e.value.field == "rows"
    with pytest.raises(MachineFormatError, match="nested deeper") as e:
        parse_json('{"session_id": "s", "prompt": ' + deep + "}", None)
    assert e.value.line is None and e.value.field == "prompt" and "'prompt'" in str(e.value)
    with pytest.raises(MachineFormatError) as e:
        parse_json('{"a": }\n', path, 7)  # a JSONL line keeps the number its reader gives it
    assert e.value.line == 7
    with pytest.raises(MachineFormatError) as e:
        parse_json('{"a": }\n', path)
    assert e.value.line is None


def test_writers_take_the_data_first(tmp_path):
    path = tmp_path / "a.jsonl"
    append_jsonl([{"n": 1}], path)
    with pytest.raises(TypeError, match=r"append_jsonl\(rows, path\) takes the rows first"):
        append_jsonl(path, [{"n": 2}])  # swapped: refused, the file untouched
    assert read_jsonl(path) == [{"n": 1}]
    write_jsonl(rows=[{"n": 3}], path=path)
    assert read_jsonl(path) == [{"n": 3}]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_special_file_is_refused_without_blocking(tmp_path, kind):
    """A FIFO (or a link to /dev/zero) named like a JSONL file is refused at once, naming it: every
    reader (`read_jsonl`, `tagged`, eval and training files) goes through iter_jsonl."""
    import subprocess
    import sys

    path = tmp_path / "train.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    code = ("import sys; from machine_nb.core.jsonl import read_jsonl\n"
            "from machine_nb.errors import MachineFormatError\n"
            "try:\n    read_jsonl(sys.argv[1])\nexcept MachineFormatError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert str(path) in out.stdout and "not a regular file" in out.stdout


def test_a_frame_with_missing_cells_is_written_as_json_every_reader_takes(tmp_path):
    """pandas gives every row every column: a row's missing cell (NaN) is left out of its line, not
    written as `NaN` (which strict JSON readers, such as the datasets library's, refuse)."""
    import math

    import pandas as pd

    frame = pd.DataFrame([{"messages": [{"role": "user", "content": "hi"}], "run": "r1", "score": 0.5},
                          {"messages": [{"role": "user", "content": "yo"}]}])
    path = write_jsonl(frame, tmp_path / "lines.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert "NaN" not in path.read_text(encoding="utf-8")
    rows = [json.loads(line, parse_constant=lambda c: math.nan) for line in lines]
    assert rows[0] == {"messages": [{"role": "user", "content": "hi"}], "run": "r1", "score": 0.5}
    assert rows[1] == {"messages": [{"role": "user", "content": "yo"}]}


def test_a_number_json_cannot_hold_is_refused_naming_the_line_and_field_and_nothing_is_written(tmp_path):
    path = write_jsonl([{"keep": True}], tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match=r"line 2.*'scores\.1'.*inf") as info:
        write_jsonl([{"ok": 1}, {"scores": [1.0, float("inf")]}], path)
    assert str(path) in str(info.value)
    assert path.read_text(encoding="utf-8") == '{"keep":true}\n'


def test_writing_over_a_folder_names_it_and_leaves_no_temporary_file(tmp_path):
    folder = tmp_path / "out.jsonl"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match="out.jsonl.*a folder"):
        write_jsonl([{"a": 1}], folder)
    assert list(tmp_path.iterdir()) == [folder] and not list(folder.iterdir())


def test_rewriting_a_file_keeps_its_permission_bits_and_a_new_one_is_private(tmp_path):
    import os
    import stat

    new = write_jsonl([{"a": 1}], tmp_path / "new.jsonl")
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o600
    shared = tmp_path / "shared.jsonl"
    shared.write_text("{}\n")
    os.chmod(shared, 0o644)
    write_jsonl([{"a": 2}], shared)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o644 and json.loads(shared.read_text()) == {"a": 2}


def test_a_last_line_cut_inside_a_character_is_a_truncated_last_line(tmp_path):
    """A file read while a writer appends may end inside a multi-byte character: that is the
    partial last line every reader expects, not a file that is not UTF-8."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":"caf\xc3')
    with pytest.raises(MachineFormatError, match="truncated last line"):
        list(iter_jsonl(path))
    path.write_bytes(b'{"a":1}\n{"b":"caf\xc3(\xa9"}\n')  # a bad byte inside a whole line is still one
    with pytest.raises(MachineFormatError, match="not UTF-8"):
        list(iter_jsonl(path))


def test_a_number_too_long_for_python_is_a_bad_line_naming_the_file_and_line(tmp_path):
    """Python refuses to convert an integer of over 4,300 digits: a bare ValueError with no file,
    from every reader of JSON (a line of a tag store, a run file, a request body)."""
    from machine_nb.core.jsonl import parse_json

    with pytest.raises(MachineFormatError, match=r"x\.json:3: .*4,?300 digits"):
        parse_json(b'{"a": ' + b"1" * 5000 + b"}", "x.json", 3)
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":' + b"9" * 5000 + b"}\n")
    assert [v for _, v in iter_jsonl(path, on_error="skip")] == [{"a": 1}]


def test_a_file_saved_with_a_byte_order_mark_says_how_to_save_it_in_every_reader(tmp_path):
    """Windows editors save "UTF-8 with BOM": the json module's words ("decode using utf-8-sig")
    name a Python call, not the way out for a file."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a":1}\n{"b":2}\n')
    with pytest.raises(MachineFormatError, match=r"x\.jsonl:1: .*byte order mark.*save the file as UTF-8 without"):
        list(iter_jsonl(path))
