"""RunPicker: filters, sort, pages, selection (clicks arrive as the view's messages) and the static fallback."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest
import traitlets
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_nb.widgets.run_picker import (
    RunPicker,
    click_selection,
    filter_mask,
    format_cell,
    row_keys,
    sort_order,
    text_haystack,
)


def make_runs(n: int = 30) -> pd.DataFrame:
    """A load_runs-shaped frame: machines a/b/c, two models, scores 0..1 (one missing), tags, texts."""
    start = pd.Timestamp("2026-11-01", tz="UTC")
    frame = pd.DataFrame({
        "id": [f"run{i:03d}" for i in range(n)],
        "machine": ["a", "b", "c"] * (n // 3),
        "model": ["m1", "m2"] * (n // 2),
        "harness": "pi",
        "score": [i / (n - 1) for i in range(n)],
        "started_at": [start + pd.Timedelta(days=i) for i in range(n)],
        "tags": [["good"] if i % 5 == 0 else (["bad", "x"] if i % 7 == 0 else []) for i in range(n)],
        "input": [f"What is {i} + {i}?" for i in range(n)],
        "output": [f"The ANSWER is {2 * i}." for i in range(n)],
        "run": [{"id": f"run{i:03d}"} for i in range(n)],
    }, index=pd.RangeIndex(100, 100 + n))
    frame.loc[103, "score"] = np.nan
    return frame


def send(picker: RunPicker, **content) -> None:
    """Deliver a message exactly as the browser's model.send() arrives in the kernel."""
    picker._table._handle_custom_msg(content, [])


def test_needs_ids_and_makes_them_unique_per_machine():
    with pytest.raises(ValueError, match="'id' column"):
        RunPicker(pd.DataFrame({"x": [1]}))
    assert row_keys(pd.DataFrame({"id": [1, 1], "machine": ["a", "b"]})) == ["a/1", "b/1"]
    with pytest.raises(ValueError, match="unique run ids"):
        row_keys(pd.DataFrame({"id": [1, 1], "machine": ["a", "a"]}))
    with pytest.raises(TypeError, match="DataFrame"):
        RunPicker([{"id": 1}])
    minimal = RunPicker(pd.DataFrame({"id": ["x", "y"]}))  # any frame with an id column works
    assert minimal.summary() == "RunPicker: 2 runs, 2 match, 0 selected"
    assert list(minimal.controls) == ["text"]


def test_filter_controls_update_the_one_page_view_model():
    runs = make_runs()
    p = RunPicker(runs, page_size=5)
    assert p._table.columns == ["id", "machine", "input", "output", "score", "tags", "model", "harness", "started_at"]
    assert len(p._table.rows) == 5 and p._table.n_pages == 6
    assert p._count.value == "30 runs · 30 match · 0 selected"

    p.controls["machine"].value = ("a", "c")
    assert set(p.filtered["machine"]) == {"a", "c"} and len(p.filtered) == 20
    p.controls["model"].value = ("m1",)
    assert list(p.filtered["id"]) == [f"run{i:03d}" for i in range(30) if i % 3 != 1 and i % 2 == 0]
    assert p._table.n_pages == 2 and [r["__key__"] for r in p._table.rows] == list(p.filtered["id"][:5])
    assert p._count.value == "30 runs · 10 match · 0 selected"
    p.set_filters(machine=None, model=None)
    assert len(p.filtered) == 30
    numbers = RunPicker(pd.DataFrame({"id": ["x", "y", "z"], "machine": [1, 2, 1]}))
    assert numbers.controls["machine"].options == (("1 (2)", 1), ("2 (1)", 2))
    numbers.controls["machine"].value = (1,)
    assert list(numbers.filtered["id"]) == ["x", "z"]


