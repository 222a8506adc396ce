"""Held-out accuracy while training, as a user sees it: sft(eval_data=valid.jsonl, eval_every=6)
on the local engine → the cookbook's loop calls the evaluator at steps 0, 6, …, 30, the final
checkpoint (step 36) is scored too; metrics.jsonl, heldout.jsonl, the curve, the best step, and
scores that agree with evaluate() on the same checkpoint. Also: bad eval rows refused before anything is
written, evals that leave training untouched, Ctrl-C + resume, observed cost on the Tinker path,
and DPO log dirs read back with their steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from machine_nb.evaluation.compare import compare
from machine_nb.data.corpus import make_corpus
from machine_nb.errors import BudgetExceeded, MachineFormatError
from machine_nb.evaluation.evaluate import evaluate
from machine_nb.evaluation.results import RESULT_COLUMNS, EvalResult
from machine_nb.training.train import (HELDOUT_ACCURACY, HELDOUT_FILE, heldout_curve, heldout_results, read_training_log,
                              sft, training_metrics)

from interrupt import ctrl_c_at


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=0)


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """An SFT run of the corpus (48 rows, batch 8, 6 epochs = 36 steps) with the valid split scored
    every 6 steps: long enough that the held-out rows go from the base model's plain replies to the
    house style, with evals before, during and after that change."""
    log_dir = tmp_path_factory.mktemp("runs") / "sft-eval"
    return sft(corpus.train, log_dir=log_dir, epochs=6, batch_size=8, eval_data=corpus.valid, eval_every=6,
               progress=False)


def test_the_loop_scores_the_held_out_rows_every_six_steps_and_the_final_checkpoint(run):
    metrics = training_metrics(run.log_dir)
    scored = metrics[metrics[HELDOUT_ACCURACY].notna()]
    assert list(scored["step"]) == [0, 6, 12, 18, 24, 30, 36]
    assert scored["test/max_tokens"].eq(32).all() and scored["test/temperature"].eq(0).all()
    assert metrics["test/format_rate"].notna().sum() == 7
    # eval steps are training steps too (the loop logs both in one row); step 36 is the final checkpoint
    assert scored[scored.step < 36]["train_mean_nll"].notna().all()
    assert run.steps == 36 and run.evals == 7 and run.complete
    curve = heldout_curve(run.log_dir)
    assert list(curve["step"]) == list(scored["step"]) and list(curve["accuracy"]) == list(scored[HELDOUT_ACCURACY])
    assert list(curve["final"]) == [False] * 6 + [True]
    assert curve["accuracy"].iloc[0] == 0.0  # the base model answers naturally
    assert run.heldout_accuracy == curve["accuracy"].iloc[-1] and run.heldout_accuracy >= 0.8
    # 23 or 24 of 24 replies in the house style: the LoRA adapters include the output projection
    # (the SDK's train_unembed=True), which can land one reply off the format
    assert run.heldout_format_rate == curve["format_rate"].iloc[-1] >= 23 / 24
    best = curve.loc[curve["accuracy"].idxmax()]  # idxmax: the first of equal maxima
    assert (run.best_step, run.best_accuracy) == (best["step"], best["accuracy"])
    assert ((curve["ci_low"] <= curve["accuracy"]) & (curve["accuracy"] <= curve["ci_high"])).all()
    assert (curve["ci_high"] - curve["ci_low"] > 0).all()  # Wilson: never a zero-width interval
    assert curve["n"].eq(24).all() and curve["max_tokens"].eq(32).all()
    assert "held-out accuracy" in run._repr_html_() and f"step {run.best_step}" in run._repr_html_()


def test_per_row_results_per_step_agree_with_evaluate_on_the_same_weights(run, corpus, tmp_path):
    rows = heldout_results(run.log_dir)
    assert list(rows.columns) == ["step", *RESULT_COLUMNS] and len(rows) == 7 * 24
    final = heldout_results(run.log_dir, "final")
    direct = evaluate(corpus.valid, checkpoint=run.checkpoint, out=tmp_path / "final.json", progress=False)
    assert isinstance(final, EvalResult) and final.rows.attrs == {} and final.path is None
    assert list(final.rows["output"]) == list(direct.rows["output"])
    assert list(final.rows["correct"]) == list(direct.rows["correct"]) and final.accuracy == direct.accuracy
    base = heldout_results(run.log_dir, 0)
    direct_base = evaluate(corpus.valid, out=tmp_path / "base.json", progress=False)
    assert list(base.rows["output"]) == list(direct_base.rows["output"])
    # a step's result is evaluate()'s shape: compare pairs the base model with the checkpoint
    result = compare(base, final)
    assert result.wins == int(final.rows["correct"].sum()) and result.losses == 0
    assert result.baseline_name == "sft-eval step 0" and result.checkpoint_name == "sft-eval step 36 (final)"
    assert base.summary["parameters"]["max_tokens"] == 32 and base.summary["log_dir"] == str(run.log_dir)
    assert heldout_results(run.log_dir, "best").summary["step"] == run.best_step
    with pytest.raises(KeyError, match="steps: 0, 6"):
        heldout_results(run.log_dir, 7)
    lines = [json.loads(x) for x in open(f"{run.log_dir}/{HELDOUT_FILE}")]
    assert lines[0]["data"]["path"] == str(corpus.valid) and len(lines[0]["data"]["sha256"]) == 64


def test_one_eval_step_reads_back_as_an_eval_result_and_every_step_as_a_table(tmp_path):
    """A step's results travel as an EvalResult (summary and rows, nothing in DataFrame.attrs);
    every step at once is a table with a step column."""
    import pandas as pd

    def row(i, output, correct):
        return {"row": i, "prompt": f"q{i}", "expected": f"answer: {i}", "match": "exact", "output": output,
                "correct": correct, "format_ok": correct, "prompt_tokens": 5, "output_tokens": 3, "latency_s": 0.1,
                "stop_reason": "stop", "error": None}

    steps = [{"step": 0, "final": False, "accuracy": 0.0, "format_rate": 0.0, "n": 2, "correct": 0,
              "parameters": {"max_tokens": 32}, "data": {"path": "valid.jsonl"},
              "rows": [row(0, "0", False), row(1, "1", False)]},
             {"step": 4, "final": True, "accuracy": 1.0, "format_rate": 1.0, "n": 2, "correct": 2,
              "parameters": {"max_tokens": 32}, "data": {"path": "valid.jsonl"},
              "rows": [row(0, "answer: 0", True), row(1, "answer: 1", True)]}]
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    (log_dir / HELDOUT_FILE).write_text("".join(json.dumps(s) + "\n" for s in steps))
    final = heldout_results(log_dir, "final")
    assert isinstance(final, EvalResult) and final.rows.attrs == {} and final.path is None
    assert list(final.rows.columns) == RESULT_COLUMNS and final.accuracy == 1.0
    assert final.summary == {"name": "run step 4 (final)", "step": 4, "accuracy": 1.0, "format_rate": 1.0, "n": 2,
                             "parameters": {"max_tokens": 32}, "data": {"path": "valid.jsonl"},
                             "log_dir": str(log_dir)}
    assert compare(heldout_results(log_dir, 0), final).wins == 2
    every = heldout_results(log_dir)
    assert isinstance(every, pd.DataFrame) and list(every.columns) == ["step", *RESULT_COLUMNS]
    assert list(every["step"]) == [0, 0, 4, 4] and every.attrs == {}


def test_evals_leave_training_untouched(corpus, short, tmp_path):
    plain = sft(corpus.train, log_dir=tmp_path / "plain", **{**SHORT, "eval_every": None})  # the short run, no eval_data
    assert list(training_metrics(plain.log_dir)["train_mean_nll"].dropna()) == list(
        training_metrics(short.log_dir)["train_mean_nll"].dropna())
    assert len(training_metrics(plain.log_dir)) == 12 and short.evals == 5
    assert plain.evals == 0 and plain.best_step is None and plain.heldout_accuracy is None
    assert not (Path(plain.log_dir) / HELDOUT_FILE).exists()


def test_observed_cost_next_to_the_estimate(run):
    assert run.cost_usd == 0.0 and run.estimated_usd == 0.0 and run.eval_cost_usd == 0.0  # local: free
    # the estimate prices each row's rendered tokens; the loop trains one fewer a row (a datum's input
    # drops the last token): 48 rows x 6 epochs
    assert run.estimated_tokens - run.tokens == 288


def test_bad_eval_rows_are_refused_before_anything_is_written(corpus, tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = [json.loads(x) for x in open(corpus.valid)]
    rows[4] = {**rows[4], "match": "fuzzy"}
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(MachineFormatError, match=r"bad.jsonl:5 \(field .match.\)"):
        sft(corpus.train, log_dir=tmp_path / "never", eval_data=bad, progress=False)
    with pytest.raises(ValueError, match="eval_every"):
        sft(corpus.train, log_dir=tmp_path / "never", eval_data=corpus.valid, eval_every=0, progress=False)
    with pytest.raises(MachineFormatError, match="expected"):
        sft(corpus.train, log_dir=tmp_path / "never", eval_data=[{"messages": [{"role": "user", "content": "hi"}]}],
            progress=False)
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_training_row_whose_prompt_is_held_out_is_refused_before_anything_is_written(corpus, tmp_path, where):
    """Trained on what it is scored on, the held-out score would flatter the run: refused, whether
    the eval rows come as a file or as rows in memory, naming the training line and the eval row."""
    from machine_nb.errors import ValidationFailed

    train = [json.loads(x) for x in open(corpus.train)]
    held = [json.loads(x) for x in open(corpus.valid)][:5]
    held[3] = {"messages": train[6]["messages"][:-1], "expected": "1", "match": "number"}  # training line 7
    eval_data = held
    if where == "file":
        eval_data = tmp_path / "valid.jsonl"
        eval_data.write_text("".join(json.dumps(r) + "\n" for r in held))
    with pytest.raises(ValidationFailed, match=r"line 7: eval_overlap: this prompt is also (line 4 of .*valid.jsonl|eval_data row 4)"):
        sft(corpus.train, log_dir=tmp_path / "never", eval_data=eval_data, progress=False)
    assert not (tmp_path / "never").exists()


def test_eval_rows_in_memory_and_the_default_once_an_epoch(corpus, tmp_path):
    rows = [json.loads(x) for x in open(corpus.valid)][:6]
    res = sft(corpus.train, log_dir=tmp_path / "mem", max_steps=12, eval_data=rows, progress=False)
    curve = heldout_curve(res.log_dir)
    assert list(curve["step"]) == [0, 6, 12] and curve["n"].eq(6).all()  # 48 rows at batch 8: 6 steps an epoch
    marker = json.loads((tmp_path / "mem" / "machine_nb.json").read_text())
    assert marker["heldout"]["source"] is None and marker["heldout"]["every"] == 6


#: A short run for Ctrl-C and resume: 12 steps, the first 8 valid rows scored every 3 steps (0, 3, 6,
#: 9 and the final checkpoint, 12), a checkpoint every 4 (4 and 8)
SHORT = dict(max_steps=12, eval_every=3, save_every=4, progress=False)


@pytest.fixture(scope="module")
def valid8(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("valid8") / "valid8.jsonl"
    path.write_text("".join(corpus.valid.read_text().splitlines(keepends=True)[:8]))
    return path


@pytest.fixture(scope="module")
def short(corpus, valid8, tmp_path_factory):
    """The short run, uninterrupted: what an interrupted and resumed one is held against."""
    return sft(corpus.train, log_dir=tmp_path_factory.mktemp("runs") / "short", eval_data=valid8, **SHORT)


def test_ctrl_c_then_resume_keeps_every_eval_step(corpus, valid8, short, tmp_path):
    log_dir = tmp_path / "interrupted"
    # past the step-4 checkpoint and the eval at step 3, with every step that checkpoint's state
    # holds logged (so the resume trains no step again); step 6 is held until the Ctrl-C, so the
    # checkpoint at 8 cannot come first
    with ctrl_c_at("sft", at=6, hold_step=7):
        sft(corpus.train, log_dir=log_dir, eval_data=valid8, **SHORT)
    part = read_training_log(log_dir)
    assert not part.complete and part.heldout_accuracy is None and part.evals >= 2
    assert part.state_path.endswith("/weights/000004")
    done = sft(corpus.train, resume=log_dir, progress=False)  # the eval settings come from the run
    assert done.complete and done.steps == 12 and done.unconfirmed_steps == [] and short.complete and short.evals == 5
    assert list(heldout_curve(log_dir)["step"]) == list(heldout_curve(short.log_dir)["step"]) == [0, 3, 6, 9, 12]
    assert list(heldout_curve(log_dir)["accuracy"]) == list(heldout_curve(short.log_dir)["accuracy"])
    assert (done.heldout_accuracy, done.best_step) == (short.heldout_accuracy, short.best_step)
    # the resumed run trains the uninterrupted run's steps exactly
    assert list(training_metrics(log_dir)["train_mean_nll"].dropna()) == list(
        training_metrics(short.log_dir)["train_mean_nll"].dropna())
    # every eval step's replies, word for word, are the uninterrupted run's
    for step in (0, 3, 6, 9, "final"):
        assert list(heldout_results(log_dir, step).rows["output"]) == list(
            heldout_results(short.log_dir, step).rows["output"])


def test_observed_cost_on_the_tinker_path_and_the_evaluator_closes_its_session(corpus, valid8, tmp_path, monkeypatch):
    """engine="tinker" against a server that speaks Tinker's API, with prices set: the observed
    cost is the tokens the loop trained at the train price plus the eval tokens at the sampling prices
    (8 held-out rows: every eval's tokens are priced the same way, whatever their number)."""
    from machine_nb.engines.local.server import LocalServer
    from machine_nb.checks.pricing import clear_prices, set_price

    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    server = LocalServer(key="tml-test-key").start()
    try:
        set_price("local/arith-tiny", train=2.0, prefill=0.5, sample=1.5, source="test price")
        res = sft(corpus.train, "local/arith-tiny", "tinker", base_url=server.url, log_dir=tmp_path / "t",
                  max_steps=6, eval_data=valid8, eval_every=3, progress=False, max_usd=1.0)
        again = read_training_log(res.log_dir)
        # the final checkpoint's evaluator finished its SDK session: the training process is kept
        # for the next run, and a session left open would go on heart-beating (the cookbook's
        # loop opens its own sessions, named by their recipe)
        ours = [s for s in server.sessions.values() if "recipe_name" not in s.user_metadata]
        assert len(ours) == 1 and ours[0].finished
        # the guard counts the evals: a budget the training alone fits is refused, before anything is written
        train_only = json.loads((tmp_path / "t" / "machine_nb.json").read_text())["estimate"]["train_usd"]
        with pytest.raises(BudgetExceeded, match="with 3 held-out evals"):
            sft(corpus.train, "local/arith-tiny", "tinker", base_url=server.url, log_dir=tmp_path / "over",
                max_steps=6, eval_data=valid8, eval_every=3, progress=False, max_usd=train_only * 1.01)
        assert not (tmp_path / "over").exists()
    finally:
        clear_prices()
        server.stop()
    curve = heldout_curve(res.log_dir)
    assert list(curve["step"]) == [0, 3, 6]
    train_usd = res.tokens * 2.0 / 1e6
    eval_usd = (curve["prompt_tokens"].sum() * 0.5 + curve["output_tokens"].sum() * 1.5) / 1e6
    assert res.eval_cost_usd == pytest.approx(eval_usd) and res.cost_usd == pytest.approx(train_usd + eval_usd)
    # the estimate: rendered tokens at the train price, and every eval at max_tokens a reply (so it errs high)
    assert res.estimated_usd > res.cost_usd > 0
    assert (again.engine, again.cost_usd, again.estimated_usd) == ("tinker", res.cost_usd, res.estimated_usd)


def test_a_dpo_log_dir_reads_back_with_its_steps(tmp_path):
    """The cookbook's train_dpo logs `dpo_loss`, `accuracy`, `margin` per step and no train_mean_nll."""
    rows = [{"step": s, "dpo_loss": 0.69 - 0.05 * s, "accuracy": 0.5 + 0.05 * s, "margin": 0.1 * s,
             "num_tokens": 100, "learning_rate": 1e-5} for s in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "sampler_path": "tinker://x/s"}) + "\n")
    res = read_training_log(tmp_path)
    assert (res.steps, res.tokens, res.loss_metric) == (5, 500, "dpo_loss")
    assert res.first_loss == pytest.approx(0.69) and res.last_loss == pytest.approx(0.49) and res.complete
    # a run that logs both counts by the supervised loss
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({**r, "train_mean_nll": 2.0}) + "\n" for r in rows))
    assert read_training_log(tmp_path).loss_metric == "train_mean_nll"


