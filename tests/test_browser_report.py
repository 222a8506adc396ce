"""Real browser tests: notebook 01's report read in headless Chromium with the network cut, and dollar
amounts read as text (not MathJax math) in JupyterLab.

The report: its title, the headline with its interval and n, the code hidden until one click shows
it, the accuracy and loss charts, links to each section, and "$" as text, in a page that fetches
nothing (every request that is not the file itself is aborted and recorded); in a dark colour
scheme the page is dark and the charts sit on white. In Lab: the saved outputs of notebooks 01 and
04 (a training result's line, 04's summary markdown and report summary) beside a markdown cell
with real math, which MathJax typesets first, so its absence in the outputs is measured after
MathJax ran. Screenshots: `<tmp_path>/*.png` (also copied to $MACHINE_NB_TEST_ARTIFACTS/ when set).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import TIMEOUT_MS, keep_screenshot, lab_page, open_notebook, screenshot_after, set_theme, shared_browser

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TITLE = "Minimal SFT: teach a house style, then measure it"


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> Path:
    """Notebook 01's report, made from the committed executed notebook (what `make report` writes)."""
    from machine_nb.reports.notebook import to_html

    out = tmp_path_factory.mktemp("report") / "minimal_sft.html"
    out.write_text(to_html((NOTEBOOKS / "01_minimal_sft.ipynb").read_text(encoding="utf-8")), encoding="utf-8")
    return out


