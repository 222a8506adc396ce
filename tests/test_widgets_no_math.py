"""Dollar amounts in the widgets' HTML are text, never TeX: every static view and every live HTML
value with a "$" sits inside an element MathJax skips, and text is escaped with "$" as an entity.
(The browser half, MathJax in a real JupyterLab, is tests/test_browser_review.py.)"""

from __future__ import annotations

import pandas as pd

import machine_nb as mnb
from machine_nb.core.theme import NO_MATH_CLASSES
from machine_nb.widgets._base import NoMathHTML, escape

LINES = [{"messages": [{"role": "user", "content": "Is $5 too much?"},
                       {"role": "assistant", "content": "No: $5 now, $7 later."}]}] * 8


def run(i: int) -> dict:
    return {"id": f"r{i}", "machine": "m", "history": [],
            "trajectory": [{"role": "user", "content": "What does it cost?"},
                           {"role": "assistant", "content": f"It costs $0.{i} now and $1.{i} later."}]}


def widgets(tmp_path):
    runs = pd.DataFrame({"id": ["r1", "r2"], "machine": "m", "input": ["What does it cost?"] * 2,
                         "output": ["It costs $0.1 now and $1.1 later.", "It costs $0.2 now and $1.2 later."],
                         "run": [run(1), run(2)]})
    picker = mnb.RunPicker(runs)
    picker.set_filters(text="$0.1")
    yield picker
    yield mnb.Tagger(runs, store=tmp_path / "store")
    yield mnb.ExamplePreviewer(LINES)
    yield mnb.CostMeter(LINES, model="thinkingmachines/Inkling", max_usd=100, background=False)


def test_every_static_view_is_outside_math(tmp_path):
    for widget in widgets(tmp_path):
        html = widget.static_bundle()["text/html"]
        assert html.startswith(f'<div class="mnb-static {NO_MATH_CLASSES}"'), type(widget).__name__
        assert "$" not in html.replace("&#36;", ""), (type(widget).__name__, html[:300])


def test_live_html_with_a_dollar_is_outside_math(tmp_path):
    for widget in widgets(tmp_path):
        values = [c.value for c in widget_tree(widget) if isinstance(c, NoMathHTML)]
        dollars = [v for v in values if "$" in v or "&#36;" in v]
        if isinstance(widget, mnb.RunPicker):  # its table is drawn by table.js, which no typesetter reads
            assert not dollars
            continue
        assert dollars, type(widget).__name__
        assert all(v.startswith(f'<div class="{NO_MATH_CLASSES}">') for v in dollars), type(widget).__name__
    plain = NoMathHTML("3 runs · 3 match")
    assert plain.value == "3 runs · 3 match"  # left exactly as given without a dollar
    assert escape("$5 <b>") == "&#36;5 &lt;b&gt;" and escape(None) == ""


def widget_tree(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from widget_tree(child)
