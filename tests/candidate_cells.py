"""Notebook code the browser tests of CandidateView share: the sample tutor's first 8 held-out
cases in the notebook's workspace "ws", and `results(name, outputs)`, the EvalResult of
those cases with the given outputs, so a candidate's report is made in the notebook with nothing
trained."""

RESULTS = '''\
import pandas as pd
import machine_nb as mnb
from machine_nb.evaluation.candidate import Candidate, Gate, build_report
from machine_nb.evaluation.cases import CASE_RESULT_COLUMNS, read_versions
from machine_nb.evaluation.results import EvalResult
cases = mnb.load_cases("ws", "tutor", "holdout").head(8)
def results(name, outputs):
    rows = [{"row": i, "case": i, "trial": 0, "input": q, "prompt": q, "expected": e, "match": "exact", "output": o,
             "correct": o == e, "format_ok": None, "prompt_tokens": 27, "output_tokens": 8, "latency_s": 0.0,
             "stop_reason": "stop", "error": None} for i, (q, e, o) in enumerate(zip(cases["input"], cases["expected"], outputs))]
    return EvalResult(pd.DataFrame(rows, columns=CASE_RESULT_COLUMNS), {"name": name})
'''
