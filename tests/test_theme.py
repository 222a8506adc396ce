"""Every colour a widget draws comes from JupyterLab's theme variables (light value as fallback).

A hard-coded colour is right in one theme only: white-on-near-white context tokens and CompareView
rows, dark grey labels on black, were what the dark theme showed. The browser test measures the
contrast in both themes; this one reads the generated HTML of every widget, live and static.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from machine_nb.core import theme

COLOUR_PROPS = {"color", "background", "background-color", "border", "border-color", "border-left",
                "border-right", "border-top", "border-bottom", "outline", "fill", "stroke"}
NAMED = re.compile(r"\b(white|black|red|green|blue|grey|gray|orange|yellow|purple|silver|navy)\b", re.I)


def strip_vars(value: str) -> str:
    """The value with every var(--jp-…, fallback) removed (fallbacks may nest parentheses)."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("var(--jp-", i):
            depth, j = 0, value.index("(", i)
            while j < len(value):
                depth += value[j] == "("
                depth -= value[j] == ")"
                j += 1
                if depth == 0:
                    break
            i = j
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def hard_coded(html: str) -> list[str]:
    """Colour declarations in inline styles that do not come from a --jp- variable."""
    bad = []
    for style in re.findall(r'style="([^"]*)"', html) + re.findall(r"style='([^']*)'", html):
        for decl in style.split(";"):
            if ":" not in decl:
                continue
            prop, value = (x.strip() for x in decl.split(":", 1))
            if prop.lower() not in COLOUR_PROPS:
                continue
            rest = strip_vars(value)
            if re.search(r"#[0-9a-fA-F]{3,8}\b|rgba?\(|hsla?\(", rest) or NAMED.search(rest):
                bad.append(f"{prop}: {value}")
    return bad


def html_of(widget) -> str:
    """The static fallback plus every HTML child's value (the live view's markup)."""
    import ipywidgets as w

    parts = [widget.static_html()]
    stack = [widget]
    while stack:
        x = stack.pop()
        if isinstance(x, (w.HTML, w.HTMLMath)):
            parts.append(x.value)
        stack.extend(getattr(x, "children", ()) or ())
    return "\n".join(parts)


STEP = {"machine": "calc", "run": "r1", "messages": [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "2 plus 2"}, {"type": "text", "text": "4"}],
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "4"},
    {"role": "assistant", "content": "answer: 4"}]}


def results(correct):
    n = len(correct)
    return pd.DataFrame({"row": range(n), "prompt": [f"{i}+1" for i in range(n)], "expected": [str(i + 1) for i in range(n)],
                         "match": ["number"] * n, "output": ["x"] * n, "correct": correct})


def widgets_to_check(tmp_path):
    from machine_nb.widgets.compare_view import CompareView
    from machine_nb.widgets.cost_meter import CostMeter
    from machine_nb.widgets.loss_plot import LossPlot
    from machine_nb.widgets.previewer import ExamplePreviewer
    from machine_nb.widgets.run_picker import RunPicker
    from machine_nb.widgets.tagger import Tagger

    log = tmp_path / "log"
    log.mkdir()
    (log / "metrics.jsonl").write_text(json.dumps({"step": 0, "train_mean_nll": 1.0}) + "\n")
    run = {"id": "r1", "machine": "calc", "history": [],
           "trajectory": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    refused = {"run": "r0", "whole_run": True, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "trainable": False}]}
    return {
        "previewer": ExamplePreviewer([STEP, refused], model="thinkingmachines/Inkling-Small"),
        "previewer (nothing trained)": ExamplePreviewer([refused], model="thinkingmachines/Inkling-Small"),
        "previewer (renderer error)": ExamplePreviewer([STEP], model="Qwen/Qwen3-8B"),
        "cost meter (over budget)": CostMeter([STEP] * 3, model="thinkingmachines/Inkling", max_usd=1e-9, batch_size=8),
        "cost meter (within budget)": CostMeter([STEP] * 8, model="thinkingmachines/Inkling", max_usd=100),
        "cost meter (cannot price)": CostMeter([STEP], model="thinkingmachines/Inkling-Small", max_usd=1),
        "compare view": CompareView(results([True, False, True, False]), results([True, True, False, False])),
        "tagger": Tagger([run], store=tmp_path / "store"),
        "loss plot": LossPlot(log, live=False),
        "run picker": RunPicker(pd.DataFrame({"id": ["r1", "r2"], "machine": ["calc", "calc"], "input": ["hi", "yo"],
                                              "output": ["hello", "hey"], "score": [1.0, 0.5]})),
    }


def results_to_check(tmp_path):
    """The HTML of result objects a notebook shows beside the widgets (the same themes apply)."""
    from machine_nb.checks.validate import validate

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "What is 2 + 2?"},
                                             {"role": "assistant", "content": "answer: 4"}]}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"messages": "not a list"}\n')
    ready, failed = validate(good, "local/arith-tiny"), validate(bad, "local/arith-tiny")
    assert ready.ok and not failed.ok
    return {"validation (ready)": ready._repr_html_(), "validation (errors)": failed._repr_html_()}


def test_every_widget_colour_is_a_theme_variable(tmp_path):
    found = {name: hard_coded(html_of(w)) for name, w in widgets_to_check(tmp_path).items()}
    found.update({name: hard_coded(html) for name, html in results_to_check(tmp_path).items()})
    assert not {k: v for k, v in found.items() if v}, found


def test_the_validation_verdict_uses_the_palettes_readable_green_and_red(tmp_path):
    shown = results_to_check(tmp_path)
    assert theme.text_colour(theme.GREEN) in shown["validation (ready)"]
    assert theme.text_colour(theme.RED) in shown["validation (errors)"]


def test_the_checker_sees_hard_coded_colours():
    assert hard_coded('<span style="background:#eceff3;color:var(--jp-content-font-color1, #111)">x</span>') == [
        "background: #eceff3"]
    assert hard_coded(f'<b style="color:{theme.text_colour(theme.GREEN)};background:{theme.tint(theme.RED)}">') == []
    assert hard_coded('<b style="border:1px solid white">') == ["border: 1px solid white"]


@pytest.mark.parametrize("name", ["FG", "FG_MUTED", "BG", "BG_ALT", "BORDER", "GREEN", "RED", "ORANGE", "BLUE"])
def test_palette_entries_are_jupyterlab_variables_with_fallbacks(name):
    value = getattr(theme, name)
    assert re.fullmatch(r"var\(--jp-[a-z0-9-]+, #[0-9a-f]{3,6}\)", value), value
