"""Real browser test: SweepView in JupyterLab (headless Chromium) over a small real sweep.

Picking another setting in its x-axis dropdown redraws the plot, and the saved notebook's static
output keeps that choice; its table and verdict are readable (contrast at least 4.5:1) in the Light
and Dark themes. The sweep and notebook run once: one choice is made in Light, another in Dark.
Screenshots: `<tmp_path>/sweep_view_<theme>.png` (also copied to $MACHINE_NB_TEST_ARTIFACTS/ when
that is set).
"""

from __future__ import annotations

import re

import pytest

from lab import (keep_widget_picture, lab_page, contrast, open_and_run_all, run_command, saved_static, screenshot_after,
                 set_theme, write_notebook)

pytestmark = pytest.mark.browser

# Two runs (each its own training process): learning_rate varies; max_steps is the grid's second
# axis with one value, so the x-axis dropdown offers two settings to pick between.
CELLS = [
    "import machine_nb as mnb\n"
    "c = mnb.make_corpus('corpus', seed=0)\n"
    "rows = mnb.read_jsonl(c.valid)[:4]\n"
    "frame = mnb.sweep(c.train, {'learning_rate': [1e-3, 3e-3], 'max_steps': [2]}, eval_data=rows, eval_every=2,\n"
    "                  eval_max_tokens=8, sweep_dir='sweep', progress=False)",
    "view = mnb.SweepView(frame)\nview",
    "print('ok')",
]


def saved_x(path) -> str | None:
    """The setting on the x axis of the saved notebook's static plot (its alt text)."""
    found = re.search(r'<img alt="sweep: [^"]* by ([^"]+)"', saved_static(path, 1))
    return found and found.group(1)


def pick_x_in_theme(page, nb_path, x: str, theme: str) -> dict[str, list[dict]]:
    """Pick `x` in the x-axis dropdown and check the plot redraws, switch to `theme`, measure the
    contrast of the table and verdict, then save and wait (up to 60 s) for the saved plot to be by `x`."""
    from playwright.sync_api import expect

    expect(page.locator(".mnb-sweep-table:visible")).to_have_count(1)  # the live view; its static twin is hidden
    before = page.locator(".widget-image:visible").first.get_attribute("src")
    page.locator(".widget-dropdown:visible", has_text="x axis").locator("select").select_option(x)
    page.wait_for_function("(b) => { const i = [...document.querySelectorAll('.widget-image')]"
                           ".find(e => e.offsetParent); return i && i.src !== b; }", arg=before)
    set_theme(page, theme)
    report = {"table": contrast(page, ".mnb-sweep-table td, .mnb-sweep-table th"),
              "verdict": contrast(page, ".mnb-sweep-verdict")}
    # the kernel's static update can reach Lab after a save: save again until the file has it
    deadline = page.evaluate("Date.now()") + 60_000
    run_command(page, "docmanager:save")
    while saved_x(nb_path) != x and page.evaluate("Date.now()") < deadline:
        page.wait_for_timeout(200)
        run_command(page, "docmanager:save")
    return report


def test_sweep_view_dropdown_redraws_and_reads_in_both_themes(lab, tmp_path):
    """One sweep and notebook run: x axis max_steps in Light, then back to learning_rate in Dark
    (so the second redraw and save are told from the first)."""
    from playwright.sync_api import expect

    nb_path = write_notebook(lab.root / "sweep.ipynb", CELLS)
    reports, saved = {}, {}
    with lab_page(lab, width=1300, height=1600) as page:
        with screenshot_after(page, tmp_path / "sweep_view_light.png"):
            open_and_run_all(page, lab, "sweep.ipynb")
            expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]', has_text="ok")).to_be_visible(
                timeout=240_000)
            assert saved_x(nb_path) is None  # nothing saved yet: the first save below is this one
            reports["JupyterLab Light"] = pick_x_in_theme(page, nb_path, "max_steps", "JupyterLab Light")
            saved["JupyterLab Light"] = saved_x(nb_path)
            keep_widget_picture(page, 1, "sweep_view-light")
        with screenshot_after(page, tmp_path / "sweep_view_dark.png"):
            reports["JupyterLab Dark"] = pick_x_in_theme(page, nb_path, "learning_rate", "JupyterLab Dark")
            saved["JupyterLab Dark"] = saved_x(nb_path)
            keep_widget_picture(page, 1, "sweep_view-dark")
    # the saved notebook keeps the choice
    assert saved == {"JupyterLab Light": "max_steps", "JupyterLab Dark": "learning_rate"}
    missing = {theme: [name for name, found in report.items() if not found] for theme, report in reports.items()}
    assert not any(missing.values()), f"nothing visible for {missing}"
    poor = {(theme, name): [f"{x['text']!r}: {x['ratio']:.2f} ({x['fg']} on {x['bg']})"
                            for x in found if x["ratio"] < 4.5]
            for theme, report in reports.items() for name, found in report.items()}
    assert not any(poor.values()), poor
