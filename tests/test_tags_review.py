"""Edge cases of tagging, selecting and exporting: a store path that is a file, ids a JSON writer
escapes, unusable scores, duplicate runs and rows, frames without some columns."""

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import machine_nb as mnb
from machine_nb.data.frames import attach_tags
from machine_nb.errors import MachineFormatError
from machine_nb.store.tags import observe_store

MSGS = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
FP = "rb"
MACHINE = {"name": "m", "rubric": FP, "holdout": []}


def run(id, input="q1", total=1.0, machine="m", **kw):
    r = {"id": id, "machine": machine, "input": input, "output": "a", "model": "x", "harness": "h",
         "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z",
         "trajectory": [{"role": "user", "content": input}, {"role": "assistant", "content": "a"}],
         "scorecard": {"total": total, "rubric": FP, "criteria": {}}}
    r.update(kw)
    return r


def workspace(tmp_path, runs):
    ws = tmp_path / "ws"
    for r in runs:
        folder = ws / ".machine" / "runs" / r["machine"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{r['id']}.json").write_text(json.dumps(r))
    return ws


# ---- the tag store


def test_tagging_into_a_store_path_that_is_a_file_names_it_and_writes_nothing(tmp_path):
    store = tmp_path / "store"
    store.write_text("my notes\n")
    with pytest.raises(MachineFormatError, match="not a folder") as err:
        mnb.tag(MSGS, store=store)
    assert err.value.path == str(store)
    assert store.read_text() == "my notes\n"


@pytest.mark.parametrize("rid", ['case "7"', "back\\slash", "tab\there"])
def test_untag_finds_a_row_whose_id_the_file_spells_with_escapes(tmp_path, rid):
    mnb.tag(MSGS, store=tmp_path, id="keep")
    row = mnb.tag(MSGS, store=tmp_path, id=rid)
    assert mnb.untag(rid, store=tmp_path) == row
    assert list(mnb.tagged(tmp_path)["id"]) == ["keep"]


def test_untag_with_an_id_that_is_not_text_says_so(tmp_path):
    mnb.tag(MSGS, store=tmp_path, id="keep")
    with pytest.raises(TypeError, match="id must be a string"):
        mnb.untag(5, store=tmp_path)
    assert list(mnb.tagged(tmp_path)["id"]) == ["keep"]


# ---- selection


@pytest.mark.parametrize("bad", [float("nan"), True])
def test_a_run_whose_total_is_nan_or_a_bool_is_not_selected(bad):
    runs = [run("r1", total=bad), run("r2", input="q2")]
    assert [r["id"] for r in mnb.select_runs(runs, MACHINE)] == ["r2"]


def test_a_run_listed_twice_is_selected_once_and_leaves_room_for_the_next_best(tmp_path):
    ws = workspace(tmp_path, [run("r1"), run("r2", total=0.9), run("r3", total=0.8)])
    frame = mnb.load_runs(ws)
    twice = pd.concat([frame, frame], ignore_index=True)
    kept = mnb.select_runs(twice, MACHINE, min_score=0.5, best_of=2)
    assert list(kept["id"]) == ["r1", "r2"]
    as_list = mnb.select_runs([run("r1"), run("r1"), run("r2", total=0.9)], MACHINE, min_score=0.5)
    assert [r["id"] for r in as_list] == ["r1", "r2"]


def test_selecting_from_a_frame_without_its_run_column_reads_the_run_files(tmp_path):
    ws = workspace(tmp_path, [run("r1"), run("r2", input="q2", total=0.5)])
    frame = mnb.load_runs(ws).drop(columns=["run"])
    kept = mnb.select_runs(frame, MACHINE)
    assert list(kept["id"]) == ["r1"]
    lines = mnb.training_lines(kept, MACHINE)
    assert [line["run"] for line in lines] == ["r1"]
    assert mnb.messages(frame.iloc[0])["run_id"].tolist() == [frame.iloc[0]["id"]] * 2


# ---- tag rows as training lines


def test_the_same_tagged_turn_in_two_rows_is_one_training_line(tmp_path):
    first = mnb.tag(MSGS, store=tmp_path, id="a1")
    mnb.tag(MSGS, store=tmp_path, id="a2")  # the same turn tagged again
    with open(tmp_path / "train.jsonl", "a") as fh:  # and a row copied in from another store
        fh.write(json.dumps(first) + "\n")
    other = mnb.tag([{"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}], store=tmp_path, id="b")
    lines = mnb.tagged_lines(mnb.tagged(tmp_path))
    assert [line["tag_id"] for line in lines] == ["a1", "b"]
    assert sorted((r["id"], why) for r, why in lines.skipped) == [
        ("a1", "duplicate of tag row 'a1'"), ("a2", "duplicate of tag row 'a1'")]
    assert other["messages"] == lines[1]["messages"]


def test_tagging_into_a_store_that_cannot_be_written_names_the_file(tmp_path):
    (tmp_path / "file").write_text("x")
    store = tmp_path / "file" / "store"  # its folder cannot be made: a file is on the way
    with pytest.raises(MachineFormatError, match="cannot write the tag row") as err:
        mnb.tag(MSGS, store=store)
    assert err.value.path == str(store / "train.jsonl")


# ---- lazy record columns (an indexed load_runs frame, tagged()'s row column)


@pytest.fixture
def indexed(tmp_path):
    ws = workspace(tmp_path, [run(f"r{i}", machine=m, total=0.5 * i) for m in "ab" for i in range(3)])
    return mnb.load_runs(ws, index=True)


def test_where_and_mask_on_an_indexed_frame_keep_and_blank_records(indexed):
    assert indexed["run"].dtype.name == "run_record"
    kept = indexed.where(indexed["machine"] == "a")
    assert [r["id"] if isinstance(r, dict) else None for r in kept["run"]] == [
        i if m == "a" else None for i, m in zip(indexed["id"], indexed["machine"])]
    masked = indexed["run"].mask(indexed["score"] > 0.6)
    assert [r is None for r in masked] == list(indexed["score"] > 0.6)
    blanked = indexed["run"].where(indexed["machine"] == "a", np.nan)  # NaN as the missing value
    assert blanked.isna().tolist() == list(indexed["machine"] != "a")
    assert blanked.notna().sum() == 3 and all(isinstance(r, dict) for r in blanked.dropna())
    grown = indexed.reindex([0, 1, 99])  # a row that is not there is a missing record
    assert grown["run"].isna().tolist() == [False, False, True] and grown["run"].iloc[2] is None
    made = pd.Series(pd.array([indexed["run"].iloc[0], np.nan], dtype="run_record"))
    assert made.isna().tolist() == [False, True]


def test_duplicates_and_uniques_of_a_lazy_column(indexed):
    twice = pd.concat([indexed, indexed], ignore_index=True)
    assert twice.duplicated(subset=["machine", "id", "run"]).tolist() == [False] * 6 + [True] * 6
    assert len(twice.drop_duplicates(subset=["run"])) == 6
    codes, uniques = pd.factorize(twice["run"])
    assert codes.tolist() == list(range(6)) * 2
    assert [u["id"] for u in uniques] == list(indexed["id"])
    assert [u["id"] for u in twice["run"].unique()] == list(indexed["id"])



# ---- held-out cases, ids and times given by the caller


def test_held_out_cases_in_a_frame_without_an_input_column_are_refused_not_ignored():
    runs = [run("r1", input="what is 2+2?"), run("r2", input="q2")]
    cases = pd.DataFrame({"prompt": ["what is 2+2?"]})
    with pytest.raises(ValueError, match=r"no 'input' column.*prompt"):
        mnb.select_runs(runs, MACHINE, exclude=cases)
    with pytest.raises(ValueError, match="no 'input' column"):
        mnb.tagged_lines([{"id": "a", "tag": "good", "messages": MSGS}], exclude=cases)
    with pytest.warns(mnb.HeldOutExcluded, match="left out 1 of 2"):
        kept = mnb.select_runs(runs, MACHINE, exclude=pd.DataFrame({"input": ["What is 2+2? "]}))
    assert [r["id"] for r in kept] == ["r2"]


def test_a_datetime_given_as_created_at_is_written_as_utc_iso_text(tmp_path):
    import datetime as dt

    aware = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    row = mnb.tag(MSGS, store=tmp_path, created_at=aware)
    assert row["created_at"] == "2026-01-02T10:00:00.000Z"
    assert json.loads((tmp_path / "train.jsonl").read_text())["created_at"] == row["created_at"]


def test_a_row_id_that_is_not_text_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError, match="id must be a string"):
        mnb.tag(MSGS, store=tmp_path, id=7)
    assert not (tmp_path / "train.jsonl").exists()


def test_rows_that_name_no_machine_left_out_for_a_machine_are_said(tmp_path):
    machine_rows = tmp_path / "train.jsonl"  # as Machine's /good writes them: no machine, no run
    machine_rows.write_text("".join(json.dumps({"id": f"x{i}", "messages": [
        {"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}], "tag": "good",
        "kind": "final"}) + "\n" for i in range(3)))
    mnb.tag([{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}], store=tmp_path, id="o")
    with pytest.warns(UserWarning, match=r"left out 4 tag row\(s\) that name no machine.*machine=None") as said:
        lines = mnb.tagged_lines(mnb.tagged(tmp_path), {"name": "m"})
    assert lines == [] and len(said) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(mnb.tagged_lines(mnb.tagged(tmp_path))) == 4


def test_untag_removes_every_copy_of_a_row_and_nothing_else(tmp_path):
    first = mnb.tag(MSGS, store=tmp_path, id="dup")
    mnb.tag(MSGS, store=tmp_path, id="keep")
    copy = json.dumps(first) + "\n"
    with open(tmp_path / "train.jsonl", "a") as fh:  # a row copied in twice by hand
        fh.write(copy)
    (tmp_path / "rejected.jsonl").write_text('{"id": "kept", "messages": [], "tag": "bad"}\n' + copy)
    seen = []
    stop = observe_store(lambda store, event, row: seen.append((event, row["id"])))
    try:
        assert mnb.untag("dup", store=tmp_path) == first
    finally:
        stop()
    assert list(mnb.tagged(tmp_path)["id"]) == ["keep", "kept"]
    assert (tmp_path / "rejected.jsonl").read_text() == '{"id": "kept", "messages": [], "tag": "bad"}\n'
    assert seen == [("untag", "dup")] * 3
    with pytest.raises(KeyError):
        mnb.untag("dup", store=tmp_path)


def test_lazy_records_are_read_after_a_change_of_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mnb.tag(MSGS, store="store", id="x")
    workspace(tmp_path, [run("r1")])
    tags = mnb.tagged("store")
    runs = mnb.load_runs("ws", index=True)
    monkeypatch.chdir(tmp_path / "ws")  # a notebook's %cd
    assert tags["row"].iloc[0]["id"] == "x"
    assert runs["run"].iloc[0]["id"] == "r1"
    assert Path(runs["path"].iloc[0]).is_absolute()


def test_a_lazy_tag_row_whose_store_file_is_gone_names_it(tmp_path):
    mnb.tag(MSGS, store=tmp_path, id="x")
    tags = mnb.tagged(tmp_path)
    (tmp_path / "train.jsonl").unlink()
    with pytest.raises(MachineFormatError, match="call tagged\\(\\) again") as err:
        tags["row"].iloc[0]
    assert err.value.path == str(tmp_path / "train.jsonl")


def test_attaching_tags_to_a_frame_without_machine_or_id_names_what_is_missing(tmp_path):
    mnb.tag(MSGS, store=tmp_path / "store", id="x")
    frame = pd.DataFrame({"id": ["r1"], "score": [1.0]})
    with pytest.raises(ValueError, match=r"needs the columns 'machine' and 'id'.*missing 'machine'"):
        attach_tags(frame, tmp_path / "store")


@pytest.mark.parametrize("bad", [float("nan"), "0.5", None, True])
def test_a_min_score_that_is_not_a_number_is_refused(tmp_path, bad):
    frame = mnb.load_runs(workspace(tmp_path, [run("r1")]))
    for runs in (frame, [run("r1")]):
        with pytest.raises(ValueError, match="min_score must be a number"):
            mnb.select_runs(runs, MACHINE, min_score=bad)


def test_a_list_of_frame_rows_exports_like_the_frame(tmp_path):
    frame = mnb.load_runs(workspace(tmp_path, [run("r1"), run("r2", input="q2")]), index=True)
    rows = [row for _, row in frame.iterrows()]
    assert mnb.training_lines(rows, MACHINE) == mnb.training_lines(frame, MACHINE)
    assert len(mnb.training_lines(rows, MACHINE)) == 2
    assert mnb.messages(rows).equals(mnb.messages(frame))
    assert [r["id"] for r in mnb.select_runs(rows, MACHINE)] == list(frame["id"])


def test_a_store_view_is_told_the_store_as_a_resolved_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen = []
    stop = observe_store(lambda store, event, row: seen.append((store, event)))
    try:
        row = mnb.tag(MSGS, store="store")
        mnb.untag(row["id"], store="store")
    finally:
        stop()
    assert seen == [((tmp_path / "store").resolve(), "tag"), ((tmp_path / "store").resolve(), "untag")]


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_a_runs_frame_saved_and_read_back_selects_and_exports(tmp_path, form):
    frame = mnb.load_runs(workspace(tmp_path, [run("r1"), run("r2", input="q2", total=0.5)]), index=True)
    saved = tmp_path / f"runs.{form}"
    if form == "csv":
        frame.to_csv(saved, index=False)
        back = pd.read_csv(saved)
    else:
        frame.to_parquet(saved)
        back = pd.read_parquet(saved)
    kept = mnb.select_runs(back, MACHINE)
    assert list(kept["id"]) == ["r1"]
    assert [line["run"] for line in mnb.training_lines(kept, MACHINE)] == ["r1"]
    with pytest.raises(ValueError, match=r"row 0 .*not a Run record.*path"):
        mnb.load_records(back.drop(columns=["path"]))


def test_an_indexed_runs_frame_saves_to_parquet_and_keeps_what_the_index_did(tmp_path):
    frame = mnb.load_runs(workspace(tmp_path, [run("r1")]), index=True)
    frame.to_parquet(tmp_path / "runs.parquet")  # pandas writes attrs as JSON
    assert frame.attrs["index"].parsed == 1 and frame.attrs["index"]["files"] == 1
    assert pd.read_parquet(tmp_path / "runs.parquet").attrs["index"]["parsed"] == 1


def test_a_lazy_row_without_an_id_is_never_read_as_another_row_after_an_untag(tmp_path):
    mnb.tag(MSGS, store=tmp_path, id="x")
    with open(tmp_path / "train.jsonl", "a") as fh:  # rows without an id, as Machine may list them "(no id)"
        for text in ("first", "second"):
            fh.write(json.dumps({"messages": [{"role": "user", "content": text},
                                              {"role": "assistant", "content": "a"}], "tag": "good"}) + "\n")
    tags = mnb.tagged(tmp_path)
    assert list(tags["id"]) == ["x", "(no id)", "(no id)"]
    assert tags["row"].iloc[1]["messages"][0]["content"] == "first"
    mnb.untag("x", store=tmp_path)  # every later line moves up one
    with pytest.raises(MachineFormatError, match="call tagged\\(\\) again"):
        tags["row"].iloc[1]
    assert mnb.tagged(tmp_path)["row"].iloc[0]["messages"][0]["content"] == "first"


def test_a_tag_row_python_reads_but_orjson_does_not_is_read_by_the_row_column(tmp_path):
    (tmp_path / "train.jsonl").write_text(
        '{"id": "n", "messages": [], "tag": "good", "score": NaN, "seq": 123456789012345678901234567890}\n'
        '{"messages": [], "tag": "good", "score": Infinity}\n')
    rows = list(mnb.tagged(tmp_path)["row"])
    assert rows[0]["seq"] == 123456789012345678901234567890 and math.isnan(rows[0]["score"])
    assert rows[1]["score"] == math.inf


def test_a_trace_whose_tool_calls_are_not_in_chat_shape_names_the_message(tmp_path):
    chat = [{"role": "user", "content": "w?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "get", "arguments": "{}"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(ValueError, match=r"message 1.*tool_calls\[0\].*function"):
        mnb.tag(chat, trace=True, store=tmp_path)
    assert not (tmp_path / "traces.jsonl").exists()


def test_a_store_and_a_workspace_given_under_home_as_tilde_are_the_home_folders(tmp_path, monkeypatch):
    """Machine's stores live under ~/.machine: `store="~/.machine/p"` is that folder, as a shell reads
    it, never a folder named "~" in the working directory; a workspace given as "~/ws" likewise."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    ws = workspace(home, [run("r1")])
    row = mnb.tag(MSGS, "good", store="~/.machine/p")
    assert (home / ".machine" / "p" / "train.jsonl").is_file() and not (cwd / "~").exists()
    assert list(mnb.tagged("~/.machine/p")["id"]) == [row["id"]]
    runs = mnb.load_runs("~/ws", store="~/.machine/p", index=False)
    assert list(runs["id"]) == ["r1"] and Path(runs["path"].iloc[0]).is_relative_to(ws)
    assert mnb.untag(row["id"], store="~/.machine/p")["id"] == row["id"]
    assert not (cwd / "~").exists()


def test_a_held_out_case_whose_input_is_missing_is_named_not_read_as_the_text_nan():
    """A held-out frame's empty input cell (NaN) became the case "nan": a case left out that no one
    wrote, and a training row whose text is "nan" held out by it."""
    from machine_nb.data.export import held_out_keys

    frame = pd.DataFrame({"input": ["What is 2+2?", None, float("nan")]})
    with pytest.raises(ValueError, match=r"held-out case 1 .*no input"):
        held_out_keys(frame)
    with pytest.raises(ValueError, match=r"held-out case 0 .*no input"):
        held_out_keys([{"input": None}])


def test_a_held_out_case_is_held_out_however_unicode_spells_its_input():
    """validate compares prompts with Unicode spelling set aside (NFKC, invisible characters, case
    folded); the held-out rule for training rows did not: "Café?" written as e + accent, or with a
    zero-width space, was trained on though "café?" is a held-out case."""
    from machine_nb.data.export import case_key, held_out_keys

    held = held_out_keys(["Café? ", "Straße"])
    for spelled in ("Cafe\u0301?", "caf\u200bé?", "CAFÉ?", "STRASSE"):
        assert case_key(spelled) in held, spelled
