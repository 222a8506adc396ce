"""The promotion gate at its edges: damaged or foreign versions.json and model.json, a live version
edited while a candidate is measured, held-out cases the gate cannot count on (repeats, empty
inputs), graders that raise or return something other than a verdict, and the CLI's exit statuses.

Measuring is faked here (a stand-in sampler and evaluate_cases returning chosen replies), so each
test builds a scratch copy of the sample's tutor machine and runs in well under a second; graders
run through the real evaluate_cases on the local engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import machine_nb as mnb
import machine_nb.evaluation.candidate as candidate_mod
import machine_nb.evaluation.cases as cases_mod
from machine_nb.evaluation.candidate import Candidate, CommitConflict, Gate
from machine_nb.evaluation.cases import CASE_RESULT_COLUMNS, read_versions
from machine_nb.evaluation.results import EvalResult
from machine_nb.errors import MachineFormatError

from scratch import copy_tutor

CHECKPOINT = "tinker://local-0123456789abcdef:train:0/sampler_weights/final"


@pytest.fixture
def ws(tmp_path):
    """A scratch copy of the sample's tutor machine (definition only)."""
    return copy_tutor(tmp_path / "ws")


def tutor(ws: Path) -> Path:
    return ws / "machines" / "tutor"


class StandIn:
    """The sampling client candidate() opens: only its base model is asked."""

    def get_base_model(self) -> str:
        return "local/arith-tiny"


def fake_measuring(monkeypatch, live: list[bool], cand: list[bool], *, live_errors=(), cand_errors=(),
                   during=None) -> list[dict]:
    """Make candidate() measure without sampling: the live version gets `live[i]` right on case i,
    the candidate `cand[i]`; rows listed in *_errors failed. `during(i)` runs inside the i-th
    measurement (0 live, 1 candidate). Returns the calls' keyword arguments."""
    calls: list[dict] = []

    def evaluate_cases(workspace, machine, model=None, checkpoint=None, *, cases=None, name=None, **kw):
        which = len(calls)
        calls.append({"model": model, "checkpoint": checkpoint, "cases": cases, **kw})
        if during is not None:
            during(which)
        right, errors = (live, live_errors) if which == 0 else (cand, cand_errors)
        rows = [{"row": i, "case": int(c["case"]), "trial": 0, "input": c["input"], "prompt": c["input"],
                 "expected": c["expected"], "match": c["match"], "output": "x", "correct": right[i] and i not in errors,
                 "format_ok": None, "prompt_tokens": 1, "output_tokens": 1, "latency_s": 0.0, "stop_reason": "stop",
                 "error": "ConnectionError: reset" if i in errors else None}
                for i, c in enumerate(cases.to_dict("records"))]
        summary = {"name": name, "machine": machine, "split": "holdout"}
        if kw.get("out") is not None:  # evaluate_cases' results JSON: its summary and rows
            Path(kw["out"]).parent.mkdir(parents=True, exist_ok=True)
            Path(kw["out"]).write_text(json.dumps({**summary, "rows": rows}))
        return EvalResult(pd.DataFrame(rows, columns=CASE_RESULT_COLUMNS), summary)

    monkeypatch.setattr(cases_mod, "evaluate_cases", evaluate_cases)
    monkeypatch.setattr(candidate_mod, "checkpoint_problem", lambda *a, **k: None)
    import machine_nb.engines as engines
    import machine_nb.evaluation.sampling as sampling

    monkeypatch.setattr(engines, "service_client", lambda *a, **k: None)
    monkeypatch.setattr(sampling, "open_sampler", lambda *a, **k: StandIn())
    return calls


def write_holdout(ws: Path, n: int) -> list[dict]:
    cases = [{"input": f"What is {i} plus 1?", "expected": f"answer: {i + 1}"} for i in range(n)]
    (tutor(ws) / "holdout.json").write_text(json.dumps(cases))
    return cases


def passing(ws: Path, monkeypatch, n: int = 8, out_dir=None, **kw) -> Candidate:
    """A candidate that wins every one of n held-out cases (the gate passes it)."""
    write_holdout(ws, n)
    fake_measuring(monkeypatch, [False] * n, [True] * n, **kw)
    return mnb.candidate(ws, "tutor", CHECKPOINT, out_dir=out_dir, progress=False)


def committed_by_hand(ws: Path, monkeypatch) -> None:
    """A commit of a passing candidate, for tests about what revert does afterwards."""
    cand = passing(ws, monkeypatch)
    assert cand.passed, cand.reason
    cand.commit()


# --------------------------------------------------------------------------- model.json


