"""Real browser tests: JupyterLab in headless Chromium runs notebooks with the widgets.

1. RunPicker and Tagger: clicking rows in the picker's table changes Python's `.selected`, header
   clicks sort, the pager pages, the search box filters, and Tagger's Good / Undo last buttons
   write and remove tag-store rows.
2. Linked widgets: picking runs in the picker shows their examples in the previewer and their
   turns in the tagger; arrow keys page the previewer; a second Good on a tagged turn is asked
   for; the note and rewrite boxes fit the cell; the saved notebook's static outputs show what
   was picked and tagged.
3. Themes: in JupyterLab Light and Dark, the text the widgets draw (tokens, legend, cards,
   compare rows, labels) has a contrast ratio of at least 4.5:1 with what is behind it (one
   notebook run, measured in Light, then in Dark).

Screenshots go to `<tmp_path>/` and are copied to $MACHINE_NB_TEST_ARTIFACTS/ when that is set
(`make test` sets it to test-artifacts/).
"""

from __future__ import annotations

import json

import pytest

from lab import (keep_widget_picture, lab_page, contrast, keep_screenshot, open_and_run_all, run_command, saved_static,
                 screenshot_after, set_theme, write_notebook)

pytestmark = pytest.mark.browser

SETUP = '''\
import pandas as pd, ipywidgets as w
import machine_nb as mnb
def run(i):
    return {"id": f"run{i:03d}", "machine": "abc"[i % 3], "history": [],  # as the frame's machine column
            "trajectory": [{"role": "user", "content": f"What is {i} + {i}?"},
                           {"role": "assistant", "content": f"The answer is {2 * i}."}]}
runs = pd.DataFrame({"id": [f"run{i:03d}" for i in range(30)], "machine": ["a", "b", "c"] * 10,
                     "model": "local/arith-tiny", "score": [i / 29 for i in range(30)],
                     "input": [f"What is {i} + {i}?" for i in range(30)],
                     "output": [f"The answer is {2 * i}." for i in range(30)],
                     "run": [run(i) for i in range(30)]})
'''
PICKER = '''\
picker = mnb.RunPicker(runs, page_size=10)
label = w.Label("selected: 0")
picker.observe_selection(lambda sel: setattr(label, "value", f"selected: {len(sel)}: " + ",".join(sel["id"])))
display(label)
picker
'''
TAGGER = 'tagger = mnb.Tagger(runs, store="tag_store")\ntagger'


def test_click_rows_in_run_picker_and_tag_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import expect

    root = lab.root
    write_notebook(root / "widgets.ipynb", [SETUP, PICKER, TAGGER, "print('ok')"])
    shot = tmp_path / "run_picker.png"
    with lab_page(lab) as page:
        try:
            open_and_run_all(page, lab, "widgets.ipynb")
            expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]')).to_have_text("ok")
            rows = page.locator(".mnb-table tbody tr")
            expect(rows).to_have_count(10)  # one page of the 30 runs, drawn by table.js
            label = page.locator(".jupyter-widgets.widget-label", has_text="selected:")
            expect(label).to_have_text("selected: 0")

            page.locator('.mnb-table tr[data-key="run002"]').click()
            expect(label).to_have_text("selected: 1: run002")  # Python's .selected changed
            expect(page.locator('.mnb-table tr[data-key="run002"]')).to_have_class("mnb-selected")
            page.locator('.mnb-table tr[data-key="run005"]').click(modifiers=["Shift"])
            expect(label).to_have_text("selected: 4: run002,run003,run004,run005")
            page.locator('.mnb-table tr[data-key="run004"]').click(modifiers=["ControlOrMeta"])
            expect(label).to_have_text("selected: 3: run002,run003,run005")
            expect(page.locator(".mnb-table tr.mnb-selected")).to_have_count(3)
            expect(page.locator(".widget-html", has_text="30 runs · 30 match · 3 selected")).to_be_visible()

            page.locator('.mnb-table th[data-column="score"]').click()  # header click sorts in Python
            expect(page.locator('.mnb-table th[data-column="score"]')).to_have_text("score ▲")
            page.locator('.mnb-table th[data-column="score"]').click()
            expect(rows.first).to_have_attribute("data-key", "run029")
            page.locator(".mnb-pager button", has_text="›").click()
            expect(page.locator(".mnb-page-info")).to_have_text("page 2 of 3")

            search = page.locator('input[placeholder="search every text column"]')
            search.fill("29")
            search.press("Enter")  # an ipywidgets control filters in Python; the table follows
            expect(rows).to_have_count(1)
            expect(rows.first).to_have_attribute("data-key", "run029")
            expect(page.locator(".widget-html", has_text="30 runs · 1 match · 3 selected (3 hidden by filters)")).to_be_visible()

            good = page.locator(".widget-button", has_text="Good").first  # Tagger opens on run000
            good.click()
            expect(page.locator(".widget-html", has_text="wrote good row")).to_be_visible()
            page.locator(".widget-button", has_text="Undo last").click()
            expect(page.locator(".widget-html", has_text="removed row")).to_be_visible()
            good.click()
            expect(page.locator(".widget-html", has_text="wrote good row")).to_be_visible()
        finally:
            keep_screenshot(page, shot)
    rows_written = [json.loads(x) for x in (root / "tag_store" / "train.jsonl").read_text().splitlines()]
    assert [(r["tag"], r["run"], r["messages"][-1]["content"]) for r in rows_written] == [
        ("good", "run000", "The answer is 0.")]
    assert shot.stat().st_size > 10_000


