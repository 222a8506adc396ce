"""The widgets as a user drives them: a second press on a turn already tagged, Undo after another
process removed the row, a picker given a string where a list goes, tags read back from parquet,
runs that land while a tagger lends its store, a secret in a tool result, a huge tool output, and
an example shown past the previewer's filter.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from machine_nb.store.tags import tag, tagged
from machine_nb.widgets.cards import chat_cards
from machine_nb.widgets.previewer import ExamplePreviewer
from machine_nb.widgets.run_picker import RunPicker
from machine_nb.widgets.tagger import Tagger


def make_run(rid: str, *, machine: str = "m", user: str = "q", answer: str = "a") -> dict:
    return {"id": rid, "machine": machine, "history": [],
            "trajectory": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def runs_frame(ids, **kwargs) -> pd.DataFrame:
    runs = [make_run(i, **kwargs) for i in ids]
    return pd.DataFrame({"id": list(ids), "machine": [r["machine"] for r in runs],
                         "input": [r["trajectory"][0]["content"] for r in runs],
                         "output": [r["trajectory"][1]["content"] for r in runs], "run": runs})


def store_rows(store) -> list[dict]:
    rows = []
    for f in sorted(store.glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


# ---- Tagger


def test_a_double_click_on_good_writes_one_row_when_the_texts_end_in_a_newline(tmp_path):
    """A user message typed with Enter ends in "\\n"; the row tag() writes keeps the text trimmed
    (as Machine does). The second press of a double click still finds the row of this turn and
    only warns, so one row is written, and the turn is listed as "this turn"."""
    store = tmp_path / "store"
    t = Tagger(runs_frame(["r1"], user="What is 2+2?\n", answer="4\n\n"), store=store)
    t._b_good.click()
    t._b_good.click()  # the double click's second press
    assert len(store_rows(store)) == 1
    assert [r["this_turn"] for r in t.existing_tags()] == [True]
    assert "press Good again" in t._status.value


def test_a_rewrite_of_a_reply_ending_in_a_newline_counts_as_this_turns_row(tmp_path):
    store = tmp_path / "store"
    t = Tagger(runs_frame(["r1"], answer="four\n"), store=store)
    t.good_with_rewrite("4")
    assert [r["this_turn"] for r in t.existing_tags()] == [True]


def test_undo_after_another_process_removed_the_row_goes_on_to_the_row_before(tmp_path):
    """Another process (Machine's /untag, an editor) removed the newest row this tagger wrote: the
    first Undo says the row is gone and forgets it; the next Undo removes the row before it,
    instead of failing on the missing row forever."""
    store = tmp_path / "store"
    t = Tagger(runs_frame(["r1", "r2"]), store=store)
    first = t.good()
    t.next_run()
    second = t.good()
    path = store / "train.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines() if second["id"] not in line))
    t._b_undo.click()
    assert "no longer in the store" in t._status.value and second["id"] in t._status.value
    assert [r["id"] for r in t.written] == [first["id"]]
    t._b_undo.click()
    assert t.written == [] and store_rows(store) == []
    assert f"removed row {first['id']}" in t._status.value


# ---- RunPicker: a string where a list goes


def test_picker_select_takes_one_key_as_a_string():
    p = RunPicker(pd.DataFrame({"id": ["r1", "r2"]}))
    p.select("r2")
    assert p.selected_ids == ["r2"]


def test_picker_set_filters_takes_one_machine_as_a_string_and_names_unknown_values():
    p = RunPicker(pd.DataFrame({"id": ["x", "y", "z"], "machine": ["calc", "web", "calc"]}))
    p.set_filters(machine="calc")
    assert p.filtered["id"].tolist() == ["x", "z"]
    with pytest.raises(ValueError, match=r"machine.*'mail'.*calc.*web"):
        p.set_filters(machine=["mail"])
    assert p.filtered["id"].tolist() == ["x", "z"]  # the refused filter changed nothing


def test_picker_show_columns_takes_one_column_as_a_string():
    p = RunPicker(pd.DataFrame({"id": ["r1"], "score": [0.5]}))
    p.show_columns("score")
    assert p.columns == ["score"]


# ---- RunPicker: tags as arrays (a frame read back from parquet)


def test_picker_reads_a_tags_column_of_arrays_as_parquet_gives_it(tmp_path):
    frame = pd.DataFrame({"id": ["a", "b", "c"], "tags": [["good", "bad"], [], ["good"]]})
    frame.to_parquet(tmp_path / "runs.parquet")
    back = pd.read_parquet(tmp_path / "runs.parquet")
    assert isinstance(back["tags"].iloc[0], np.ndarray)
    p = RunPicker(back, sort_by="tags")
    assert [r["tags"] for r in p._table.rows] == ["", "good", "good, bad"]
    p.set_filters(tag="good")
    assert sorted(p.filtered["id"]) == ["a", "c"]
    p.set_filters(tag="(untagged)")
    assert p.filtered["id"].tolist() == ["b"]


# ---- RunPicker and Tagger sharing a store while runs land


def test_runs_added_to_a_picker_that_follows_a_store_carry_their_tags_and_follow_new_ones(tmp_path):
    """A dashboard adds runs as they land (load_runs rows, no `tags` column) to a picker whose
    tagger lent it its store: the new rows get their tags from the store, and a tag made later
    shows on them (no "a view of the tag store failed" warning)."""
    store = tmp_path / "store"
    tag(make_run("c"), store=store)  # tagged before the picker saw the run
    p = RunPicker(runs_frame(["a", "b"]), store=store)
    p.add_runs(runs_frame(["c", "d"]))
    assert dict(zip(p.runs["id"], p.runs["tags"])) == {"a": [], "b": [], "c": ["good"], "d": []}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tag(make_run("d"), tag="bad", store=store)
    assert dict(zip(p.runs["id"], p.runs["tags"]))["d"] == ["bad"]
    p.set_filters(tag="bad")
    assert p.filtered["id"].tolist() == ["d"]


# ---- cards


def test_cards_redact_a_secret_a_tool_printed(monkeypatch):
    """An agent ran `env`: the key in the tool result never reaches the card's HTML (which a saved
    notebook keeps)."""
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    messages = [{"role": "user", "content": "what is set?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "function": {"name": "sh", "arguments": json.dumps({"cmd": f"echo {key}"})}}]},
                {"role": "tool", "tool_call_id": "c1", "content": f"TINKER_API_KEY={key}\nsk-abcdefghijklmnopqrstuvwx"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": f"the key is {key}"},
                                                  {"type": "text", "text": "done"}]}]
    html = chat_cards(messages)
    assert key not in html and "sk-abcdefghijklmnopqrstuvwx" not in html
    assert "[redacted]" in html and "TINKER_API_KEY=" in html and "done" in html


def test_a_huge_tool_output_is_cut_in_its_card():
    """A tool that printed 5 MB: the card keeps a bounded amount of it, and says how much is left out."""
    from machine_nb.widgets import cards

    big = "\n".join(f"line {i} " + "x" * 60 for i in range(80_000))
    html = chat_cards([{"role": "tool", "content": big}])
    assert len(html) < 2 * cards.FOLD_MAX_CHARS
    assert f"{len(big) - cards.FOLD_MAX_CHARS:,} more characters not shown" in html
    assert "line 0 " in html and "line 79999" not in html


# ---- ExamplePreviewer


def test_showing_an_example_the_filter_hides_clears_the_filter():
    lines = [{"messages": [{"role": "user", "content": "alpha"}, {"role": "assistant", "content": "one"}]},
             {"messages": [{"role": "user", "content": "beta"}, {"role": "assistant", "content": "two"}]}]
    p = ExamplePreviewer(lines)
    p.set_filter("beta")
    assert p.matches == [1]
    p.show(0)
    assert p.current == 0 and p.filter_text == "" and p.position == 0
    assert p.summary().startswith("ExamplePreviewer: example 1/2")


def test_the_tagger_redacts_a_secret_in_the_turn_it_shows(tmp_path, monkeypatch):
    """The turn on screen (user text, tool steps, answer) and the recent list never carry a key
    into the tagger's HTML, which the saved notebook keeps; the row written keeps the run's text."""
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    run = {"id": "r1", "machine": "m", "history": [], "trajectory": [
        {"role": "user", "content": f"is {key} set?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "env", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": f"TINKER_API_KEY={key}"},
        {"role": "assistant", "content": f"yes: {key}"}]}
    t = Tagger([run], store=tmp_path / "store")
    row = t.good()
    html = t.static_html() + t._turn_view.value + t._recent.value
    assert key not in html and "[redacted]" in html and "TINKER_API_KEY=" in html
    assert row["messages"][-1]["content"] == f"yes: {key}"


def test_a_tagger_refuses_at_once_a_picker_whose_frame_has_no_run_records(tmp_path):
    """A picker over columns picked from load_runs (no `run`): the Tagger says so when it is made,
    instead of every later click in the picker failing inside the picker's own handler."""
    p = RunPicker(pd.DataFrame({"id": ["a", "b"], "machine": "m"}))
    with pytest.raises(ValueError, match=r"`run` column"):
        Tagger(p, store=tmp_path / "store")
    p.click("a")  # the picker goes on working
    assert p.selected_ids == ["a"]


