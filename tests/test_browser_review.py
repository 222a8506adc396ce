"""Real browser tests of a review session in JupyterLab (headless Chromium), one Lab for the module:

1. Reopen: a notebook with widgets, run and saved in Lab, closed and reopened (a new widget
   manager, a new kernel), reads cleanly: each widget's static view, never "Error displaying
   widget: model not found".
2. Dollars: the widgets' dollar amounts render as text, not as MathJax math.
3. One tag store: a tag written in the Tagger (or by `tag()`) reaches the picker's tags column and
   its "(untagged)" filter (waited for in the DOM, not slept on).
4. Keyboard and contrast: Space on a picker row keeps focus on the row; headers carry tabindex and
   aria-sort; the Tagger's keys; the buttons and the picker's "columns" header read at 4.5:1 or
   more in the Light and Dark themes (ratios computed from the rendered colours).
5. The picker's search box finds ids and machines as you type.
6. CompareView: the "show" buttons keep wins, ties or losses; a flipped case opens to both
   outputs with the difference marked.

Screenshots go to `<tmp_path>/` (and $MACHINE_NB_TEST_ARTIFACTS/ when set).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from candidate_cells import RESULTS
from lab import (close_documents, lab_page, contrast, open_and_run_all, open_notebook, run_command, run_in_kernel,
                 screenshot_after, set_theme, write_notebook)

pytestmark = pytest.mark.browser

SETUP = '''\
import pandas as pd
import machine_nb as mnb
def run(i):
    return {"id": f"run{i:03d}", "machine": "abc"[i % 3], "history": [],
            "trajectory": [{"role": "user", "content": f"What does {i} cost?"},
                           {"role": "assistant", "content": f"It costs $0.{i:02d} now and $1.{i:02d} later."}]}
runs = pd.DataFrame({"id": [f"run{i:03d}" for i in range(12)], "machine": ["abc"[i % 3] for i in range(12)],
                     "score": [i / 11 for i in range(12)],
                     "input": [f"What does {i} cost?" for i in range(12)],
                     "output": [f"It costs $0.{i:02d} now and $1.{i:02d} later." for i in range(12)],
                     "tags": [[] for _ in range(12)],
                     "run": [run(i) for i in range(12)]})
'''
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
# a passing candidate of the sample's tutor (its report made here, nothing trained)
CANDIDATE = RESULTS + '''\
report = build_report("tutor", results("live v1", ["It is so."] * 8), results("candidate", list(cases["expected"])))
passed, reason = Gate().decide(report)
cand = Candidate(workspace="ws", machine="tutor", checkpoint="tinker://local-0000000000000008:train:0/sampler_weights/8",
                 base_model="local/arith-tiny", engine="local", live_version=read_versions("ws", "tutor")[0],
                 report=report, passed=passed, reason=reason)
mnb.CandidateView(cand)'''
CELLS = [
    SETUP,
    "picker = mnb.RunPicker(runs, page_size=12, store='tag_store')\npicker",
    "tagger = mnb.Tagger(picker, store='tag_store')\ntagger",
    "mnb.CostMeter([{'messages': [{'role': 'user', 'content': 'a $5 question'},"
    " {'role': 'assistant', 'content': 'a $7 answer'}]}] * 4, model='thinkingmachines/Inkling', max_usd=100)",
    CANDIDATE,
    "def res(correct, outputs):\n"
    "    n = len(correct)\n"
    "    return pd.DataFrame({'row': range(n), 'prompt': [f'{i} + 1' for i in range(n)], 'expected': [str(i + 1) for i in range(n)],\n"
    "                         'match': ['number'] * n, 'output': outputs, 'correct': correct})\n"
    "mnb.CompareView(res([True, False, True], ['answer: 1', 'It is 3, I think', 'answer: 3']),\n"
    "                res([True, True, False], ['answer: 1', 'answer: 2', 'It is 4 for sure']))",
    # a plain HTML output, which Lab typesets with MathJax: its math shows the typesetter has run
    "from IPython.display import HTML, update_display\ndisplay(HTML('<span class=\"probe\">probe $x^2$</span>'), display_id='probe')",
    "print('ok')",
]
ERROR = "Error displaying widget"
THEMES = ("JupyterLab Light", "JupyterLab Dark")


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The process's JupyterLab rooted at a folder for this module (its kernels stop at the end)."""
    folder = shared_lab.folder("review")
    try:
        yield folder
    finally:
        folder.end_test()


@pytest.fixture(scope="module")
def page(lab):
    with lab_page(lab, width=1400, height=2000) as p:
        yield p


@pytest.fixture(scope="module")
def session(lab, page):
    """The notebook, run once in Lab; the tests below use it in order."""
    from playwright.sync_api import expect

    shutil.copytree(SAMPLE / "machines" / "tutor", lab.root / "ws" / "machines" / "tutor")
    write_notebook(lab.root / "review.ipynb", CELLS)
    with screenshot_after(page, lab.root / "session.png"):
        open_and_run_all(page, lab, "review.ipynb")
        expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]', has_text="ok")).to_be_visible()
        expect(page.locator(".mnb-table tbody tr")).to_have_count(12)
    return lab.root / "review.ipynb"


