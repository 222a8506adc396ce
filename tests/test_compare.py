"""compare(): baseline vs checkpoint with paired statistics a reader can trust.

The numbers are checked against cases worked by hand (exact McNemar from binomial sums, a
bootstrap whose distribution can be enumerated), then through files and the CLI.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from machine_nb.evaluate import (CompareResult, compare, load_results, mcnemar_exact, min_discordant_for,
                                 paired_bootstrap_ci)


def frame(correct, outputs=None, name=None, prompts=None):
    n = len(correct)
    prompts = prompts or [f"What is {i} plus {i}?" for i in range(n)]
    df = pd.DataFrame({
        "row": range(n), "prompt": prompts, "expected": [f"answer: {2 * i}" for i in range(n)],
        "match": ["exact"] * n,
        "output": outputs or [f"answer: {2 * i}" if c else f"{i} + {i} = {2 * i}" for i, c in enumerate(correct)],
        "correct": list(correct), "format_ok": list(correct),
    })
    if name:
        df.attrs["summary"] = {"name": name}
    return df


def write_results(path, df, **summary):
    path.write_text(json.dumps({**summary, "n": len(df), "rows": df.to_dict("records")}))
    return path


# --------------------------------------------------------------------------- McNemar by hand

def test_mcnemar_hand_worked():
    # b=1, c=6: 7 discordant pairs; P(X <= 1) = (C(7,0) + C(7,1)) / 2^7 = 8/128; two-sided doubles it
    assert mcnemar_exact(1, 6) == pytest.approx(2 * (1 + 7) / 128) == pytest.approx(0.125)
    assert mcnemar_exact(6, 1) == mcnemar_exact(1, 6)  # symmetric
    # b=0, c=19: 2 * 0.5^19
    assert mcnemar_exact(0, 19) == pytest.approx(2 * 0.5 ** 19) == pytest.approx(3.815e-6, rel=1e-3)
    # b=2, c=8: (1 + 10 + 45) / 1024 * 2 = 0.109375
    assert mcnemar_exact(2, 8) == pytest.approx(112 / 1024)
    assert mcnemar_exact(0, 0) == 1.0  # no discordant pairs: no evidence
    assert mcnemar_exact(3, 3) == 1.0  # capped at 1
    assert mcnemar_exact(0, 5) == pytest.approx(0.0625) and mcnemar_exact(0, 6) == pytest.approx(0.03125)


def test_fewest_discordant_pairs_for_significance():
    assert min_discordant_for(0.05) == 6   # 2/2^5 = 0.0625, 2/2^6 = 0.031
    assert min_discordant_for(0.01) == 8   # 2/2^7 = 0.0156, 2/2^8 = 0.0078


# --------------------------------------------------------------------------- bootstrap

def test_bootstrap_matches_an_enumerable_case():
    # two rows, deltas (1, 0): a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4,
    # so the 2.5th and 97.5th percentiles are 0 and 1
    assert paired_bootstrap_ci([0, 0], [1, 0]) == (0.0, 1.0)


def test_bootstrap_is_reproducible_and_brackets_the_delta():
    base = [True] + [False] * 23
    ckpt = [True] * 20 + [False] * 4
    lo, hi = paired_bootstrap_ci(base, ckpt, seed=0)
    assert (lo, hi) == paired_bootstrap_ci(base, ckpt, seed=0)
    delta = 19 / 24
    assert lo < delta < hi
    # normal approximation: sd = sqrt(p(1-p)/n) = 0.083, so about delta ± 0.16
    assert 0.55 <= lo <= 0.7 and 0.9 <= hi <= 1.0
    # every resampled delta is a multiple of 1/24
    assert math.isclose(lo * 24, round(lo * 24)) and math.isclose(hi * 24, round(hi * 24))


def test_bootstrap_all_ties_is_zero_width():
    assert paired_bootstrap_ci([True, False, True], [True, False, True]) == (0.0, 0.0)


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
    assert "McNemar exact p = 0.5" in html and "95% CI" in html
    assert load_results(ckpt_path).attrs["summary"]["name"] == "final"
    d = r.to_dict()
    assert d["wins"] == 2 and isinstance(d["flips"], list) and d["flips"][0]["change"] == "win"
    json.dumps(d)  # plain data


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