def test_an_infinite_score_leaves_the_score_slider_usable_and_is_kept_at_the_open_end():
    """A run scored inf (or -inf): the slider spans the finite scores (a range to inf has no usable
    step in the browser), and a handle left at its end keeps the infinite scores beyond it."""
    p = RunPicker(pd.DataFrame({"id": ["a", "b", "c", "d"], "score": [0.1, 0.5, np.inf, -np.inf]}))
    s = p.controls["score"]
    assert (s.min, s.max) == (0.1, 0.5) and np.isfinite(s.step) and s.step > 0
    assert p.filters == {} and len(p.filtered) == 4
    p.set_filters(score=(0.3, 0.5))
    assert sorted(p.filtered["id"]) == ["b", "c"]
    p.set_filters(score=(0.1, 0.3))
    assert sorted(p.filtered["id"]) == ["a", "d"]


def test_the_picker_shows_a_secret_in_a_runs_output_redacted(monkeypatch):
    """A run whose answer quotes a key: the table's cells, their hover text and the picker's saved
    static HTML show it redacted; `.selected` keeps the frame's own value."""
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    out = f"your key is {key} " + "and more words " * 20
    p = RunPicker(pd.DataFrame({"id": ["a"], "output": [out]}))
    p.select(["a"])
    seen = json.dumps(p._table.rows) + p.static_html()
    assert key not in seen and "[redacted]" in seen
    assert p.selected["output"].iloc[0] == out


