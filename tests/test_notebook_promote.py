"""The committed notebook 03 (tag → train → held-out cases → promote): executed, clean, parameterised,
listed for refresh, and its report shows the gate's decision and the commit."""

import json
from pathlib import Path

from machine_nb.reports.notebook import WIDGET_VIEW

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "03_tag_train_promote.ipynb"


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
    text = json.dumps(nb)
    assert WIDGET_VIEW not in text and "papermill" not in json.dumps(nb["metadata"])
    assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text, "absolute local paths in outputs"
    assert "03_tag_train_promote.ipynb" in (ROOT / "scripts" / "refresh_notebooks.py").read_text()
    assert "notebooks/03_tag_train_promote.ipynb" in (ROOT / "README.md").read_text()


def test_the_report_shows_the_decision_the_refusal_and_the_commit():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    shown = "\n".join(outputs_text(c) for c in nb["cells"] if c["cell_type"] == "code")
    assert "A candidate passes when it loses no held-out case the live version gets right" in shown
    assert "Passed: " in shown and "Committed as v2" in shown and "committed as <b>v2</b>" in shown
    assert "did not pass the promotion gate, so v1 stays live" in shown  # the one-step candidate
    assert "left out 2 of" in shown and "held-out" in shown
    assert "checks passed; the source workspace is unchanged" in shown
    assert "held-out case(s) flipped" in shown  # the static CandidateView lists the flips


def test_the_training_cell_draws_the_loss_with_each_step_and_saves_only_the_final_plot():
    """The SFT cell hands LossPlot.update to sft (the plot moves with the progress bar, no poll lag)
    and the saved notebook shows the final curve, with no stale "no metrics yet" copy beside it."""
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and "mnb.LossPlot(" in "".join(c["source"]))
    source = "".join(cell["source"])
    assert "on_metrics=plot.update" in source and "plot.stop()" in source
    plots = [o for o in cell["outputs"] if "image/png" in o.get("data", {})]
    assert len(plots) == 1 and "".join(plots[0]["data"]["text/plain"]).startswith("LossPlot: sft: ")
    assert " steps, last loss " in "".join(plots[0]["data"]["text/plain"])
    assert "no metrics yet" not in json.dumps(nb), "a stale text/plain of the loss plot was saved"


def test_the_commit_flow_shows_the_candidate_once_and_reads_the_commit_from_versions_json():
    """The report and its case table are shown once (by the CandidateView), and the commit cell says
    what versions.json holds, so a Commit clicked in the view is never contradicted below it."""
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    views = [o for c in code for o in c.get("outputs", [])
             if "".join(o.get("data", {}).get("text/plain", "")).startswith("CandidateView:")]
    assert len(views) == 1, "the candidate's report is shown more than once"
    tables = sum(outputs_text(c).count("held-out case(s) flipped") for c in code)
    assert tables == 1, "the flipped-cases table is shown more than once"
    cell = next(c for c in code if "candidate_view.commit()" in "".join(c["source"]))
    source = "".join(cell["source"])
    assert "mnb.read_versions(" in source and "if entry is None and cand.passed" in source
    assert outputs_text(cell).strip().startswith("Committed as v2: tutor now runs tinker://")
    assert "Not committed" not in outputs_text(cell)
