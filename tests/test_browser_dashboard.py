"""Real browser test of the Dashboard in JupyterLab (light and dark): the notebook shows it, a
writer process adds runs and events, and they appear on screen without re-running a cell (each
step waits on the page's DOM, never on a sleep); a click on a run opens it in the previewer; the
saved notebook's static fallback shows the dashboard as it was; its text reads (contrast ≥ 4.5:1).
Screenshots:
`<tmp_path>/dashboard_<theme>.png` (also copied to $MACHINE_NB_TEST_ARTIFACTS/ when set).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab import lab_page, contrast, open_and_run_all, run_command, screenshot_after, set_theme, write_notebook

pytestmark = pytest.mark.browser

WRITER = Path(__file__).with_name("dashboard_writer.py")
CELLS = ["import machine_nb as mnb\nd = mnb.Dashboard('ws', interval=0.2)\npicker = d.picker\nd", "picker"]


def test_dashboard_shows_new_runs_as_they_land(lab, tmp_path):
    from playwright.sync_api import expect

    sys.path.insert(0, str(Path(__file__).parent))
    from dashboard_writer import write_run

    root = lab.root / "ws" / ".machine" / "runs"
    write_run(str(root), "support", "first", cost=0.5)
    write_notebook(lab.root / "dash.ipynb", CELLS)
    writer = subprocess.Popen([sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, bufsize=1)

    def write(op: str, **args) -> None:
        writer.stdin.write(json.dumps({"op": op, **args}) + "\n")
        writer.stdin.flush()
        assert json.loads(writer.stdout.readline())["ok"]

    events = str(lab.root / "ws" / ".machine" / "events.jsonl")
    try:
        with lab_page(lab) as page:
            open_and_run_all(page, lab, "dash.ipynb")
            view = page.locator(".mnb-dashboard-view")
            expect(view.locator(".mnb-machines")).to_contain_text("support")
            expect(view.locator(".mnb-latest a.mnb-run")).to_have_count(1)
            expect(view).to_contain_text("$0.50")  # a dollar amount as text, not typeset as math
            expect(page.locator(".mnb-table")).to_contain_text("first")
            for n, (theme, machine) in enumerate([("light", "coder"), ("dark", "chatbot/triage")]):
                set_theme(page, {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}[theme])
                with screenshot_after(page, tmp_path / f"dashboard_{theme}.png"):
                    ids = [f"{theme}{i}" for i in range(3)]
                    write("runs", root=str(root), machine=machine, ids=ids, events=events)
                    # the new runs appear without running a cell: in the dashboard and in the picker
                    expect(view.locator(f'.mnb-latest a.mnb-run[data-run="{machine}/{ids[-1]}"]')).to_be_visible()
                    expect(view.locator(".mnb-events")).to_contain_text("run.finished")
                    expect(view).to_contain_text(f"{1 + 3 * (n + 1)} runs")
                    expect(page.locator(".mnb-table")).to_contain_text(ids[-1])
                    write("append", path=events, text=json.dumps({"type": f"trial.{theme}", "x": 1}) + "\n")
                    expect(view.locator(".mnb-events")).to_contain_text(f'"type": "trial.{theme}"')  # shown raw
                    low = [c for c in contrast(page, ".mnb-dashboard-view td, .mnb-dashboard-view li, "
                                                     ".mnb-dashboard-view div, .mnb-dashboard-view a") if c["ratio"] < 4.5]
                    assert not low, f"text under 4.5:1 in {theme}: {low}"
                    view.locator(f'.mnb-latest a.mnb-run[data-run="{machine}/{ids[0]}"]').click()
                    expect(page.locator(".mnb-previewer")).to_contain_text(f"answer {ids[0]}")
            run_command(page, "docmanager:save")
            page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
        nb = json.loads((lab.root / "dash.ipynb").read_text())
        saved = next(o["data"]["text/html"] for o in nb["cells"][0]["outputs"] if "text/html" in o.get("data", {}))
        saved = "".join(saved) if isinstance(saved, list) else saved
        assert "dark2" in saved and "chatbot/triage" in saved and "answer dark0" in saved
    finally:
        writer.stdin.close()
        writer.wait(10)


def test_the_dashboard_commands_page_takes_its_token_out_of_the_address_bar(tmp_path):
    """`machine-nb dashboard` in a real browser: the page opened at the printed address shows the
    workspace, with the token gone from the address bar; a reload still shows it (the cookie)."""
    import os
    import re

    from playwright.sync_api import expect

    from lab import shared_browser

    sys.path.insert(0, str(Path(__file__).parent))
    from dashboard_writer import write_run

    write_run(str(tmp_path / "ws" / ".machine" / "runs"), "support", "first")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MACHINE_NB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "dashboard", str(tmp_path / "ws")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    context = shared_browser().new_context()
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", proc.stdout.readline()).group(0)
        page = context.new_page()
        page.goto(url)
        expect(page.locator("#dash")).to_contain_text("support/first")
        assert "token" not in page.url and page.url == url.split("?")[0]
        page.reload()
        expect(page.locator("#dash")).to_contain_text("support/first")
        expect(page.locator("#status")).to_have_text("")
    finally:
        context.close()
        proc.terminate()
        proc.wait(20)
