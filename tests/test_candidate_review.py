"""The promotion gate and a machine's cases where a user meets their edges: a revert to a checkpoint
that is gone, a grader whose error holds a key or that is not a function, cases that mix scored and
grader-scored ones (JSON that stays JSON), failed requests in the results files, the gate's own
ties and extreme rules, out_dirs that cannot be written, one budget over every trial and both
versions, training data in other shapes (preference pairs, frames read back through pyarrow),
cases given without their list, instructions.md as an editor saved it, and `machine-nb commit
--json` when the gate refuses.

Sampling is faked throughout (a stand-in evaluate() or evaluate_cases returning chosen replies),
so every test runs in well under a second.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import machine_nb as mnb
import machine_nb.evaluation.candidate as candidate_mod
import machine_nb.evaluation.cases as cases_mod
from machine_nb.evaluation.candidate import CandidateReport, Gate
from machine_nb.evaluation.cases import CASE_RESULT_COLUMNS
from machine_nb.evaluation.results import RESULT_COLUMNS, EvalResult

from scratch import copy_tutor, local_checkpoint

CHECKPOINT = "tinker://local-0123456789abcdef:train:0/sampler_weights/final"


@pytest.fixture
def ws(tmp_path):
    """A scratch copy of the sample's tutor machine (definition only)."""
    return copy_tutor(tmp_path / "ws")


def tutor(ws: Path) -> Path:
    return ws / "machines" / "tutor"