def test_revert_refuses_a_model_json_that_is_not_an_object_and_writes_nothing(ws, monkeypatch):
    committed_by_hand(ws, monkeypatch)
    d = tutor(ws)
    (d / "model.json").write_text('["local/arith-tiny"]')
    before = (d / "versions.json").read_bytes()
    with pytest.raises(MachineFormatError, match="model.json.*object"):
        mnb.revert(ws, "tutor")
    assert (d / "versions.json").read_bytes() == before  # still v2 live, as model.json says nothing else
    assert (d / "model.json").read_text() == '["local/arith-tiny"]'


# --------------------------------------------------------------------------- graders


@pytest.mark.parametrize("verdict", ["no", float("nan"), None, [True]])
def test_a_grader_verdict_that_is_not_true_false_or_a_score_is_an_error_of_that_row(ws, verdict):
    with pytest.warns(UserWarning, match="grader"):
        res = mnb.evaluate_cases(ws, "tutor", cases=["What is 47 plus 15?", "Who wrote Hamlet?"],
                                 grader=lambda case, reply: verdict if case["input"].startswith("What") else True,
                                 progress=False)
    first, second = res.rows.iloc[0], res.rows.iloc[1]
    assert not first["correct"] and "grader returned" in first["error"] and second["correct"]
    assert pd.isna(second["error"]) and res.summary["errors"] == 1


def test_a_grader_verdict_may_be_a_numpy_bool_or_number(ws):
    import numpy as np

    for verdict, correct in ((np.True_, True), (np.float64(1.0), True), (np.int64(0), False), (0.5, False)):
        res = mnb.evaluate_cases(ws, "tutor", cases=["What is 47 plus 15?"], grader=lambda c, r: verdict,
                                 progress=False)
        assert res.rows["correct"].tolist() == [correct] and res.summary["errors"] == 0


def test_a_grader_that_raises_is_an_error_of_that_row_not_a_lost_measurement(ws):
    def grader(case, reply):
        if "Hamlet" in case["input"]:
            raise KeyError("no answer key")
        return True

    with pytest.warns(UserWarning, match="grader"):
        res = mnb.evaluate_cases(ws, "tutor", cases=["What is 47 plus 15?", "Who wrote Hamlet?"], grader=grader,
                                 progress=False)
    assert res.rows["correct"].tolist() == [True, False]
    assert res.rows["error"].iloc[1] == "grader raised KeyError: 'no answer key'" and res.summary["errors"] == 1


# --------------------------------------------------------------------------- the gate


@pytest.mark.parametrize("side", ["live", "candidate"])
def test_the_gate_refuses_when_replies_failed(ws, monkeypatch, side):
    """A live version whose requests failed scores 0: the candidate would "win" every case."""
    write_holdout(ws, 8)
    errors = {"live_errors" if side == "live" else "cand_errors": (0, 1)}
    fake_measuring(monkeypatch, [False] * 8, [True] * 8, **errors)
    cand = mnb.candidate(ws, "tutor", CHECKPOINT, progress=False)
    assert not cand.passed
    assert f"2 of the {'live version' if side == 'live' else 'candidate'}'s 8 replies failed" in cand.reason


# --------------------------------------------------------------------------- held-out cases the gate cannot count on


def test_a_held_out_case_given_twice_is_refused_before_any_sampling(ws, monkeypatch):
    """One case written six times would make one win six, and the sign test 'significant'."""
    cases = write_holdout(ws, 3)
    repeated = cases + [{"input": "  what is 1 PLUS 1? ", "expected": "answer: 2"}] * 5
    (tutor(ws) / "holdout.json").write_text(json.dumps(repeated))
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    with pytest.raises(MachineFormatError, match=r"case 4 repeats case 2 .* remove the repeats") as err:
        mnb.candidate(ws, "tutor", CHECKPOINT, progress=False)
    assert err.value.path.endswith("holdout.json") and err.value.field == "[3].input" and calls == []


@pytest.mark.parametrize("empty", ["", "   \n"])
def test_a_held_out_case_with_an_empty_input_is_refused(ws, monkeypatch, empty):
    (tutor(ws) / "holdout.json").write_text(json.dumps(["What is 1 plus 1?", {"input": empty, "expected": "x"}]))
    with pytest.raises(MachineFormatError, match="case 2 has an empty input") as err:
        mnb.load_cases(ws, "tutor", "holdout")
    assert err.value.field == "[1].input"
    with pytest.raises(MachineFormatError, match="case 1 has an empty input"):
        mnb.evaluate_cases(ws, "tutor", cases=[empty], grader=lambda c, r: True, progress=False)


