"""Notebooks 02, 03 and 05 on a workspace unlike the sample (tests/helpdesk_workspace.py: machine
`helpdesk`, no `correct` criterion, ~700-token chats with tool calls under a long policy prompt,
held-out cases without expected answers, no tag store). Each runs once through `run_report`
(papermill), the way `machine-nb report -p workspace … -p machine helpdesk` runs it: it completes, or
it stops with one of the stated reasons, never on a Python error.
"""

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

import helpdesk_workspace
from machine_nb.reports.notebook import run_report

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
MACHINE_NOTEBOOKS = ("02_explore_runs.ipynb", "03_tag_train_promote.ipynb", "05_preference.ipynb")


def digest(root: Path) -> str:
    return hashlib.sha256(b"".join(p.relative_to(root).as_posix().encode() + p.read_bytes()
                                   for p in sorted(root.rglob("*")) if p.is_file())).hexdigest()


@pytest.fixture(scope="module")
def helpdesk(tmp_path_factory):
    """The helpdesk workspace, and an environment whose kernels can import its grader."""
    tmp = tmp_path_factory.mktemp("helpdesk")
    ws = helpdesk_workspace.generate(tmp / "workspace")
    mp = pytest.MonkeyPatch()
    tests = str(Path(helpdesk_workspace.__file__).parent)
    mp.setenv("PYTHONPATH", tests + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    try:
        yield ws, tmp, digest(ws)
    finally:
        mp.undo()


def executed(rep) -> dict:
    return json.loads(rep.executed.read_text(encoding="utf-8"))


def assert_no_python_error(nb: dict) -> None:
    """No failed cell, no traceback or warning printed: a report a colleague can read."""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"cell {cell.get('id')} failed: {out.get('ename')}: {out.get('evalue')}"
            assert not (out["output_type"] == "stream" and out["name"] == "stderr"), \
                f"cell {cell.get('id')} wrote to stderr: {''.join(out['text'])[:300]}"
            assert "Traceback" not in json.dumps(out), f"a traceback in cell {cell.get('id')}'s output"


def last_output_text(nb: dict) -> str:
    outs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    data = outs[-1].get("data", {})
    return "".join(data.get("text/plain", "")) or "".join(outs[-1].get("text", ""))


def test_the_machine_notebooks_use_the_public_api_and_no_sample_names():
    for name in MACHINE_NOTEBOOKS:
        nb = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        assert not re.search(r"\bfrom machine_nb\.|\bimport machine_nb\.", code), f"{name} imports a private module"
        assert not re.search(r"""\[["']criteria["']\]\[|["']answer: """, code), f"{name} reads a criterion or case format by name"
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                assert not re.search(r"(?<!\\)\$\d", "".join(cell["source"])), f"{name}: an unescaped dollar amount"


@pytest.mark.slow
def test_explore_completes_on_another_workspace(helpdesk, tmp_path):
    ws, _, before = helpdesk
    rep = run_report(NOTEBOOKS / "02_explore_runs.ipynb",
                     {"workspace": str(ws), "store": str(tmp_path / "store"), "export_path": str(tmp_path / "train.jsonl"),
                      "model": "local/arith-tiny"},  # the cheapest renderer: its rows are too long, which 02 shows
                     tmp_path / "02.html", progress=False, timeout=600)
    assert rep.stopped is None
    assert_no_python_error(executed(rep))
    lines = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert lines and all(line["machine"] == "helpdesk" for line in lines)
    assert any(m.get("tool_calls") for line in lines for m in line["messages"]), "the tool calls were not exported"
    assert digest(ws) == before


@pytest.mark.slow
def test_tag_train_promote_tags_exports_and_stops_at_the_tiny_models_context(helpdesk, tmp_path):
    """The tagging rule needs no criterion name, the held-out run is left out, the grader scores the
    held-out cases, and 700-token chats do not fit local/arith-tiny: the notebook says which model would."""
    ws, _, before = helpdesk
    rep = run_report(NOTEBOOKS / "03_tag_train_promote.ipynb",
                     {"workspace": str(ws), "machine": "helpdesk", "scratch_root": str(tmp_path / "scratch"),
                      "grader": "helpdesk_workspace:grade", "expect_live_at_most": None,
                      "expect_candidate_at_least": None},
                     tmp_path / "03.html", progress=False, timeout=600)
    nb = executed(rep)
    assert_no_python_error(nb)
    assert rep.stopped is not None and "longer than the 128 tokens local/arith-tiny can hold" in rep.stopped
    assert "local/smollm2-135m" in rep.stopped
    assert rep.stopped in last_output_text(nb), "the report does not end with the reason"
    shown = json.dumps(nb)
    assert "the others scored by grade" in shown
    assert "wrote 13 rows; helpdesk now has 13 tag rows: 13 good" in shown  # every run scoring 0.6 or more
    assert "1 left out because their input is held out" in shown
    page = rep.html.read_text(encoding="utf-8")
    assert "Stopped here." in page
    assert 'class="mnb-headline"' not in page, "a stopped notebook states a headline it never measured"
    assert digest(ws) == before, "the notebook wrote into the workspace it was pointed at"


@pytest.mark.slow
def test_preference_stops_when_there_is_nothing_to_pair(helpdesk, tmp_path):
    """No tag rows, and runs of one case whose tool results differ (no two share a conversation): no pairs."""
    ws, _, before = helpdesk
    rep = run_report(NOTEBOOKS / "05_preference.ipynb",
                     {"workspace": str(ws), "machine": "helpdesk", "runs_root": str(tmp_path / "runs"),
                      "grader": "helpdesk_workspace:grade", "expect_pair_accuracy_at_least": None,
                      "expect_sft_exact_at_least": None},
                     tmp_path / "05.html", progress=False, timeout=600)
    nb = executed(rep)
    assert_no_python_error(nb)
    assert rep.stopped is not None and rep.stopped.startswith("no preference pairs for DPO from helpdesk")
    assert rep.stopped in last_output_text(nb)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.jsonl")), "something trained"
    assert 'class="mnb-headline"' not in rep.html.read_text(encoding="utf-8"), "a headline it never measured"
    assert digest(ws) == before


def test_report_parameters_read_python_literals_as_papermill_does():
    """`machine-nb report … -p expect_live_at_most None` (the way a user turns the sample's assertions off)."""
    from machine_nb.cli.report import _value

    assert _value("None") is None and _value("True") is True and _value("False") is False
    assert _value("null") is None and _value("0.6") == 0.6 and _value("helpdesk") == "helpdesk"
