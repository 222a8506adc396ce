"""Every HTML view the package draws outside its widgets reads "$" as text, never as math.

JupyterLab, classic Notebook and nbviewer run MathJax over HTML outputs: "$0.0000 observed
(estimated $0.0000)" between two dollars turned italic. Each view sits inside an element math
typesetters skip and writes "$" as an entity (the browser test checks Lab's rendering).
"""

from __future__ import annotations

import pandas as pd

import machine_nb as mnb
from machine_nb.evaluation.candidate import CandidateReport, Gate, report_html
from machine_nb.checks.pricing import CostEstimate, DPOCostEstimate, EvalCostEstimate, Price
from machine_nb.core.progress import progress
from machine_nb.reports.notebook import Report
from machine_nb.evaluation.results import EvalResult
from machine_nb.training.runlog import TrainResult
from machine_nb.core.theme import NO_MATH_CLASSES
from machine_nb.checks.validate import ValidationResult

PRICE = Price(0.1, 0.05, 0.3, 0.4, source="table $ row", date="2026-01-01")


def _results(name: str, correct: list[bool]) -> EvalResult:
    rows = pd.DataFrame({"row": range(len(correct)), "prompt": [f"Is $5 < ${i}?" for i in range(len(correct))],
                         "expected": ["answer: $1"] * len(correct), "output": ["$1"] * len(correct),
                         "correct": correct})
    return EvalResult(rows=rows, summary={"name": name}, path=f"runs/{name} $.json")


def _views(tmp_path) -> dict[str, str]:
    base, tuned = _results("base $", [False] * 6), _results("tuned $", [True] * 6)
    comparison = mnb.compare(base, tuned)
    cases = pd.DataFrame({"case": range(6), "input": ["$2 + $3"] * 6, "expected": ["$5"] * 6,
                          "live_output": ["$4"] * 6, "candidate_output": ["$5"] * 6, "live_correct": [0.0] * 6,
                          "candidate_correct": [1.0] * 6, "change": ["win"] * 6})
    report = CandidateReport(machine="m", live_name="live $", candidate_name="cand $", trials=1, live=base,
                             candidate=tuned, cases=cases, comparison=comparison, wins=6, ties=0, losses=0,
                             p_value=0.03, live_accuracy=0.0, candidate_accuracy=1.0)
    bar = progress(total=3, desc="spent $2", enabled=False)
    return {
        "TrainResult": TrainResult(checkpoint="tinker://x/$", steps=2, tokens=10, first_loss=1.0, last_loss=0.5,
                                   log_dir="runs/x", cost_usd=0.25, estimated_usd=0.3, note="paid $1")._repr_html_(),
        "CostEstimate": CostEstimate(model="m", rows=4, tokens=100, trained_tokens=50, epochs=1, batch_size=2,
                                     steps=2, usd=1.5, exact=True, price=PRICE, note="$ note")._repr_html_(),
        "EvalCostEstimate": EvalCostEstimate(model="m", rows=4, prompt_tokens=100, max_output_tokens=32, usd=0.5,
                                             exact=True, price=PRICE)._repr_html_(),
        "DPOCostEstimate": DPOCostEstimate(model="m", pairs=4, tokens=100, trained_tokens=50, epochs=1,
                                           batch_size=2, steps=2, train_usd=0.1, forward_usd=0.2,
                                           reference_usd=0.3, usd=0.6, exact=False, price=PRICE)._repr_html_(),
        "EvalResult": base._repr_html_(),
        "CompareResult": comparison._repr_html_(),
        "CompareManyResult": mnb.compare_many(base, {"a $": tuned, "b $": tuned})._repr_html_(),
        "ValidationResult": ValidationResult(
            path=None, model="m $", findings=pd.DataFrame({"line": [1], "severity": ["warning"], "code": ["x"],
                                                           "message": ["costs $3"]}),
            summary={"histogram": {"<$8": 1}, "errors": 0, "warnings": 1, "kind": "eval", "rows": 1,
                     "tokens": 8, "exact": True})._repr_html_(),
        "CandidateReport": report_html(report, Gate(), True, "gained $1", committed="v2 $"),
        "progress": bar._html(),
        "Corpus": mnb.make_corpus(tmp_path / "corpus $")._repr_html_(),
        "Report": Report(notebook=tmp_path / "a.ipynb", html=tmp_path / "r $.html", executed=tmp_path / "r $.ipynb",
                         wall_s=1.0, redactions=0)._repr_html_(),
        "ReportSummary": mnb.report_summary(comparison, cost_usd=0.5, estimated_usd=1.0,
                                            cost_note="$ note")._repr_mimebundle_()["text/html"],
    }


def test_no_html_view_outside_the_widgets_holds_a_bare_dollar_or_leaves_math_on(tmp_path):
    for name, html in _views(tmp_path).items():
        assert "$" not in html, f"{name}: a bare $ a typesetter reads as math: {html[html.index('$') - 60:][:120]!r}"
        assert html.startswith(f'<div class="{NO_MATH_CLASSES}">') or html.startswith(f'<p class="{NO_MATH_CLASSES}">'), \
            f"{name}: not inside an element math typesetters skip: {html[:80]!r}"
        assert "&#36;" in html, f"{name}: the dollars it was given are gone"
