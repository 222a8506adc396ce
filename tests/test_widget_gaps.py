"""Closing a widget closes what it made, and a tool result is shown under its own call.

A closed widget takes its parts with it (buttons, text boxes, the previewer and picker a dashboard
made) and stops following its store, its picker or its files, while a picker the user passed in
stays open and theirs. The chat cards pair each tool result with the call it answers, whatever
JSON value the ids are.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import ipywidgets as w
import pandas as pd
import pytest

import machine_nb as mnb

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_writer import write_run  # noqa: E402


def inside(widget) -> list:
    """Every widget inside `widget`: its children all the way down, with their layouts and styles."""
    out, todo, seen = [], list(getattr(widget, "children", ())), set()
    while todo:
        x = todo.pop()
        if id(x) in seen or not isinstance(x, w.Widget):
            continue
        seen.add(id(x))
        out.append(x)
        todo += [getattr(x, "layout", None), getattr(x, "style", None), *getattr(x, "children", ())]
    return out


def still_open(widgets) -> list:
    return [x for x in widgets if x.comm is not None]


def runs_frame(ids=("r1", "r2")) -> pd.DataFrame:
    def run(rid):
        return {"id": rid, "machine": "m", "history": [],
                "trajectory": [{"role": "user", "content": f"q {rid}"}, {"role": "assistant", "content": "a"}]}

    return pd.DataFrame({"id": list(ids), "machine": "m", "score": [0.2, 0.8][: len(ids)],
                         "input": [f"q {i}" for i in ids], "output": "a", "run": [run(i) for i in ids]})


# ---- closing a dashboard


@pytest.mark.parametrize("opened", [False, True], ids=["previewer-never-shown", "previewer-shown"])
def test_closing_a_dashboard_closes_its_previewer_and_picker_and_leaves_the_users_picker_open(tmp_path, opened):
    """The dashboard made its view, its previewer (shown on the first click, made before it) and
    `d.picker`: closing it closes them all. A RunPicker the user handed to `follow` stays open
    and gets no more rows from the closed dashboard."""
    from machine_nb.widgets.dashboard import Dashboard
    from machine_nb.widgets.run_picker import RunPicker

    ws = tmp_path / "ws"
    runs_dir = str(ws / ".machine" / "runs")
    write_run(runs_dir, "support", "r1")
    d = Dashboard(ws, follow=False, file_events=False)
    made = d.picker
    mine = d.follow(RunPicker(mnb.load_runs(ws)))
    if opened:
        d.open_run("support/r1")
    parts = [d.previewer, made, *inside(d), *inside(d.previewer), *inside(made)]
    d.close()
    assert still_open(parts) == []
    assert mine.comm is not None and still_open(inside(mine)) != []
    write_run(runs_dir, "support", "r2")
    d.poll()  # what a follower's last read, landing after close, would hand on
    assert list(mine.runs["id"]) == ["r1"]


def test_a_closed_dashboard_stops_following_the_files(tmp_path):
    from machine_nb.widgets.dashboard import Dashboard
    from machine_nb.widgets.run_picker import RunPicker

    ws = tmp_path / "ws"
    runs_dir = str(ws / ".machine" / "runs")
    write_run(runs_dir, "support", "r1")
    d = Dashboard(ws, interval=0.02, file_events=False)
    mine = d.follow(RunPicker(mnb.load_runs(ws)))
    d.close()
    assert not d.following
    write_run(runs_dir, "support", "r2")
    time.sleep(0.2)
    assert list(mine.runs["id"]) == ["r1"] and mine.comm is not None


# ---- closing the other composite widgets


def test_closing_a_previewer_closes_its_controls_and_leaves_the_picker_it_followed(tmp_path):
    from machine_nb.widgets.previewer import ExamplePreviewer
    from machine_nb.widgets.run_picker import RunPicker

    picker = RunPicker(runs_frame())
    picker.select(["r1"])
    p = ExamplePreviewer(picker)
    p._ensure_hider()  # what displaying it adds
    parts = inside(p)
    p.close()
    assert still_open(parts) == []
    assert picker.comm is not None and p.picker is None
    picker.select(["r2"])  # no longer followed
    assert [x["run"] for x in p.lines] == ["r1"]


def test_closing_a_run_picker_closes_every_control_it_made(tmp_path):
    """Following a store gives a frame without tags a tag filter: the picker lays its rows out
    again and closes the boxes it dropped (the controls in them are kept, open); closing the
    picker closes the rest."""
    from machine_nb.widgets.run_picker import RunPicker

    runs = runs_frame()
    p = RunPicker(runs)
    before = inside(p)
    store = tmp_path / "store"
    mnb.tag(runs.iloc[0], "good", store=store)
    p.follow_store(store)
    now = inside(p)
    assert "tag" in p.controls and still_open(now) == now
    assert {id(x) for x in still_open(before)} <= {id(x) for x in now}
    assert len(still_open(before)) < len(before)  # the dropped rows and boxes
    p.close()
    assert still_open(before + now) == []


def test_closing_a_tagger_closes_its_controls_and_stops_following_the_store(tmp_path):
    """After close(), a row tagged in a cell no longer redraws the tagger; the picker it followed stays open."""
    from machine_nb.widgets.run_picker import RunPicker
    from machine_nb.widgets.tagger import Tagger

    store = tmp_path / "store"
    run = {"id": "r1", "machine": "m", "input": "q", "output": "a",
           "trajectory": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    frame = pd.DataFrame({"id": ["r1"], "machine": "m", "run": [run]})
    picker = RunPicker(frame)
    picker.select(["r1"])
    t = Tagger(picker, store=store)
    drawn: list[int] = []
    t._draw = lambda: drawn.append(1)  # counts the redraws the store's writes cause
    mnb.tag(run, "good", store=store)
    assert drawn == [1]
    t._ensure_hider()
    parts = inside(t)
    t.close()
    assert still_open(parts) == [] and picker.comm is not None and t.picker is None
    mnb.tag(run, "bad", store=store)
    assert drawn == [1]


def test_closing_a_cost_meter_drops_the_count_still_running(monkeypatch):
    """A count in the worker thread that finishes after close() is not drawn into the closed meter,
    and wait() on it returns at once."""
    from machine_nb.widgets.cost_meter import CostMeter

    release = threading.Event()
    started = threading.Event()
    armed = threading.Event()  # the meter's first count (made while it is built) answers at once

    def slow_count(self, model):
        if armed.is_set():
            started.set()
            release.wait(10)
        raise ValueError("no tokenizer here")

    monkeypatch.setattr(CostMeter, "_count", slow_count)
    lines = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    m = CostMeter(lines, model="local/arith-tiny", background=False)
    armed.set()
    m.background = True
    m.update_data(lines + lines)
    assert started.wait(5) and m.computing
    parts = inside(m)
    redrawn: list[int] = []
    m._redraw = lambda: redrawn.append(1)
    m.close()
    assert still_open(parts) == []
    m.wait(5)  # returns with the count still held in the worker: the closed meter waits for nothing
    assert not m.computing and not release.is_set()
    workers = [x for x in threading.enumerate() if x.name.startswith("CostMeter train")]
    release.set()
    for x in workers:
        x.join(5)
    assert redrawn == [] and m.error == ""


def test_closing_a_loss_plot_closes_its_image(tmp_path):
    from machine_nb.widgets.loss_plot import LossPlot

    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "train_mean_nll": 2.0}) + "\n")
    plot = LossPlot(d, refresh_s=0.02)
    parts = inside(plot)
    plot.close()
    assert still_open(parts) == [] and not plot.live


def test_closing_a_candidate_view_closes_its_button(tmp_path):
    from machine_nb.evaluation.candidate import Candidate
    from machine_nb.widgets.candidate_view import CandidateView

    cand = Candidate(workspace=str(tmp_path), machine="tutor", checkpoint="tinker://x", base_model="local/arith-tiny",
                     engine="local", live_version={"id": "v1"}, report=None)
    view = CandidateView(cand)
    parts = inside(view)
    view.close()
    assert still_open(parts) == [] and cand._observers == []


def test_closing_a_compare_view_and_a_sweep_view_closes_their_controls():
    from machine_nb.widgets.compare_view import CompareView
    from machine_nb.widgets.sweep_view import SweepView

    def results(correct):
        n = len(correct)
        return pd.DataFrame({"row": range(n), "prompt": [f"q{i}" for i in range(n)], "expected": ["1"] * n,
                             "match": ["number"] * n, "output": ["1"] * n, "correct": correct,
                             "format_ok": [None] * n})

    cv = CompareView(results([True, False, True]), results([True, True, False]))
    frame = pd.DataFrame({"run": ["r0", "r1"], "lr": [1e-3, 3e-3], "seed": 0, "status": "ran",
                          "final_loss": [1.0, 0.5], "cost_usd": None, "estimated_usd": None, "log_dir": "x"})
    sv = SweepView(frame, metric="final_loss", x="lr")
    for view in (cv, sv):
        parts = inside(view)
        view.close()
        assert still_open(parts) == []


# ---- a tool result under its call, whatever JSON value the ids are


def call(cid, name="lookup"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def calls_and_results(html: str) -> list[tuple[str, str]]:
    """(call name, the result shown under it or "") per call, in order."""
    import re

    out = []
    for block in html.split('class="mnb-tool-call"')[1:]:
        block = block.split("</div>")[0]
        name = re.search(r"<code>(.*?)</code>", block).group(1)
        res = re.search(r"<b>result</b><pre[^>]*>(.*?)</pre>", block)
        out.append((name, res.group(1) if res else ""))
    return out


@pytest.mark.parametrize("call_id,result_id,paired", [
    (7, 7, True),           # numbers on both sides: the same JSON value
    ("7", "7", True),
    (7, 7.0, True),         # one JSON number, written two ways
    (7, "7", False),        # a number and a string are different values (as validate reads them)
    ("7", 7, False),
    (True, 1, False),       # true is not the number 1
    ({"k": 1}, {"k": 1}, True),
], ids=["numbers", "strings", "7-and-7.0", "number-and-string", "string-and-number", "true-and-1", "objects"])
def test_a_tool_result_is_shown_under_its_call_when_the_ids_are_the_same_json_value(call_id, result_id, paired):
    from machine_nb.widgets.cards import chat_cards
    from machine_nb.widgets.previewer import ExamplePreviewer

    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [call(call_id, "get_weather")]},
                {"role": "tool", "tool_call_id": result_id, "content": "sunny"},
                {"role": "assistant", "content": "Sunny."}]
    want = [("get_weather", "sunny" if paired else "")]
    assert calls_and_results(chat_cards(messages)) == want
    p = ExamplePreviewer([{"messages": messages}])
    assert calls_and_results(p.static_html()) == want
    assert p.static_html().count("sunny") == (2 if paired else 1)  # the tool's own card shows it too


def test_numeric_ids_are_flagged_by_validate_and_the_previewer_still_pairs_them():
    """validate asks for string ids; the previewer shows the row as it came, each result under
    the call with the same id."""
    from machine_nb.checks.validate import shape_findings
    from machine_nb.widgets.previewer import ExamplePreviewer

    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [call(7, "a"), call(8, "b")]},
                {"role": "tool", "tool_call_id": 8, "content": "eight"},
                {"role": "tool", "tool_call_id": 7, "content": "seven"},
                {"role": "assistant", "content": "done"}]
    codes = {code for _severity, code, _message in shape_findings({"messages": messages}, "train")}
    assert "orphan_tool_result" in codes
    html = ExamplePreviewer([{"messages": messages}]).static_html()
    assert calls_and_results(html) == [("a", "seven"), ("b", "eight")]


def test_an_id_used_again_in_a_later_step_shows_each_calls_own_result():
    """Harnesses that number calls per reply reuse "call_0": each call's result is the first one
    after it with its id (the rule export follows), not the last one in the conversation."""
    from machine_nb.widgets.cards import chat_cards

    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [call("call_0", "first")]},
                {"role": "tool", "tool_call_id": "call_0", "content": "one"},
                {"role": "assistant", "content": "", "tool_calls": [call("call_0", "second")]},
                {"role": "tool", "tool_call_id": "call_0", "content": "two"},
                {"role": "assistant", "content": "done"}]
    assert calls_and_results(chat_cards(messages)) == [("first", "one"), ("second", "two")]


def test_a_closed_dashboard_refuses_to_start_follow_or_make_a_picker(tmp_path):
    """What a closed dashboard would start or hand out would never be fed nor closed: refused, naming it."""
    from machine_nb.widgets.dashboard import Dashboard
    from machine_nb.widgets.run_picker import RunPicker

    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    d = Dashboard(ws, interval=0.02, file_events=False)
    d.close()
    for call in (d.start, lambda: d.picker, lambda: d.follow(RunPicker(mnb.load_runs(ws))),
                 lambda: d.open_run("support/r1")):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    assert not d.following


def test_a_followers_errors_are_those_since_its_last_good_read_and_stay_few(tmp_path):
    """A workspace unreadable for hours must not grow the follower's list twice a second forever;
    once a read works again, what went wrong before is over."""
    from machine_nb.widgets.dashboard import ERRORS_KEPT, DashboardState, Follower

    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    state = DashboardState(ws)
    good_read = state.read
    reads = {"n": 0, "errors_then": None}
    recovered = threading.Event()

    def read(**kw):
        reads["n"] += 1
        if reads["n"] <= ERRORS_KEPT * 3:
            raise PermissionError(13, "Permission denied", "events.jsonl")
        if reads["errors_then"] is None:
            reads["errors_then"] = list(follower.errors)  # what the failing reads left
        recovered.set()
        return good_read(**kw)

    state.read = read
    follower = Follower(state, lambda *_: None, interval=0.001)
    follower.start()
    try:
        assert recovered.wait(10)
    finally:
        follower.stop()
        state.close()
    assert len(reads["errors_then"]) == ERRORS_KEPT and "Permission denied" in reads["errors_then"][-1]
    assert follower.errors == []


def test_the_dashboard_widget_says_when_the_workspace_cannot_be_read_until_it_can(tmp_path):
    """A workspace that turns unreadable (a network drive gone, permissions changed) left the widget
    showing what it last read, without a word; the page said so, the notebook did not."""
    from machine_nb.widgets.dashboard import Dashboard

    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    d = Dashboard(ws, interval=0.01, file_events=False)
    good_read, failing = d.state.read, threading.Event()
    failing.set()

    def read(**kw):
        if failing.is_set():
            raise PermissionError(13, "Permission denied", str(ws / ".machine" / "events.jsonl"))
        return good_read(**kw)

    d.state.read = read
    said, cleared = threading.Event(), threading.Event()
    shown = d._errors_changed

    def watch(errors):
        shown(errors)
        (said if errors else cleared).set()

    d._follower.on_errors = watch
    d.start()
    try:
        assert said.wait(10)
        assert "Permission denied" in d._view.html and "Permission denied" in d.static_html()
        failing.clear()
        assert cleared.wait(10)
        assert "Permission denied" not in d._view.html and "Permission denied" not in d.static_html()
    finally:
        d.close()
