"""Tagger: turns of a run, Good / Bad / rewrite rows land in the real tag store via tag(), undo removes only its own row."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from machine_nb.store.tags import tag, tagged
from machine_nb.widgets.tagger import Tagger, split_turns, turn_run


def make_run(i: int, turns: int = 2) -> dict:
    """A Machine Run: earlier turns in history, the run's own turn (with a tool call) in trajectory."""
    history = []
    for t in range(turns - 1):
        history += [{"role": "user", "content": f"q{i}.{t}"}, {"role": "assistant", "content": f"a{i}.{t}"}]
    trajectory = [
        {"role": "user", "content": f"What is {i} + {i}?"},
        {"role": "assistant", "content": "", "name": "calc", "toolCallId": f"c{i}", "toolInput": {"expr": f"{i}+{i}"}},
        {"role": "tool", "content": str(2 * i), "name": "calc", "toolCallId": f"c{i}"},
        {"role": "assistant", "content": f"The answer is {2 * i}."},
    ]
    return {"id": f"run{i}", "machine": "arith", "model": "local/arith-tiny", "input": f"What is {i} + {i}?",
            "output": f"The answer is {2 * i}.", "history": history, "trajectory": trajectory}


def runs_frame(n: int = 3) -> pd.DataFrame:
    runs = [make_run(i) for i in range(n)]
    return pd.DataFrame({"id": [r["id"] for r in runs], "machine": "arith", "run": runs})


def store_rows(store) -> list[dict]:
    rows = []
    for f in sorted(store.glob("*.jsonl")):
        rows += [dict(json.loads(line), _file=f.name) for line in f.read_text().splitlines()]
    return rows


def test_split_turns_finds_user_turns_answers_and_tool_steps():
    run = make_run(4)
    msgs = run["history"] + run["trajectory"]
    turns = split_turns(msgs)
    assert [(t["start"], t["end"], t["user"], t["answer"]) for t in turns] == [
        (0, 2, "q4.0", "a4.0"), (2, 6, "What is 4 + 4?", "The answer is 8.")]
    assert [m["role"] for m in turns[1]["steps"]] == ["assistant", "tool"]  # the call and its result
    assert split_turns([{"role": "user", "content": "hi"}])[0]["answer_index"] is None
    assert split_turns([])[0]["answer"] == ""
    cut = turn_run(run, msgs, turns[0])
    assert cut["id"] == "run4" and cut["trajectory"] == msgs[0:2] and cut["history"] == []


def test_buttons_write_rows_exactly_as_tag_does(tmp_path):
    store = tmp_path / "store"
    t = Tagger(runs_frame(), store=store)
    assert t.current["run_id"] == "run0" and t.current["turn"] == 1  # opens on the run's own turn
    t.note.value = "clean"
    t._b_good.click()
    t.next_run()
    t._b_bad.click()
    t.prev_turn()  # an earlier turn of run1
    t.rewrite.value = "a1.0 (fixed)"
    t._b_rewrite.click()
    rows = store_rows(store)
    assert [(r["_file"], r["tag"], r["run"], r["messages"]) for r in rows] == [
        ("rejected.jsonl", "bad", "run1", [{"role": "user", "content": "What is 1 + 1?"},
                                          {"role": "assistant", "content": "The answer is 2."}]),
        ("train.jsonl", "good", "run0", [{"role": "user", "content": "What is 0 + 0?"},
                                        {"role": "assistant", "content": "The answer is 0."}]),
        ("train.jsonl", "good", "run1", [{"role": "user", "content": "q1.0"},
                                        {"role": "assistant", "content": "a1.0 (fixed)"}]),
    ]
    assert rows[1]["note"] == "clean" and "note" not in rows[0] and rows[2]["rewritten"] is True
    # the same keys and values tag() itself writes for the same turn (ids and times aside)
    direct = tag(make_run(0), "good", note="clean", store=tmp_path / "direct", id=rows[1]["id"],
                 created_at=rows[1]["created_at"])
    assert direct == {k: v for k, v in rows[1].items() if k != "_file"}
    assert list(tagged(store)["id"]) == [rows[1]["id"], rows[2]["id"], rows[0]["id"]]
    assert [r["tag"] for r in t.recent_rows()] == ["good", "bad", "good"]  # newest first
    assert t.recent_rows()[0]["preview"] == "a1.0 (fixed)" and t.note.value == "" and t.rewrite.value == ""


