"""Sweeps as a user runs them: a small grid x seeds on the local engine → one row per run; the
same sweep dir again reads finished runs back and runs only what is missing (more seeds, a failed
run resumed, a stale one set aside); parallel runs give the same numbers; the summary's spread and
interval; the words; and on Tinker the whole sweep priced and refused before the first run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from machine_nb.data.corpus import make_corpus
from machine_nb.errors import BudgetExceeded
from machine_nb.training.sweeps import (RUN_COLUMNS, SUMMARY_COLUMNS, grid_points, read_sweep, run_name, sweep, sweep_summary,
                               verdict)
from machine_nb.training.runlog import hold_log_dir
from machine_nb.training.train import heldout_results, read_training_log, training_metrics

from interrupt import engine_fault_at

GRID = {"learning_rate": [1e-3, 3e-3]}
# four steps, a checkpoint every two, scored at steps 0 and 3 and on the final checkpoint (eval_every=3):
# a fault at the last step leaves a checkpoint to resume from, and every run has a mid-run eval
FIXED = {"max_steps": 4, "save_every": 2, "eval_max_tokens": 16}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    c = make_corpus(root, seed=0)
    small = root / "valid8.jsonl"
    small.write_text("".join(c.valid.read_text().splitlines(keepends=True)[:8]))
    return c, small


@pytest.fixture(scope="module")
def swept(corpus, tmp_path_factory):
    c, valid = corpus
    out = tmp_path_factory.mktemp("sweeps") / "lr"
    return out, sweep(c.train, GRID, seeds=[0, 1], eval_data=valid, eval_every=3, sweep_dir=out, progress=False,
                      **FIXED)


def test_one_row_per_run_in_grid_order_with_its_log_dir(swept):
    out, df = swept
    assert list(df.columns) == ["run", "learning_rate", *RUN_COLUMNS]
    assert list(df["run"]) == ["learning_rate=0.001_seed=0", "learning_rate=0.001_seed=1",
                               "learning_rate=0.003_seed=0", "learning_rate=0.003_seed=1"]
    assert list(df["status"]) == ["ran"] * 4 and df["error"].isna().all()
    for row in df.itertuples():
        res = read_training_log(row.log_dir)
        assert (res.steps, res.last_loss, res.heldout_accuracy, res.best_step) == (
            row.steps, row.final_loss, row.heldout_accuracy, row.best_step) == (4, res.last_loss, res.heldout_accuracy,
                                                                               res.best_step)
        assert row.evals == 3 and row.eval_max_tokens == 16 and row.cost_usd == 0.0 and row.estimated_usd == 0.0
        marker = json.loads(open(f"{row.log_dir}/machine_nb.json").read())
        assert (marker["learning_rate"], marker["seed"], marker["max_steps"]) == (row.learning_rate, row.seed, 4)
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["grid"] == {"learning_rate": [0.001, 0.003]} and manifest["seeds"] == [0, 1]
    # seeds differ in data order only: the same setting, other losses
    assert df["final_loss"].iloc[0] != df["final_loss"].iloc[1]


def test_the_same_dir_reads_finished_runs_back_and_runs_only_new_seeds(swept, corpus):
    out, df = swept
    c, valid = corpus
    stamps = {r: (out / r / "metrics.jsonl").stat().st_mtime_ns for r in df["run"]}
    again = sweep(c.train, GRID, seeds=[0, 1, 2], eval_data=valid, eval_every=3, sweep_dir=out, progress=False,
                  **FIXED)
    assert list(again["status"]) == ["read back", "read back", "ran"] * 2
    assert {r: (out / r / "metrics.jsonl").stat().st_mtime_ns for r in df["run"]} == stamps  # nothing re-ran
    assert again[again.status == "read back"]["wall_s"].isna().all()
    same = again[again.status == "read back"].reset_index(drop=True)
    assert list(same["final_loss"]) == list(df["final_loss"]) and list(same["heldout_accuracy"]) == list(
        df["heldout_accuracy"])
    assert json.loads((out / "sweep.json").read_text())["seeds"] == [0, 1, 2]
    back = read_sweep(out)
    assert list(back["run"]) == list(again["run"]) and set(back["status"]) == {"read back"}
    assert list(back["final_loss"]) == list(again["final_loss"])


def test_another_sweeps_dir_and_bad_grids_are_refused(swept, corpus, tmp_path):
    out, _ = swept
    c, valid = corpus
    before = (out / "sweep.json").read_bytes()
    with pytest.raises(ValueError, match="holds another sweep: its data_sha256"):
        sweep(c.eval.parent / "valid.jsonl", GRID, eval_data=valid, sweep_dir=out, progress=False, **FIXED)
    with pytest.raises(ValueError, match="settings"):
        sweep(c.train, GRID, eval_data=valid, eval_every=3, sweep_dir=out, progress=False, max_steps=12)
    assert (out / "sweep.json").read_bytes() == before
    with pytest.raises(ValueError, match="'warmup' is not a setting"):
        sweep(c.train, {"warmup": [1]}, sweep_dir=tmp_path / "x", progress=False)
    with pytest.raises(TypeError, match="non-empty list"):
        sweep(c.train, {"epochs": 5}, sweep_dir=tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="seeds go in seeds"):
        sweep(c.train, {"seed": [0, 1]}, sweep_dir=tmp_path / "x", progress=False)
    with pytest.raises(TypeError, match="not sft settings"):
        sweep(c.train, GRID, sweep_dir=tmp_path / "x", progress=False, lernrate=1)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a sweep"):
        sweep(c.train, GRID, sweep_dir=tmp_path / "mine", progress=False, **FIXED)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"] and not (tmp_path / "x").exists()


def test_a_failed_run_is_recorded_then_resumed_and_a_stale_one_set_aside(swept, corpus, tmp_path):
    c, valid = corpus
    out = tmp_path / "sw"
    with engine_fault_at(4):  # the engine fails the first run's 4th (last) step, once
        first = sweep(c.train, GRID, eval_data=valid, eval_every=3, sweep_dir=out, progress=False, **FIXED)
    assert list(first["status"]) == ["failed", "ran"] and "engine fault" in first["error"].iloc[0]
    # a run dir that never reached a checkpoint (as after a crash at start): set aside, not deleted
    stale = out / run_name({"learning_rate": 0.003}, 0)
    for p in stale.iterdir():
        if p.is_dir():
            continue
        if p.name != "machine_nb.json":
            p.unlink()
    # while another kernel's run holds them (one resuming, one starting), neither is touched
    ran_in = [out / run_name({"learning_rate": 0.001}, 0), stale]
    with hold_log_dir(ran_in[0]), hold_log_dir(ran_in[1]):
        held = sweep(c.train, GRID, eval_data=valid, eval_every=3, sweep_dir=out, progress=False, **FIXED)
    assert list(held["status"]) == ["failed", "failed"], held
    assert all("is in use: a run is training there now" in e for e in held["error"]), list(held["error"])
    assert [p.name for p in stale.iterdir() if p.is_file()] == ["machine_nb.json"]
    assert not list(out.glob("*.stale-*"))
    second = sweep(c.train, GRID, eval_data=valid, eval_every=3, sweep_dir=out, progress=False, **FIXED)
    assert list(second["status"]) == ["resumed", "ran"] and second["error"].isna().all()
    assert (out / f"{stale.name}.stale-1" / "machine_nb.json").exists()
    assert list(second["steps"]) == [4, 4] and second["heldout_accuracy"].notna().all()
    _, fresh = swept  # the same sweep's seed-0 runs, run straight through
    fresh = fresh[fresh.seed == 0]
    assert list(second["run"]) == list(fresh["run"])
    assert list(second["final_loss"]) == list(fresh["final_loss"])  # the resumed run is the same run


def test_parallel_runs_give_the_numbers_of_sequential_ones(swept, corpus, tmp_path):
    """Both settings' seed-0 runs at once, each in its own child, served by one local engine: the
    numbers of the same runs in the sequential sweep."""
    _, df = swept
    c, valid = corpus
    par = sweep(c.train, GRID, seeds=[0], eval_data=valid, eval_every=3, sweep_dir=tmp_path / "par",
                max_parallel=2, progress=False, **FIXED)
    assert list(par["status"]) == ["ran"] * 2
    seq = df[df.seed == 0]
    assert len(seq) == 2
    for a, b in zip(par.itertuples(), seq.itertuples()):
        assert a.run == b.run
        assert list(training_metrics(a.log_dir)["train_mean_nll"].dropna()) == list(
            training_metrics(b.log_dir)["train_mean_nll"].dropna())
        assert list(heldout_results(a.log_dir, "final").rows["output"]) == list(
            heldout_results(b.log_dir, "final").rows["output"])


def test_summary_spread_interval_and_words(swept):
    _, df = swept
    s = sweep_summary(df)
    assert list(s.columns) == ["learning_rate", *SUMMARY_COLUMNS] and list(s["learning_rate"]) == [1e-3, 3e-3]
    for row in s.itertuples():
        g = df[df.learning_rate == row.learning_rate]["heldout_accuracy"]
        assert row.seeds == 2 and row.mean == pytest.approx(g.mean()) and row.min == g.min() and row.max == g.max()
        assert row.sd == pytest.approx(g.std(ddof=1))
        assert 0 < row.effective_n <= 8  # 8 questions, answered by both seeds: never more than 8 questions' worth
        assert row.ci_low <= row.mean <= row.ci_high and row.ci_high - row.ci_low > 0
    loss = sweep_summary(df, "final_loss")
    assert loss["ci_low"].isna().all() and list(loss["metric"]) == ["final_loss"] * 2
    words = verdict(df)
    best = s.loc[s["mean"].idxmax()]
    assert f"learning_rate={best.learning_rate:g}" in words and "over 2 seeds" in words and "interval" in words
    assert "Best minus the runner-up" in words
    assert "lowest" not in verdict(df, "final_loss")
    assert verdict(df, "final_loss").startswith("Best by mean final_loss: learning_rate=0.003")


def test_the_best_setting_by_cost_is_the_cheapest(swept):
    """Lower is better for a cost as for a loss: the verdict and the SweepView's line name the
    cheapest setting, not the dearest."""
    from machine_nb.widgets.sweep_view import SweepView

    _, df = swept
    priced = df.assign(cost_usd=[0.02 if lr == 1e-3 else 0.01 for lr in df["learning_rate"]])
    assert verdict(priced, "cost_usd").startswith("Best by mean cost_usd: learning_rate=0.003")
    assert "best learning_rate=0.003" in SweepView(priced, metric="cost_usd").summary()


def test_grid_points_are_every_combination_first_axis_slowest():
    assert grid_points({"learning_rate": [1e-3, 3e-3], "epochs": [5, 10]}) == [
        {"learning_rate": 1e-3, "epochs": 5}, {"learning_rate": 1e-3, "epochs": 10},
        {"learning_rate": 3e-3, "epochs": 5}, {"learning_rate": 3e-3, "epochs": 10}]
    assert run_name({"learning_rate": 1e-5, "lr_schedule": "linear"}, 2) == "learning_rate=1e-05_lr_schedule=linear_seed=2"


def test_on_tinker_the_whole_sweep_is_priced_before_the_first_run(corpus, tmp_path, monkeypatch):
    from machine_nb.checks.pricing import UnknownPrice, estimate_cost, estimate_eval_cost

    c, valid = corpus
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    model = "thinkingmachines/Inkling"
    one = estimate_cost(c.train, model, epochs=10).usd + 11 * estimate_eval_cost(valid, model).usd
    with pytest.raises(BudgetExceeded, match="the sweep's 6 run"):
        sweep(c.train, {"epochs": [10]}, seeds=[0, 1, 2, 3, 4, 5], eval_data=valid, model=model,
              sweep_dir=tmp_path / "t", max_usd=one * 5.5, progress=False)  # 5 fit, 6 do not
    with pytest.raises(UnknownPrice, match="cannot bound the cost of the sweep"):
        sweep(c.train, {"epochs": [1]}, model="thinkingmachines/Inkling-Small", sweep_dir=tmp_path / "t",
              progress=False)
    assert not (tmp_path / "t").exists()


def test_cli_sweep_prints_the_summary_and_the_verdict_and_tinker_needs_yes(corpus, tmp_path, capsys, monkeypatch):
    from machine_nb.cli import main

    c, valid = corpus
    args = ["sweep", str(c.train), "--grid", "learning_rate=1e-3,3e-3", "--seeds", "0", "--eval", str(valid),
            "--eval-every", "3", "--set", "max_steps=3", "--set", "eval_max_tokens=8", "--sweep-dir", str(tmp_path / "s")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "learning_rate" in out and "Best by mean heldout_accuracy" in out and str(tmp_path / "s") in out
    assert main([*args, "--json"]) == 0  # the same dir: read back
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["status"] for r in rows] == ["read back", "read back"] and rows[0]["steps"] == 3
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    code = main(["sweep", str(c.train), "--grid", "epochs=5,10", "--seeds", "0,1", "--eval", str(valid),
                 "--model", "thinkingmachines/Inkling", "--sweep-dir", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert code == 4 and "about $" in err and "for 4 runs" in err and "--yes" in err and not (tmp_path / "t").exists()
    assert main(["sweep", str(c.train), "--grid", "learning_rate"]) == 1
    assert "SETTING=VALUES" in capsys.readouterr().err


def test_cli_sweep_help_says_what_it_reads_writes_and_costs():
    from test_cli import _help, _says_reads_writes_costs

    _says_reads_writes_costs("sweep", _help("sweep"))


def test_the_summary_sums_observed_and_estimated_cost_per_setting_at_a_real_price(corpus, tmp_path, monkeypatch):
    """engine="tinker" against a server that speaks Tinker's API, with prices the test sets: each
    setting's cost_usd is its seeds' observed costs (tokens trained x the train price plus the eval
    tokens x the sampling prices) summed, estimated_usd their estimates summed; one unpriced run makes
    its setting's sum unknown, not smaller."""
    import pandas as pd

    from machine_nb.engines.local.server import LocalServer
    from machine_nb.checks.pricing import clear_prices, set_price
    from machine_nb.training.train import heldout_curve

    c, valid = corpus
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    server = LocalServer(key="tml-test-key").start()
    try:
        set_price("local/arith-tiny", train=2.0, prefill=0.5, sample=1.5, source="test price")
        df = sweep(c.train, GRID, seeds=[0, 1], eval_data=valid, eval_every=2, model="local/arith-tiny",
                   engine="tinker", base_url=server.url, sweep_dir=tmp_path / "priced", progress=False,
                   max_usd=1.0, max_steps=2, eval_max_tokens=8)
    finally:
        clear_prices()
        server.stop()
    assert list(df["status"]) == ["ran"] * 4
    observed = {}
    for row in df.itertuples():
        curve = heldout_curve(row.log_dir)
        observed[row.run] = (row.tokens * 2.0 + curve["prompt_tokens"].sum() * 0.5
                             + curve["output_tokens"].sum() * 1.5) / 1e6
        assert row.cost_usd == pytest.approx(observed[row.run]) and row.cost_usd > 0
        assert row.estimated_usd == json.loads(open(f"{row.log_dir}/machine_nb.json").read())["estimate"]["usd"] > 0
    for metric in ("final_loss", "heldout_accuracy"):
        s = sweep_summary(df, metric)
        assert list(s["learning_rate"]) == [1e-3, 3e-3]
        for row in s.itertuples():
            runs = df[df.learning_rate == row.learning_rate]
            assert row.seeds == 2
            assert row.cost_usd == pytest.approx(sum(observed[r] for r in runs["run"]))
            assert row.estimated_usd == pytest.approx(runs["estimated_usd"].sum())
            assert row.estimated_usd > row.cost_usd > 0  # every eval reply priced at max_tokens: the estimate errs high
    unpriced = df.copy()
    unpriced.loc[0, "cost_usd"] = None  # e.g. a run whose model's price was unknown when it was read back
    s = sweep_summary(unpriced, "final_loss")
    assert pd.isna(s["cost_usd"].iloc[0]) and s["cost_usd"].iloc[1] == pytest.approx(
        df[df.learning_rate == 3e-3]["cost_usd"].sum())
    assert s["estimated_usd"].iloc[0] == pytest.approx(df[df.learning_rate == 1e-3]["estimated_usd"].sum())


