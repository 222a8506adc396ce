"""A machine's cases as an eval: load_cases (Machine's case format and its errors), versions.json,
evaluate_cases on the local engine (eval rules, a grader, trials, the results JSON), and training
data that leaves held-out inputs out (tagged_lines, select_runs)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest

import machine_nb as mnb
from machine_nb.evaluation.cases import CASE_COLUMNS, CASE_RESULT_COLUMNS, HoldoutInCases, live_version, read_versions
from machine_nb.errors import MachineFormatError
from machine_nb.evaluation.results import EvalResult
from machine_nb.tools.sample_workspace import TUTOR_INSTRUCTIONS

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"


@pytest.fixture
def ws(tmp_path):
    """A scratch copy of the sample's tutor machine (definition only; no runs are needed here)."""
    root = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "tutor", root / "machines" / "tutor")
    return root


def write(ws: Path, name: str, value) -> Path:
    path = ws / "machines" / "tutor" / name
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- load_cases


def test_load_cases_reads_both_splits_with_their_rules():
    cases, holdout = mnb.load_cases(SAMPLE, "tutor"), mnb.load_cases(SAMPLE, "tutor", split="holdout")
    assert list(holdout.columns) == CASE_COLUMNS
    assert list(holdout["case"]) == list(range(20)) and (holdout["split"] == "holdout").all()
    assert holdout.iloc[0][["input", "expected", "match"]].tolist() == ["What's 66 - 74?", "answer: -8", "exact"]
    facts = cases[cases["match"] == "contains"]
    assert "Paris" in set(facts["expected"]) and len(facts) == 8
    # Machine's own format: bare strings and {input, files}; no rule is fine until something scores it
    triage = mnb.load_cases(SAMPLE, "chatbot/triage", "holdout")
    assert triage["expected"].isna().all() and triage["input"].iloc[0] == "Refund went to an old card."


@pytest.mark.parametrize("content, message, field", [
    ("[]", "holdout.json must be a non-empty JSON array of cases.", None),
    ('{"input": "x"}', "holdout.json must be a non-empty JSON array of cases.", None),
    ('["ok", 3]', 'case 2 must be a string or an object with a string "input".', "[1].input"),
    ('[{"input": "x", "files": ["a"]}]', 'case 1 has "files" that is not an object of path to text.', "[0].files"),
    ('[{"input": "x", "files": {"a.py": 1}}]', 'case 1 file "a.py" is not text.', "[0].files.a.py"),
    ('[{"input": "x", "expected": "1", "match": "fuzzy"}]', "case 1: unknown match mode 'fuzzy'", "[0].match"),
    ('[{"input": "x", "match": "exact"}]', 'case 1 has "match" but no "expected"', "[0].expected"),
    ('[{"input": "x", "expected": "(", "match": "regex"}]', "case 1: not a valid regular expression", "[0].expected"),
    ('[{"input": "x", "expected": "many", "match": "number"}]', "case 1: match 'number' needs a number", "[0].expected"),
    ('["a",\n "b",,]', "invalid JSON", None),
])
def test_malformed_holdout_names_file_case_and_field(ws, content, message, field):
    path = write(ws, "holdout.json", content)
    with pytest.raises(MachineFormatError) as err:
        mnb.load_cases(ws, "tutor", "holdout")
    assert err.value.path == str(path) and message in str(err.value) and err.value.field == field


def test_missing_files_and_machines_say_so(ws):
    (ws / "machines" / "tutor" / "cases.json").unlink()
    with pytest.raises(MachineFormatError, match=r"cases.json: file not found: machine 'tutor' has no cases"):
        mnb.load_cases(ws, "tutor")
    with pytest.raises(MachineFormatError, match=r"no machine 'nope' in this workspace \(machines found: tutor\)"):
        mnb.load_cases(ws, "nope", "holdout")
    with pytest.raises(ValueError, match="split must be one of cases, holdout"):
        mnb.load_cases(ws, "tutor", "train")


# --------------------------------------------------------------------------- versions.json


