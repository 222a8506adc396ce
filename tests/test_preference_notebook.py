"""The committed notebook 05 (preference training from tags): executed, clean, parameterised, listed
for refresh and in the README, and its report shows the three runs and their comparisons."""

import json
from pathlib import Path

from committed_notebook import check_listed, report_text

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_preference.ipynb"


def test_committed_notebook_is_refreshed_by_the_script_and_in_the_readme():
    check_listed(NOTEBOOK.name)


def test_the_report_shows_pairs_costs_three_runs_and_their_comparisons():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    shown = report_text(nb)
    assert "44 pairs: 44 rewrite; 2 left out as held-out" in shown
    assert '"label":"A"' in shown and '"chosen":[{"role":"assistant"' in shown  # both file formats
    assert "reference model $" in shown
    for run in ("SFT", "DPO", "SFT→DPO"):
        assert f"{run}: held-out pair accuracy / exact match" in shown
    assert "SFT → DPO" in shown and "SFT → SFT→DPO" in shown and "DPO → SFT→DPO" in shown
    assert "checks passed" in shown
    assert any("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