def _open_offline(browser, path: Path, scheme: str):
    """A page on `path` in a context with no network: every request but the file is aborted and kept."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    fetched: list[str] = []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            fetched.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    context.set_offline(True)
    page.goto(path.as_uri(), wait_until="load")
    return context, page, fetched


def _rgb(css: str) -> list[float]:
    return [float(v) for v in css[css.index("(") + 1:css.index(")")].replace(",", " ").split()[:3]]


def test_report_of_notebook_01_reads_offline_with_headline_charts_and_hidden_code(report_page, tmp_path):
    from playwright.sync_api import expect

    browser = shared_browser()
    context, page, fetched = _open_offline(browser, report_page, "light")
    try:
        with screenshot_after(page, tmp_path / "report_light.png"):
            assert page.title() == TITLE
            expect(page.locator("h1.mnb-title")).to_have_text(TITLE)
            headline = page.locator(".mnb-headline").inner_text()
            for part in ("95.8%", "0.0%", "95% CI", "n = 24", "McNemar, p = "):
                assert part in headline, (part, headline)
            # "$" as text: the cost line, and a training result's line in the body; no math typeset anywhere
            assert "$0.0000 observed" in page.locator(".mnb-cost").inner_text()
            train_line = page.locator(".machine-nb-train").last.inner_text()
            assert "$0.0000 observed (estimated $0.0000)" in train_line, train_line
            assert page.locator("mjx-container, .MathJax, .MathJax_Display").count() == 0
            # the charts: accuracy with intervals beside the loss curve, both decoded images
            for chart in (".mnb-accuracy-chart img", ".mnb-loss-chart img"):
                expect(page.locator(chart)).to_be_visible()
                assert page.locator(chart).evaluate("i => i.complete && i.naturalWidth > 100"), chart
            acc, loss = (page.locator(c).bounding_box() for c in (".mnb-accuracy-chart", ".mnb-loss-chart"))
            assert abs(acc["y"] - loss["y"]) < 5 and loss["x"] > acc["x"] + acc["width"] - 1, "not side by side"
            # settings from the parameters cell, links to each section (limitations kept)
            expect(page.locator(".mnb-settings th", has_text="max_steps")).to_be_visible()
            links = page.locator(".mnb-toc a").all_inner_texts()
            assert "Limitations, in plain words" in links and len(links) >= 10, links
            for href in page.locator(".mnb-toc a").evaluate_all("as => as.map(a => a.getAttribute('href'))"):
                assert page.evaluate("(id) => !!document.getElementById(id)", href[1:]), href
            # code: hidden, then one click shows it
            code = page.locator(".jp-CodeCell .jp-Cell-inputWrapper")
            assert code.count() >= 10
            assert code.evaluate_all("cs => cs.filter(c => c.offsetParent !== null).length") == 0
            expect(page.get_by_role("button", name="Show code")).to_be_visible()
        page.get_by_role("button", name="Show code").click()
        with screenshot_after(page, tmp_path / "report_code_shown.png"):
            expect(code.first).to_be_visible()
            assert code.evaluate_all("cs => cs.filter(c => c.offsetParent === null).length") == 0
            expect(page.get_by_role("button", name="Hide code")).to_have_attribute("aria-pressed", "true")
    finally:
        context.close()
    assert fetched == [], f"the report tried to fetch {fetched}"

    context, page, fetched = _open_offline(browser, report_page, "dark")
    try:
        with screenshot_after(page, tmp_path / "report_dark.png"):
            background = _rgb(page.evaluate("getComputedStyle(document.body).backgroundColor"))
            assert max(background) < 60, f"the page is not dark in a dark colour scheme: {background}"
            for chart in (".mnb-accuracy-chart img", ".mnb-loss-chart img"):
                behind = page.locator(chart).evaluate("i => getComputedStyle(i).backgroundColor")
                assert _rgb(behind) == [255, 255, 255], f"{chart} is not on white in the dark page: {behind}"
    finally:
        context.close()
    assert fetched == [], f"the report tried to fetch {fetched}"


def _saved_outputs(notebook: str, cell_id: str, wanted) -> list[dict]:
    nb = json.loads((NOTEBOOKS / notebook).read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c.get("id") == cell_id)
    outputs = [o for o in cell.get("outputs", []) if wanted(o.get("data") or {})]
    assert outputs, f"{notebook} cell {cell_id}: no saved output of the kind this test reads (refresh it)"
    return outputs


def test_dollar_amounts_read_as_text_in_jupyterlab(lab, tmp_path):
    """A training result's line and notebook 04's summary, as the committed notebooks saved them, open in
    Lab beside real math: MathJax typesets the math and leaves every dollar amount as text."""
    from playwright.sync_api import expect

    text = lambda d, mime: "".join(d.get(mime, "")) if isinstance(d.get(mime), list) else d.get(mime, "")  # noqa: E731
    train = _saved_outputs("01_minimal_sft.ipynb", "sft", lambda d: "machine-nb-train" in text(d, "text/html"))
    summary_04 = _saved_outputs("04_sweep.ipynb", "a14c11f2", lambda d: "**Cost**" in text(d, "text/markdown")
                                or "machine-nb.report-summary" in json.dumps(list(d)))
    cells = [{"cell_type": "markdown", "id": "math", "metadata": {}, "source": "Real math: $x^2 + y^2$."}]
    for i, outs in enumerate((train, summary_04)):
        cells.append({"cell_type": "code", "id": f"saved-{i}", "metadata": {}, "execution_count": 1,
                      "source": "# the committed notebook's saved output", "outputs": outs})
    (lab.root / "dollars.ipynb").write_text(json.dumps({
        "cells": cells, "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}))
    with lab_page(lab) as page:
        open_notebook(page, lab, "dollars.ipynb")
        expect(page.locator(".jp-MarkdownCell mjx-container").first).to_be_attached()  # MathJax has run
        for theme, shot in (("JupyterLab Light", "dollars_light.png"), ("JupyterLab Dark", "dollars_dark.png")):
            set_theme(page, theme)
            with screenshot_after(page, tmp_path / shot):
                line = page.locator(".machine-nb-train").last.inner_text()
                assert "$0.0000 observed (estimated $0.0000)" in line, line
                summary = page.locator(".jp-OutputArea [data-mime-type='text/markdown']").last.inner_text()
                assert "Cost: observed $0.0000 (estimated $0.0000)" in summary, summary
                headline = page.locator(".mnb-report-summary").last.inner_text()
                assert "Cost: $0.0000 observed" in headline, headline
                typeset = page.locator(".jp-OutputArea mjx-container")
                assert typeset.count() == 0, f"{typeset.count()} piece(s) of output text typeset as math"
        keep_screenshot(page, tmp_path / "dollars_end.png")