# --------------------------------------------------------------------------- versions.json and model.json kept whole


def test_fields_machine_wrote_survive_commit_and_revert(ws, monkeypatch):
    d = tutor(ws)
    versions = json.loads((d / "versions.json").read_text())
    versions[0]["machineOnly"] = {"nested": [1, 2.5, None, "é"]}
    versions[0]["source"]["extra"] = True
    (d / "versions.json").write_text(json.dumps(versions))
    (d / "model.json").write_text(json.dumps({"model": "local/arith-tiny", "thinking": "high", "revision": ""}))
    committed_by_hand(ws, monkeypatch)
    after = json.loads((d / "versions.json").read_text())
    assert {k: v for k, v in after[0].items() if k != "live"} == {k: v for k, v in versions[0].items() if k != "live"}
    assert json.loads((d / "model.json").read_text()) == {"model": CHECKPOINT, "thinking": "high", "revision": ""}
    mnb.revert(ws, "tutor")
    back = json.loads((d / "versions.json").read_text())
    assert back[0] == versions[0] and back[1] == {k: v for k, v in after[1].items() if k != "live"}
    assert json.loads((d / "model.json").read_text()) == {"model": "local/arith-tiny", "thinking": "high",
                                                            "revision": ""}


def test_a_committed_version_records_the_instructions_it_was_measured_with(ws, monkeypatch):
    """A live entry Machine wrote without instructions: the candidate ran instructions.md's."""
    d = tutor(ws)
    versions = json.loads((d / "versions.json").read_text())
    del versions[0]["instructions"]
    (d / "versions.json").write_text(json.dumps(versions))
    text = (d / "instructions.md").read_text()
    entry = passing(ws, monkeypatch).commit()
    assert entry["instructions"] == text and read_versions(ws, "tutor")[-1]["instructions"] == text


def test_a_live_version_edited_while_measured_is_a_conflict(ws, monkeypatch):
    d = tutor(ws)

    def edit(which: int) -> None:
        if which == 1:  # while the candidate is measured, the live entry's instructions change
            versions = json.loads((d / "versions.json").read_text())
            versions[0]["instructions"] = "Answer in French."
            (d / "versions.json").write_text(json.dumps(versions))

    cand = passing(ws, monkeypatch, during=edit)
    before = (d / "versions.json").read_bytes()
    with pytest.raises(CommitConflict, match="instructions .* changed since"):
        cand.commit()
    assert (d / "versions.json").read_bytes() == before


def test_instructions_md_edited_while_measured_is_a_conflict(ws, monkeypatch):
    d = tutor(ws)
    versions = json.loads((d / "versions.json").read_text())
    del versions[0]["instructions"]
    (d / "versions.json").write_text(json.dumps(versions))

    def edit(which: int) -> None:
        if which == 1:
            (d / "instructions.md").write_text("Answer in French.\n")

    cand = passing(ws, monkeypatch, during=edit)
    with pytest.raises(CommitConflict, match="instructions.md changed since"):
        cand.commit()


# --------------------------------------------------------------------------- the rule itself


@pytest.mark.parametrize("rule, message", [
    (dict(max_losses=-1), "max_losses must be a whole number, 0 or more"),
    (dict(max_losses=1.5), "max_losses must be a whole number, 0 or more"),
    (dict(min_delta=float("nan")), "min_delta must be a finite number"),
    (dict(alpha=0), "alpha must be above 0 and at most 1"),
    (dict(alpha=1.5), "alpha must be above 0 and at most 1"),
    (dict(alpha=float("nan")), "alpha must be above 0 and at most 1"),
])
def test_a_gate_no_candidate_could_pass_is_refused_when_made(rule, message):
    with pytest.raises(ValueError, match=message):
        Gate(**rule)
    assert Gate(max_losses=2, min_delta=-0.05, alpha=1).alpha == 1


# --------------------------------------------------------------------------- cases without an expected answer


def test_held_out_cases_without_expected_answers_and_no_grader_stop_before_any_sampler_opens(ws, monkeypatch):
    (tutor(ws) / "holdout.json").write_text(json.dumps(["What is 1 plus 1?", {"input": "Who painted the ceiling?"}]))
    fake_measuring(monkeypatch, [False] * 2, [True] * 2)
    import machine_nb.evaluation.sampling as sampling

    monkeypatch.setattr(sampling, "open_sampler", lambda *a, **k: pytest.fail("opened a sampler"))
    with pytest.raises(MachineFormatError, match=r"case 1 declares no expected answer \(2 of 2 do not\)"):
        mnb.candidate(ws, "tutor", CHECKPOINT, progress=False)


