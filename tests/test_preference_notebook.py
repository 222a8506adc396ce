"""The committed notebook 05 (preference training from tags): executed, clean, parameterised, listed
for refresh and in the README, and its report shows the three runs and their comparisons."""

import json
from pathlib import Path

from machine_nb.reports.notebook import WIDGET_VIEW

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_preference.ipynb"


def outputs_text(cell: dict) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append("".join(o.get("text", "")))
        for mime in ("text/plain", "text/html"):
            parts.append("".join(o.get("data", {}).get(mime, "")))
    return "\n".join(parts)


def test_committed_notebook_is_clean_parameterised_and_refreshed_by_the_script():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] >= 5 and "widgets" not in nb["metadata"]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", []) and all(c.get("id") for c in nb["cells"])
    assert all(c.get("execution_count") for c in code), "committed notebooks carry executed outputs (refresh them)"
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not [o for c in code for o in c.get("outputs", []) if o.get("name") == "stderr"], "warnings in the report"
    text = json.dumps(nb)
    assert WIDGET_VIEW not in text and "papermill" not in json.dumps(nb["metadata"])
    assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text, "absolute local paths in outputs"
    assert "05_preference.ipynb" in (ROOT / "scripts" / "refresh_notebooks.py").read_text()
    assert "notebooks/05_preference.ipynb" in (ROOT / "README.md").read_text()


def test_the_report_shows_pairs_costs_three_runs_and_their_comparisons():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    shown = "\n".join(outputs_text(c) for c in nb["cells"] if c["cell_type"] == "code")
    assert "44 pairs: 44 rewrite; 2 left out as held-out" in shown
    assert '"label":"A"' in shown and '"chosen":[{"role":"assistant"' in shown  # both file formats
    assert "reference model $" in shown
    for run in ("SFT", "DPO", "SFT→DPO"):
        assert f"{run}: held-out pair accuracy / exact match" in shown
    assert "SFT → DPO" in shown and "SFT → SFT→DPO" in shown and "DPO → SFT→DPO" in shown
    assert "checks passed" in shown
    assert any("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
