"""RunPicker.add_runs: runs that land go on top; filters, sort, selection and the view follow."""

from __future__ import annotations

import pandas as pd

from machine_nb.widgets.run_picker import RunPicker


def frame(ids, machine="support", score=0.5, text="hello"):
    return pd.DataFrame({"id": ids, "machine": [machine] * len(ids), "score": [score] * len(ids),
                         "input": [f"{text} {i}" for i in ids], "output": ["ok"] * len(ids)})


def test_new_runs_go_on_top_and_keep_filters_and_selection():
    picker = RunPicker(frame([f"a{i}" for i in range(30)]), page_size=5)
    picker.select(["a3", "a7"])
    picker.set_filters(text="hello")
    added = picker.add_runs(frame(["n1", "n2"], text="hello"))
    assert added == 2 and len(picker.runs) == 32
    assert picker.page_keys[:2] == ["n1", "n2"]
    assert picker.selected_ids == ["a3", "a7"] and list(picker.selected["id"]) == ["a3", "a7"]
    assert picker.count_line() == "32 runs · 32 match · 2 selected"
    picker.add_runs(frame(["n3"], text="other"))  # filtered out by the text filter
    assert picker.count_line() == "33 runs · 32 match · 2 selected"
    picker.set_filters(text=None)
    assert picker.page_keys[0] == "n3"
    picker.click("n2")
    assert list(picker.selected["id"]) == ["n2"]


def test_several_additions_keep_positions_right():
    picker = RunPicker(frame(["a", "b"]))
    for k in range(5):
        picker.add_runs(frame([f"x{k}", f"y{k}"]))
    keys = list(picker.runs["id"])
    assert keys == ["x4", "y4", "x3", "y3", "x2", "y2", "x1", "y1", "x0", "y0", "a", "b"]
    picker.select(keys)
    assert list(picker.selected["id"]) == keys  # every key finds its row


def test_a_run_written_again_replaces_its_row():
    picker = RunPicker(frame(["a", "b", "c"]))
    picker.select(["b"])
    added = picker.add_runs(frame(["b", "d"], score=1.0))
    assert added == 1 and list(picker.runs["id"]) == ["b", "d", "a", "c"]
    assert picker.runs.loc[picker.runs["id"] == "b", "score"].tolist() == [1.0]
    assert list(picker.selected["id"]) == ["b"]


def test_an_id_seen_on_another_machine_switches_keys_to_machine_and_id():
    picker = RunPicker(frame(["a", "b"]))
    picker.select(["a"])
    picker.add_runs(frame(["a"], machine="coder"))
    assert len(picker.runs) == 3
    assert picker.selected_ids == ["support/a"] and list(picker.selected["machine"]) == ["support"]


def test_prepared_against_an_older_frame_is_made_again():
    picker = RunPicker(frame(["a"]))
    ready = picker.prepare_runs(frame(["x"]))
    picker.add_runs(frame(["y"]))
    assert picker.add_runs(ready) == 1
    assert list(picker.runs["id"]) == ["x", "y", "a"]


def test_nothing_to_add():
    picker = RunPicker(frame(["a"]))
    assert picker.add_runs(frame([])) == 0 and len(picker.runs) == 1