def strict_json(text: str):
    """JSON as a strict reader (Machine's JSON.parse, orjson) reads it: NaN and Infinity refused."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


class StandIn:
    """The sampling client candidate() opens: only its base model is asked."""

    def get_base_model(self) -> str:
        return "local/arith-tiny"


def fake_measuring(monkeypatch, live: list[bool], cand: list[bool]) -> list[dict]:
    """candidate() without sampling: the live version gets `live[i]` right on case i, the candidate
    `cand[i]`; rows are built as evaluate_cases builds them (a frame of CASE_RESULT_COLUMNS, with
    expected None for grader-scored cases)."""
    calls: list[dict] = []

    def evaluate_cases(workspace, machine, model=None, checkpoint=None, *, cases=None, name=None, **kw):
        right = live if not calls else cand
        calls.append(kw)
        graded = [not isinstance(c["expected"], str) for c in cases.to_dict("records")]
        rows = [{"row": i, "case": int(c["case"]), "trial": 0, "input": c["input"], "prompt": c["input"],
                 "expected": None if graded[i] else c["expected"], "match": "grader" if graded[i] else c["match"],
                 "output": "x", "correct": right[i], "format_ok": None, "prompt_tokens": 1, "output_tokens": 1,
                 "latency_s": 0.0, "stop_reason": "stop", "error": None}
                for i, c in enumerate(cases.to_dict("records"))]
        summary = {"name": name, "machine": machine, "split": "holdout"}
        if kw.get("out") is not None:
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


def write_holdout(ws: Path, n: int) -> None:
    cases = [{"input": f"What is {i} plus 1?", "expected": f"answer: {i + 1}"} for i in range(n)]
    (tutor(ws) / "holdout.json").write_text(json.dumps(cases))


@pytest.fixture
def fake_evaluate(monkeypatch):
    """evaluate() without sampling, as evaluate_cases calls it: row 0 answers "answer: 2"; every
    other row's request failed (no output, no stop reason). The frame is built as evaluate builds it.
    Returns the rows each call was asked."""
    import machine_nb.evaluation.evaluate as evaluate_mod

    asked: list[list[dict]] = []

    def evaluate(rows, **kw):
        asked.append(rows)
        records = [{"row": i, "prompt": "p", "expected": r["expected"], "match": r["match"],
                    "output": "" if i else "answer: 2", "correct": not i, "format_ok": None, "prompt_tokens": 3,
                    "output_tokens": 0 if i else 2, "latency_s": 0.1, "stop_reason": None if i else "stop",
                    "error": "ConnectionError: reset" if i else None} for i, r in enumerate(rows)]
        summary = {"renderer": "r", "parameters": {"max_tokens": 8}, "cost": {"usd": 0.0, "source": None}}
        return EvalResult(pd.DataFrame.from_records(records, columns=RESULT_COLUMNS), summary)

    monkeypatch.setattr(evaluate_mod, "evaluate", evaluate)
    return asked


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


def report(live_right: int, cand_right: int, n: int, *, wins: int = 0, losses: int = 0) -> CandidateReport:
    """A CandidateReport with these counts (the gate reads only its numbers)."""
    cases = pd.DataFrame({"change": ["win"] * wins + ["loss"] * losses + ["tie"] * (n - wins - losses)})
    from machine_nb.evaluation.stats import mcnemar_exact

    return CandidateReport(machine="tutor", live_name="live v1", candidate_name="candidate", trials=1, live=None,
                           candidate=None, cases=cases, comparison=None, wins=wins, ties=n - wins - losses,
                           losses=losses, p_value=mcnemar_exact(losses, wins), live_accuracy=live_right / n,
                           candidate_accuracy=cand_right / n)


# --------------------------------------------------------------------------- revert


def test_revert_to_a_local_checkpoint_that_is_gone_is_refused_and_writes_nothing(ws, tmp_path):
    from machine_nb.engines.local.checkpoints import checkpoint_dir, default_data_dir

    gone, kept = local_checkpoint(tmp_path, "gone"), local_checkpoint(tmp_path, "kept")
    d = tutor(ws)
    versions = json.loads((d / "versions.json").read_text())
    del versions[0]["live"]
    versions += [{"id": "v2", "model": gone, "baseModel": "local/arith-tiny", "previousLive": "v1"},
                 {"id": "v3", "model": kept, "baseModel": "local/arith-tiny", "previousLive": "v2", "live": True}]
    (d / "versions.json").write_text(json.dumps(versions))
    (d / "model.json").write_text(json.dumps({"model": kept}))
    shutil.rmtree(checkpoint_dir(default_data_dir(), gone))
    before = {name: (d / name).read_bytes() for name in ("versions.json", "model.json")}
    with pytest.raises(ValueError, match=r"v2 runs .*gone.* cannot be sampled .*v3 stays live.*force=True"):
        mnb.revert(ws, "tutor")
    assert {name: (d / name).read_bytes() for name in before} == before
    # force restores it anyway (a checkpoint served elsewhere)
    assert mnb.revert(ws, "tutor", force=True)["id"] == "v2"
    assert json.loads((d / "model.json").read_text())["model"] == gone


def test_cli_revert_refuses_a_gone_checkpoint_with_exit_1_and_force_restores(ws, tmp_path, capsys):
    from machine_nb.engines.local.checkpoints import checkpoint_dir, default_data_dir

    gone = local_checkpoint(tmp_path, "gone-cli")
    d = tutor(ws)
    versions = json.loads((d / "versions.json").read_text())
    versions[0]["model"] = gone
    versions[0]["baseModel"] = "local/arith-tiny"
    del versions[0]["live"]
    versions.append({"id": "v2", "model": "local/arith-tiny", "previousLive": "v1", "live": True})
    (d / "versions.json").write_text(json.dumps(versions))
    shutil.rmtree(checkpoint_dir(default_data_dir(), gone))
    code, out, err = cli(capsys, "revert", str(ws), "--machine", "tutor")
    assert code == 1 and out == "" and "cannot be sampled" in err and "--force" in err
    code, out, _ = cli(capsys, "revert", str(ws), "--machine", "tutor", "--force")
    assert code == 0 and "v1 is live again" in out


# --------------------------------------------------------------------------- graders


def test_a_grader_error_holding_a_key_is_redacted_in_rows_warning_and_results_file(ws, fake_evaluate, tmp_path):
    key = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0" * 2

    def grader(case, reply):
        raise RuntimeError(f"judge refused: Incorrect API key provided: {key}")

    out = tmp_path / "res.json"
    with pytest.warns(UserWarning, match="grader") as said:
        res = mnb.evaluate_cases(ws, "tutor", cases=["What is 47 plus 15?"], grader=grader, out=out,
                                 sampling_client=StandIn(), progress=False)
    assert "grader raised RuntimeError: judge refused" in res.rows["error"].iloc[0]
    assert key not in res.rows["error"].iloc[0]
    assert not any(key in str(w.message) for w in said)
    assert key not in out.read_text()


# --------------------------------------------------------------------------- cases without a rule


def mixed_holdout(ws: Path) -> None:
    (tutor(ws) / "holdout.json").write_text(json.dumps([{"input": "What is 1 plus 1?", "expected": "answer: 2"},
                                                        "Who painted the chapel ceiling?"]))


def test_load_cases_says_none_for_a_case_without_a_rule_beside_one_with_a_rule(ws):
    mixed_holdout(ws)
    holdout = mnb.load_cases(ws, "tutor", "holdout")
    second = holdout.to_dict("records")[1]
    assert second["expected"] is None and second["match"] is None and second["format"] is None


def test_cli_cases_json_stays_json_and_text_says_no_rule(ws, capsys):
    mixed_holdout(ws)
    code, out, _ = cli(capsys, "cases", str(ws), "--machine", "tutor", "--holdout", "--json")
    assert code == 0
    cases = strict_json(out)
    assert cases[1]["expected"] is None and cases[1]["match"] is None
    code, out, _ = cli(capsys, "cases", str(ws), "--machine", "tutor", "--holdout")
    assert code == 0 and "no rule (needs a grader)" in out.splitlines()[1] and "nan" not in out


def test_a_grader_scored_candidate_writes_report_json_as_json_and_measures_again_into_it(ws, monkeypatch, tmp_path):
    """Half the held-out cases declare an answer, half are left to the grader."""
    (tutor(ws) / "holdout.json").write_text(json.dumps([f"Say {i}." if i % 2 else {"input": f"Say {i}.", "expected": "x"}
                                                        for i in range(8)]))
    fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    out = tmp_path / "out"
    first = mnb.candidate(ws, "tutor", CHECKPOINT, grader=lambda c, r: True, out_dir=out, progress=False)
    saved = strict_json((out / "report.json").read_text())
    assert saved["cases"][1]["expected"] is None and saved["candidate"] == first.id
    assert saved["cases"][1]["case"] == 1 and saved["cases"][1]["live_correct"] == 0.0
    second = mnb.candidate(ws, "tutor", CHECKPOINT, grader=lambda c, r: True, out_dir=out, progress=False)
    assert strict_json((out / "report.json").read_text())["candidate"] == second.id


def test_a_failed_request_leaves_the_results_file_strict_json(ws, fake_evaluate, tmp_path):
    """A failed request has no stop reason; the file still reads back as JSON (Machine's reader too)."""
    out = tmp_path / "live.json"
    mnb.evaluate_cases(ws, "tutor", cases=[{"input": "What is 1 plus 1?", "expected": "answer: 2"},
                                           {"input": "What is 2 plus 2?", "expected": "answer: 4"}],
                       out=out, sampling_client=StandIn(), progress=False)
    rows = strict_json(out.read_text())["rows"]
    assert rows[1]["stop_reason"] is None and rows[1]["error"] == "ConnectionError: reset"
    assert rows[0]["stop_reason"] == "stop"


# --------------------------------------------------------------------------- the gate's edges


def test_a_gate_at_alpha_1_decides_a_report_with_nothing_changed():
    passed, reason = Gate(alpha=1).decide(report(5, 5, 10))
    assert not passed and "not beyond chance (sign test p = 1" in reason


def test_a_gain_of_exactly_min_delta_is_decided_the_same_whatever_the_accuracies():
    """3→4 of 10 and 6→7 of 10 are both a gain of exactly ten points: "more than 10%" refuses both."""
    gate = Gate(min_delta=0.1, alpha=None, max_losses=0)
    low, high = gate.decide(report(3, 4, 10, wins=1)), gate.decide(report(6, 7, 10, wins=1))
    assert low[0] is high[0] is False
    assert gate.decide(report(3, 5, 10, wins=2))[0] is True


@pytest.mark.parametrize("min_delta", [1.0, 10])
def test_a_margin_no_accuracy_can_beat_is_refused_when_the_gate_is_made(min_delta):
    with pytest.raises(ValueError, match="min_delta must be below 1"):
        Gate(min_delta=min_delta)


@pytest.mark.parametrize("trials", [1.5, "2", True])
def test_trials_that_are_not_a_whole_number_are_refused(ws, fake_evaluate, trials):
    with pytest.raises(ValueError, match="trials must be at least 1, a whole number"):
        mnb.evaluate_cases(ws, "tutor", cases=["What is 1 plus 1?"], grader=lambda c, r: True, trials=trials,
                           sampling_client=StandIn(), progress=False)


# --------------------------------------------------------------------------- out_dir


@pytest.mark.parametrize("below", ["", "run1"])
def test_an_out_dir_that_is_a_file_is_refused_before_any_sampling(ws, monkeypatch, tmp_path, below):
    write_holdout(ws, 8)
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    mine = tmp_path / "results.json"
    mine.write_text("mine\n")
    with pytest.raises(FileExistsError, match="results.json: is a file, not a folder"):
        mnb.candidate(ws, "tutor", CHECKPOINT, out_dir=mine / below if below else mine, progress=False)
    assert calls == [] and mine.read_text() == "mine\n"


def test_results_that_cannot_be_written_are_returned_with_a_warning(ws, fake_evaluate, tmp_path):
    """The replies are sampled (and paid for) before the file is written: a write that fails keeps them."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be\n")
    with pytest.warns(UserWarning, match="could not be written"):
        res = mnb.evaluate_cases(ws, "tutor", cases=["What is 1 plus 1?"], grader=lambda c, r: True,
                                 out=blocked / "live.json", sampling_client=StandIn(), progress=False)
    assert len(res.rows) == 1 and res.path is None


# --------------------------------------------------------------------------- the CLI


def test_cli_commit_json_prints_the_decision_when_the_gate_refuses(ws, monkeypatch, capsys):
    write_holdout(ws, 8)
    fake_measuring(monkeypatch, [True] * 8, [True] * 8)
    code, out, err = cli(capsys, "commit", str(ws), "--machine", "tutor", "--checkpoint", CHECKPOINT, "--json")
    assert code == 3 and "did not pass the promotion gate" in err
    said = strict_json(out)
    assert said["passed"] is False and said["committed"] is None and said["live_version"] == "v1"


def test_a_report_that_cannot_be_written_still_returns_the_measured_candidate(ws, monkeypatch, tmp_path):
    import machine_nb.core.jsonl as jsonl

    write_holdout(ws, 8)
    fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    real = jsonl.atomic_write_text

    def full_disk(path, text, **kw):
        if Path(path).name == "report.json":
            raise OSError(28, "No space left on device")
        return real(path, text, **kw)

    monkeypatch.setattr(jsonl, "atomic_write_text", full_disk)
    with pytest.warns(UserWarning, match="report.json: the report could not be written .No space left"):
        cand = mnb.candidate(ws, "tutor", CHECKPOINT, out_dir=tmp_path / "out", progress=False)
    assert cand.passed and cand.report.wins == 8


# --------------------------------------------------------------------------- instructions.md as the machine's text


def without_own_instructions(ws: Path) -> None:
    d = tutor(ws)
    versions = json.loads((d / "versions.json").read_text())
    del versions[0]["instructions"]
    (d / "versions.json").write_text(json.dumps(versions))


def test_an_editors_byte_order_mark_is_not_part_of_the_system_prompt(ws, fake_evaluate):
    """candidate() reads instructions.md without it; evaluate_cases of the same machine must too."""
    without_own_instructions(ws)
    (tutor(ws) / "instructions.md").write_bytes(b"\xef\xbb\xbfAnswer briefly.\n")
    res = mnb.evaluate_cases(ws, "tutor", cases=[{"input": "What is 1 plus 1?", "expected": "answer: 2"}],
                             sampling_client=StandIn(), progress=False)
    assert fake_evaluate[0][0]["messages"][0] == {"role": "system", "content": "Answer briefly.\n"}
    assert res.summary["instructions_sha256"] == hashlib.sha256(b"Answer briefly.\n").hexdigest()


def test_instructions_md_that_is_not_utf8_is_named_and_revert_writes_nothing(ws, tmp_path, fake_evaluate):
    from machine_nb.errors import MachineFormatError

    d = tutor(ws)
    ckpt = local_checkpoint(tmp_path, "kept")
    versions = json.loads((d / "versions.json").read_text())
    del versions[0]["live"]
    versions.append({"id": "v2", "model": ckpt, "baseModel": "local/arith-tiny", "instructions": "Be brief.",
                     "previousLive": "v1", "live": True})
    (d / "versions.json").write_text(json.dumps(versions))
    (d / "model.json").write_text(json.dumps({"model": ckpt}))
    (d / "instructions.md").write_bytes("Réponds brièvement.\n".encode("latin-1"))
    before = {name: (d / name).read_bytes() for name in ("versions.json", "model.json", "instructions.md")}
    with pytest.raises(MachineFormatError, match="instructions.md"):
        mnb.revert(ws, "tutor")
    assert {name: (d / name).read_bytes() for name in before} == before
    del versions[-1]["instructions"]  # the live version runs instructions.md's text
    (d / "versions.json").write_text(json.dumps(versions))
    with pytest.raises(MachineFormatError, match="instructions.md"):
        mnb.evaluate_cases(ws, "tutor", model="local/arith-tiny", cases=["What is 1 plus 1?"],
                           grader=lambda c, r: True, sampling_client=StandIn(), progress=False)


# --------------------------------------------------------------------------- cases given in memory


@pytest.mark.parametrize("given", ["What is 1 plus 1?", {"input": "What is 1 plus 1?", "expected": "answer: 2"}])
def test_one_case_given_without_its_list_is_one_case_not_its_characters_or_keys(ws, fake_evaluate, given):
    res = mnb.evaluate_cases(ws, "tutor", cases=given, grader=lambda c, r: True, sampling_client=StandIn(),
                             progress=False)
    assert res.rows["input"].tolist() == ["What is 1 plus 1?"] and len(fake_evaluate[0]) == 1


def test_bytes_given_as_cases_are_refused(ws, fake_evaluate):
    from machine_nb.errors import MachineFormatError

    with pytest.raises(MachineFormatError, match=r"cases must be a list .* not a bytes"):
        mnb.evaluate_cases(ws, "tutor", cases=b"What is 1 plus 1?", grader=lambda c, r: True,
                           sampling_client=StandIn(), progress=False)
    assert fake_evaluate == []


def test_a_path_given_as_cases_is_refused_with_the_way_to_read_it(ws, fake_evaluate):
    from machine_nb.errors import MachineFormatError

    with pytest.raises(MachineFormatError, match=r"cases must be a list .* not a .*Path.*load_cases"):
        mnb.evaluate_cases(ws, "tutor", cases=tutor(ws) / "holdout.json", sampling_client=StandIn(), progress=False)


@pytest.mark.parametrize("odd", [3, None, ["What is 1 plus 1?"]])
def test_a_case_that_is_neither_text_nor_an_object_is_named(ws, fake_evaluate, odd):
    from machine_nb.errors import MachineFormatError

    with pytest.raises(MachineFormatError, match='case 2 must be a string or an object with a string "input"') as err:
        mnb.evaluate_cases(ws, "tutor", cases=["What is 2 plus 2?", odd], grader=lambda c, r: True,
                           sampling_client=StandIn(), progress=False)
    assert err.value.field == "[1].input"


# --------------------------------------------------------------------------- training data that held held-out inputs


def pairs_on_holdout(ws: Path) -> list[dict]:
    """Preference pairs (DPO's data) whose prompts are two of the held-out inputs."""
    write_holdout(ws, 8)
    return [{"prompt": [{"role": "user", "content": f"What is {i} plus 1?"}],
             "chosen": [{"role": "assistant", "content": f"answer: {i + 1}"}],
             "rejected": [{"role": "assistant", "content": "answer: 0"}]} for i in (0, 1)]


def test_preference_pairs_trained_on_held_out_prompts_are_counted(ws, monkeypatch, tmp_path):
    pairs = pairs_on_holdout(ws)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    for data in (pairs, path):
        cand = mnb.candidate(ws, "tutor", CHECKPOINT, data=data, progress=False)
        assert cand.report.trained_on_holdout == 2 and not cand.passed, data


def test_training_rows_read_back_through_pyarrow_are_counted(ws, monkeypatch):
    """A frame from read_parquet holds numpy arrays where the rows held lists."""
    import numpy as np

    write_holdout(ws, 8)
    frame = pd.DataFrame({"messages": [np.array([{"role": "user", "content": "What is 3 plus 1?"},
                                                 {"role": "assistant", "content": "answer: 4"}], dtype=object)]})
    fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    cand = mnb.candidate(ws, "tutor", CHECKPOINT, data=frame, progress=False)
    assert cand.report.trained_on_holdout == 1 and not cand.passed


@pytest.mark.parametrize("data, message", [
    (['{"messages": [{"role": "user", "content": "What is 3 plus 1?"}]}'], "training row 1 must be an object"),
    ({"messages": [{"role": "user", "content": "What is 3 plus 1?"}]}, "one training row was given"),
])
def test_training_data_the_check_cannot_read_is_refused_not_passed(ws, monkeypatch, data, message):
    from machine_nb.errors import MachineFormatError

    write_holdout(ws, 8)
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    with pytest.raises(MachineFormatError, match=message):
        mnb.candidate(ws, "tutor", CHECKPOINT, data=data, progress=False)
    assert calls == []


# --------------------------------------------------------------------------- the budget covers every trial and both versions


@pytest.fixture
def cent_a_reply(monkeypatch):
    """Tinker's price stand-in: one cent per sampled reply (prompts free). Returns the estimates asked."""
    import machine_nb.checks.pricing as pricing

    asked: list[dict] = []

    def estimate_eval_cost(data, model, max_tokens=32, price=None, max_usd=None, *, samples_per_row=1, prices=None):
        rows = list(data)
        asked.append({"rows": len(rows), "samples_per_row": samples_per_row})
        pricing.check_budget(0.01 * len(rows) * samples_per_row, max_usd, f"evaluating {model} on {len(rows)} rows")

    monkeypatch.setattr(pricing, "estimate_eval_cost", estimate_eval_cost)
    return asked


def test_evaluate_cases_holds_every_trial_to_one_budget(ws, fake_evaluate, cent_a_reply):
    from machine_nb.errors import BudgetExceeded

    cases = [{"input": "What is 1 plus 1?", "expected": "answer: 2"}, {"input": "What is 2 plus 2?", "expected": "answer: 4"}]
    with pytest.raises(BudgetExceeded, match="over the budget"):  # 2 cases x 3 trials: 6 cents, each trial 2
        mnb.evaluate_cases(ws, "tutor", cases=cases, trials=3, engine="tinker", max_usd=0.05,
                           sampling_client=StandIn(), progress=False)
    assert fake_evaluate == []
    mnb.evaluate_cases(ws, "tutor", cases=cases, trials=2, engine="tinker", max_usd=0.05, sampling_client=StandIn(),
                       progress=False)
    assert len(fake_evaluate) == 2


def test_candidate_holds_both_versions_to_one_budget(ws, monkeypatch, cent_a_reply):
    from machine_nb.errors import BudgetExceeded

    write_holdout(ws, 8)
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    with pytest.raises(BudgetExceeded, match="over the budget"):  # 8 cases x 2 versions: 16 cents, each 8
        mnb.candidate(ws, "tutor", CHECKPOINT, engine="tinker", max_usd=0.10, progress=False)
    assert calls == [] and cent_a_reply[-1] == {"rows": 8, "samples_per_row": 2}


@pytest.mark.parametrize("gate", [{"max_losses": 1}, 0.05])
def test_a_gate_that_is_not_a_gate_is_refused_before_any_sampling(ws, monkeypatch, gate):
    write_holdout(ws, 8)
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    with pytest.raises(TypeError, match="gate must be a Gate, such as Gate"):
        mnb.candidate(ws, "tutor", CHECKPOINT, gate=gate, progress=False)
    assert calls == []


def test_candidate_trials_that_are_not_whole_are_refused_before_any_sampling(ws, monkeypatch):
    write_holdout(ws, 8)
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    with pytest.raises(ValueError, match="trials must be at least 1, a whole number, not 1.5"):
        mnb.candidate(ws, "tutor", CHECKPOINT, trials=1.5, progress=False)
    assert calls == []


def test_a_grader_that_cannot_be_called_is_refused_before_any_sampling(ws, fake_evaluate, monkeypatch):
    with pytest.raises(TypeError, match=r"grader must be a function \(case, reply\) -> bool, not str"):
        mnb.evaluate_cases(ws, "tutor", cases=["What is 1 plus 1?"], grader="contains", sampling_client=StandIn(),
                           progress=False)
    assert fake_evaluate == []
    (tutor(ws) / "holdout.json").write_text(json.dumps([f"Say {i}." for i in range(8)]))
    calls = fake_measuring(monkeypatch, [False] * 8, [True] * 8)
    with pytest.raises(TypeError, match="grader must be a function"):
        mnb.candidate(ws, "tutor", CHECKPOINT, grader="contains", progress=False)
    assert calls == []


def test_cli_cases_json_is_ascii_json_a_terminal_of_any_encoding_writes_whole(ws, capsys):
    """On a stdout that cannot write every character (cp1252), an emoji written raw came out as
    Python's `\\U0001f600`, which is not JSON: the records are written with JSON's own escapes."""
    (tutor(ws) / "holdout.json").write_text(json.dumps(["Say \U0001f600 back.", "Café?"]), encoding="utf-8")
    code, out, _ = cli(capsys, "cases", str(ws), "--machine", "tutor", "--holdout", "--json")
    assert code == 0 and out.strip().isascii()
    assert [c["input"] for c in strict_json(out)] == ["Say \U0001f600 back.", "Café?"]
