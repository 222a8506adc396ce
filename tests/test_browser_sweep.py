"""Real browser test: SweepView in JupyterLab (headless Chromium) over a small real sweep.

Picking another setting in its x-axis dropdown redraws the plot, and the saved notebook's static
output keeps that choice; its table and verdict are readable (contrast at least 4.5:1) in the Light
and Dark themes. Screenshots: `<tmp_path>/sweep_view_<theme>.png` (also copied to
$MACHINE_NB_TEST_ARTIFACTS/ when that is set).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from lab import chromium_page, chromium_path, contrast, lab_server, open_and_run_all, run_command, set_theme, write_notebook

pytestmark = pytest.mark.browser

CELLS = [
    "import machine_nb as mnb\n"
    "c = mnb.make_corpus('corpus', seed=0)\n"
    "rows = mnb.read_jsonl(c.valid)[:4]\n"
    "frame = mnb.sweep(c.train, {'learning_rate': [1e-3, 3e-3], 'max_steps': [2, 4]}, eval_data=rows, eval_every=2,\n"
    "                  eval_max_tokens=8, sweep_dir='sweep', progress=False)",
    "view = mnb.SweepView(frame)\nview",
    "print('ok')",
]


def saved_static(path, cell: int) -> str:
    nb = json.loads(path.read_text())
    for out in nb["cells"][cell].get("outputs", []):
        html = out.get("data", {}).get("text/html", "")
        html = "".join(html) if isinstance(html, list) else html
        if "mnb-static" in html:
            return html
    return ""


def keep(page, shot) -> None:
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("MACHINE_NB_TEST_ARTIFACTS"):
        out = os.environ["MACHINE_NB_TEST_ARTIFACTS"]
        os.makedirs(out, exist_ok=True)
        shutil.copy(shot, os.path.join(out, shot.name))


@pytest.mark.parametrize("theme", ["JupyterLab Light", "JupyterLab Dark"])
def test_sweep_view_dropdown_redraws_and_reads_in_both_themes(tmp_path, theme):
    from playwright.sync_api import expect

    chromium_path()
    root = tmp_path / "lab"
    root.mkdir()
    nb_path = write_notebook(root / "sweep.ipynb", CELLS)
    shot = tmp_path / f"sweep_view_{theme.split()[-1].lower()}.png"
    with lab_server(root) as lab, chromium_page(width=1300, height=1600) as page:
        try:
            open_and_run_all(page, lab.url("sweep.ipynb"))
            expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]', has_text="ok")).to_be_visible(
                timeout=240_000)
            table = page.locator(".mnb-sweep-table:visible")
            expect(table).to_have_count(1)  # the live view; its static twin is hidden
            image = page.locator(".widget-image:visible").first
            before = image.get_attribute("src")
            page.locator(".widget-dropdown:visible", has_text="x axis").locator("select").select_option("max_steps")
            page.wait_for_function("(b) => { const i = [...document.querySelectorAll('.widget-image')]"
                                   ".find(e => e.offsetParent); return i && i.src !== b; }", arg=before)
            set_theme(page, theme)
            report = {"table": contrast(page, ".mnb-sweep-table td, .mnb-sweep-table th"),
                      "verdict": contrast(page, ".mnb-sweep-verdict")}
            run_command(page, "docmanager:save")
            deadline = page.evaluate("Date.now()") + 60_000
            while "by max_steps" not in saved_static(nb_path, 1) and page.evaluate("Date.now()") < deadline:
                page.wait_for_timeout(250)
        finally:
            keep(page, shot)
    assert "by max_steps" in saved_static(nb_path, 1)  # the saved notebook keeps the choice
    missing = [name for name, found in report.items() if not found]
    assert not missing, f"nothing visible for {missing}"
    poor = {name: [f"{x['text']!r}: {x['ratio']:.2f} ({x['fg']} on {x['bg']})" for x in found if x["ratio"] < 4.5]
            for name, found in report.items()}
    assert not any(poor.values()), poor
