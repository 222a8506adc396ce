"""A committed notebook's saved outputs as text, for the tests that check what its report shows.

Whether every committed notebook is clean, parameterised and executed is checked once for all of
them in test_notebook_reports.py; `check_listed` adds what each story's test also needs: the
notebook is refreshed by scripts/refresh_notebooks.py and linked from the README; `run_small` runs a
notebook top to bottom in a kernel with smaller parameters, for the stories the suite runs that way.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(name: str) -> dict:
    """The committed notebook notebooks/NAME as JSON."""
    return json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))


def outputs_text(cell: dict) -> str:
    """A cell's saved outputs: streams, and each output's text/plain, text/html and text/markdown."""
    parts = []
    for o in cell.get("outputs", []):
        parts.append("".join(o.get("text", "")))
        for mime in ("text/plain", "text/html", "text/markdown"):
            parts.append("".join(o.get("data", {}).get(mime, "")))
    return "\n".join(parts)


def report_text(nb: dict) -> str:
    """Every code cell's saved outputs, in order."""
    return "\n".join(outputs_text(c) for c in nb["cells"] if c["cell_type"] == "code")


def run_small(name: str, out: Path, parameters: dict) -> list[dict]:
    """Run notebooks/NAME top to bottom in a kernel started as a report's is (papermill, from the
    notebooks folder, reports.notebook.kernel_arguments) with `parameters` injected, into the
    notebook file `out`, written once when the run ends (papermill's save after every cell serves a
    reader watching the file fill, which a test is not); assert every code cell ran and none raised.
    Returns the executed code cells."""
    import papermill

    from machine_nb.reports.notebook import kernel_arguments

    folder = ROOT / "notebooks"
    nb = papermill.execute_notebook(str(folder / name), str(out), cwd=str(folder), progress_bar=False,
                                    parameters=parameters, extra_arguments=kernel_arguments(),
                                    request_save_on_cell_execute=False)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), "a cell did not run"
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    return code


def check_listed(name: str) -> None:
    """Assert that the refresh script re-executes notebooks/NAME and the README links it."""
    assert name in (ROOT / "scripts" / "refresh_notebooks.py").read_text()
    assert f"notebooks/{name}" in (ROOT / "README.md").read_text()