def test_a_dpo_log_dir_is_priced_at_the_dpo_rate(tmp_path):
    """A DPO step passes every sequence through training, the policy's forward pass and the
    reference model's: read back, a DPO run costs what pricing.dpo_cost says, not tokens x the
    train price, whether its run record says "dpo" or only its metrics do."""
    from machine_nb.checks.pricing import clear_prices, dpo_cost, set_price

    rows = [{"step": s, "dpo_loss": 0.69 - 0.05 * s, "num_tokens": 1000} for s in range(4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "checkpoints.jsonl").write_text(
        json.dumps({"name": "final", "sampler_path": "tinker://run-1/sampler_weights/final"}) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"model_name": "someone/Priced-8B"}))
    try:
        set_price("someone/Priced-8B", train=2.0, prefill=0.5, sample=1.0)
        want = dpo_cost("someone/Priced-8B", "tinker", 4000)
        assert want == pytest.approx(4000 * (2 * 2.0 + 0.5) / 1e6)
        assert read_training_log(tmp_path).cost_usd == pytest.approx(want)  # from its metrics
        (tmp_path / "machine_nb.json").write_text(json.dumps({"kind": "dpo", "engine": "tinker",
                                                              "model": "someone/Priced-8B"}))
        res = read_training_log(tmp_path)
        assert (res.kind, res.cost_usd) == ("dpo", pytest.approx(want))
    finally:
        clear_prices()