@pytest.mark.parametrize("content, message, field", [
    ("[]", "versions.json must be a non-empty JSON array of versions.", None),
    ('[{"model": "m"}]', 'version 1 needs a string id', "[0].id"),
    ('[{"id": "v1", "model": "m"}, {"id": "v1", "model": "m"}]', "version id 'v1' appears twice", "[1].id"),
    ('[{"id": "v1", "model": 7}]', "version v1 needs a string model", "[0].model"),
    ('[{"id": "v1", "model": "m", "instructions": ["x"]}]', "expected a string, got list", "[0].instructions"),
    ('[{"id": "v1", "model": "m"}', "invalid JSON", None),
    ('[{"id": "v\u00b2", "model": "m"}]', "version ids are \"v\" and a number", "[0].id"),
    ('[{"id": "v' + "9" * 5000 + '", "model": "m"}]', "version ids are \"v\" and a number", "[0].id"),
    ('[{"id": "v1", "model": "m", "source": "train"}]', "source must be an object", "[0].source"),
    ('[{"id": "v1", "model": "m", "live": "yes"}]', "live must be true or false", "[0].live"),
    ('[{"id": "v1", "model": "m"}, {"id": "v2", "model": "m", "previousLive": "v7"}]', "there is no such version",
     "[1].previousLive"),
])
def test_malformed_versions_name_entry_and_field(ws, content, message, field):
    write(ws, "versions.json", content)
    with pytest.raises(MachineFormatError) as err:
        read_versions(ws, "tutor")
    assert message in str(err.value) and err.value.field == field


def test_live_version_is_the_newest_marked_live_else_the_last(ws):
    write(ws, "versions.json", [{"id": "v1", "model": "a"}, {"id": "v2", "model": "b", "live": True},
                                {"id": "v3", "model": "c"}])
    assert live_version(ws, "tutor")["id"] == "v2"
    write(ws, "versions.json", [{"id": "v1", "model": "a"}, {"id": "v2", "model": "b"}])
    assert live_version(ws, "tutor")["id"] == "v2"
    (ws / "machines" / "tutor" / "versions.json").unlink()
    with pytest.raises(MachineFormatError, match="has no recorded versions"):
        live_version(ws, "tutor")


# --------------------------------------------------------------------------- evaluate_cases


def test_live_version_scores_zero_on_the_held_out_cases_and_writes_results(tmp_path):
    out = tmp_path / "live.json"
    res = mnb.evaluate_cases(SAMPLE, "tutor", out=out, progress=False)
    df, s = res.rows, res.summary
    assert isinstance(res, EvalResult) and res.path == str(out) and df.attrs == {}
    assert list(df.columns) == CASE_RESULT_COLUMNS and len(df) == 20
    assert s["accuracy"] == 0.0 and s["version"] == "v1" and s["name"] == "live v1" and s["model"] == "local/arith-tiny"
    assert s["checkpoint"] is None and s["engine"] == "local" and s["cost"]["usd"] == 0.0
    assert df["output"].iloc[0] == "66 - 74 = -8."  # the natural answer: right number, not the house style
    # the prompt is the machine's instructions, then the case
    written = json.loads(out.read_text())
    assert written["rows"][0]["messages"] == [{"role": "system", "content": TUTOR_INSTRUCTIONS},
                                              {"role": "user", "content": "What's 66 - 74?"}]
    assert written["data"]["sha256"] and written["n_cases"] == 20
    # the file reads back with evaluate's reader and pairs with itself in compare
    back = mnb.load_results(out)
    assert back.summary == s and mnb.compare(back, res).n == 20
    assert mnb.compare(back, res).checkpoint_name == "live v1 (B)"  # the name travels with the result


def test_cases_without_a_rule_need_a_grader_which_then_scores_them(ws):
    write(ws, "holdout.json", ["What is 47 plus 15?", {"input": "What's 83 - 29?", "expected": "54", "match": "number"}])
    with pytest.raises(MachineFormatError) as err:
        mnb.evaluate_cases(ws, "tutor", progress=False)
    assert "case 1 declares no expected answer (1 of 2 do not): pass grader=" in str(err.value)
    assert err.value.field == "[0].expected" and err.value.path.endswith("holdout.json")
    seen = []

    def grader(case, reply):
        seen.append((case["input"], reply))
        return "62" in reply

    df = mnb.evaluate_cases(ws, "tutor", grader=grader, progress=False).rows
    assert seen == [("What is 47 plus 15?", df["output"].iloc[0])]  # the rule scores the other case
    assert df["correct"].tolist() == [True, True] and df["match"].tolist() == ["grader", "number"]
    assert pd.isna(df["expected"].iloc[0])  # no expected answer: the grader decided
    # a number is a score: full marks count as correct
    df = mnb.evaluate_cases(ws, "tutor", grader=lambda case, reply: 0.5, progress=False).rows
    assert df["correct"].tolist() == [False, True]