def test_each_filter_kind():
    runs = make_runs()
    p = RunPicker(runs)
    p.set_filters(score=(0.5, 1.0))
    assert (p.filtered["score"] >= 0.5).all() and len(p.filtered) == 15
    p.set_filters(score=None)
    assert len(p.filtered) == 30  # full range keeps the run without a score
    p.set_filters(score=(0.0, 0.2))
    assert "run003" not in set(p.filtered["id"])  # missing score drops out once a range is set
    p.set_filters(score=None, date=(dt.date(2026, 11, 3), dt.date(2026, 11, 5)))
    assert list(p.filtered["id"]) == ["run002", "run003", "run004"]  # both days inclusive
    p.set_filters(date=(None, dt.date(2026, 11, 2)))
    assert list(p.filtered["id"]) == ["run000", "run001"]
    p.set_filters(date=None, tag="good")
    assert list(p.filtered["id"]) == [f"run{i:03d}" for i in range(0, 30, 5)]
    p.set_filters(tag="x")
    assert list(p.filtered["id"]) == ["run007", "run014", "run021", "run028"]
    p.set_filters(tag="(untagged)")
    assert all(t == [] for t in p.filtered["tags"]) and len(p.filtered) == 30 - 6 - 4
    p.set_filters(tag=None, text="answer IS 2")  # terms AND-ed, case-insensitive, over every text column
    assert set(p.filtered["id"]) == {f"run{i:03d}" for i in range(30)
                                     if "2" in str(2 * i) or "2" in str(i) or i % 2 == 1}  # model m2 too
    p.set_filters(text="what 14 28")  # one term in input, one in output
    assert list(p.filtered["id"]) == ["run014"]
    with pytest.raises(ValueError, match="unknown filters"):
        p.set_filters(colour="red")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 1), st.text("xyzXY ", max_size=6)),
                min_size=1, max_size=20),
       st.floats(0, 1), st.floats(0, 1), st.text("xyXY", max_size=2))
def test_filter_mask_matches_a_row_by_row_reference(rows, lo, hi, text):
    frame = pd.DataFrame({"id": range(len(rows)), "machine": [r[0] for r in rows],
                          "score": [r[1] for r in rows], "input": [r[2] for r in rows], "output": ""})
    lo, hi = min(lo, hi), max(lo, hi)
    filters = {"machine": ["a"], "score": (lo, hi), "text": text}
    got = filter_mask(frame, filters)  # through a FilterIndex: codes and distinct lower-cased texts
    want = [m == "a" and lo <= s <= hi and all(t in i.lower() for t in text.lower().split())
            for m, s, i in rows]
    assert got.tolist() == want
    assert filter_mask(frame, filters, haystack=text_haystack(frame, ("input", "output"))).tolist() == want


def test_sort_by_header_messages_and_python():
    runs = make_runs()
    p = RunPicker(runs, sort_by="score", ascending=False, page_size=4)
    assert p.page_keys == ["run029", "run028", "run027", "run026"]
    send(p, event="sort", column="score")  # header click on the sorted column flips it
    assert p._table.sort == {"column": "score", "ascending": True}
    assert p.page_keys == ["run000", "run001", "run002", "run004"]
    assert list(p.filtered["id"])[-1] == "run003"  # the missing score sorts last
    send(p, event="sort", column="machine")
    assert p._table.sort == {"column": "machine", "ascending": True}
    assert list(p.filtered["machine"]) == sorted(runs["machine"])
    send(p, event="sort", column="tags")  # lists sort by their text
    assert p.filtered["tags"].map(", ".join).is_monotonic_increasing
    send(p, event="sort", column="no-such-column")  # ignored, not a traceback in the kernel log
    with pytest.raises(ValueError, match="no such column"):
        p.sort_by("nope")
    assert sort_order(runs, None).tolist() == list(range(30))


def test_pages_carry_one_page_only():
    p = RunPicker(make_runs(), page_size=7)
    assert p._table.n_pages == 5 and len(p._table.rows) == 7
    send(p, event="page", page=4)
    assert p._table.page == 4 and p.page_keys == ["run028", "run029"]
    send(p, event="page", page=99)  # clamped
    assert p._table.page == 4
    p.controls["machine"].value = ("b",)  # a filter change goes back to page 1
    assert p._table.page == 0 and p._table.n_pages == 2


