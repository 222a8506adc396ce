"""Real browser test: JupyterLab in headless Chromium runs a notebook with RunPicker and Tagger;
clicking rows in the picker's table changes Python's `.selected`, header clicks sort, the pager
pages, the search box filters, and Tagger's Good / Undo last buttons write and remove tag-store rows. Screenshot: `<tmp_path>/run_picker.png` (also copied to
$MACHINE_NB_TEST_ARTIFACTS/ when that is set, e.g. by CI to keep it).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from lab import chromium_page, chromium_path, lab_server, open_and_run_all, write_notebook

pytestmark = pytest.mark.browser

SETUP = '''\
import pandas as pd, ipywidgets as w
import machine_nb as mnb
def run(i):
    return {"id": f"run{i:03d}", "machine": "arith", "history": [],
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


def test_click_rows_in_run_picker_and_tag_in_jupyterlab(tmp_path):
    from playwright.sync_api import expect

    chromium_path()  # fails at once, saying to run `make setup`, when Chromium is missing
    root = tmp_path / "lab"
    root.mkdir()
    write_notebook(root / "widgets.ipynb", [SETUP, PICKER, TAGGER, "print('ok')"])
    shot = tmp_path / "run_picker.png"
    with lab_server(root) as lab, chromium_page() as page:
        try:
            open_and_run_all(page, lab.url("widgets.ipynb"))
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

            search = page.locator('input[placeholder="search input/output (Enter)"]')
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
            page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("MACHINE_NB_TEST_ARTIFACTS"):
                out = os.environ["MACHINE_NB_TEST_ARTIFACTS"]
                os.makedirs(out, exist_ok=True)
                shutil.copy(shot, os.path.join(out, shot.name))
    rows_written = [json.loads(x) for x in (root / "tag_store" / "train.jsonl").read_text().splitlines()]
    assert [(r["tag"], r["run"], r["messages"][-1]["content"]) for r in rows_written] == [
        ("good", "run000", "The answer is 0.")]
    assert shot.stat().st_size > 10_000
