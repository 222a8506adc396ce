"""The committed notebook 04 (learning rate x epochs, 3 seeds): executed, clean, parameterised,
listed for refresh and in the README, and its saved outputs read as a report without a kernel:
the grid's plot and table, the verdict in words with its uncertainty, the chosen setting's curves,
the report on eval.jsonl, and the cost history."""

import json
from pathlib import Path

from committed_notebook import check_listed, outputs_text, report_text, run_small

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "04_sweep.ipynb"


def test_committed_notebook_has_its_parameters_and_is_refreshed_by_the_script_and_in_the_readme():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    params = "".join(code[0]["source"])
    for name in ("learning_rates", "epochs", "seeds", "eval_every", "engine", "max_usd", "max_parallel"):
        assert f"\n{name} = " in f"\n{params}", name
    check_listed(NOTEBOOK.name)
    # assertion cells guard the story when nbval re-runs it
    sources = ["".join(c["source"]) for c in code]
    assert sum(s.lstrip().startswith("assert") for s in sources) >= 3


def test_the_saved_outputs_read_as_a_report():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    shown = report_text(nb)
    assert "3 x 2 settings x 3 seeds = 18 runs" in shown and "18 runs in" in shown
    assert "mnb-sweep-table" in shown and "image/png" in json.dumps(nb)  # SweepView's static twin
    assert "Best by mean heldout_accuracy: " in shown and "95% interval over questions" in shown
    assert "Best minus the runner-up" in shown and "Newcombe" in shown
    assert "eval.jsonl, chosen setting: " in shown and "base model: 0.0%" in shown
    assert "18 run(s) recorded" in shown and "mnb-cost-history" in shown
    assert "**Reported on eval.jsonl**" in shown and "max_tokens 32 and temperature 0" in shown


def test_the_notebook_runs_top_to_bottom_on_a_small_grid(tmp_path):
    """The whole notebook, its assertion cells included, in a kernel on a 2 x 1 grid x 2 seeds of 2
    epochs (12 steps, scored at step 0 and on the final checkpoint): the grid still tells its
    settings apart (1e-3 learns nothing in 2 epochs; 1e-2 answers most valid.jsonl questions), the
    chosen setting beats the base model on eval.jsonl, and every view and the summary are drawn. The
    committed copy keeps the full grid's outputs (checked above) for readers."""
    code = run_small(NOTEBOOK.name, tmp_path / "04.ipynb",
                     {"learning_rates": [1e-3, 1e-2], "epochs": [2], "seeds": [0, 1], "eval_every": 12,
                      "data_dir": str(tmp_path / "data"), "sweep_root": str(tmp_path / "sweeps")})
    shown = "\n".join(outputs_text(c) for c in code)
    assert "2 x 1 settings x 2 seeds = 4 runs" in shown and "4 runs in" in shown and "{'ran': 4}" in shown
    assert "mnb-sweep-table" in shown and "Best by mean heldout_accuracy: learning_rate=0.01, epochs=2" in shown
    assert "eval.jsonl, chosen setting: " in shown and "base model: 0.0%" in shown
    assert "4 run(s) recorded" in shown and "mnb-cost-history" in shown
    assert "**Reported on eval.jsonl**" in shown and "ReportSummary: The chosen setting scores" in shown
    assert len(list((tmp_path / "sweeps").rglob("metrics.jsonl"))) == 4