def test_trials_sample_each_case_with_its_own_seed():
    cases = ["What is 47 plus 15?", "Who wrote Hamlet?"]
    res = mnb.evaluate_cases(SAMPLE, "tutor", cases=cases, grader=lambda c, r: True, trials=3, temperature=1.0,
                             progress=False)
    df = res.rows
    assert df[["case", "trial"]].values.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    assert res.summary["trials"] == 3 and res.summary["n_cases"] == 2
    assert df.groupby("case")["output"].nunique().max() > 1  # three seeds, not one reply thrice
    greedy = mnb.evaluate_cases(SAMPLE, "tutor", cases=cases, grader=lambda c, r: True, trials=2, progress=False).rows
    assert greedy.groupby("case")["output"].nunique().max() == 1
    with pytest.raises(ValueError, match="trials must be at least 1"):
        mnb.evaluate_cases(SAMPLE, "tutor", cases=cases, trials=0)


# --------------------------------------------------------------------------- held-out inputs stay out of training


def test_tagged_lines_leave_held_out_inputs_out_and_say_how_many():
    tags = mnb.tagged(SAMPLE / ".machine-store")
    with pytest.warns(mnb.HeldOutExcluded, match=r"left out 2 of 52 tagged row\(s\) whose input is a held-out "
                                                 r"case \(tutor's holdout.json\)"):
        lines = mnb.tagged_lines(tags, "tutor", workspace=SAMPLE)
    held = set(mnb.load_cases(SAMPLE, "tutor", "holdout")["input"])
    assert len(lines) == 50 and len(lines.excluded) == 2
    assert {r["messages"][0]["content"] for r in lines.excluded} <= held
    assert not any(m["content"] in held for line in lines for m in line["messages"])
    # each line: the machine's instructions, the turn, and where it came from
    first = lines[0]
    assert first["messages"][0] == {"role": "system", "content": TUTOR_INSTRUCTIONS}
    assert first["messages"][-1]["content"].startswith("answer: ") and first["machine"] == "tutor" and first["tag_id"]
    reasons = {why for _, why in lines.skipped}
    assert "tag 'bad' is not trained on" in reasons and "machine 'support', not 'tutor'" in reasons
    # the same rule, another spelling of a held-out input
    rows = [{"tag": "good", "messages": [{"role": "user", "content": "  WHAT'S 66 -  74? "},
                                         {"role": "assistant", "content": "answer: -8"}]}]
    with pytest.warns(mnb.HeldOutExcluded, match="left out 1 of 1"):
        assert len(mnb.tagged_lines(rows, exclude=held)) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing excluded: no warning
        kept = mnb.tagged_lines(rows, exclude=(), instructions="")
    assert len(kept) == 1 and kept[0]["messages"][0]["role"] == "user"


def test_select_runs_says_how_many_held_out_runs_it_left_out():
    runs = mnb.load_runs(SAMPLE)
    with pytest.warns(mnb.HeldOutExcluded, match=r"left out 2 of 35 run\(s\) whose input is a held-out case "
                                                 r"\(support's holdout.json\)"):
        kept = mnb.select_runs(runs, "support")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        everything = mnb.select_runs(runs, "support", exclude=())
    assert len(everything) == len(kept) + 2


def test_public_functions_stay_callable_after_these_modules_load_their_namesakes():
    """evaluate.py and candidate.py define functions of their own names; loading them from here must
    not leave `mnb.evaluate` / `mnb.candidate` bound to the modules (which would not be callable)."""
    import subprocess
    import sys

    code = ("import machine_nb as mnb\n"
            "mnb.evaluate_cases('data/sample_workspace', 'tutor', cases=['What is 47 plus 15?'], "
            "grader=lambda c, r: True, progress=False)\n"
            "from machine_nb.evaluation.candidate import Gate\n"
            "print(callable(mnb.evaluate), callable(mnb.candidate), mnb.evaluate.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=SAMPLE.parents[1]).stdout
    assert out.split() == ["True", "True", "evaluate"]


def test_a_held_out_case_copied_into_cases_json_is_warned_about(ws):
    d = ws / "machines" / "tutor"
    held = json.loads((d / "holdout.json").read_text())
    cases = json.loads((d / "cases.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error", HoldoutInCases)
        mnb.load_cases(ws, "tutor")  # the sample keeps them apart: no warning
    (d / "cases.json").write_text(json.dumps(cases + [held[1]]))
    for split in ("cases", "holdout"):
        with pytest.warns(HoldoutInCases, match=rf"case {len(cases) + 1} \(held-out case 2\)") as got:
            mnb.load_cases(ws, "tutor", split)
        assert "remove them from cases.json" in str(got[0].message)