def test_a_broken_or_deeply_nested_sweep_json_is_a_format_error_naming_it(corpus, tmp_path):
    from machine_nb.errors import MachineFormatError

    c, _ = corpus
    out = tmp_path / "sweep"
    out.mkdir()
    manifest = out / "sweep.json"
    manifest.write_text("[" * 100_000 + "]" * 100_000)  # json.loads alone would raise RecursionError
    for call in (lambda: read_sweep(out), lambda: sweep(c.train, GRID, sweep_dir=out, progress=False, **FIXED)):
        with pytest.raises(MachineFormatError, match="nested deeper") as err:
            call()
        assert err.value.path == str(manifest)
    manifest.write_text(json.dumps({"grid": [1e-3], "seeds": [0]}))
    with pytest.raises(MachineFormatError, match=r"sweep.json \(field 'grid'\)"):
        read_sweep(out)
    assert sorted(p.name for p in out.iterdir()) == ["sweep.json"]  # nothing was run or written


@pytest.mark.parametrize("values", [[1, 1.0], [np.float64(1e-3), 1e-3], [np.int64(2), 2]])
def test_grid_values_that_are_one_setting_are_refused(values):
    axis = "epochs" if isinstance(values[1], int) else "learning_rate"
    with pytest.raises(ValueError, match=f"grid axis '{axis}'"):
        grid_points({axis: values})