def test_undo_removes_only_this_widgets_last_row(tmp_path):
    store = tmp_path / "store"
    other = tag(make_run(9), "good", note="someone else", store=store)  # written by another tool
    t = Tagger(runs_frame(2), store=store)
    first = t.good()
    with pytest.warns(UserWarning, match="already tagged good"):  # the same turn twice, on purpose
        second = t.good("second")
    also_other = tag(make_run(8), "good", store=store)  # interleaved foreign row, newer than ours
    assert t.undo() == second
    ids = [r["id"] for r in store_rows(store)]
    assert ids == [other["id"], first["id"], also_other["id"]]
    assert t.undo() == first
    assert t.undo() is None and t._status.value == "nothing to undo"
    assert [r["id"] for r in store_rows(store)] == [other["id"], also_other["id"]]
    assert t._b_undo.disabled


def test_errors_show_in_the_widget_not_as_tracebacks(tmp_path):
    run = make_run(1)
    run["trajectory"] = [{"role": "user", "content": "unanswered"}]
    t = Tagger([run], store=tmp_path)
    t._b_good.click()
    assert "no assistant answer" in t._status.value and not list(tmp_path.glob("*.jsonl"))
    t._b_rewrite.click()  # empty rewrite
    assert "rewrite is empty" in t._status.value
    t.rewrite.value = "It is unanswerable."
    t._b_rewrite.click()
    assert store_rows(tmp_path)[0]["messages"][-1] == {"role": "assistant", "content": "It is unanswerable."}
    with pytest.raises(ValueError, match="`run` column"):
        Tagger(pd.DataFrame({"id": ["x"]}))
    with pytest.raises(ValueError, match="no runs"):
        Tagger([])


def test_rewrite_rows_record_the_reply_they_replaced_and_none_for_an_unanswered_turn(tmp_path):
    """`replaced` is the reply a rewrite set aside (what a preference pair rejects): the turn's
    own answer when it had one, and no key at all when it had none."""
    from machine_nb.store.tags import REPLACED

    answered = make_run(1)
    unanswered = make_run(2, turns=1)
    unanswered["trajectory"] = [{"role": "user", "content": "What is 2 + 2?"}]
    t = Tagger([answered, unanswered], store=tmp_path)
    t.rewrite.value = "answer: 2"
    t._b_rewrite.click()
    t.next_run()
    t.rewrite.value = "answer: 4"
    t._b_rewrite.click()
    rows = {r["run"]: r for r in store_rows(tmp_path)}
    assert rows["run1"][REPLACED] == "The answer is 2." and rows["run1"]["messages"][-1]["content"] == "answer: 2"
    assert REPLACED not in rows["run2"]
    assert rows["run2"]["messages"] == [{"role": "user", "content": "What is 2 + 2?"},
                                        {"role": "assistant", "content": "answer: 4"}]
    assert rows["run2"]["rewritten"] is True and rows["run2"]["machine"] == "arith"
    assert [r["id"] for r in t.written] == [rows["run1"]["id"], rows["run2"]["id"]]
    assert {p.name for p in tmp_path.iterdir() if not p.name.startswith(".")} == {"train.jsonl"}
    assert t.undo()["id"] == rows["run2"]["id"] and [r["run"] for r in store_rows(tmp_path)] == ["run1"]


