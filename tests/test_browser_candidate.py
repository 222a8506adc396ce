"""Real browser test: CandidateView's Commit button in JupyterLab (headless Chromium). A click on a
refused candidate shows why and writes nothing; a click on a passing one writes v2 to the machine's
versions.json and turns the button off. Screenshot: `<tmp_path>/candidate_view.png` (also copied to
$MACHINE_NB_TEST_ARTIFACTS/ when that is set).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from candidate_cells import RESULTS
from lab import lab_page, keep_widget_picture, open_and_run_all, set_theme, write_notebook

pytestmark = pytest.mark.browser

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"

SETUP = RESULTS + '''\
def checkpoint(n):  # a local checkpoint's description in the server's data dir, as commit checks it
    import json
    from machine_nb.engines.local.checkpoints import checkpoint_dir, default_data_dir
    path = f"tinker://local-{n:016x}:train:0/sampler_weights/final"
    d = checkpoint_dir(default_data_dir(), path)
    d.mkdir(parents=True, exist_ok=True)
    (d / "checkpoint.json").write_text(json.dumps({"base_model": "local/arith-tiny", "lora_rank": 0}))
    return path
def make(learned):
    live = results("live v1", ["It is so."] * len(cases))
    cand = results("candidate", [e if i < learned else "It is so." for i, e in enumerate(cases["expected"])])
    report = build_report("tutor", live, cand)
    passed, reason = Gate().decide(report)
    return Candidate(workspace="ws", machine="tutor", checkpoint=checkpoint(learned), base_model="local/arith-tiny",
                     engine="local", live_version=read_versions("ws", "tutor")[0], report=report, passed=passed, reason=reason)
'''


def test_commit_button_obeys_the_gate_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import expect

    root = lab.root
    shutil.copytree(SAMPLE / "machines" / "tutor", root / "ws" / "machines" / "tutor")
    write_notebook(root / "candidate.ipynb", [SETUP, "mnb.CandidateView(make(2))", "mnb.CandidateView(make(8))",
                                               "print('ok')"])
    shot = tmp_path / "candidate_view.png"
    versions = root / "ws" / "machines" / "tutor" / "versions.json"
    before = versions.read_bytes()
    with lab_page(lab) as page:
        try:
            open_and_run_all(page, lab, "candidate.ipynb")
            expect(page.locator('[data-mime-type="application/vnd.jupyter.stdout"]')).to_have_text("ok")
            buttons = page.locator(".widget-button", has_text="Commit")
            expect(buttons).to_have_count(2)
            expect(page.locator(".mnb-candidate:visible").first).to_contain_text("refused")  # live views; each has a hidden static twin
            buttons.nth(0).click()
            expect(page.locator(".mnb-candidate-status:visible").first).to_contain_text("Not committed: Refused:")
            assert versions.read_bytes() == before  # the refused click wrote nothing
            buttons.nth(1).click()
            expect(page.locator(".mnb-candidate-status:visible").nth(1)).to_contain_text("Committed as v2")
            expect(buttons.nth(1)).to_be_disabled()
            expect(page.locator(".mnb-candidate:visible").nth(1)).to_contain_text("committed as v2")
            set_theme(page, "JupyterLab Light")
            keep_widget_picture(page, 2, "candidate_view-light")
            set_theme(page, "JupyterLab Dark")
            keep_widget_picture(page, 2, "candidate_view-dark")
        finally:
            page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("MACHINE_NB_TEST_ARTIFACTS"):
                out = os.environ["MACHINE_NB_TEST_ARTIFACTS"]
                os.makedirs(out, exist_ok=True)
                shutil.copy(shot, os.path.join(out, shot.name))
    written = json.loads(versions.read_text())
    assert [v["id"] for v in written] == ["v1", "v2"] and written[1]["model"] == "tinker://local-0000000000000008:train:0/sampler_weights/final"
    assert [v["id"] for v in written if v.get("live")] == ["v2"]
    assert shot.stat().st_size > 10_000