LINKED = [
    SETUP,
    "picker = mnb.RunPicker(runs, page_size=10)\npicker",
    "preview = mnb.ExamplePreviewer(picker, model='thinkingmachines/Inkling-Small')\npreview",
    "tagger = mnb.Tagger(picker, store='tag_store')\ntagger",
    "print('ok')",
]


def test_picker_drives_previewer_and_tagger_and_the_saved_notebook_keeps_it(lab, tmp_path):
    from playwright.sync_api import expect

    root = lab.root
    nb_path = write_notebook(root / "linked.ipynb", LINKED)
    shot = tmp_path / "linked_picker_previewer.png"
    with lab_page(lab, height=2200) as page:
        try:
            open_and_run_all(page, lab, "linked.ipynb")
            expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]', has_text="ok")).to_be_visible()
            status = page.locator(".mnb-previewer .widget-html", has_text="ExamplePreviewer")
            expect(page.locator(".mnb-previewer", has_text="Select runs in the picker")).to_be_visible()
            # the static twins stay hidden while their live views are on screen
            expect(page.locator("[data-mnb-static]")).to_have_count(3)
            for i in range(3):
                expect(page.locator("[data-mnb-static]").nth(i)).to_be_hidden()

            page.locator('.mnb-table tr[data-key="run002"]').click()
            expect(status).to_contain_text("example 1/1 · run run002")
            expect(page.locator(".mnb-previewer .mnb-card", has_text="What is 2 + 2?")).to_be_visible()
            expect(page.locator(".mnb-previewer .mnb-tok-trained").first).to_be_visible()  # Inkling's tokens
            expect(page.locator(".mnb-tagger-live .widget-html", has_text="run 1 of 1 · run002")).to_be_visible()

            page.locator('.mnb-table tr[data-key="run003"]').click(modifiers=["ControlOrMeta"])
            expect(status).to_contain_text("example 2/2 · run run003")  # the newly picked run
            next_button = page.locator(".mnb-previewer .widget-button", has_text="next")
            prev_button = page.locator(".mnb-previewer .widget-button", has_text="prev")
            expect(next_button).to_be_disabled()  # on the last example
            expect(prev_button).to_be_enabled()
            page.locator(".mnb-previewer .mnb-card").first.click()  # focus the previewer
            page.keyboard.press("ArrowLeft")
            expect(status).to_contain_text("example 1/2 · run run002")
            expect(prev_button).to_be_disabled()
            page.keyboard.press("ArrowRight")
            expect(status).to_contain_text("example 2/2 · run run003")
            search = page.locator('.mnb-previewer input[placeholder="filter by words (Enter)"]')
            search.fill("2 + 2")
            search.press("Enter")
            expect(status).to_contain_text("example 1/2 · run run002 · machine c · step · 2 messages, 1 trained · filter '2 + 2': 1 of 1")

            tagger = page.locator(".mnb-tagger-live")
            expect(tagger.locator(".widget-html", has_text="run 2 of 2 · run003")).to_be_visible()
            good = tagger.locator(".widget-button", has_text="Good").first
            good.click()
            expect(tagger.locator(".widget-html", has_text="wrote good row")).to_be_visible()
            good.click()  # the same turn again: asked, not written
            expect(tagger.locator(".mnb-duplicate")).to_contain_text("already tagged good")
            expect(tagger.locator(".mnb-existing-tags")).to_contain_text("already tagged: good (this turn)")
            good.click()
            expect(tagger.locator(".widget-html", has_text="wrote good row")).to_be_visible()
            # the note and rewrite boxes stay inside the tagger (and its cell)
            out_area = tagger.locator("xpath=ancestor::div[contains(@class, 'jp-OutputArea-output')]").first
            right = out_area.bounding_box()["x"] + out_area.bounding_box()["width"]
            for box in (tagger.locator("input[placeholder='note (optional)']"), tagger.locator("textarea")):
                b = box.bounding_box()
                assert b["x"] + b["width"] <= right + 0.5, (b, right)
                assert b["width"] > 300  # stretched to the cell's width, not squeezed

            run_command(page, "docmanager:save")
            deadline = page.evaluate("Date.now()") + 60_000
            while "2 tagged here" not in saved_static(nb_path, 3) and page.evaluate("Date.now()") < deadline:
                page.wait_for_timeout(250)
        finally:
            keep_screenshot(page, shot)
    preview_html, tagger_html = saved_static(nb_path, 2), saved_static(nb_path, 3)
    assert "example 1/2 · run run002" in preview_html and "What is 2 + 2?" in preview_html
    assert "Select runs in the picker" not in preview_html
    assert "2 tagged here" in tagger_html and "run003" in tagger_html
    rows = [json.loads(x) for x in (root / "tag_store" / "train.jsonl").read_text().splitlines()]
    assert [(r["tag"], r["run"]) for r in rows] == [("good", "run003")] * 2