def test_tagger_go_to_finds_a_run_by_its_id_as_text_when_the_frame_holds_numbers(tmp_path):
    """Ids read from a CSV are numbers: go_to("7") finds run 7, as the picker's keys (text) name it."""
    frame = runs_frame(["5", "7"])
    frame["id"] = [5, 7]
    t = Tagger(frame, store=tmp_path / "store")
    t.go_to("7")
    assert t.current["run"] == 1


def test_unpicking_another_run_keeps_the_turn_note_and_rewrite_on_screen(tmp_path):
    """The tagger follows a picker; the user is on an earlier turn of run a, halfway through a note
    and a rewrite, and unpicks run b: run a stays on screen as it was (turn, note, rewrite)."""
    def two_turns(rid):
        return {"id": rid, "machine": "m", "history": [{"role": "user", "content": "first"},
                                                       {"role": "assistant", "content": "one"}],
                "trajectory": [{"role": "user", "content": "second"}, {"role": "assistant", "content": "two"}]}

    runs = [two_turns(r) for r in ("a", "b")]
    p = RunPicker(pd.DataFrame({"id": ["a", "b"], "machine": "m", "run": runs}))
    p.select(["a", "b"])
    t = Tagger(p, store=tmp_path / "store")
    assert t.current["run_id"] == "a"
    t.prev_turn()
    t.note.value, t.rewrite.value = "half a note", "half a rewrite"
    p.click("b", toggle=True)  # unpick b
    assert t.current["run_id"] == "a" and t.current["turn"] == 0
    assert (t.note.value, t.rewrite.value) == ("half a note", "half a rewrite")


