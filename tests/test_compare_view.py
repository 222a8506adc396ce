"""CompareView over evaluate()-shaped results: numbers from the real compare(), flips highlighted."""

import json

import pandas as pd

from machine_nb.evaluation.compare import compare
from machine_nb.widgets.compare_view import CompareView, side_by_side


def results(correct, outputs):
    n = len(correct)
    return pd.DataFrame({"row": range(n), "prompt": [f"What is {i} + 1?" for i in range(n)],
                         "expected": [str(i + 1) for i in range(n)], "match": ["number"] * n,
                         "output": outputs, "correct": correct, "format_ok": [None] * n})


BASE = results([True, False, False, True, False, True],
               ["answer: 1", "3", "The answer is 4.", "answer: 4", "no idea", "answer: 6"])
CKPT = results([True, True, True, False, False, True],
               ["answer: 1", "answer: 2", "answer: 3", "answer: 5", "answer: 9", "answer: 6"])


def test_side_by_side_marks_wins_losses_ties():
    rows = side_by_side(BASE, CKPT)
    assert list(rows["change"]) == ["tie", "win", "win", "loss", "tie", "tie"]
    assert rows.loc[1, "baseline_output"] == "3" and rows.loc[1, "checkpoint_output"] == "answer: 2"


def test_numbers_flips_and_toggle(tmp_path):
    a_path, b_path = tmp_path / "base.json", tmp_path / "ckpt.json"
    a_path.write_text(json.dumps({"name": "base", "rows": BASE.to_dict("records")}))
    b_path.write_text(json.dumps({"name": "ckpt", "rows": CKPT.to_dict("records")}))
    v = CompareView(a_path, b_path)
    r = v.result
    assert (r.wins, r.ties, r.losses) == (2, 3, 1)
    html = v.static_html()
    assert f"{r.p_value:.3g}" in html and "wins / ties / losses" in html
    assert html.count('class="mnb-win"') == 2 and html.count('class="mnb-loss"') == 1
    assert html.count('class="mnb-tie"') == 3
    assert "The answer is 4." in html and "answer: 3" in html  # outputs side by side
    v._toggle.value = True  # "only flips"
    assert v._table.value.count("<tr class=") == 3 and 'class="mnb-tie"' not in v._table.value
    assert v.summary().startswith("CompareView: 50.0% → 66.7% (+16.7%), W/T/L 2/3/1")


def test_from_a_compare_result_with_or_without_frames():
    res = compare(BASE, CKPT)
    only = CompareView(res)
    assert len(only.rows) == 3 and set(only.rows["change"]) == {"win", "loss"}
    full = CompareView(result=res, frames=(BASE, CKPT))
    assert len(full.rows) == 6
    no_change = CompareView(BASE, BASE, only_flips=True)
    assert "No row changed." in no_change.static_html()


def test_all_wins_at_n_24_never_prints_a_zero_width_interval():
    """24/0/0 used to read "+100.0% (paired bootstrap 95% CI [+100.0%, +100.0%])": a certainty 24
    rows cannot give. The view shows the small-n intervals and says the bootstrap has no spread."""
    base = results([False] * 24, [f"{i} + 1 = {i + 1}" for i in range(24)])
    tuned = results([True] * 24, [f"answer: {i + 1}" for i in range(24)])
    html = CompareView(base, tuned).static_html()
    assert "+100.0%, +100.0%" not in html and "+100.0% to +100.0%" not in html
    assert "Newcombe" in html and "no spread" in html and "86.2% to 100.0%" in html


def test_eval_results_and_their_names_reach_the_view(tmp_path):
    from machine_nb.evaluation.results import EvalResult

    base, tuned = EvalResult(BASE, {"name": "base model"}), EvalResult(CKPT, {"name": "step 60"})
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(tuned.to_dict()))
    views = [CompareView(base, tuned), CompareView(base, path), CompareView(result=compare(base, tuned),
                                                                             frames=(base, str(path)))]
    rows = side_by_side(base, path)
    for v in views:
        assert (v.result.wins, v.result.ties, v.result.losses) == (2, 3, 1)
        assert v.result.baseline_name == "base model" and v.result.checkpoint_name == "step 60"
        assert ">base model</th>" in v.static_html() and ">step 60</th>" in v.static_html()
        assert list(v.rows["change"]) == list(rows["change"]) == ["tie", "win", "win", "loss", "tie", "tie"]


def test_show_wins_ties_or_losses_and_open_a_case_with_its_difference_marked():
    v = CompareView(BASE, CKPT)
    assert v.show == "all" and v._table.value.count("<tr class=") == 6
    v.show = "loss"  # the "show" buttons
    assert v._table.value.count("<tr class=") == 1 and 'class="mnb-loss"' in v._table.value
    assert "answer: 4" in v.static_html() and "answer: 6" not in v.static_html()
    v._show.value = "win"
    assert v._table.value.count('class="mnb-win"') == 2 and "mnb-tie" not in v._table.value
    # a case opens to both whole transcripts side by side, the words that differ marked
    html = v._table.value
    assert "<details" in html and "mnb-case-detail" in html
    detail = html[html.index("mnb-case-detail"):]
    assert 'class="mnb-diff-removed"' in detail and 'class="mnb-diff-added"' in detail
    v.show = "tie"
    v.only_flips = True
    assert "No row" in v._table.value
    import pytest

    with pytest.raises(ValueError, match="show"):
        v.show = "draws"
