"""compare() and compare_many(): baseline vs checkpoint(s) with paired statistics a reader can trust.

The statistics themselves are checked against published and hand-worked values in
test_stats.py; here they are checked as a user meets them: the numbers and sentences compare()
gives for the small evals people run (24/0/0, 7 wins and 1 loss, 12 vs 18 of 24), clustering by
case, Holm across checkpoints, results files, HTML and the CLI.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pandas as pd
import pytest

from machine_nb.evaluation import stats
from machine_nb.evaluation.compare import CompareManyResult, CompareResult, compare, compare_many
from machine_nb.evaluation.results import EvalResult, load_results

Z2 = 1.959963984540054 ** 2


def frame(correct, outputs=None, name=None, prompts=None):
    """Per-row results as a DataFrame; with a name, as the EvalResult evaluate() returns."""
    n = len(correct)
    prompts = prompts or [f"What is {i} plus {i}?" for i in range(n)]
    df = pd.DataFrame({
        "row": range(n), "prompt": prompts, "expected": [f"answer: {2 * i}" for i in range(n)],
        "match": ["exact"] * n,
        "output": outputs or [f"answer: {2 * i}" if c else f"{i} + {i} = {2 * i}" for i, c in enumerate(correct)],
        "correct": list(correct), "format_ok": list(correct),
    })
    return EvalResult(df, {"name": name}) if name else df


def write_results(path, df, **summary):
    path.write_text(json.dumps({**summary, "n": len(df), "rows": df.to_dict("records")}))
    return path


# --------------------------------------------------------------------------- the public names

def test_the_comparison_names_come_from_compare_and_stats():
    import machine_nb

    assert stats.min_discordant_for(0.05) == 6 and stats.min_discordant_for(0.01) == 8  # 2/2^6 = 0.031, 2/2^8 = 0.0078
    assert machine_nb.compare is compare and machine_nb.CompareResult is CompareResult
    assert machine_nb.compare_many is compare_many and machine_nb.CompareManyResult is CompareManyResult


def test_mnb_compare_is_callable_however_the_module_was_loaded():
    # importing evaluate (or CompareView) loads machine_nb.evaluation.compare, which binds the package's
    # `compare` attribute to the module: calling it must still compare
    code = ("import json, machine_nb as mnb, machine_nb.evaluation.evaluate, pandas as pd\n"
            "df = lambda c: pd.DataFrame({'prompt': ['p0', 'p1'], 'expected': ['a', 'a'], 'output': ['a', 'b'], 'correct': c})\n"
            "r = mnb.compare(df([False, False]), df([True, False]))\n"
            "print(json.dumps([r.wins, type(r).__name__]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [1, "CompareResult"]


# --------------------------------------------------------------------------- compare

def test_compare_the_minimal_sft_story():
    """24 rows; the baseline right on 1, the checkpoint right on 20 (including that one)."""
    base = frame([True] + [False] * 23, name="baseline")
    ckpt = frame([True] * 20 + [False] * 4, name="final")
    r = compare(base, ckpt)
    assert isinstance(r, CompareResult)
    assert r.n == 24 and r.baseline_accuracy == pytest.approx(1 / 24) and r.checkpoint_accuracy == pytest.approx(20 / 24)
    assert r.delta == pytest.approx(19 / 24)
    assert (r.wins, r.ties, r.losses) == (19, 5, 0)
    assert r.p_value == pytest.approx(2 * 0.5 ** 19)
    assert r.ci_low < r.delta < r.ci_high
    assert list(r.flips.columns) == ["row", "prompt", "expected", "baseline_output", "checkpoint_output",
                                     "baseline_correct", "checkpoint_correct", "change"]
    assert len(r.flips) == 19 and set(r.flips["change"]) == {"win"} and r.flips["row"].tolist() == list(range(1, 20))
    assert r.flips.loc[0, "baseline_output"] == "1 + 1 = 2" and r.flips.loc[0, "checkpoint_output"] == "answer: 2"
    assert "baseline: 4.2% correct; final: 83.3% correct, a delta of +79.2%" in r.summary
    assert "19 win(s), 5 tie(s), 0 loss(es)" in r.summary and "p = 3.81e-06" in r.summary
    assert "unlikely to be noise" in r.summary and "better" in r.summary
    assert r.baseline_format_rate == pytest.approx(1 / 24) and r.checkpoint_format_rate == pytest.approx(20 / 24)
    # Wilson intervals for 1/24 and 20/24, Newcombe for the paired delta (a = 1, b = 19, c = 0, d = 4)
    assert (r.baseline_ci_low, r.baseline_ci_high) == stats.proportion_interval(1, 24)
    assert (r.checkpoint_ci_low, r.checkpoint_ci_high) == stats.proportion_interval(20, 24)
    assert (r.delta_ci_low, r.delta_ci_high) == stats.newcombe_paired_interval([[1, 19], [0, 4]])
    assert r.delta_ci_low < r.delta < r.delta_ci_high
    assert r.cases == 24 and r.design_effect == 1.0 and r.effective_n == 24 and r.p_method == "exact McNemar"
    assert r.rows_for_power == stats.rows_for_power(19 / 24, 0)
    assert "(Wilson score)" in r.summary and "Newcombe's paired score interval" in r.summary


def test_compare_small_effect_says_what_cannot_be_concluded():
    # b=1 loss, c=6 wins over 24 rows: p = 0.125
    base = [False] * 24
    ckpt = [False] * 24
    for i in range(6):
        ckpt[i] = True
    base[10] = True
    r = compare(frame(base), frame(ckpt))
    assert (r.wins, r.losses, r.ties) == (6, 1, 17) and r.p_value == pytest.approx(0.125)
    assert r.delta == pytest.approx(5 / 24)
    assert "cannot be told from noise" in r.summary
    assert "with 24 rows at least 6 discordant pairs, all in one direction, are needed for p < 0.05" in r.summary
    assert "here there are 7 (6 one way, 1 the other)" in r.summary
    # 7 pairs: 7-0 gives p = 0.0156, 6-1 gives 0.125, so only 7 to 0 would do
    assert "With 7 discordant pairs, p < 0.05 needs a split of at least 7 to 0" in r.summary
    assert r.flips["change"].tolist() == ["win"] * 6 + ["loss"]


def test_compare_balanced_discordance_is_not_significant():
    # 10 discordant pairs split 5/5: p = 1; a 9-1 split would give p = 2 * 11/1024 = 0.021
    base = [True] * 5 + [False] * 5 + [False] * 14
    ckpt = [False] * 5 + [True] * 5 + [False] * 14
    r = compare(frame(base), frame(ckpt))
    assert (r.wins, r.losses) == (5, 5) and r.p_value == 1.0 and r.delta == 0
    assert r.ci_low < 0 < r.ci_high
    assert "needs a split of at least 9 to 1" in r.summary


def test_compare_no_change_and_tiny_n():
    r = compare(frame([True, False, True]), frame([True, False, True]))
    assert (r.wins, r.ties, r.losses) == (0, 3, 0) and r.p_value == 1.0 and (r.ci_low, r.ci_high) == (0.0, 0.0)
    assert len(r.flips) == 0 and "No row changed" in r._repr_html_()
    assert "With 3 rows no result can reach p < 0.05" in r.summary


def test_compare_refuses_different_rows():
    a = frame([True, False, True])
    with pytest.raises(ValueError, match="baseline has 3 rows, .* has 2"):
        compare(a.assign(), frame([True, False]))
    other = frame([True, False, True], prompts=["What is 0 plus 0?", "What is 9 plus 9?", "What is 2 plus 2?"])
    with pytest.raises(ValueError, match=r"row 1 differs in 'prompt'.*'What is 1 plus 1\?'.*'What is 9 plus 9\?'"):
        compare(a, other)
    shifted = a.copy()
    shifted.loc[2, "expected"] = "answer: 5"
    with pytest.raises(ValueError, match="row 2 differs in 'expected'"):
        compare(a, shifted)


def test_compare_from_result_files_and_html(tmp_path):
    base = write_results(tmp_path / "baseline.json", frame([True] + [False] * 5), name="baseline")
    ckpt = frame([True, True, True, False, False, False], outputs=["answer: 0", "answer: 2", "answer: <b>4</b>",
                                                                 "x", "y", "z"])
    ckpt_path = write_results(tmp_path / "final.json", ckpt, name="final")
    r = compare(base, ckpt_path)
    assert (r.wins, r.losses) == (2, 0) and r.checkpoint_name == "final"
    html = r._repr_html_()
    assert "answer: &lt;b&gt;4&lt;/b&gt;" in html and "<b>4</b>" not in html  # outputs are escaped
    assert "exact McNemar p = 0.5" in html and "95% CI" in html
    assert load_results(ckpt_path).summary["name"] == "final"
    d = r.to_dict()
    assert d["wins"] == 2 and isinstance(d["flips"], list) and d["flips"][0]["change"] == "win"
    json.dumps(d)  # plain data


def test_compare_takes_an_eval_result_a_frame_a_results_path_or_a_dict(tmp_path):
    """Whatever form results come in, the numbers are the same and the name travels with them."""
    base = frame([True] + [False] * 7, name="baseline")
    rows = frame([True] * 6 + [False] * 2)
    tuned = EvalResult(rows, {"name": "tuned", "accuracy": 0.75}, None)
    forms = {"EvalResult": tuned, "DataFrame": rows, "path": write_results(tmp_path / "tuned.json", rows, name="tuned"),
             "dict": tuned.to_dict()}
    got = {kind: compare(base, value) for kind, value in forms.items()}
    many = compare_many(base, {"as result": tuned, "as file": forms["path"]})
    numbers = {kind: (r.wins, r.ties, r.losses, r.p_value, r.delta_ci_low, r.delta_ci_high) for kind, r in got.items()}
    assert set(numbers.values()) == {(5, 3, 0, 2 * 0.5 ** 5, got["path"].delta_ci_low, got["path"].delta_ci_high)}
    assert {kind: r.checkpoint_name for kind, r in got.items()} == {
        "EvalResult": "tuned", "DataFrame": "checkpoint", "path": "tuned", "dict": "tuned"}
    assert got["path"].baseline_name == "baseline"
    assert many.table["wins"].tolist() == [5, 5]
    with pytest.raises(TypeError, match="checkpoint: expected an EvalResult, a results JSON path"):
        compare(base, 42)


def test_cli_compare(tmp_path, capsys):
    from machine_nb.cli import main

    a = write_results(tmp_path / "baseline.json", frame([False] * 8), name="baseline")
    b = write_results(tmp_path / "final.json", frame([True] * 7 + [False]), name="final")
    assert main(["eval", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "7 win(s), 1 tie(s), 0 loss(es)" in out and "[win] row 0" in out
    assert main(["eval", "compare", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["wins"] == 7 and data["p_value"] == pytest.approx(2 * 0.5 ** 7)
    short = write_results(tmp_path / "short.json", frame([True] * 3), name="short")
    assert main(["eval", "compare", str(a), str(short)]) == 1
    assert "not over the same rows" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{")
    assert main(["eval", "compare", str(a), str(tmp_path / "junk.json")]) == 1
    assert "junk.json: not a results JSON" in capsys.readouterr().err


# --------------------------------------------------------------------------- the three small evals

def test_all_24_wins_never_prints_a_zero_width_interval():
    r = compare(frame([False] * 24), frame([True] * 24))
    assert (r.wins, r.ties, r.losses) == (24, 0, 0) and r.delta == 1.0
    assert (r.ci_low, r.ci_high) == (1.0, 1.0) and not r.bootstrap_has_spread  # the bootstrap collapses
    # Newcombe by hand: 1 - sqrt(2) · z²/(24 + z²) to 1
    assert r.delta_ci_low == pytest.approx(1 - math.sqrt(2) * Z2 / (24 + Z2)) == pytest.approx(0.8049, abs=1e-4)
    assert r.delta_ci_high == 1.0
    assert r.checkpoint_ci_low == pytest.approx(24 / (24 + Z2)) and r.baseline_ci_high == pytest.approx(Z2 / (24 + Z2))
    assert r.delta_text == "+100.0% (95% CI +80.5% to +100.0%, Newcombe)"
    shown = [r.summary, r._repr_html_(), repr(r)]
    for text in shown:
        assert "+100.0% to +100.0%" not in text and "[+100.0%, +100.0%]" not in text and "+1.000, +1.000" not in text
    assert "the paired bootstrap shows no spread (every resample gives +100.0%" in r.summary
    assert "not certainty; read the Newcombe interval" in r.summary
    assert "the delta +80.5% to +100.0%" in r.summary
    assert "takes about 6 rows" in r.summary and "observed 100.0% and 0.0%" in r.summary
    assert r.rows_for_power == 6


def test_seven_wins_one_loss_of_24():
    base = [False] * 24
    base[23] = True
    ckpt = [True] * 7 + [False] * 17
    r = compare(frame(base), frame(ckpt))
    assert (r.wins, r.ties, r.losses) == (7, 16, 1)
    assert r.p_value == pytest.approx(2 * 9 / 256)  # (C(8,0) + C(8,1)) / 2^8, doubled
    assert (r.delta_ci_low, r.delta_ci_high) == stats.newcombe_paired_interval([[0, 7], [1, 16]])
    assert round(r.delta_ci_low, 3) == 0.021 and round(r.delta_ci_high, 3) == 0.457
    assert "cannot be told from noise" in r.summary and "needs a split of at least 8 to 0" in r.summary
    # the score interval excludes 0 where the exact test does not reach 0.05: said, not hidden
    assert "treat this result as borderline" in r.summary
    assert r.rows_for_power == 43 == stats.rows_for_power(7 / 24, 1 / 24)
    assert "takes about 43 rows" in r.summary and "observed 29.2% and 4.2%" in r.summary


def test_twelve_vs_eighteen_of_24_paired():
    # the baseline's 12 correct rows are among the checkpoint's 18: 6 wins, no loss
    base = [True] * 12 + [False] * 12
    ckpt = [True] * 18 + [False] * 6
    r = compare(frame(base), frame(ckpt))
    assert (r.wins, r.ties, r.losses) == (6, 18, 0) and r.p_value == pytest.approx(2 / 64)
    assert (r.delta_ci_low, r.delta_ci_high) == stats.newcombe_paired_interval([[12, 6], [0, 6]])
    # pairing is the point: the unpaired (independent samples) Newcombe interval for 18/24 vs 12/24
    # is wider and includes 0
    from statsmodels.stats.proportion import confint_proportions_2indep

    lo, hi = confint_proportions_2indep(18, 24, 12, 24, method="newcomb")
    assert lo < 0 < r.delta_ci_low and r.delta_ci_high - r.delta_ci_low < 0.8 * (hi - lo)  # 0.36 vs 0.50
    assert "unlikely to be noise" in r.summary and "borderline" not in r.summary


# --------------------------------------------------------------------------- clustering by case

def test_several_trials_per_case_are_not_counted_as_independent_rows():
    cases = [f"case-{i // 8}" for i in range(24)]
    plain = compare(frame([False] * 24), frame([True] * 24))
    r = compare(frame([False] * 24).assign(case=cases), frame([True] * 24).assign(case=cases))
    assert r.cases == 3 and r.p_method == "exact sign-flip test over 3 cases"
    assert r.p_value == pytest.approx(0.25)  # 2 of the 2³ sign patterns
    assert r.effective_n == pytest.approx(stats.effective_size([1] * 24, cases))
    assert r.effective_n < 6
    assert r.delta_ci_low < plain.delta_ci_low - 0.2 and r.checkpoint_ci_low < plain.checkpoint_ci_low - 0.2
    assert "The 24 rows come from 3 cases" in r.summary and "5.5 independent rows" in r.summary
    assert "With 3 cases no result can reach p < 0.05" in r.summary
    assert r.rows_for_power == 48 and "about 48 rows (6 cases of 8 rows)" in r.summary  # 6 cases, all won
    # the same labels given directly, or the case column ignored
    assert compare(frame([False] * 24), frame([True] * 24), cluster=cases).p_value == r.p_value
    ignored = compare(frame([False] * 24).assign(case=cases), frame([True] * 24).assign(case=cases), cluster=False)
    assert ignored.cases == 24 and ignored.p_value == plain.p_value


def test_clustered_bootstrap_and_power_use_cases():
    # 8 cases of 3 trials: the checkpoint wins all three trials in 6 cases, ties the rest
    cases = [i // 3 for i in range(24)]
    base = [False] * 24
    ckpt = [True] * 18 + [False] * 6
    r = compare(frame(base), frame(ckpt), cluster=cases)
    assert r.cases == 8 and r.p_value == pytest.approx(2 / 2 ** 6)
    assert (r.ci_low, r.ci_high) == stats.paired_bootstrap_ci(base, ckpt, clusters=cases)
    assert (r.ci_low, r.ci_high) != stats.paired_bootstrap_ci(base, ckpt)
    assert r.design_effect == pytest.approx(stats.design_effect([1] * 18 + [0] * 6, cases)) and r.design_effect > 2
    # power is sized in cases, as the test counts them: 6 of 8 cases net a win, none a loss
    cases_needed = stats.rows_for_power(6 / 8, 0)
    assert r.rows_for_power == 3 * cases_needed
    assert f"about {3 * cases_needed} rows ({cases_needed} cases of 3 rows)" in r.summary
    assert "observed 75.0% and 0.0%" in r.summary


def test_case_labels_are_checked():
    a, b = frame([True, False, True]), frame([True, True, True])
    with pytest.raises(ValueError, match="row 1 has no case"):
        compare(a.assign(case=["x", None, "y"]), b)
    with pytest.raises(ValueError, match="disagree on the case of row 2"):
        compare(a.assign(case=["x", "x", "y"]), b.assign(case=["x", "x", "z"]))
    with pytest.raises(ValueError, match="neither result has a 'task' column"):
        compare(a, b, cluster="task")
    with pytest.raises(ValueError, match="2 case labels for 3 rows"):
        compare(a, b, cluster=["x", "y"])


def test_case_from_results_files(tmp_path):
    cases = ["a", "a", "b", "b"]
    base = write_results(tmp_path / "baseline.json", frame([False] * 4).assign(case=cases), name="baseline")
    ckpt = write_results(tmp_path / "final.json", frame([True] * 4).assign(case=cases), name="final")
    r = compare(base, ckpt)
    assert r.cases == 2 and r.p_method == "exact sign-flip test over 2 cases" and r.p_value == pytest.approx(0.5)


# --------------------------------------------------------------------------- several checkpoints

def test_compare_many_holm():
    base = frame([False] * 24, name="baseline")
    strong = frame([True] * 24)                          # 24 wins: p = 1.2e-7
    edge = frame([True] * 6 + [False] * 18)              # 6 wins: p = 0.031, alone under 0.05
    none = frame([False] * 24)                            # nothing changed: p = 1
    many = compare_many(base, {"strong": strong, "edge": edge, "none": none})
    assert isinstance(many, CompareManyResult) and list(many.results) == ["strong", "edge", "none"]
    raw = [compare(base, c).p_value for c in (strong, edge, none)]
    assert many.table["p_value"].tolist() == pytest.approx(raw)
    assert many.table["p_holm"].tolist() == pytest.approx(stats.holm(raw))
    # Holm by hand: sorted p1 < p2 < p3 -> 3·p1, max(3·p1, 2·p2), max(…, p3)
    assert many.table["p_holm"].tolist() == pytest.approx([3 * raw[0], 2 * raw[1], 1.0])
    assert many.table["significant"].tolist() == [True, False, False]
    assert list(many.table.columns) == ["checkpoint", "n", "accuracy", "accuracy_low", "accuracy_high", "delta",
                                        "delta_low", "delta_high", "wins", "ties", "losses", "p_value", "p_holm",
                                        "significant"]
    assert "Holm-adjusted over the 3 comparisons" in many.summary and "not adjusted" in many.summary
    assert "edge: 25.0% correct" in many.summary and "not distinguishable from the baseline" in many.summary
    edge_r = many.results["edge"]
    assert edge_r.checkpoint_name == "edge" and edge_r.adjustment == "Holm over 3 comparisons"
    assert edge_r.p_adjusted == pytest.approx(2 * raw[1])
    assert "but not once corrected for the other comparisons" in edge_r.summary
    assert "unlikely to be noise (Holm over 3 comparisons: adjusted p" in many.results["strong"].summary
    # the power sentence uses alpha / 3
    assert "two-sided α = 0.0167 (0.05 over the comparisons)" in edge_r.summary
    assert edge_r.rows_for_power == stats.rows_for_power(0.25, 0, alpha=0.05 / 3)
    html_text = many._repr_html_()
    assert "p (Holm)" in html_text and "edge" in html_text


def test_compare_many_inputs():
    base = frame([False] * 4, name="baseline")
    named = [frame([True] * 4, name="one"), frame([True, False, False, False], name="two")]
    many = compare_many(base, named)
    assert list(many.results) == ["one", "two"]
    with pytest.raises(ValueError, match="share a name"):
        compare_many(base, [frame([True] * 4, name="x"), frame([True] * 4, name="x")])
    with pytest.raises(ValueError, match="at least one checkpoint"):
        compare_many(base, {})
    with pytest.raises(ValueError, match="not over the same rows"):
        compare_many(base, {"short": frame([True] * 3)})


# --------------------------------------------------------------------------- display

def test_html_colours_follow_the_jupyterlab_theme():
    base = [True] * 3 + [False] * 5
    ckpt = [False] + [True] * 4 + [False] * 3
    r = compare(frame(base), frame(ckpt))
    many = compare_many(frame(base), {"c": frame(ckpt)})
    for text in (r._repr_html_(), many._repr_html_()):
        colours = re.findall(r"(?<![\w-])(?:color|background(?:-color)?|border(?:-(?:top|bottom|left|right))?)"
                             r"\s*:\s*([^;'\"]+)", text)
        assert colours and all("var(--jp-" in c for c in colours), colours
        assert not re.search(r"#[0-9a-fA-F]{3,6}(?![^(]*\))", text)  # a hex colour only as a var() fallback


def test_to_dict_is_plain_data_with_the_new_fields():
    d = compare(frame([False] * 24), frame([True] * 24)).to_dict()
    json.dumps(d)
    for key in ("baseline_ci_low", "checkpoint_ci_high", "delta_ci_low", "delta_ci_high", "p_method", "cases",
                "design_effect", "effective_n", "rows_for_power", "level"):
        assert key in d


def test_an_impossible_alpha_is_refused_instead_of_looping():
    import pytest as _pytest

    from machine_nb.evaluation.stats import min_discordant_for

    for alpha in (0, -0.1, 1, 1.5):
        with _pytest.raises(ValueError, match="alpha"):
            min_discordant_for(alpha)


def test_a_row_without_a_score_is_refused_naming_it_not_counted_as_correct():
    """A results frame built by hand (a merge that missed a row) can hold NaN or None where
    `correct` belongs: compare and the accuracy refuse it, naming the results and the row, rather
    than count it as correct (bool(nan) is True)."""
    a = frame([True, False, True, False])
    b = frame([True, True, True, False])
    b["correct"] = b["correct"].astype(object)
    b.loc[2, "correct"] = float("nan")
    with pytest.raises(ValueError, match=r"checkpoint: row 2 has no 'correct' value"):
        compare(a, b)
    with pytest.raises(ValueError, match=r"row 2 has no 'correct' value"):
        EvalResult(b, {"name": "x"}).accuracy
    b.loc[2, "correct"] = None
    with pytest.raises(ValueError, match=r"row 2 has no 'correct' value"):
        compare_many(a, {"ckpt": b})