def test_a_key_across_the_cut_of_a_tool_step_shows_no_part_of_itself(tmp_path, monkeypatch):
    """A tool step is shown cut short; a key that straddles the cut is redacted whole, not shown
    up to the cut."""
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    run = {"id": "r1", "machine": "m", "history": [], "trajectory": [
        {"role": "user", "content": "env?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "env", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 290 + key + "y" * 100},
        {"role": "assistant", "content": "done"}]}
    t = Tagger([run], store=tmp_path / "store")
    assert key[:8] not in t._turn_view.value and "more characters not shown" in t._turn_view.value


def test_existing_tags_are_read_again_when_another_process_rewrites_the_store_mid_read(tmp_path, monkeypatch):
    """tagged() lists the store, then its rows are read from their lines; another process's untag
    lands in between (the lines shift). The tagger reads the store again instead of giving up on
    existing tags for the rest of the session (which would also let a double press write twice)."""
    import machine_nb.store.tags as tags_module

    store = tmp_path / "store"
    other = tag(make_run("r0"), store=store)
    mine = tag(make_run("r1"), store=store)
    real, calls = tags_module.tagged, []

    def tagged_then_untag_elsewhere(*args, **kwargs):
        frame = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:  # another process removes r0's row right after the listing
            path = store / "train.jsonl"
            path.write_text("".join(line + "\n" for line in path.read_text().splitlines() if other["id"] not in line))
        return frame

    monkeypatch.setattr(tags_module, "tagged", tagged_then_untag_elsewhere)
    t = Tagger(runs_frame(["r1"]), store=store)
    assert [r["id"] for r in t.existing_tags()] == [mine["id"]]
    assert "could not read" not in t._status.value
    t._b_good.click()  # the turn is tagged already: a press only warns
    assert len(store_rows(store)) == 1


def test_a_run_file_gone_since_loading_is_shown_as_unreadable_and_the_picker_click_still_works(tmp_path):
    """load_runs with the index reads each run from its file when shown; the file of run b was
    removed since. Picking b in the picker does not fail the click: the tagger names the file it
    could not read, refuses to tag that run, and the next run tags as usual."""
    import os
    import sys
    from pathlib import Path

    import machine_nb as mnb

    sys.path.insert(0, str(Path(__file__).parent))
    from dashboard_writer import write_run

    runs_dir = str(tmp_path / "ws" / ".machine" / "runs")
    write_run(runs_dir, "m", "a")
    gone = write_run(runs_dir, "m", "b")
    runs = mnb.load_runs(tmp_path / "ws", index=True)
    os.remove(gone)
    p = RunPicker(runs)
    t = Tagger(p, store=tmp_path / "store")
    p.click("b")
    assert p.selected_ids == ["b"] and t.current["run_id"] == "b"
    assert "could not read run b" in t._turn_view.value and "b.json" in t._turn_view.value
    t._b_good.click()
    assert "could not read run b" in t._status.value and not (tmp_path / "store").exists()
    p.click("a", toggle=True)
    assert t.current["run_id"] == "a"
    t._b_good.click()
    assert [r["run"] for r in store_rows(tmp_path / "store")] == ["a"]