def test_numpy_grid_values_run_as_plain_numbers():
    points = grid_points({"learning_rate": [np.float64(1e-3), 3e-3], "epochs": [np.int64(2)]})
    assert points == [{"learning_rate": 1e-3, "epochs": 2}, {"learning_rate": 3e-3, "epochs": 2}]
    assert [type(p["epochs"]) for p in points] == [int, int]
    assert run_name(points[0], 0) == "learning_rate=0.001_epochs=2_seed=0"
    # values that differ past the 6 digits of "%g" keep their own run dirs
    near = grid_points({"learning_rate": [1e-3, 1.0000001e-3]})
    assert len({run_name(p, 0) for p in near}) == 2


def test_a_grid_over_the_evals_sampling_shows_each_runs_own_value_once(tmp_path):
    """eval_max_tokens and eval_temperature are both grid axes and run columns: a grid over one
    of them gives it one column, holding each run's own value (not the fixed setting's default)."""
    out = tmp_path / "sw"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"grid": {"eval_max_tokens": [8, 16]}, "seeds": [0, 1],
                                                "settings": {"eval_temperature": 0.5}, "eval_sha256": "x"}))
    back = read_sweep(out)  # no run started yet: every row "missing"
    assert list(back.columns) == ["run", "eval_max_tokens", *[c for c in RUN_COLUMNS if c != "eval_max_tokens"]]
    assert list(back["eval_max_tokens"]) == [8, 8, 16, 16] and list(back["eval_temperature"]) == [0.5] * 4
    assert list(back["status"]) == ["missing"] * 4


def test_a_budget_that_bounds_nothing_is_refused_before_anything_is_written(corpus, tmp_path):
    c, _ = corpus
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="max_usd"):
            sweep(c.train, GRID, sweep_dir=tmp_path / "x", max_usd=bad, progress=False, **FIXED)
    assert not (tmp_path / "x").exists()
