"""Evaluation inputs a user builds or edits by hand: result frames and files whose scores are not
True/False, confidence levels given in percent, results that disagree with their own summary, case
lists that reuse a case number, and two results that were not measured the same way. Each is
either refused with a message that names the value and the way out, or warned about; none is
counted silently.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

import machine_nb as mnb
from machine_nb.errors import MachineFormatError
from machine_nb.evaluation.compare import NotMeasuredAlike, compare, compare_many
from machine_nb.evaluation.results import EvalResult, correct_values, load_results

MODEL = "thinkingmachines/Inkling-Small"  # renders offline through tml_renderers


def frame(correct, prompts=None):
    """Per-row results as evaluate() returns them, built by hand."""
    n = len(correct)
    return pd.DataFrame({
        "row": range(n), "prompt": prompts or [f"What is {i} plus {i}?" for i in range(n)],
        "expected": [f"answer: {2 * i}" for i in range(n)], "match": ["exact"] * n,
        "output": [f"answer: {2 * i}" if c is True else "no" for i, c in enumerate(correct)],
        "correct": list(correct)})


# --------------------------------------------------------------------------- scores that are not True/False

def test_a_correct_cell_that_is_not_true_or_false_is_refused_not_counted_as_correct():
    """A frame read from a CSV as text holds "False", and an Inspect-style partial score 0.5; both
    are truthy, so every such row was counted correct (accuracy 100% for an all-wrong run)."""
    as_text = frame(["False", "False", "True"])
    with pytest.raises(ValueError, match=r"checkpoint: row 0 has 'correct' 'False' \(str\)"):
        compare(frame([True, False, True]), as_text)
    with pytest.raises(ValueError, match=r"row 0 has 'correct' 'False'"):
        EvalResult(as_text, {"name": "csv"}).accuracy  # noqa: B018
    partial = frame([0.5, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"row 0 has 'correct' 0.5 \(float\).*>= 1"):
        correct_values(partial, "partial")
    # what a frame legitimately holds: bools, numpy bools, 0/1 as int or float
    assert correct_values(frame([np.True_, np.False_, 1, 0, 1.0, 0.0])) == [True, False, True, False, True, False]


def test_a_results_file_whose_correct_is_not_a_boolean_names_the_file_row_and_field(tmp_path):
    """A hand-edited results JSON ("correct": "false", or null) read back: "false" counted as right
    and null failed only later, in compare, without naming the file."""
    rows = frame([True, False]).to_dict("records")
    path = tmp_path / "final.json"
    for bad in ("false", None, 2):
        rows[1]["correct"] = bad
        path.write_text(json.dumps({"name": "final", "rows": rows}), encoding="utf-8")
        with pytest.raises(MachineFormatError) as err:
            load_results(path)
        assert err.value.path == str(path) and err.value.field == "rows.1.correct"
        assert "true or false" in str(err.value)
    rows[1]["correct"] = False
    path.write_text(json.dumps({"name": "final", "rows": rows}), encoding="utf-8")
    assert load_results(path).accuracy == 0.5


# --------------------------------------------------------------------------- compare's own arguments

def test_compare_refuses_a_level_or_alpha_given_in_percent_naming_the_argument():
    """level=95 (meant as 95%) raised statistics' "p must be in the range 0.0 < p < 1.0", which
    names neither argument; cluster=True raised "'bool' object is not iterable"."""
    a, b = frame([True] * 4 + [False] * 4), frame([True] * 8)
    for kwargs, word in (({"level": 95}, "level"), ({"level": 1.0}, "level"), ({"alpha": 5}, "alpha"),
                         ({"alpha": 0}, "alpha")):
        with pytest.raises(ValueError, match=rf"{word} must be between 0 and 1"):
            compare(a, b, **kwargs)
        with pytest.raises(ValueError, match=rf"{word} must be between 0 and 1"):
            compare_many(a, {"x": b}, **kwargs)
    with pytest.raises(ValueError, match=r"cluster=True"):
        compare(a, b, cluster=True)


# --------------------------------------------------------------------------- a result agrees with its rows

def test_the_accuracy_is_the_rows_it_shows_not_a_stale_summary():
    """A result rebuilt from a subset of rows (or a summary edited by hand) said "1/4 correct,
    75.0%": the count came from the rows and the share from the summary."""
    res = EvalResult(frame([True, False, False, False]), {"name": "x", "accuracy": 0.75, "n": 4})
    assert res.accuracy == 0.25
    assert res._headline().startswith("x: 1/4 correct, 25.0%")
    # a result without per-row scores (a summary alone) still reports the summary's accuracy
    assert EvalResult(pd.DataFrame({"row": []}), {"accuracy": 0.5}).accuracy == 0.5


