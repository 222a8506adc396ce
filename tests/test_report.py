"""Reports: a notebook executed with parameters becomes HTML + executed .ipynb, with no secret."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from machine_nb.report import clean_notebook, run_report, scrub, secret_values

CANARY = "tml-canary-0123456789abcdefDEADBEEF"


def _notebook(path: Path, cells: list[tuple[str, str, list[str]]]) -> Path:
    """Write a notebook as plain JSON: (cell_type, source, tags) triples."""
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}}, "cells": []}
    for i, (kind, source, tags) in enumerate(cells):
        cell = {"cell_type": kind, "id": f"c{i}", "metadata": {"tags": tags}, "source": source}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        nb["cells"].append(cell)
    path.write_text(json.dumps(nb))
    return path


def test_report_injects_parameters_and_writes_html_and_ipynb(tmp_path):
    nb = _notebook(tmp_path / "demo.ipynb", [
        ("markdown", "# Demo report", []),
        ("code", "steps = 1\nlabel = 'default'", ["parameters"]),
        ("code", "print(f'steps={steps} label={label}')", []),
    ])
    out = tmp_path / "out" / "demo.html"
    report = run_report(nb, {"steps": 7, "label": "seven"}, out, progress_bar=False)
    assert report.html == out.resolve() and out.exists()
    executed = json.loads(report.executed.read_text())
    stdout = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "steps=7 label=seven" in stdout
    html = out.read_text()
    assert "steps=7 label=seven" in html and "Demo report" in html


def test_report_redacts_secret_env_values_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", CANARY)
    nb = _notebook(tmp_path / "leak.ipynb", [
        ("code", "x = 1", ["parameters"]),
        ("code", "import os\nprint(os.environ['TINKER_API_KEY'])\nos.environ['TINKER_API_KEY']", []),
        ("code", "from IPython.display import HTML\nHTML('<b>' + os.environ['TINKER_API_KEY'] + '</b>')", []),
    ])
    report = run_report(nb, {"note": CANARY[:4]}, tmp_path / "out" / "leak.html", progress_bar=False)
    for path in (report.html, report.executed):
        text = path.read_text()
        assert CANARY not in text, f"secret leaked into {path}"
        assert "[redacted]" in text
    assert report.redactions >= 3


def test_failed_cell_still_writes_partial_report_then_raises(tmp_path):
    from papermill.exceptions import PapermillExecutionError

    nb = _notebook(tmp_path / "bad.ipynb", [
        ("code", "x = 1", ["parameters"]),
        ("code", "print('before')", []),
        ("code", "raise ValueError('boom in cell')", []),
    ])
    with pytest.raises(PapermillExecutionError):
        run_report(nb, {}, tmp_path / "out" / "bad.html", progress_bar=False)
    html = (tmp_path / "out" / "bad.html").read_text()
    assert "before" in html and "boom in cell" in html


def test_clean_notebook_drops_widget_views_with_fallback_and_widget_metadata():
    view = {"version_major": 2, "version_minor": 0, "model_id": "abc"}
    nb = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"version_major": 2}}},
          "cells": [{"cell_type": "code", "outputs": [
              {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": view,
                                                       "text/html": "<table></table>", "text/plain": "Picker"}},
              {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": view}},
          ]}]}
    out = clean_notebook(nb)
    assert "widgets" not in out["metadata"]
    first, second = out["cells"][0]["outputs"]
    assert set(first["data"]) == {"text/html", "text/plain"}
    assert "interactive widget" in second["data"]["text/plain"]


def test_secret_values_and_scrub_cover_json_escaped_forms():
    env = {"TINKER_API_KEY": 'ab"cd\\efgh1234', "HOME": "/root", "SHORT_TOKEN": "1"}
    assert secret_values(env) == ['ab"cd\\efgh1234']
    text, n = scrub(json.dumps({"v": env["TINKER_API_KEY"]}), secret_values(env))
    assert n == 1 and "efgh1234" not in text


def test_cli_report_parses_parameters(tmp_path):
    nb = _notebook(tmp_path / "cli.ipynb", [
        ("code", "lr = 0.1\nname = 'x'", ["parameters"]),
        ("code", "print(type(lr).__name__, lr, name)", []),
    ])
    out = tmp_path / "out" / "cli.html"
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "report", str(nb), "-p", "lr", "3e-3",
                           "-p", "name", "hello", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "float 0.003 hello" in out.read_text()