def test_navigation_and_static_fallback(tmp_path):
    t = Tagger(runs_frame(3), store=tmp_path)
    t.go_to("run2")
    assert t.current["run"] == 2 and t._b_next_run.disabled and not t._b_prev_run.disabled
    t.next_run()
    assert t.current["run"] == 2  # stays on the last
    t.go_to(0, turn=0)
    assert t.current["user"] == "q0.0" and t._b_prev_turn.disabled
    t.next_turn()
    t.next_turn()
    assert t.current["turn"] == 1
    with pytest.raises(KeyError):
        t.go_to("nope")
    t.bad("wrong <b>format</b>")
    bundle = t._repr_mimebundle_()
    assert bundle["text/plain"] == "Tagger: run 1 of 3, turn 2 of 2, 1 tagged here"
    page = bundle["text/html"]
    assert "What is 0 + 0?" in page and "The answer is 0." in page and "2 step(s) before the answer" in page
    assert "wrong &lt;b&gt;format&lt;/b&gt;" in page and "<b>format</b>" not in page


def test_a_tagged_turn_shows_its_tags_and_a_duplicate_needs_a_second_click(tmp_path):
    store = tmp_path / "store"
    tag(make_run(0), "good", note="from the CLI", store=store)  # tagged before the widget opened
    t = Tagger(runs_frame(2), store=store)
    assert "already tagged" in t.static_html() and "from the CLI" in t.static_html()
    assert [r["tag"] for r in t.existing_tags()] == ["good"] and t.existing_tags()[0]["this_turn"]
    t._b_good.click()  # a duplicate: warned, nothing written
    assert len(store_rows(store)) == 1
    assert "already tagged good" in t._status.value and "again" in t._status.value
    t._b_good.click()  # the confirming second click writes it
    assert len(store_rows(store)) == 2 and "wrote good row" in t._status.value
    t.prev_turn()  # another turn of the same run: its tags are shown, no confirm needed there
    assert not [r for r in t.existing_tags() if r["this_turn"]] and "already tagged" in t.static_html()
    t._b_bad.click()
    assert len(store_rows(store)) == 3
    t.next_run()  # run1 has no tags
    assert t.existing_tags() == [] and "already tagged" not in t.static_html()
    t._b_good.click()
    assert len(store_rows(store)) == 4
    with pytest.warns(UserWarning, match="already tagged good"):  # the Python method writes, and warns
        t.good()
    assert len(store_rows(store)) == 5
    t.undo()  # an undone row no longer counts as a tag
    assert len([r for r in t.existing_tags() if r["this_turn"]]) == 1


def test_turns_that_repeat_a_user_text_are_told_apart_by_their_reply(tmp_path):
    """"continue" twice in one run: a tag of the first turn is not this turn's on the second, so the
    second is tagged with no confirming click, and each turn shows its own tag."""
    store = tmp_path / "store"
    run = {"id": "run9", "machine": "arith", "history": [
        {"role": "user", "content": "continue"}, {"role": "assistant", "content": "answer: 1"}],
        "trajectory": [{"role": "user", "content": "continue"}, {"role": "assistant", "content": "answer: 2"}]}
    t = Tagger(pd.DataFrame({"id": ["run9"], "machine": "arith", "run": [run]}), store=store)
    t.prev_turn()
    assert t.current["turn"] == 0
    t._b_good.click()
    t.next_turn()
    assert [r["this_turn"] for r in t.existing_tags()] == [False] and "already tagged" in t.static_html()
    t._b_bad.click()  # no duplicate here: written at once
    assert sorted(r["tag"] for r in store_rows(store)) == ["bad", "good"]
    assert [(r["tag"], r["this_turn"]) for r in t.existing_tags()] == [("good", False), ("bad", True)]
    t.prev_turn()
    assert [(r["tag"], r["this_turn"]) for r in t.existing_tags()] == [("good", True), ("bad", False)]
    with pytest.warns(UserWarning, match="already tagged good"):  # a rewrite of it belongs to it too
        t.good_with_rewrite("answer: 3")
    assert [(r["tag"], r["this_turn"]) for r in t.existing_tags()][-1] == ("good", True)


