"""Edge cases of scoring, small-n statistics, comparisons and results files, as a user meets them:
numbers written in unusual ways, confidence levels and counts out of range, rows that do not pair
up, Inspect samples in another order, results files that are folders or come from another version.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from decimal import Decimal

import pandas as pd
import pytest

from machine_nb.errors import MachineFormatError
from machine_nb.evaluation import stats
from machine_nb.evaluation.compare import compare, compare_many
from machine_nb.evaluation.results import EvalResult, load_results
from machine_nb.evaluation.scoring import last_number, score_output, to_number


def frame(correct, **columns):
    """Per-row results as a DataFrame, one prompt per row."""
    n = len(correct)
    df = pd.DataFrame({"prompt": [f"What is {i} plus {i}?" for i in range(n)], "expected": [str(2 * i) for i in range(n)],
                       "match": ["number"] * n, "output": [f"reply {i}" for i in range(n)], "correct": list(correct)})
    for key, values in columns.items():
        df[key] = values
    return df


# --------------------------------------------------------------------------- scoring numbers

def test_a_reply_in_scientific_notation_is_scored_by_its_value():
    assert score_output("1e3", "1e3", "number")
    assert score_output("That is about 1.5E+3 rows.", "1500", "number")
    assert score_output("2.5e-3", "0.0025", "number")
    assert not score_output("1e3", "3", "number")
    assert last_number("the 3 eggs") == 3  # an "e" not followed by digits is not an exponent


def test_a_unicode_minus_sign_keeps_the_number_negative():
    assert not score_output("The answer is \u22125.", "5", "number")
    assert score_output("x = \u22125", "-5", "number")
    assert to_number("\u22125") == Decimal(-5)


def test_a_hyphen_between_digits_is_not_a_minus_sign():
    assert last_number("Pages 3-5") == 5
    assert last_number("on 2024-01-05") == 5
    assert score_output("The range is 10-20", "20", "number")
    assert last_number("x = -5") == -5
    assert last_number("(-5)") == -5
    assert last_number("-0") == 0


def test_an_expected_answer_that_is_not_a_finite_number_is_not_a_number():
    for text in ("NaN", "nan", "sNaN", "Infinity", "-inf", "inf"):
        assert to_number(text) is None, text
    assert score_output("5", "sNaN", "number") is False  # no decimal.InvalidOperation
    assert score_output("NaN", "NaN", "number") is False


def test_commas_count_only_as_thousands_separators():
    assert to_number("1,5") is None  # a decimal comma, not fifteen
    assert to_number("1,2,3") is None
    assert to_number("1,000") == 1000
    assert to_number("-12,345.5") == Decimal("-12345.5")
    assert to_number(" 1,000,000 ") == 1_000_000
    assert score_output("The answer is 1,000.", "1000", "number")


# --------------------------------------------------------------------------- statistics

@pytest.mark.parametrize("method", ["wilson", "clopper-pearson", "jeffreys"])
@pytest.mark.parametrize("level", [0, 1, 95, -0.1, float("nan"), float("inf")])
def test_an_interval_level_outside_0_1_is_refused(method, level):
    with pytest.raises(ValueError, match="level"):
        stats.proportion_interval(3, 10, level=level, method=method)


def test_other_intervals_refuse_a_level_outside_0_1():
    with pytest.raises(ValueError, match="level"):
        stats.newcombe_paired_interval([[3, 1], [2, 4]], level=1.0)
    with pytest.raises(ValueError, match="level"):
        stats.paired_bootstrap_ci([1, 0, 1], [0, 1, 1], level=95)
    with pytest.raises(ValueError, match="level"):
        stats.effective_size([1, 0, 1, 1], ["a", "a", "b", "b"], level=float("nan"))


@pytest.mark.parametrize("method", ["wilson", "clopper-pearson", "jeffreys"])
def test_an_interval_of_infinite_counts_is_refused(method):
    with pytest.raises(ValueError, match="finite"):
        stats.proportion_interval(math.inf, math.inf, method=method)
    with pytest.raises(ValueError, match="finite"):
        stats.proportion_interval(1, math.inf, method=method)


@pytest.mark.parametrize("method", ["wilson", "clopper-pearson"])
@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 24), (24, 24), (0, 0.4), (0.4, 0.4)])
def test_all_right_or_all_wrong_intervals_hold_the_accuracy(method, k, n):
    low, high = stats.proportion_interval(k, n, method=method)
    assert not math.isnan(low) and not math.isnan(high)
    assert 0.0 <= low <= k / n <= high <= 1.0


def test_the_bootstrap_refuses_rows_that_do_not_pair_up():
    with pytest.raises(ValueError, match="1 .* 4|rows"):
        stats.paired_bootstrap_ci([1], [0, 1, 1, 0])
    with pytest.raises(ValueError, match="resamples"):
        stats.paired_bootstrap_ci([1, 0], [0, 1], resamples=0)


# --------------------------------------------------------------------------- compare

def test_compare_many_refuses_one_results_given_as_its_checkpoints(tmp_path):
    base = frame([True, False])
    path = tmp_path / "final.json"
    path.write_text(json.dumps({"rows": frame([False, True]).to_dict("records")}))
    for one in (str(path), path, frame([False, True])):
        with pytest.raises(TypeError, match="checkpoints"):
            compare_many(base, one)
    result = compare_many(base, [str(path)])  # a list of one is fine
    assert list(result.table["wins"]) == [1]


def test_flips_keep_a_row_whose_row_number_is_missing():
    a = frame([True, False, True], row=[0, float("nan"), 2])
    b = frame([True, True, False], row=[0, float("nan"), 2])
    result = compare(a, b)
    assert (result.wins, result.losses) == (1, 1)
    assert list(result.flips["row"]) == [1, 2]  # the position stands in for the missing number
    assert list(result.flips["change"]) == ["win", "loss"]


def inspect_like(correct_by_id, order):
    """Rows as load_results gives an Inspect log: sample_id and epoch, in the log's order."""
    rows = [{"prompt": f"q{s}", "expected": "x", "match": None, "output": "x" if correct_by_id[s] else "y",
             "correct": correct_by_id[s], "sample_id": s, "epoch": 1} for s in order]
    return pd.DataFrame(rows)