THEMED = [
    "import pandas as pd\nimport machine_nb as mnb\n"
    "lines = [{'machine': 'calc', 'run': f'r{i}', 'messages': [\n"
    "    {'role': 'system', 'content': 'You add numbers.'},\n"
    "    {'role': 'user', 'content': f'What is {i} + {i}? Answer in the house style.'},\n"
    "    {'role': 'assistant', 'content': f'answer: {2 * i}'}]} for i in range(8)]\n"
    "def res(correct):\n"
    "    n = len(correct)\n"
    "    return pd.DataFrame({'row': range(n), 'prompt': [f'{i} + 1' for i in range(n)], 'expected': [str(i + 1) for i in range(n)],\n"
    "                         'match': ['number'] * n, 'output': [f'answer: {i}' for i in range(n)], 'correct': correct})",
    "mnb.ExamplePreviewer(lines, model='thinkingmachines/Inkling-Small')",
    "mnb.CompareView(res([True, False, True, False]), res([True, True, False, False]))",
    "mnb.CostMeter(lines, model='thinkingmachines/Inkling', max_usd=100)",
    "mnb.Tagger({'id': 'r1', 'machine': 'calc', 'history': [], 'trajectory': lines[1]['messages'][1:]}, store='tag_store')",
    # a LossPlot of a real run, pictured for the gallery (the contrast checks measure the other
    # widgets): 8 steps with held-out evals at steps 4 and 8 give it a curve and evals to draw
    "c = mnb.make_corpus('corpus', seed=0)\n"
    "run = mnb.sft(c.train, max_steps=8, eval_data=mnb.read_jsonl(c.valid)[:8], eval_every=4, eval_max_tokens=8,\n"
    "              progress=False)\n"
    "mnb.LossPlot(run.log_dir, live=False)",
    "print('ok')",
]
# Text a fixed colour would leave unreadable in the dark theme (tokens, legend, compare rows,
# labels) and the rest the widgets colour themselves.
READABLE = {
    "context tokens": ".mnb-tok:not(.mnb-tok-trained)",
    "trained tokens": ".mnb-tok-trained",
    "token legend": ".mnb-tokens > div:first-child, .mnb-legend-trained, .mnb-legend-context",
    "card text": ".mnb-card pre",
    "card headers": ".mnb-card > div:first-child",
    "trained badge": ".mnb-trained",
    "prompt check": ".mnb-diff div",
    "compare rows": ".mnb-compare-rows td",
    "compare numbers": ".mnb-compare-numbers td, .mnb-compare-numbers span",
    "cost meter": ".mnb-cost-meter td, .mnb-cost-meter b, .mnb-cost-meter span",
    "tagger turn": ".mnb-tagger-turn > div",
}


def readable_text(page, theme: str) -> dict[str, list[dict]]:
    """Switch to `theme`, then measure the contrast of each READABLE kind of text on screen."""
    set_theme(page, theme)
    return {name: contrast(page, sel) for name, sel in READABLE.items()}


def test_widget_text_is_readable_in_light_and_dark_themes(lab, tmp_path):
    """One notebook run, measured in Light, then in Dark (Lab switches theme without a reload)."""
    from playwright.sync_api import expect

    write_notebook(lab.root / "themed.ipynb", THEMED)
    reports = {}
    with lab_page(lab, width=1400, height=2600) as page:
        with screenshot_after(page, tmp_path / "widgets_light_theme.png"):
            open_and_run_all(page, lab, "themed.ipynb")
            expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]', has_text="ok")).to_be_visible()
            expect(page.locator(".mnb-tok-trained:visible").first).to_be_visible()  # the live views
            expect(page.locator(".mnb-compare-rows:visible").first).to_be_visible()
            reports["JupyterLab Light"] = readable_text(page, "JupyterLab Light")
            keep_widget_picture(page, 1, "previewer-light")
            keep_widget_picture(page, 5, "loss_plot-light")
        with screenshot_after(page, tmp_path / "widgets_dark_theme.png"):
            reports["JupyterLab Dark"] = readable_text(page, "JupyterLab Dark")
            keep_widget_picture(page, 1, "previewer-dark")
            keep_widget_picture(page, 5, "loss_plot-dark")
    missing = {theme: [name for name, found in report.items() if not found] for theme, report in reports.items()}
    assert not any(missing.values()), f"nothing visible for {missing}"
    poor = {(theme, name): [f"{x['text']!r}: {x['ratio']:.2f} ({x['fg']} on {x['bg']})"
                            for x in found if x["ratio"] < 4.5]
            for theme, report in reports.items() for name, found in report.items()}
    assert not any(poor.values()), {k: v[:3] for k, v in poor.items() if v}