def test_dollars_render_as_text_not_math(session, page, tmp_path):
    from playwright.sync_api import expect

    with screenshot_after(page, tmp_path / "dollars.png"):
        page.locator('.mnb-table tr[data-key="run003"]').click()
        tagger = page.locator(".mnb-tagger-live")
        expect(tagger.locator(".mnb-tagger-turn")).to_contain_text("It costs $0.03 now and $1.03 later.")
        expect(page.locator(".mnb-cost-meter:visible").first).to_contain_text("$")
        # MathJax (Lab 4: MathJax 3, drawing <mjx-container>) typesets in order: once the probe,
        # a plain HTML widget updated after ours, is typeset, ours would have been too
        run_in_kernel(page, "update_display(HTML('<span class=\"probe\">probe $y^2$</span>'), display_id='probe')")
        expect(page.locator(".probe mjx-container")).to_have_count(1)
        ours = page.locator(".mnb-tagger-live, .mnb-strong-titles, .mnb-cost-meter, [data-mnb-static], .mnb-candidate")
        assert ours.locator("mjx-container").count() == 0
        assert "$0.03 now and $1.03" in tagger.locator(".mnb-tagger-turn").inner_text()
        assert "$0.03 now and $1.03" in page.locator('.mnb-table tr[data-key="run003"]').inner_text()


def test_tag_in_tagger_reaches_the_picker(session, page, tmp_path):
    from playwright.sync_api import expect

    with screenshot_after(page, tmp_path / "tagger_to_picker.png"):
        page.locator('.mnb-table tr[data-key="run004"]').click()
        tagger = page.locator(".mnb-tagger-live")
        expect(tagger.locator(".widget-html", has_text="run004")).to_be_visible()
        tags_cell = page.locator('.mnb-table tr[data-key="run004"] td[data-column="tags"]')
        expect(tags_cell).to_have_text("")
        tagger.locator(".widget-button", has_text=re.compile(r"^\s*Good\s*$")).click()
        expect(tags_cell).to_have_text("good")  # the picker follows the store (no sleep: the DOM is waited on)
        # tag() from code reaches it too
        run_in_kernel(page, "mnb.tag(runs.iloc[5]['run'], 'bad', store='tag_store')")
        expect(page.locator('.mnb-table tr[data-key="run005"] td[data-column="tags"]')).to_have_text("bad")
        # the "(untagged)" filter leaves out both
        page.locator(".widget-dropdown select").first.select_option("(untagged)")
        expect(page.locator(".mnb-table tbody tr")).to_have_count(10)
        expect(page.locator('.mnb-table tr[data-key="run004"]')).to_have_count(0)
        page.locator(".widget-dropdown select").first.select_option("(any)")
        expect(page.locator(".mnb-table tbody tr")).to_have_count(12)


def test_search_finds_ids_and_machines_as_you_type(session, page, tmp_path):
    from playwright.sync_api import expect

    rows = page.locator(".mnb-table tbody tr")
    with screenshot_after(page, tmp_path / "search.png"):
        search = page.locator('input[placeholder="search every text column"]')
        search.press_sequentially("run00")  # no Enter: the table follows the typing
        expect(rows).to_have_count(10)
        search.press_sequentially("7")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-key", "run007")
        search.fill("b")  # a machine name (and every text with a "b")
        expect(rows).to_have_count(4)
        search.fill("")
        expect(rows).to_have_count(12)


def test_keyboard_on_the_picker_and_the_tagger(session, page, tmp_path):
    from playwright.sync_api import expect

    with screenshot_after(page, tmp_path / "keyboard.png"):
        th = page.locator('.mnb-table th[data-column="score"]')
        expect(th).to_have_attribute("tabindex", "0")
        expect(th).to_have_attribute("aria-sort", "none")
        th.focus()
        page.keyboard.press("Enter")
        expect(th).to_have_attribute("aria-sort", "ascending")
        expect(page.locator('.mnb-table th[data-column="score"]')).to_be_focused()  # redrawn, focus kept
        page.keyboard.press("Enter")
        expect(th).to_have_attribute("aria-sort", "descending")
        row = page.locator('.mnb-table tr[data-key="run008"]')
        row.focus()
        page.keyboard.press(" ")
        expect(row).to_have_class(re.compile("mnb-selected"))
        expect(row).to_be_focused()  # Space keeps focus on the row, not <body>
        page.keyboard.press("ArrowDown")
        page.keyboard.press(" ")
        expect(page.locator(".mnb-table tr.mnb-selected")).to_have_count(3)  # run004 (picked before), run008, run007
        focused = page.evaluate("document.activeElement.closest('tr') && document.activeElement.closest('tr').dataset.key")
        assert focused == "run007"  # the next row down in the descending sort
        # the Tagger's keys: the tagger focused, → goes to the next picked run, g tags it Good
        tagger = page.locator(".mnb-tagger-live")
        expect(tagger.locator(".mnb-tagger-keys")).to_contain_text("g good")
        tagger.locator(".mnb-tagger-turn").click()
        expect(tagger.locator(".widget-html", has_text="run007")).to_be_visible()  # the newly picked run
        page.keyboard.press("ArrowRight")  # picked runs in frame order: run004, run007, run008
        expect(tagger.locator(".widget-html", has_text="run008")).to_be_visible()
        page.keyboard.press("g")
        expect(page.locator('.mnb-table tr[data-key="run008"] td[data-column="tags"]')).to_have_text("good")
        # typing in the rewrite box is text, not keys (no "b"ad, no "g"ood), and shows the diff
        box = tagger.locator("textarea")
        box.press_sequentially("It costs a big $1.08 later.")
        # the diff follows the typing from the kernel: wait for the finished text's one addition and
        # one removal, each with its text (a half-typed rewrite can also show one addition and one
        # removal, of other words)
        diff = tagger.locator(".mnb-rewrite-diff")
        expect(diff.locator(".mnb-diff-added")).to_have_text([re.compile("a big")])
        expect(diff.locator(".mnb-diff-removed")).to_have_text([re.compile(re.escape("$0.08 now and"))])
        expect(page.locator('.mnb-table tr[data-key="run008"] td[data-column="tags"]')).to_have_text("good")