def test_clicks_shift_ranges_toggles_select_all_and_clear():
    runs = make_runs()
    p = RunPicker(runs, page_size=10)
    frames: list[pd.DataFrame] = []
    p.observe_selection(frames.append)
    send(p, event="click", key="run002", shift=False, toggle=False)
    assert p.selected_ids == ["run002"] and len(frames) == 1
    assert list(frames[-1]["id"]) == ["run002"]
    assert p._table.page_selected == ["run002"]
    send(p, event="click", key="run005", shift=True, toggle=False)  # range from the anchor
    assert p.selected_ids == ["run002", "run003", "run004", "run005"]
    send(p, event="click", key="run004", shift=False, toggle=True)  # ctrl/cmd-click removes one
    assert p.selected_ids == ["run002", "run003", "run005"]
    send(p, event="click", key="run008", shift=True, toggle=True)  # ctrl+shift adds a range from
    # the anchor, which the ctrl-click moved to run004 (as in a file browser)
    assert p.selected_ids == ["run002", "run003", "run005", "run004", "run006", "run007", "run008"]
    assert list(p.selected["id"]) == ["run002", "run003", "run004", "run005", "run006", "run007", "run008"]
    send(p, event="click", key="run009", shift=False, toggle=False)  # plain click: only this one
    assert p.selected_ids == ["run009"]
    n = len(frames)
    send(p, event="click", key="run009", shift=False, toggle=False)  # no change, no event
    assert len(frames) == n
    send(p, event="click", key="not-a-run", shift=False, toggle=False)
    assert p.selected_ids == ["run009"]

    p.controls["machine"].value = ("b",)  # run009 is on machine a
    assert p._count.value == "30 runs · 10 match · 1 selected (1 hidden by filters)"
    p.select_all_filtered()
    assert len(p.selected) == 11 and p.selected["machine"].value_counts().to_dict() == {"b": 10, "a": 1}
    assert p.summary() == "RunPicker: 30 runs, 10 match, 11 selected"
    p.clear_selection()
    assert p.selected.empty and frames[-1].empty


def test_shift_range_follows_the_sorted_view():
    p = RunPicker(make_runs(), sort_by="score", ascending=False)
    p.click("run010")
    p.click("run007", shift=True)
    assert p.selected_ids == ["run010", "run009", "run008", "run007"]
    sel = p.selected  # frame order, original columns and index
    assert list(sel["id"]) == ["run007", "run008", "run009", "run010"]
    assert list(sel.index) == [107, 108, 109, 110] and list(sel.columns) == list(make_runs().columns)


def test_click_selection_is_pure():
    view = ["a", "b", "c", "d"]
    assert click_selection([], view, "c", None, shift=True) == (["c"], "c")  # no anchor: plain click
    assert click_selection(["a"], view, "c", "a", shift=True) == (["a", "b", "c"], "a")
    assert click_selection(["x"], view, "b", "d", shift=True, toggle=True) == (["x", "b", "c", "d"], "d")
    assert click_selection(["a", "b"], view, "a", "b", toggle=True) == (["b"], "a")


def test_traitlets_observe_hook_fires_on_change():
    p = RunPicker(make_runs())
    seen = []
    p.observe(lambda ch: seen.append(list(ch["new"])), names="selected_ids")
    p.select(["run001", "run004"])
    assert seen == [["run001", "run004"]]
    with pytest.raises(KeyError):
        p.select(["zzz"])
    with pytest.raises(traitlets.TraitError, match="no runs with keys"):
        p.selected_ids = ["run001", "zzz"]
    p.selected_ids = ["run002", "run002"]  # duplicates collapse
    assert p.selected_ids == ["run002"] and list(p.selected["id"]) == ["run002"]


def test_empty_frame_and_no_match():
    empty = RunPicker(make_runs().iloc[:0])
    assert empty.summary() == "RunPicker: 0 runs, 0 match, 0 selected" and empty._table.rows == []
    assert "score" not in empty.controls and empty.selected.empty
    p = RunPicker(make_runs())
    p.set_filters(text="no such words")
    assert p._table.rows == [] and p._table.n_pages == 1 and "0 match" in p.static_html()


def test_static_fallback_shows_page_filters_and_selection():
    runs = make_runs()
    runs.loc[100, "input"] = "<script>alert(1)</script>"
    p = RunPicker(runs, page_size=3, columns=["id", "machine", "score", "input"])
    p.click("run001")
    p.set_filters(machine=["a", "b"])
    bundle = p._repr_mimebundle_()
    assert bundle["text/plain"] == "RunPicker: 30 runs, 20 match, 1 selected"
    assert "application/vnd.jupyter.widget-view+json" in bundle
    page = bundle["text/html"]
    assert "30 runs · 20 match · 1 selected" in page and "machine: [&#x27;a&#x27;, &#x27;b&#x27;]" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<tr>") == 4 and "<td>✓</td><td>run001</td>" in page and "page 1 of 7" in page
    with pytest.raises(ValueError, match="no such columns"):
        RunPicker(runs, columns=["id", "colour"])


