"""Held-out accuracy while DPO trains, as a user sees it: dpo(pairs, eval_data=…, eval_every=2) on the
local engine → tinker-cookbook's train_dpo calls the evaluator at steps 0, 2 and before its last
step (3), the final checkpoint (4) is scored too; metrics.jsonl, heldout.jsonl, the best step, scores
that agree with evaluate() on the same weights; bad eval rows and overlapping prompts refused before
anything is written; Ctrl-C + resume keeps every eval step and says what the resume changed; the
observed cost and the budget guard on the Tinker path; `machine-nb dpo --eval`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import machine_nb as mnb
from machine_nb.errors import BudgetExceeded, MachineFormatError, ValidationFailed
from machine_nb.evaluation.evaluate import evaluate
from machine_nb.data.export import HeldOutExcluded
from machine_nb.training.preference import dpo, read_dpo_log
from machine_nb.evaluation.results import RESULT_COLUMNS
from machine_nb.training.train import HELDOUT_ACCURACY, HELDOUT_FILE, heldout_curve, heldout_results, training_metrics

from interrupt import ctrl_c_at

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
#: 16 pairs at batch 4 = 4 steps an epoch, 1 epoch; scored every 2: 0, 2, the last step (3, which
#: train_dpo always evaluates, though not a multiple of 2) and the final checkpoint (4): each kind of
#: eval step once, and a checkpoint (step 2) to resume from with a step after it
KW = dict(batch_size=4, epochs=1, eval_every=2, save_every=2, progress=False)
STEPS = [0, 2, 3, 4]


@pytest.fixture(scope="module")
def pairs():
    with pytest.warns(HeldOutExcluded):
        return mnb.preference_pairs(SAMPLE / ".machine-store", workspace=SAMPLE, machine="tutor")


@pytest.fixture(scope="module")
def train_pairs(pairs):
    return pairs.head(16)


@pytest.fixture(scope="module")
def eval_file(pairs, tmp_path_factory):
    """Eight tutor questions the run does not train on (pairs past the first 16), with the tutor's
    instructions, scored on the number in the reply; the format is the chosen replies' `answer: N`."""
    path = tmp_path_factory.mktemp("eval") / "valid.jsonl"
    rows = [{"messages": r.prompt, "expected": r.chosen[0]["content"].split()[-1], "match": "number",
             "format": r"^answer: -?\d+$"} for r in pairs.iloc[36:44].itertuples()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def run(train_pairs, eval_file, tmp_path_factory):
    return dpo(train_pairs, log_dir=tmp_path_factory.mktemp("runs") / "dpo-eval", eval_data=eval_file, **KW)


def test_the_dpo_loop_scores_the_held_out_rows_at_its_eval_steps_and_the_final_checkpoint(run):
    assert run.kind == "dpo" and run.complete and run.steps == 4 and run.loss_metric == "dpo_loss"
    metrics = training_metrics(run.log_dir)
    scored = metrics[metrics[HELDOUT_ACCURACY].notna()]
    assert list(scored["step"]) == STEPS
    assert scored["test/max_tokens"].eq(32).all() and scored["test/temperature"].eq(0).all()
    assert metrics["test/format_rate"].notna().sum() == len(STEPS)
    # the loop logs an eval step's scores in that step's row; step 4 is the final checkpoint's own row
    assert scored[scored.step < 4]["dpo_loss"].notna().all() and math.isnan(scored["dpo_loss"].iloc[-1])
    assert run.evals == len(STEPS) and run.steps == 4  # the final checkpoint's row is no training step
    curve = heldout_curve(run.log_dir)
    assert list(curve["step"]) == STEPS and list(curve["final"]) == [False] * 3 + [True]
    assert list(curve["accuracy"]) == list(scored[HELDOUT_ACCURACY]) and curve["n"].eq(8).all()
    assert run.heldout_accuracy == curve["accuracy"].iloc[-1]
    assert run.heldout_format_rate == curve["format_rate"].iloc[-1]
    best = curve.loc[curve["accuracy"].idxmax()]  # the earliest of equal maxima
    assert (run.best_step, run.best_accuracy) == (best["step"], best["accuracy"])
    assert curve["accuracy"].iloc[0] >= 0.75  # the base model gets the numbers right in its own words
    html = run._repr_html_()
    assert "held-out accuracy" in html and f"step {run.best_step}" in html and "note" not in html
    assert run.resumed_at == [] and run.note is None
    # LossPlot: dpo_loss as the loss, the held-out scores on an axis of their own, the best step in words
    from machine_nb.widgets.loss_plot import LossPlot, figure

    plot = LossPlot(run.log_dir, live=False)
    assert plot.finished()  # the final checkpoint's score is in: nothing left to wait for
    assert (f"held-out {run.heldout_accuracy:.1%} at step 4 (best {run.best_accuracy:.1%} at step {run.best_step})"
            in plot.summary())
    assert "held-out" in [a.get_ylabel() for a in figure(plot.frame).axes]
    # read back from the log dir alone: the same
    again = read_dpo_log(run.log_dir)
    assert (again.best_step, again.heldout_accuracy, again.evals, again.cost_usd) == (
        run.best_step, run.heldout_accuracy, run.evals, 0.0)
    marker = json.loads((Path(run.log_dir) / "machine_nb.json").read_text())
    assert marker["heldout"]["every"] == 2 and marker["heldout"]["evals"] == 4 and marker["steps"] == 4
    assert marker["estimate"]["usd"] == 0.0 and marker["estimate"]["evals"] == 4
    # the estimate prices each sequence's rendered tokens; the loop passes one fewer a sequence (a datum's
    # input drops the last token): 16 pairs x 2 sequences x 1 epoch
    assert run.estimated_usd == 0.0 and run.estimated_tokens - run.tokens == 32


def test_per_row_results_agree_with_evaluate_on_the_same_weights(run, eval_file, tmp_path):
    rows = heldout_results(run.log_dir)
    assert list(rows.columns) == ["step", *RESULT_COLUMNS] and len(rows) == len(STEPS) * 8
    final = heldout_results(run.log_dir, "final")
    direct = evaluate(eval_file, checkpoint=run.checkpoint, out=tmp_path / "final.json", progress=False)
    assert list(final.rows["output"]) == list(direct.rows["output"])
    assert list(final.rows["correct"]) == list(direct.rows["correct"])
    base = heldout_results(run.log_dir, 0)
    direct_base = evaluate(eval_file, out=tmp_path / "base.json", progress=False)
    assert list(base.rows["output"]) == list(direct_base.rows["output"])
    lines = [json.loads(x) for x in open(Path(run.log_dir) / HELDOUT_FILE)]
    assert [x["step"] for x in lines] == STEPS and lines[0]["data"]["path"] == str(eval_file)
    assert heldout_results(run.log_dir, "best").summary["step"] == run.best_step


def test_evals_leave_the_dpo_steps_untouched(run, train_pairs, tmp_path):
    plain = dpo(train_pairs, log_dir=tmp_path / "plain", **{**KW, "eval_every": None})
    assert list(training_metrics(plain.log_dir)["dpo_loss"]) == list(training_metrics(run.log_dir)["dpo_loss"].dropna())
    assert plain.evals == 0 and plain.best_step is None and plain.heldout_accuracy is None
    assert not (tmp_path / "plain" / HELDOUT_FILE).exists()


def test_bad_eval_rows_and_overlapping_prompts_are_refused_before_anything_is_written(train_pairs, eval_file,
                                                                                      tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = [json.loads(x) for x in open(eval_file)]
    rows[2] = {**rows[2], "match": "fuzzy"}
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(MachineFormatError, match=r"bad.jsonl:3 \(field .match.\)"):
        dpo(train_pairs, log_dir=tmp_path / "never", eval_data=bad, **KW)
    with pytest.raises(ValueError, match="eval_every"):
        dpo(train_pairs, log_dir=tmp_path / "never", eval_data=eval_file, **{**KW, "eval_every": 0})
    # a pair whose prompt is one of the eval file's: trained on what it is scored on
    seen = tmp_path / "seen.jsonl"
    first = train_pairs.iloc[0]
    seen.write_text(json.dumps({"messages": first["prompt"], "expected": "1", "match": "number"}) + "\n")
    with pytest.raises(ValidationFailed, match=r"eval_overlap"):
        dpo(train_pairs, log_dir=tmp_path / "never", eval_data=seen, **KW)
    assert not (tmp_path / "never").exists()


def test_a_pair_whose_prompt_is_in_eval_rows_in_memory_is_refused_too(train_pairs, eval_file, tmp_path):
    held = [json.loads(x) for x in open(eval_file)]
    held[1] = {"messages": train_pairs.iloc[2]["prompt"], "expected": "1", "match": "number"}
    with pytest.raises(ValidationFailed, match=r"pair 3: eval_overlap: this prompt is also eval_data row 2") as err:
        dpo(train_pairs, log_dir=tmp_path / "never", eval_data=held, **KW)
    assert not (tmp_path / "never").exists()
    assert list(err.value.result.errors()["code"]) == ["eval_overlap"]


def test_ctrl_c_then_resume_keeps_every_eval_step_and_says_what_the_resume_changed(run, train_pairs, eval_file,
                                                                                   tmp_path):
    log_dir = tmp_path / "interrupted"
    with ctrl_c_at("dpo", at=3, hold_step=4):
        dpo(train_pairs, log_dir=log_dir, eval_data=eval_file, **KW)
    part = read_dpo_log(log_dir)
    assert not part.complete and part.heldout_accuracy is None and part.state_path.endswith("/weights/000002")
    assert part.evals >= 2 and part.note is None  # steps 0 and 2 scored before the interrupt
    done = dpo(train_pairs, resume=log_dir, progress=False)  # the eval settings come from the run
    assert done.complete and done.steps == 4
    assert list(heldout_curve(log_dir)["step"]) == STEPS
    # the steps before the checkpoint, and the weights they reach, are the uninterrupted run's
    for step in (0, 2):
        assert list(heldout_results(log_dir, step).rows["output"]) == list(heldout_results(run.log_dir, step).rows["output"])
    full, resumed = training_metrics(run.log_dir), training_metrics(log_dir)
    assert list(resumed["dpo_loss"][:2]) == list(full["dpo_loss"][:2])
    # from step 2 on, the reference model is the step-2 weights: the loss starts again at log 2
    assert math.isclose(resumed["dpo_loss"].iloc[2], math.log(2), rel_tol=1e-4)
    assert not math.isclose(full["dpo_loss"].iloc[2], math.log(2), rel_tol=1e-4)
    assert done.resumed_at == [2] and "resumed at step 2" in done.note and "reference model" in done.note
    assert "steps 2-3" in done.note and "note" in done._repr_html_()
    assert read_dpo_log(log_dir).note == done.note and done.to_dict()["note"] == done.note
    assert (done.best_step is not None and done.heldout_accuracy == heldout_curve(log_dir)["accuracy"].iloc[-1])


def test_observed_cost_and_the_budget_guard_on_the_tinker_path(train_pairs, eval_file, tmp_path, monkeypatch):
    """engine="tinker" against a server that speaks Tinker's API, with prices set: the observed cost is
    the DPO passes at the train and prefill prices plus the eval tokens at the sampling prices, and the
    budget guard counts the evals. One step suffices: the eval at step 0 and the final checkpoint's are
    priced as every eval is."""
    from machine_nb.engines.local.server import LocalServer
    from machine_nb.checks.pricing import clear_prices, set_price

    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    server = LocalServer(key="tml-test-key").start()
    try:
        set_price("local/arith-tiny", train=2.0, prefill=0.5, sample=1.5, source="test price")
        res = dpo(train_pairs, "local/arith-tiny", "tinker", base_url=server.url, log_dir=tmp_path / "t",
                  max_steps=1, batch_size=4, eval_data=eval_file, eval_every=1, progress=False, max_usd=1.0)
        train_only = json.loads((tmp_path / "t" / "machine_nb.json").read_text())["estimate"]["train_usd"]
        with pytest.raises(BudgetExceeded, match="with 2 held-out evals"):
            dpo(train_pairs, "local/arith-tiny", "tinker", base_url=server.url, log_dir=tmp_path / "over",
                max_steps=1, batch_size=4, eval_data=eval_file, eval_every=1, progress=False,
                max_usd=train_only * 1.01)
        assert not (tmp_path / "over").exists()
        again = read_dpo_log(res.log_dir)
    finally:
        clear_prices()
        server.stop()
    curve = heldout_curve(res.log_dir)
    assert list(curve["step"]) == [0, 1]  # the step, then the final checkpoint
    train_usd = res.tokens * (2 * 2.0 + 0.5) / 1e6  # training + the policy's forward pass + the reference's
    eval_usd = (curve["prompt_tokens"].sum() * 0.5 + curve["output_tokens"].sum() * 1.5) / 1e6
    assert res.eval_cost_usd == pytest.approx(eval_usd) and res.cost_usd == pytest.approx(train_usd + eval_usd)
    assert res.estimated_usd > res.cost_usd > 0  # every eval reply priced at max_tokens: the estimate errs high
    assert (again.engine, again.cost_usd, again.estimated_usd) == ("tinker", res.cost_usd, res.estimated_usd)


def test_cli_dpo_with_eval_prints_the_held_out_line_and_prices_the_evals(pairs, train_pairs, eval_file, tmp_path,
                                                                          capsys):
    from machine_nb.cli import main
    from machine_nb.training.pairs import write_pairs

    path = write_pairs(train_pairs, tmp_path / "pairs.jsonl")
    # one step: the held-out evals at step 0 and on the final checkpoint are what the CLI reports and prices
    # (the evals at later steps inside the loop are the run fixture's)
    assert main(["dpo", str(path), "--steps", "1", "--batch-size", "4", "--log-dir", str(tmp_path / "cli"),
                 "--eval", str(eval_file), "--eval-every", "1"]) == 0
    out = capsys.readouterr().out
    assert "held-out:" in out and "2 evals" in out and "(estimated $0.0000)" in out
    assert list(heldout_curve(tmp_path / "cli")["step"]) == [0, 1]
    code = main(["dpo", str(path), "--engine", "tinker", "--model", "thinkingmachines/Inkling",
                 "--eval", str(eval_file), "--eval-every", "4"])
    err = capsys.readouterr().err
    # 16 pairs at batch 8: 2 steps an epoch x 10; steps 0, 4, …, 16 and the last (19), then the final checkpoint
    assert code == 4 and "Held-out evals: 7 x 8 rows, at most $" in err and "--yes" in err