def test_compare_view_shows_one_kind_of_row_and_opens_a_case(session, page, tmp_path):
    from playwright.sync_api import expect

    view = page.locator(".mnb-compare-rows:visible").first.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
    with screenshot_after(page, tmp_path / "compare_view.png"):
        rows = view.locator(".mnb-compare-rows tbody tr[class]")
        expect(rows).to_have_count(3)
        view.locator(".widget-toggle-button", has_text="losses").click()
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_class("mnb-loss")
        view.locator(".mnb-case-detail summary").click()  # both whole outputs, the difference marked
        expect(view.locator(".mnb-case-detail .mnb-diff-removed")).to_contain_text("answer:")
        expect(view.locator(".mnb-case-detail .mnb-diff-added")).to_contain_text("It is 4 for sure")
        view.locator(".widget-toggle-button", has_text="all").click()
        expect(rows).to_have_count(3)


# the text of the controls the widgets colour, by what a user reads on them
CONTROLS = {
    "Good": ".mnb-tagger-live .widget-button.mod-success",
    "Good with rewrite": ".mnb-tagger-live .widget-button.mod-info",
    "Bad": ".mnb-tagger-live .widget-button.mod-danger",
    "Commit": ".widget-button.mod-success.mnb-button:not(.mnb-tagger-live *)",
    "columns": ".mnb-strong-titles .jupyter-widget-Collapse-header, .mnb-strong-titles .lm-Collapse-header",
}


def test_control_text_contrast_in_light_and_dark(session, page, tmp_path):
    found = {}
    for theme in THEMES:
        with screenshot_after(page, tmp_path / f"controls_{theme.split()[-1].lower()}.png"):
            set_theme(page, theme)
            for name, selector in CONTROLS.items():
                found[(theme, name)] = contrast(page, selector)
    missing = [k for k, v in found.items() if not v]
    assert not missing, f"nothing visible for {missing}"
    poor = {k: [f"{x['text']!r}: {x['ratio']:.2f} ({x['fg']} on {x['bg']})" for x in v if x["ratio"] < 4.5]
            for k, v in found.items()}
    assert not any(poor.values()), {k: v for k, v in poor.items() if v}
    set_theme(page, THEMES[0])


def test_reopened_notebook_shows_no_widget_errors(session, lab, page, tmp_path):
    from playwright.sync_api import expect

    with screenshot_after(page, tmp_path / "reopened.png"):
        run_command(page, "docmanager:save")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
        run_command(page, "kernelmenu:shutdown")
        expect(page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"No Kernel|Unknown|Shut"))).to_be_visible()
        close_documents(page)  # its panel, widget manager and widget views disposed
        open_notebook(page, lab, "review.ipynb")  # reopened: a new widget manager, a new kernel
        statics = page.locator("[data-mnb-static]")
        expect(statics).to_have_count(5)
        for i in range(5):
            expect(statics.nth(i)).to_be_visible()  # the static view is what a reopened notebook shows
        expect(page.locator(".mnb-run-picker").first).to_contain_text("12 runs")
        expect(page.locator(".probe mjx-container")).to_have_count(1)  # MathJax ran on this page
        assert page.locator("[data-mnb-static] mjx-container").count() == 0
        assert "It costs $0.00 now and $1.00 later." in page.locator(".mnb-run-picker").first.inner_text()
        # the widget manager has tried (and failed) to restore the models: give it its turn, then look
        page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                               ".every(n => !/Loading widget/.test(n.textContent))")
        errors = page.locator(".jp-OutputArea-output", has_text=ERROR)
        visible = [errors.nth(i).is_visible() for i in range(errors.count())]
        assert not any(visible), f"{sum(visible)} widget error line(s) on screen"
        assert ERROR not in page.locator(".jp-Notebook").inner_text()