def test_many_inspect_samples_in_another_order_pair_up():
    # 20,000 samples: pairing by id must not compare every sample with every other
    n = 20_000
    base_ok = {str(i): i % 3 == 0 for i in range(n)}
    ckpt_ok = {str(i): i % 2 == 0 for i in range(n)}
    ids = [str(i) for i in range(n)]
    result = compare(inspect_like(base_ok, ids), inspect_like(ckpt_ok, ids[::-1]), resamples=10)
    wins = sum(ckpt_ok[s] and not base_ok[s] for s in ids)
    losses = sum(base_ok[s] and not ckpt_ok[s] for s in ids)
    assert (result.wins, result.losses) == (wins, losses)


def test_compare_names_a_sample_id_listed_twice():
    ok = {"a": True, "b": False, "c": True}
    with pytest.raises(ValueError, match="more than once: a"):
        compare(inspect_like(ok, ["a", "b", "c", "a"]), inspect_like(ok, ["a", "b", "c", "a"]))


# --------------------------------------------------------------------------- the compare view

def test_side_by_side_pairs_inspect_samples_as_compare_does():
    from machine_nb.widgets.compare_view import CompareView, side_by_side

    base_ok = {"a": True, "b": False, "c": False, "d": True}
    ckpt_ok = {"a": True, "b": True, "c": False, "d": False}
    base, ckpt = inspect_like(base_ok, ["a", "b", "c", "d"]), inspect_like(ckpt_ok, ["d", "c", "b", "a"])
    table = side_by_side(base, ckpt)
    assert list(table["prompt"]) == ["qa", "qb", "qc", "qd"]
    assert list(table["change"]) == ["tie", "win", "tie", "loss"]
    view = CompareView(base, ckpt)
    shown = view.rows["change"].value_counts()
    assert (shown.get("win", 0), shown.get("loss", 0)) == (view.result.wins, view.result.losses) == (1, 1)


def test_side_by_side_refuses_results_over_other_rows():
    from machine_nb.widgets.compare_view import side_by_side

    a = frame([True, False])
    b = frame([True, False])
    b.loc[1, "prompt"] = "Another question?"
    with pytest.raises(ValueError, match="row 1 differs in 'prompt'"):
        side_by_side(a, b)


# --------------------------------------------------------------------------- results files

def test_loading_a_folder_as_results_is_a_clear_error(tmp_path):
    folder = tmp_path / "final.json"
    folder.mkdir()
    with pytest.raises(MachineFormatError, match="final.json") as info:
        load_results(folder)
    assert "folder" in str(info.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_loading_a_named_pipe_as_results_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "final.json"
    os.mkfifo(fifo)
    with pytest.raises(MachineFormatError, match="FIFO"):
        load_results(fifo)


def test_a_results_summary_from_another_version_still_shows(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"name": "old", "format_rate": "n/a", "errors": 0,
                                "rows": [{"prompt": "p", "expected": "1", "output": "1", "correct": True}]}))
    res = load_results(path)
    assert "1/1 correct" in res._repr_html_()
    assert "format" not in res._headline()
    assert "accuracy=1.000" in repr(res)