# --------------------------------------------------------------------------- cases that share a number

class FailingSampler:
    """A sampler that fails every request: reached only if the cases were accepted."""

    async def sample_async(self, prompt, num_samples, sampling_params):
        raise ConnectionError("stand-in: not reached when the cases are refused")


def test_cases_that_share_a_case_number_are_refused_not_merged_into_one_case():
    """load_cases numbers each file's cases from 0, so both splits in one frame reuse 0, 1, …:
    evaluate_cases filed two different cases under one number, and compare() then clustered them
    as trials of one case and case_accuracy averaged them together."""
    both = pd.concat([mnb.load_cases("data/sample_workspace", "tutor", "cases"),
                      mnb.load_cases("data/sample_workspace", "tutor", "holdout")])
    with pytest.raises(MachineFormatError, match=r"case 0 is given 2 times.*case=range") as err:
        mnb.evaluate_cases("data/sample_workspace", "tutor", model=MODEL, engine="tinker", instructions="",
                           cases=both, sampling_client=FailingSampler(), progress=False)
    assert err.value.field == "case"
    listed = [{"input": "What is 1 plus 1?", "case": 3}, {"input": "What is 2 plus 2?", "case": 3}]
    with pytest.raises(MachineFormatError, match=r"case 3 is given 2 times"):
        mnb.evaluate_cases("data/sample_workspace", "tutor", model=MODEL, engine="tinker", instructions="",
                           cases=listed, grader=lambda c, r: True, sampling_client=FailingSampler(), progress=False)


# --------------------------------------------------------------------------- two results measured differently

def test_results_with_other_prompts_behind_the_same_last_message_are_warned_about():
    """The rows' `prompt` is the last user message only: two eval files that differ in their system
    prompt paired silently. Results files carry each row's whole `messages`, and those are compared:
    a difference is said (two sets of instructions may be compared on purpose), not refused."""
    a = frame([True, False]).assign(messages=[[{"role": "user", "content": "What is 0 plus 0?"}],
                                              [{"role": "user", "content": "What is 1 plus 1?"}]])
    b = frame([True, True]).assign(messages=[[{"role": "user", "content": "What is 0 plus 0?"}],
                                             [{"role": "system", "content": "Reply as answer: N."},
                                              {"role": "user", "content": "What is 1 plus 1?"}]])
    with pytest.warns(NotMeasuredAlike, match=r"the whole prompt \(a system message or earlier turns\) in 1 of 2"):
        assert compare(a, b).wins == 1


def test_results_sampled_with_other_settings_or_base_models_are_warned_about():
    """A baseline sampled with max_tokens=32 and a checkpoint with 256, or from another base model,
    or over another eval file: compare() paired them without a word, and the delta then measures the
    settings as much as the training."""
    rows = frame([True, False, False, True])
    base = {"name": "baseline", "model": MODEL, "renderer": "inkling",
            "parameters": {"max_tokens": 32, "temperature": 0.0, "seed": 0, "concurrency": 8},
            "data": {"path": "eval.jsonl", "sha256": "a" * 64}}
    same = EvalResult(rows.assign(correct=[True] * 4), {**base, "name": "final",
                                                         "parameters": {**base["parameters"], "concurrency": 32}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same settings (concurrency aside): no warning
        compare(EvalResult(rows, base), same)
    other = EvalResult(rows.assign(correct=[True] * 4), {
        **base, "name": "final", "model": "Qwen/Qwen3-8B", "parameters": {**base["parameters"], "max_tokens": 256},
        "data": {"path": "eval.jsonl", "sha256": "b" * 64}})
    with pytest.warns(UserWarning) as caught:
        compare(EvalResult(rows, base), other)
    text = " ".join(str(w.message) for w in caught)
    assert "max_tokens" in text and "32" in text and "256" in text
    assert "Qwen/Qwen3-8B" in text and "sha256" in text


def test_an_inspect_log_of_rows_whose_correct_is_text_is_refused_not_scored_correct(tmp_path):
    """"False" as text was written as a correct (C) score, and counted in the log's accuracy."""
    rows = frame([True, False]).assign(correct=[True, "False"])
    with pytest.raises(ValueError, match=r"row 1 has 'correct' 'False' \(str\)"):
        EvalResult(rows, {"name": "handmade"}).write_inspect_log(tmp_path / "handmade.eval")
    assert not (tmp_path / "handmade.eval").exists()
