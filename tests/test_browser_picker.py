"""Real browser test of the RunPicker on the sample workspace, in JupyterLab's light and dark
themes at 1400 px: the texts are on screen, the selection column stays pinned when a far column
is sorted, long cells show their whole text on hover, columns can be chosen, text is readable
(contrast), and the saved notebook's static fallback shows what the user did. The notebook runs
once: the picker is used in Light, put back from Python, and used again in Dark. Screenshots:
`<tmp_path>/run_picker_<theme>.png` (also copied to $MACHINE_NB_TEST_ARTIFACTS/ when set).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from lab import (keep_widget_picture, lab_page, open_and_run_all, run_in_kernel, saved_outputs, screenshot_after, set_theme,
                 write_notebook)

pytestmark = pytest.mark.browser

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
CELLS = [
    "import machine_nb as mnb\nruns = mnb.load_runs('ws')\npicker = mnb.RunPicker(runs, page_size=10)\n"
    "first_columns = picker.columns\npicker",
    "print('ok')",
]
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
# back to the picker as the cell first showed it
RESET = ("import ipywidgets as w\n"
         "picker.set_filters(text=None); picker.clear_selection(); picker.show_columns(first_columns)\n"
         "picker.sort_by(None); picker.go_to_page(0)\n"
         "for child in picker.children:\n"
         "    if isinstance(child, w.Accordion):\n"
         "        child.selected_index = None")

# WCAG contrast of the computed text colour against the first opaque background behind it
CONTRAST_JS = """(el) => {
  const rgb = (s) => { const m = s.match(/[\\d.]+/g).map(Number); return m.length > 3 ? m : [...m, 1]; };
  const lum = ([r, g, b]) => { const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  let node = el, bg = null;
  while (node && node.nodeType === 1) {
    const c = rgb(getComputedStyle(node).backgroundColor);
    if (c[3] > 0.5) { bg = c; break; }
    node = node.parentElement;
  }
  bg = bg || [255, 255, 255, 1];
  const fg = rgb(getComputedStyle(el).color);
  const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
  return (a + 0.05) / (b + 0.05);
}"""
N_RUNS = sum(1 for _ in (SAMPLE / ".machine" / "runs").rglob("*.json"))  # the committed sample's runs


def saved_picker_html(path: Path) -> str:
    for out in saved_outputs(path, 0):
        if "text/html" in out.get("data", {}):
            html = out["data"]["text/html"]
            return "".join(html) if isinstance(html, list) else html
    return ""


def use_the_picker(page, nb_path: Path, theme: str, search: str, matches: int, pages: int) -> None:
    """Check the picker as it first shows in `theme`, use it (sort, select, columns, search `search`
    with `matches` runs on `pages` pages, next page), save, and check the saved static fallback."""
    from playwright.sync_api import expect

    assert page.evaluate("document.body.dataset.jpThemeLight") == ("false" if theme == "dark" else "true")
    table = page.locator(".mnb-table")
    rows = page.locator(".mnb-table tbody tr")
    expect(rows).to_have_count(10)

    # at 1400 px the texts are on screen, not behind the scrollbar
    box = table.bounding_box()
    for col in ("input", "output"):
        th = page.locator(f'.mnb-table th[data-column="{col}"]').bounding_box()
        assert th["x"] + th["width"] / 2 < box["x"] + box["width"], f"{col} is off screen"

    # a long cell is cut in the view and whole on hover
    cell = rows.first.locator('td[data-column="input"]')
    full = cell.get_attribute("title")
    assert full and cell.evaluate("e => getComputedStyle(e).textOverflow") == "ellipsis"

    # sort the far right column: the selection column stays pinned and in view
    table.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
    far = page.locator(".mnb-table th[data-column]").last
    name = far.get_attribute("data-column")
    view = table.get_attribute("data-view")
    far.click()
    expect(far).to_have_text(f"{name} ▲")
    assert table.evaluate("e => e.scrollLeft") > 0  # the redraw kept the scroll position
    # updating the static twin leaves the live view alone: the same view, still scrolled
    assert table.get_attribute("data-view") == view
    box = table.bounding_box()
    check = rows.first.locator("input[type=checkbox]")
    cb, first = check.bounding_box(), rows.first.locator("td.mnb-first").bounding_box()
    assert box["x"] <= cb["x"] < box["x"] + 40 and first["x"] < box["x"] + 200
    check.click()
    expect(page.locator(".mnb-table tr.mnb-selected")).to_have_count(1)
    expect(page.locator(".widget-html", has_text=f"{N_RUNS} runs · {N_RUNS} match · 1 selected")).to_be_visible()

    # readable text in this theme: a plain cell, the selected row, the header
    for el in (rows.nth(1).locator("td").nth(2), page.locator(".mnb-table tr.mnb-selected td").nth(2),
               page.locator(".mnb-table th").nth(1), page.locator(".mnb-page-info")):
        ratio = el.evaluate(CONTRAST_JS)
        assert ratio >= 4.5, f"contrast {ratio:.2f} in {theme} theme"

    # choose columns: untick harness in the chooser
    page.locator(".jupyter-widget-Collapse-header, .p-Collapse-header, .lm-Collapse-header",
                 has_text="columns").first.click()
    page.locator(".widget-select-multiple select option", has_text="harness").click(modifiers=["ControlOrMeta"])
    expect(page.locator('.mnb-table th[data-column="harness"]')).to_have_count(0)

    # filter, page: then save; the saved output's static HTML shows this state
    search_box = page.locator('input[placeholder="search every text column"]')
    search_box.fill(search)
    search_box.press("Enter")
    expect(page.locator(".widget-html", has_text=f"{N_RUNS} runs · {matches} match · 1 selected")).to_be_visible()
    page.locator(".mnb-pager button", has_text="›").click()
    expect(page.locator(".mnb-page-info")).to_have_text(f"page 2 of {pages}")
    page.keyboard.press("ControlOrMeta+s")
    deadline = time.monotonic() + 60
    html = ""
    while time.monotonic() < deadline:
        html = saved_picker_html(nb_path)
        if f"text: {search}" in html and f"page 2 of {pages}" in html:
            break
        time.sleep(0.2)
        page.keyboard.press("ControlOrMeta+s")  # saved again once the fallback is updated
    assert (f"text: {search}" in html and f"{matches} match · 1 selected" in html
            and f"page 2 of {pages}" in html), (theme, html[:400])
    assert "harness" not in html.split("<thead>")[1].split("</thead>")[0], theme


def reset_picker(page) -> None:
    """Put the picker back as it first showed (from Python: no filter, selection or sort, all its
    columns, page 1, chooser closed, table scrolled left) and check the live view follows."""
    from playwright.sync_api import expect

    run_in_kernel(page, RESET)
    expect(page.locator(".widget-html", has_text=f"{N_RUNS} runs · {N_RUNS} match · 0 selected")).to_be_visible()
    expect(page.locator(".mnb-table tr.mnb-selected")).to_have_count(0)
    expect(page.locator('.mnb-table th[data-column="harness"]')).to_have_count(1)
    expect(page.locator(".mnb-table th", has_text="▲")).to_have_count(0)
    expect(page.locator(".mnb-page-info")).to_have_text(f"page 1 of {-(-N_RUNS // 10)}")
    expect(page.locator(".widget-select-multiple select option", has_text="harness")).to_be_hidden()
    page.locator(".mnb-table").evaluate("e => { e.scrollLeft = 0; }")


def test_run_picker_in_jupyterlab(lab, tmp_path):
    """One notebook run: the picker used in the Light theme, put back, then used again in Dark
    (another search, so the second save is told from the first)."""
    from playwright.sync_api import expect

    shutil.copytree(SAMPLE / ".machine", lab.root / "ws" / ".machine")
    nb_path = write_notebook(lab.root / "picker.ipynb", CELLS)
    with lab_page(lab, width=1400, height=1000) as page:
        with screenshot_after(page, tmp_path / "run_picker_light.png"):
            open_and_run_all(page, lab, "picker.ipynb")
            expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]')).to_have_text("ok")
            set_theme(page, THEMES["light"])
            use_the_picker(page, nb_path, "light", search="order", matches=23, pages=3)
            keep_widget_picture(page, 0, "run_picker-light")
        with screenshot_after(page, tmp_path / "run_picker_dark.png"):
            reset_picker(page)
            set_theme(page, THEMES["dark"])
            use_the_picker(page, nb_path, "dark", search="return", matches=33, pages=4)
            keep_widget_picture(page, 0, "run_picker-dark")
    for theme in THEMES:
        assert (tmp_path / f"run_picker_{theme}.png").stat().st_size > 10_000


def test_a_notebook_caught_mid_save_reads_as_no_outputs_yet(tmp_path):
    # the polls above read the file while JupyterLab may be writing it in place
    nb_path = write_notebook(tmp_path / "half.ipynb", CELLS)
    whole = nb_path.read_text()
    nb_path.write_text(whole[: len(whole) // 2])
    assert saved_outputs(nb_path, 0) == [] and saved_picker_html(nb_path) == ""
    nb_path.write_text("")
    assert saved_outputs(nb_path, 0) == []