def test_tags_of_the_same_id_on_another_machine_do_not_count(tmp_path):
    store = tmp_path / "store"
    other = {**make_run(0), "machine": "other"}
    tag(other, "good", store=store)
    t = Tagger(runs_frame(1), store=store)
    assert t.existing_tags() == []
    t._b_good.click()
    assert len(store_rows(store)) == 2  # written at once: no duplicate on this machine


def test_tagger_follows_a_run_picker(tmp_path):
    import machine_nb as mnb

    frame = runs_frame(4)
    picker = mnb.RunPicker(frame)
    t = Tagger(picker, store=tmp_path / "store")
    assert "Select runs in the picker" in t.static_html() and t._b_good.disabled
    picker.click("run2")
    assert t.current["run_id"] == "run2" and not t._b_good.disabled
    t.good()
    picker.click("run3", toggle=True)
    assert t.current["run_id"] == "run3" and "run 2 of 2" in t.static_html()  # the newly picked run
    assert "1 tagged here" in t.summary()
    picker.clear_selection()
    with pytest.raises(ValueError, match="no run"):
        t.good()
    other = Tagger(frame, store=tmp_path / "store")
    other.link(picker)
    picker.click("run1")
    assert other.current["run_id"] == "run1" and t.current["run_id"] == "run1"


def test_a_closed_tagger_stops_following_its_picker(tmp_path):
    import machine_nb as mnb

    picker = mnb.RunPicker(runs_frame(4))
    t = Tagger(picker, store=tmp_path / "store")
    picker.click("run1")
    assert t.current["run_id"] == "run1"
    t.close()
    assert t.picker is None
    picker.click("run2")
    assert t.current["run_id"] == "run1"  # no longer called: the picker holds it no more


def test_note_and_rewrite_boxes_fit_their_cell():
    t = Tagger(runs_frame(1))
    for box in (t.note, t.rewrite):
        assert box.layout.width != "100%"  # width 100% plus the widget's margins overflowed the cell
        assert box.layout.max_width == "100%" or box.layout.width == "auto"


def test_an_unanswered_turn_is_tagged_by_tag_itself(tmp_path, monkeypatch):
    """The Tagger writes every row with one tag() call into the real store, an unanswered turn's
    rewrite included (no scratch store, no second writer)."""
    import machine_nb.store.tags as tags

    calls = []
    real = tags.tag

    def counting(*args, **kwargs):
        calls.append((kwargs.get("rewrite"), kwargs.get("store")))
        return real(*args, **kwargs)

    monkeypatch.setattr(tags, "tag", counting)
    run = make_run(1, turns=1)
    run["trajectory"] = [{"role": "user", "content": "What is 1 + 1?"}]
    t = Tagger([run], store=tmp_path)
    row = t.good_with_rewrite("answer: 2")
    assert calls == [("answer: 2", tmp_path)] and "replaced" not in row
    assert store_rows(tmp_path) == [{**row, "_file": "train.jsonl"}]


