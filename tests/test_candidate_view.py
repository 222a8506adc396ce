"""CandidateView: the report, the flipped cases, the gate's decision, and a Commit button that obeys
the gate (a refused candidate writes nothing; a passing one writes the version once)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import machine_nb as mnb
from machine_nb.evaluation.candidate import Candidate, Gate, build_report
from machine_nb.evaluation.cases import CASE_RESULT_COLUMNS, read_versions
from machine_nb.engines.local.checkpoints import checkpoint_dir, default_data_dir
from machine_nb.evaluation.results import EvalResult

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
HOLDOUT = [("What's 66 - 74?", "-8"), ("What is 28 minus 74?", "-46"), ("How much is 33 minus 45?", "-12"),
           ("How much is 73 plus 51?", "124"), ("How much is 51 plus 89?", "140"), ("How much is 89 minus 14?", "75"),
           ("What's 77 - 69?", "8"), ("How much is 40 minus 47?", "-7")]


def results(name: str, outputs: list[str]) -> pd.DataFrame:
    """An evaluate_cases-shaped frame over HOLDOUT with these replies (scored by exact match)."""
    rows = [{"row": i, "case": i, "trial": 0, "input": q, "prompt": q, "expected": f"answer: {n}", "match": "exact",
             "output": o, "correct": o == f"answer: {n}", "format_ok": None, "prompt_tokens": 27, "output_tokens": 8,
             "latency_s": 0.01, "stop_reason": "stop", "error": None}
            for i, ((q, n), o) in enumerate(zip(HOLDOUT, outputs))]
    return EvalResult(pd.DataFrame(rows, columns=CASE_RESULT_COLUMNS), {"name": name})


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "tutor", root / "machines" / "tutor")
    return root


def make(ws: Path, learned: int) -> Candidate:
    """A candidate whose first `learned` held-out replies are in the house style."""
    live = results("live v1", [f"It is {n}." for _, n in HOLDOUT])
    cand = results("candidate", [f"answer: {n}" if i < learned else f"It is {n}." for i, (_, n) in enumerate(HOLDOUT)])
    report = build_report("tutor", live, cand)
    gate = Gate()
    passed, reason = gate.decide(report)
    ckpt = f"tinker://local-{hashlib.sha256(str(ws).encode()).hexdigest()[:16]}:train:0/sampler_weights/final"
    folder = checkpoint_dir(default_data_dir(), ckpt)  # commit checks that the checkpoint is there
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint.json").write_text(json.dumps({"base_model": "local/arith-tiny", "lora_rank": 0}))
    return Candidate(workspace=str(ws), machine="tutor", checkpoint=ckpt,
                     base_model="local/arith-tiny", engine="local", live_version=read_versions(ws, "tutor")[0],
                     report=report, gate=gate, passed=passed, reason=reason)


def test_refused_candidate_shows_why_and_the_button_writes_nothing(ws):
    cand = make(ws, learned=2)
    assert not cand.passed
    view = mnb.CandidateView(cand)
    html = view.static_html()
    assert "refused" in html and "not beyond chance" in html and "A candidate passes when" in html
    assert html.count("class='mnb-win'") == 2 and "2 held-out case(s) flipped" in html
    assert "Not committed: the gate refused it." in html
    before = (ws / "machines" / "tutor" / "versions.json").read_bytes()
    view._button.click()  # what a click in the browser runs
    assert view.committed is None and view.status.startswith("Not committed: Refused: ")
    assert (ws / "machines" / "tutor" / "versions.json").read_bytes() == before
    assert not view._button.disabled and "Not committed: Refused" in view.static_html()
    bundle = view._repr_mimebundle_()
    assert bundle["text/plain"].startswith("CandidateView: Candidate cand-") and "refused" in bundle["text/plain"]


def test_passing_candidate_commits_once_from_the_button(ws):
    cand = make(ws, learned=8)
    assert cand.passed and cand.report.wins == 8
    view = mnb.CandidateView(cand, note="from the view")
    assert "passes" in view.static_html() and "Not committed yet: the gate passed it" in view.static_html()
    view._button.click()
    assert view.committed == "v2" and view._button.disabled
    assert view.status == f"Committed as v2: tutor runs {cand.checkpoint}."
    versions = read_versions(ws, "tutor")
    assert [v["id"] for v in versions] == ["v1", "v2"] and versions[-1]["source"]["note"] == "from the view"
    assert "committed as <b>v2</b>" in view.static_html()
    assert view.commit() == "v2"  # a second click (or call) writes nothing more, and says what is so
    assert len(read_versions(ws, "tutor")) == 2 and view.status.startswith("Committed as v2")
    assert json.loads((ws / "machines" / "tutor" / "model.json").read_text())["model"].endswith("final")


def test_a_candidate_committed_elsewhere_opens_with_the_button_off(ws):
    cand = make(ws, learned=8)
    cand.commit()
    view = mnb.CandidateView(cand)
    assert view._button.disabled and "Committed as v2:" in view.static_html()


def test_every_view_and_print_follows_the_candidate(ws):
    """Clicked Commit, then a later cell commits again and prints: no "Not committed … already
    committed" beside views that say committed; views of the same candidate agree."""
    cand = make(ws, learned=8)
    view, other = mnb.CandidateView(cand), mnb.CandidateView(cand)
    assert cand.state == "passed" and cand.status.startswith("Not committed yet")
    view._button.click()
    assert other._button.disabled and other.committed == "v2"  # the other view followed the click
    assert "committed as <b>v2</b>" in other.static_html() and other.status == cand.status
    assert view.commit() == "v2" and other.commit() == "v2"  # a later cell: no second version, no error
    assert cand.state == "committed" and cand.status.startswith("Committed as v2: tutor runs ")
    for text in (view.status, other.status, view.static_html(), other.static_html(), cand.summary(), cand._repr_html_()):
        assert "Not committed" not in text and "already committed" not in text
    assert len(read_versions(ws, "tutor")) == 2
    code = make(ws, learned=8)  # committed in code, not by a click: its view follows too
    later = mnb.CandidateView(code)
    import pytest

    from machine_nb.evaluation.candidate import CommitConflict

    with pytest.raises(CommitConflict):  # measured against v1; v2 is live now
        code.commit()
    assert not later._button.disabled and later.committed is None