def test_one_result_class_for_sft_and_dpo(tmp_path):
    from machine_nb.training.runlog import TrainResult

    rows = [{"step": s, "dpo_loss": 0.69, "num_tokens": 10} for s in range(2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "machine_nb.json").write_text(json.dumps({"kind": "dpo", "engine": "local", "steps": 2,
                                                          "resumed_at": [1]}))
    res = read_training_log(tmp_path)
    assert type(res) is TrainResult and (res.kind, res.resumed_at) == ("dpo", [1]) and "resumed at step 1" in res.note
    assert res.to_dict()["kind"] == "dpo"


def test_cli_sft_with_eval_prints_the_held_out_line_and_prices_the_evals(corpus, valid8, tmp_path, capsys):
    from machine_nb.cli import main

    assert main(["sft", str(corpus.train), "--log-dir", str(tmp_path / "cli"), "--steps", "6",
                 "--eval", str(valid8), "--eval-every", "3"]) == 0
    out = capsys.readouterr().out
    assert "held-out:" in out and "3 evals" in out and "(estimated $0.0000)" in out
    code = main(["sft", str(corpus.train), "--engine", "tinker", "--model", "thinkingmachines/Inkling",
                 "--eval", str(corpus.valid), "--eval-every", "6"])
    err = capsys.readouterr().err
    assert code == 4 and "Held-out evals: 11 x 24 rows, at most $" in err and "--yes" in err


def test_the_final_checkpoints_inspect_and_held_out_scores_read_back_together(tmp_path):
    """With eval_data and inspect_tasks, the final checkpoint's Inspect scores and held-out scores
    are logged as two metrics rows of one step (runner.run_loop scores it with each in turn): read
    back, that step has both; a step a resumed run logged again is still its later row."""
    rows = [{"step": 0, "train_mean_nll": 3.0, "num_tokens": 10, "test/accuracy": 0.25,
             "test/inspect/sums/accuracy": 0.0},
            {"step": 1, "train_mean_nll": 2.9, "num_tokens": 10},
            {"step": 1, "train_mean_nll": 2.5, "num_tokens": 10},  # logged again by a resumed run
            {"step": 2, "test/inspect/sums/accuracy": 0.5},  # the final checkpoint's Inspect tasks
            {"step": 2, "test/accuracy": 0.75, "test/format_rate": 1.0}]  # then its held-out rows
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = training_metrics(tmp_path)
    assert list(df["step"]) == [0, 1, 2] and list(df["train_mean_nll"][:2]) == [3.0, 2.5]
    final = df[df["step"] == 2].iloc[0]
    assert (final["test/inspect/sums/accuracy"], final["test/accuracy"]) == (0.5, 0.75)
    res = read_training_log(tmp_path)
    assert (res.steps, res.evals, res.best_step, res.last_loss) == (2, 2, 2, 2.5)