def test_one_store_every_view_follows_it(tmp_path):
    """Rows written by a Tagger or by tag() in code reach the picker's tags column and "(untagged)"
    filter, and every Tagger of the store, at once."""
    import machine_nb as mnb

    store = tmp_path / "store"
    frame = runs_frame(4)
    picker = mnb.RunPicker(frame)
    t = Tagger(picker, store=store)  # lends the picker its store
    other = Tagger(frame, store=store)
    assert "tags" in picker.columns and "tags" not in frame.columns  # the caller's frame is left alone
    picker.click("run1")
    t._b_good.click()
    assert picker.runs.set_index("id").loc["run1", "tags"] == ["good"]
    assert {r["__key__"]: r["tags"] for r in picker._table.rows}["run1"] == "good"
    picker.set_filters(tag="(untagged)")
    assert sorted(picker.filtered["id"]) == ["run0", "run2", "run3"]
    tag(make_run(2), "bad", store=store)  # tag() in a cell
    assert sorted(picker.filtered["id"]) == ["run0", "run3"]
    other.go_to("run2")
    assert [r["tag"] for r in other.existing_tags()] == ["bad"]  # read before: follows the write
    t.undo()
    assert sorted(picker.filtered["id"]) == ["run0", "run1", "run3"]
    picker.set_filters(tag="bad")
    assert list(picker.filtered["id"]) == ["run2"]
    elsewhere = tmp_path / "elsewhere"
    tag(make_run(3), "good", store=elsewhere)  # another store: not this picker's
    assert picker.runs.set_index("id").loc["run3", "tags"] == []


def test_a_rewrite_is_shown_as_stored_and_the_reply_itself_is_refused(tmp_path):
    store = tmp_path / "store"
    t = Tagger(runs_frame(1), store=store)
    t.rewrite.value = "The answer is 0."  # the reply as it is
    t._b_rewrite.click()
    assert store_rows(store) == [] and "the rewrite is the reply as it is" in t._status.value
    with pytest.raises(ValueError, match="Good"):
        t.good_with_rewrite("  The answer is\n0. ")
    t.good_with_rewrite("0 + 0 = 0.", note="shorter")
    line = t.static_html()
    assert "already tagged: good (this turn, note “shorter”, rewrite “0 + 0 = 0.”)" in line


def test_keys_do_what_their_buttons_do(tmp_path):
    store = tmp_path / "store"
    t = Tagger(runs_frame(2), store=store)
    t._on_key(None, {"event": "key", "key": "g"}, None)
    assert [r["tag"] for r in store_rows(store)] == ["good"]
    t._on_key(None, {"event": "key", "key": "ArrowRight"}, None)
    assert t.current["run_id"] == "run1"
    t._on_key(None, {"event": "key", "key": "ArrowUp"}, None)
    assert t.current["turn"] == 0
    t._on_key(None, {"event": "key", "key": "b"}, None)
    t._on_key(None, {"event": "key", "key": "u"}, None)
    assert [r["tag"] for r in store_rows(store)] == ["good"]
    assert {"g", "b", "w", "u", "ArrowLeft"} <= set(t._keys.key_names)


def test_the_rewrite_is_shown_against_the_reply():
    from machine_nb.widgets.tagger import rewrite_diff

    assert rewrite_diff("The answer is 4.", "answer: 4") == [
        ("removed", "The answer is 4."), ("added", "answer: 4")]
    assert rewrite_diff("It costs $5 now.", "It costs $7 now.") == [
        ("same", "It costs "), ("removed", "$5 "), ("added", "$7 "), ("same", "now.")]
    t = Tagger(runs_frame(1), store=None)
    t.rewrite.value = "The answer is zero."
    html = t._diff.value
    assert "mnb-diff-removed" in html and ">0.</span>" in html and ">zero.</span>" in html
    t.rewrite.value = ""
    assert t._diff.value == ""


def test_a_row_this_tagger_wrote_and_a_cell_removed_leaves_its_list_and_undo(tmp_path):
    from machine_nb.store.tags import untag

    store = tmp_path / "store"
    t = Tagger(runs_frame(2), store=store)
    first = t.good()
    t.next_run()
    second = t.bad()
    untag(second["id"], store=store)  # removed in a cell
    assert [r["id"] for r in t.recent_rows()] == [first["id"]] and "1 tagged here" in t.summary()
    assert second["id"] not in t._recent.value  # the "recently tagged" table
    assert t.undo() == first  # the newest row still in the store
    assert store_rows(store) == [] and t.written == [] and t._b_undo.disabled