def test_a_summary_accuracy_that_is_not_a_share_is_not_shown_as_one():
    for summary in ({"accuracy": "high", "n": 4}, {"accuracy": 1.5, "n": 4}, {"accuracy": 0.5, "n": "many"},
                    {"accuracy": True, "n": 4}):
        res = EvalResult(pd.DataFrame(), summary)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            text = repr(res)
        assert "EvalResult(" in text
        if summary["accuracy"] == 0.5:
            assert res.accuracy == 0.5 and res.accuracy_interval() is None
        else:
            assert res.accuracy is None and res.accuracy_interval() is None
    assert EvalResult(pd.DataFrame(), {"accuracy": 0.5, "n": 4}).accuracy_interval() == \
        stats.proportion_interval(2, 4)


def test_format_rate_of_a_nullable_boolean_column():
    df = frame([True, True, False], format_ok=[True, None, False]).convert_dtypes()  # format_ok: boolean, <NA>
    result = compare(df, df)
    assert result.baseline_format_rate == result.checkpoint_format_rate == 0.5


def test_format_ok_as_text_is_refused_not_counted_as_true():
    df = frame([True, True], format_ok=["True", "False"])
    with pytest.raises(ValueError, match="row 0 has 'format_ok' 'True'"):
        compare(df, df)


def test_a_view_refuses_frames_other_than_the_ones_its_result_counts():
    from machine_nb.widgets.compare_view import CompareView

    a, b, c = frame([True, False, False]), frame([True, True, False]), frame([False, True, True])
    with pytest.raises(ValueError, match="frames="):
        CompareView(result=compare(a, c), frames=(a, b))
    view = CompareView(result=compare(a, b), frames=(a, b))
    assert (view.result.wins, view.result.losses) == (1, 0)


def test_the_headline_format_rate_is_counted_from_the_rows_shown(tmp_path):
    rows = frame([True, False, True, True], format_ok=[True, True, None, False])
    res = EvalResult(rows, {"name": "final", "format_rate": 0.1})  # the summary of a larger run
    assert "3/4 correct" in res._headline()
    assert "format 66.7%" in res._headline()
    subset = EvalResult(rows.head(2), res.summary)
    assert "1/2 correct" in subset._headline() and "format 100.0%" in subset._headline()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_choosing_a_results_path_past_a_named_pipe_does_not_wait_on_it(tmp_path):
    from machine_nb.evaluation.results import free_results_path

    os.mkfifo(tmp_path / "final.json")
    with pytest.warns(UserWarning, match="not results of this model"):
        path = free_results_path("final", "base-model", "tinker://run/sampler_weights/final", folder=tmp_path)
    assert path == tmp_path / "final-2.json"


def test_the_bootstrap_refuses_values_that_are_not_0_or_1():
    with pytest.raises(ValueError, match="0 or 1"):
        stats.paired_bootstrap_ci([1, float("nan"), 0], [1, 1, 0])
    with pytest.raises(ValueError, match="0 or 1"):
        stats.paired_bootstrap_ci([1, 2, 0], [1, 1, 0])
    assert stats.paired_bootstrap_ci([True, False, True], [True, True, True], resamples=200) == \
        stats.paired_bootstrap_ci([1, 0, 1], [1, 1, 1], resamples=200)


def test_a_level_that_is_not_a_whole_percent_is_labelled_as_it_is():
    a, b = frame([True, False] * 10), frame([True, True] * 10)
    result = compare(a, b, level=0.975)
    assert "97.5% intervals" in result.summary and "98%" not in result.summary
    assert "(97.5% CI " in result.delta_text
    assert "97.5% CI (Wilson score)" in result._repr_html_()
    many = compare_many(a, {"b": b}, level=0.975)
    assert "97.5% CI" in many.summary and "97.5% CI" in many._repr_html_()


def test_a_format_rate_short_of_all_rows_is_not_shown_as_100_percent():
    ok = [True] * 199 + [False]
    result = compare(frame([True] * 200, format_ok=ok), frame([True] * 200, format_ok=ok))
    assert result.baseline_format_rate == 0.995
    assert "99.5%" in result._repr_html_() and ">100%<" not in result._repr_html_()
