"""Notebook 03 (tag → train → held-out cases → promote) runs top to bottom in a kernel, its assertion
cells included at their committed thresholds, on a shorter training run; what its committed copy
shows is checked in test_notebook_promote.py."""

from pathlib import Path

import pytest

from committed_notebook import outputs_text, run_small

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "03_tag_train_promote.ipynb"


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom_on_a_shorter_training_run(tmp_path):
    """The candidate trains 30 steps (60 in the committed run): deterministic (seed 0), and enough for
    the tagged rows' format, so the assertion cell's thresholds hold for the same reason as on the
    full run: the live version answers no held-out case, the candidate at least 70% of them, the
    gate passes it and it is committed, the one-step candidate is refused, and the source workspace
    is unchanged."""
    code = run_small(NOTEBOOK.name, tmp_path / "03.ipynb",
                     {"max_steps": 30, "scratch_root": str(tmp_path / "scratch")})
    by_id = {c.get("id"): outputs_text(c) for c in code}
    assert by_id["96a2347a"].startswith("30 steps, loss ")
    assert "Passed: " in by_id["72cece72"] and "committed as v2" in by_id["72cece72"]
    assert "did not pass the promotion gate, so v1 stays live" in by_id["b3b42556"]
    assert "Committed as v2" in by_id["02128836"]
    assert "The promotion gate passed it: committed as v2." in by_id["report-summary"]
    assert "checks passed; the source workspace is unchanged" in by_id["0a6b04c7"]
