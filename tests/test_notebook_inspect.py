"""Notebook 07 (the held-out rows as an Inspect task, before and after SFT) runs top to bottom in a
kernel, its assertion cell included, on a shorter training run."""

from pathlib import Path

import pytest

from committed_notebook import outputs_text, run_small

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "07_inspect.ipynb"


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom_on_a_shorter_training_run(tmp_path):
    """SFT for 5 epochs (30 steps; 60 in the committed run), which already takes the replies to the
    trained format (4 epochs do not), so the comparison has rows that changed: the assertion cell
    reads both Inspect logs back and finds the same pairing, wins and losses, and `evaluate` gives
    the same replies as the Inspect run of the base model."""
    code = run_small(NOTEBOOK.name, tmp_path / "07.ipynb",
                     {"epochs": 5, "max_steps": 30, "data_dir": str(tmp_path / "corpus"),
                      "log_root": str(tmp_path / "runs")})
    by_id = {c.get("id"): outputs_text(c) for c in code}
    assert "24 held-out rows" in by_id["c03"]
    assert "CompareResult(n=24, baseline=0.000, " in by_id["c12"] and "W/T/L=0/24/0" not in by_id["c12"]
    assert "evaluate's results as an Inspect log: " in by_id["c14"] and by_id["c14"].count(".eval") >= 3