def test_text_search_paths_agree(monkeypatch):
    """Distinct texts searched once and mapped back, every row searched, in threads: same rows."""
    from machine_nb.widgets import run_picker as rp

    runs = make_runs(60)
    runs["output"] = ["The ANSWER is one", "no", None, "İstanbul ANSWER"] * 15
    want = None
    for ratio, parallel in [(2.0, 10**9), (0.0, 10**9), (2.0, 7), (0.0, 7)]:
        monkeypatch.setattr(rp, "DISTINCT_SEARCH_RATIO", ratio)
        monkeypatch.setattr(rp, "PARALLEL_TEXTS", parallel)
        index = rp.FilterIndex(runs)
        got = [index.text_mask(q).tolist() for q in ("answer", "what 1", "istanbul", "is  one", "zzz")]
        assert sum(got[0]) == 30 and not any(got[4])
        want = want or got
        assert got == want


def test_choose_columns_and_hover_text():
    runs = make_runs()
    runs.loc[101, "output"] = "long " * 100
    p = RunPicker(runs, page_size=5)
    chooser = p._column_choice
    assert "run" not in chooser.options and set(chooser.value) == set(p.columns)
    chooser.value = tuple(c for c in chooser.value if c not in ("model", "harness"))  # untick two
    assert p.columns == ["id", "machine", "input", "output", "score", "tags", "started_at"] == p._table.columns
    chooser.value = (*chooser.value, "model")  # ticked again: joins at the end
    assert p.columns[-1] == "model" and set(p._table.rows[0]) >= {"__key__", "model"}
    p.show_columns(["output", "id"])
    assert p._table.columns == ["output", "id"] and set(chooser.value) == {"id", "output"}
    row = next(r for r in p._table.rows if r["__key__"] == "run001")
    assert row["output"].endswith("…") and row["__full__"]["output"] == "long " * 100  # the hover title
    assert "__full__" not in p._table.rows[0]  # short cells need none
    with pytest.raises(ValueError, match="cannot show"):
        p.show_columns(["run"])


def test_format_cell():
    assert format_cell(pd.Timestamp("2026-11-01 10:22:33", tz="UTC")) == "2026-11-01 10:22"
    assert format_cell(0.123456) == "0.123" and format_cell(float("nan")) == "" and format_cell(None) == ""
    assert format_cell(["good", "x"]) == "good, x" and format_cell(pd.NaT) == ""
    long = format_cell("word\n" * 100)
    assert len(long) == 120 and long.endswith("…") and "\n" not in long


def test_search_covers_every_text_column_as_you_type():
    import asyncio

    runs = make_runs()
    p = RunPicker(runs, page_size=5)
    p.set_filters(text="run013")  # an id
    assert list(p.filtered["id"]) == ["run013"]
    p.set_filters(text="pi m2 run01")  # harness, model and a part of an id, together
    assert list(p.filtered["id"]) == ["run011", "run013", "run015", "run017", "run019"]
    p.set_filters(text=None)

    async def type_in_the_box() -> list[str]:
        # keystrokes as the browser sends them (continuous_update): the search waits for a pause
        for text in ("r", "ru", "run02", "run029"):
            p.controls["text"].value = text
        assert len(p.filtered) == 30  # nothing scanned while typing
        for _ in range(1000):  # until the one search scheduled after the last keystroke has run
            if p._search_timer is None:
                break
            await asyncio.sleep(0.01)
        return list(p.filtered["id"])

    assert p.controls["text"].continuous_update
    assert asyncio.run(type_in_the_box()) == ["run029"]


def test_a_view_sorted_by_tags_stays_sorted_as_runs_are_tagged(tmp_path):
    from machine_nb.store.tags import tag, untag

    store = tmp_path / "store"
    runs = make_runs(6).drop(columns=["tags"])
    p = RunPicker(runs, store=store, sort_by="tags", ascending=False)
    assert list(p.filtered["id"]) == [f"run{i:03d}" for i in range(6)]  # all untagged: the frame's order
    row = tag({"id": "run004", "machine": "b", "trajectory": [{"role": "user", "content": "q"},
                                                             {"role": "assistant", "content": "a"}]},
              "good", store=store)
    assert list(p.filtered["id"])[0] == "run004" and p.page_keys[0] == "run004"  # the tagged run on top
    assert p.filtered["tags"].map(", ".join).is_monotonic_decreasing
    untag(row["id"], store=store)
    assert list(p.filtered["id"]) == [f"run{i:03d}" for i in range(6)]