def test_the_cli_says_how_to_measure_cases_without_expected_answers(ws, monkeypatch, capsys):
    (tutor(ws) / "holdout.json").write_text(json.dumps(["What is 1 plus 1?"]))
    calls = fake_measuring(monkeypatch, [False], [True])
    code, out, err = cli(capsys, "candidate", str(ws), "--machine", "tutor", "--checkpoint", CHECKPOINT)
    assert code == 1 and out == "" and calls == []
    assert "the command line has no grader" in err and '"expected"' in err


# --------------------------------------------------------------------------- leftovers of a killed write


def test_a_commit_removes_the_temporary_files_a_killed_write_left_and_nothing_else(ws, monkeypatch):
    d = tutor(ws)
    stale = [d / ".versions.json.k3j_9xq2.tmp", d / ".model.json.a1b2c3d4.tmp", d / ".instructions.md.zz99zz99.tmp"]
    mine = [d / ".versions.json.notes", d / ".versions.json.k3j9xq2.tmp", d / "versions.json.bak"]
    for f in stale + mine:
        f.write_text("{")
    committed_by_hand(ws, monkeypatch)
    assert not any(f.exists() for f in stale[:2]) and all(f.exists() for f in mine)
    stale[0].write_text("{")
    mnb.revert(ws, "tutor")
    assert not any(f.exists() for f in stale) and all(f.exists() for f in mine)


# --------------------------------------------------------------------------- the CLI


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`machine-nb ARGS` in this process: (exit status, stdout, stderr)."""
    from machine_nb.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ["live.json", "candidate.json", "report.json"])
def test_out_dir_files_the_toolkit_did_not_write_are_refused_before_any_sampling(ws, monkeypatch, tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text('{"mine": true}\n')
    write_holdout(ws, 8)
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    with pytest.raises(FileExistsError, match=f"{name} is not a file candidate.. wrote"):
        mnb.candidate(ws, "tutor", CHECKPOINT, out_dir=out, progress=False)
    assert calls == [] and (out / name).read_text() == '{"mine": true}\n'


def test_a_candidate_measured_again_into_the_same_out_dir_replaces_its_own_files(ws, monkeypatch, tmp_path):
    out = tmp_path / "out"
    first = passing(ws, monkeypatch, out_dir=out)
    second = passing(ws, monkeypatch, out_dir=out)
    assert json.loads((out / "report.json").read_text())["candidate"] == second.id != first.id
    assert {p.name for p in out.iterdir()} == {"live.json", "candidate.json", "report.json"}


def test_cli_exit_statuses_pass_refuse_error(ws, monkeypatch, capsys):
    write_holdout(ws, 8)
    fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    base = ["--machine", "tutor", "--checkpoint", CHECKPOINT]
    assert cli(capsys, "candidate", str(ws), *base)[0] == 0
    fake_measuring(monkeypatch, [False] * 8, [True] * 8, live_errors=(3,))
    code, out, _ = cli(capsys, "candidate", str(ws), *base)
    assert code == 3 and "1 of the live version's 8 replies failed" in out
    code, _, err = cli(capsys, "commit", str(ws), *base)
    assert code == 3 and "did not pass the promotion gate" in err
    code, _, err = cli(capsys, "revert", str(ws), "--machine", "tutor")
    assert code == 1 and "v1 is the first version of tutor" in err
    code, _, err = cli(capsys, "revert", str(ws), "--machine", "../tutor")
    assert code == 1 and 'Invalid machine name "../tutor"' in err
    assert cli(capsys, "candidate", str(ws), "--machine", "tutor")[0] == 2


def test_a_commit_and_a_revert_write_through_linked_machine_files(ws, monkeypatch, tmp_path):
    """versions.json and model.json kept elsewhere (a synced folder) and linked into the machine's
    folder: a commit and a revert edit the files the links lead to, and the links stay links."""
    d = tutor(ws)
    elsewhere = tmp_path / "synced"
    elsewhere.mkdir()
    for name in ("versions.json", "model.json"):
        (d / name).rename(elsewhere / name)
        (d / name).symlink_to(elsewhere / name)
    committed_by_hand(ws, monkeypatch)
    assert (d / "versions.json").is_symlink() and (d / "model.json").is_symlink()
    assert json.loads((elsewhere / "model.json").read_text())["model"] == CHECKPOINT
    assert len(json.loads((elsewhere / "versions.json").read_text())) == 2
    mnb.revert(ws, "tutor")
    assert (d / "versions.json").is_symlink() and json.loads((elsewhere / "model.json").read_text())["model"] != CHECKPOINT
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == []  # no temporary file left
