"""Edge cases of sweeps, their view, the loss plot, the cost meter and pricing, as a user meets them:
a grid with a default (None) among its values, a sweep resumed with its axes in another order, a
damaged sweep.json, a price that is not a price, budgets of less than a cent, a non-number budget,
and a step whose loss is infinite."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from machine_nb.checks import pricing
from machine_nb.checks.pricing import Price, check_budget, clear_prices, estimate_cost, set_price
from machine_nb.errors import BudgetExceeded, MachineFormatError
from machine_nb.training import sweeps as sweeps_module
from machine_nb.training import train
from machine_nb.training.sweeps import _frame, _row, read_sweep, run_name, sweep, sweep_summary, verdict

INKLING = "thinkingmachines/Inkling"
ROWS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                      {"role": "assistant", "content": f"answer: {2 * i}"}]} for i in range(8)]


@pytest.fixture(autouse=True)
def _no_overrides():
    clear_prices()
    yield
    clear_prices()


class _Result:
    """The run attributes a sweep row reads, for a run that finished with `loss`."""

    def __init__(self, loss: float):
        for name in ("steps", "first_loss", "heldout_accuracy", "heldout_format_rate", "best_step", "best_accuracy",
                     "evals", "tokens", "estimated_tokens", "checkpoint"):
            setattr(self, name, None)
        self.last_loss, self.cost_usd, self.estimated_usd = loss, 0.0, 0.0


def _frame_of(axis: str, values: list, losses: list[float], tmp_path: Path):
    rows, losses = [], iter(losses)
    for value in values:
        for seed in (0, 1):
            point = {axis: value}
            rows.append(_row(run_name(point, seed), point, seed, _Result(next(losses)), "ran", 1.0, None, {},
                             tmp_path / run_name(point, seed)))
    return _frame(rows, [axis])


# ----------------------------------------------------------------------------- sweeps


def test_a_grid_with_the_default_none_keeps_none_in_the_frame_summary_words_and_view(tmp_path):
    from machine_nb.widgets.sweep_view import SweepView

    frame = _frame_of("max_steps", [None, 50], [1.0, 0.5, 0.3, 0.2], tmp_path)
    assert list(frame["max_steps"]) == [None, None, 50, 50]
    summary = sweep_summary(frame, "final_loss")
    assert list(summary["max_steps"]) == [None, 50] and list(summary["mean"]) == [0.75, 0.25]
    words = verdict(frame, "final_loss", summary=summary)
    assert "max_steps=50, 0.25" in words and "max_steps=None: 0.75" in words and "nan" not in words
    view = SweepView(frame, metric="final_loss")
    assert view.summary().startswith("SweepView: 2 settings x 2 seeds, best max_steps=50")
    from machine_nb.widgets.sweep_view import sweep_figure

    ax = sweep_figure(frame, summary, "max_steps", "final_loss").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["None", "50"]
    from matplotlib.collections import PathCollection

    dots = sorted(y for c in ax.collections if isinstance(c, PathCollection) for y in c.get_offsets()[:, 1])
    assert dots == [0.2, 0.3, 0.5, 1.0]  # every run drawn, the None setting's too


def test_a_none_setting_among_others_is_one_line_of_the_plot(tmp_path):
    from machine_nb.widgets.sweep_view import sweep_figure

    rows = []
    for i, (lr, steps) in enumerate([(1e-3, None), (1e-3, 50), (3e-3, None), (3e-3, 50)]):
        point = {"learning_rate": lr, "max_steps": steps}
        rows.append(_row(run_name(point, 0), point, 0, _Result(1.0 / (i + 1)), "ran", 1.0, None, {},
                         tmp_path / run_name(point, 0)))
    frame = _frame(rows, ["learning_rate", "max_steps"])
    summary = sweep_summary(frame, "final_loss")
    ax = sweep_figure(frame, summary, "learning_rate", "final_loss").axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["max_steps=None", "max_steps=50"]


def _fake_sft(calls: list):
    """sft that records where it was asked to train and fails at once (nothing is trained)."""

    @functools.wraps(train.sft)
    def fake(data, model=None, engine=None, **kwargs):
        calls.append(Path(kwargs["log_dir"]).name)
        raise RuntimeError("not trained in this test")

    return fake


def test_resuming_with_the_axes_in_another_order_finds_the_same_runs(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(train, "sft", _fake_sft(calls))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "sweep"
    first = sweep(data, {"learning_rate": [1e-3], "max_steps": [3]}, sweep_dir=out, progress=False)
    again = sweep(data, {"max_steps": [3], "learning_rate": [1e-3]}, sweep_dir=out, progress=False)
    assert list(again["run"]) == list(first["run"]) == ["learning_rate=0.001_max_steps=3_seed=0"]
    assert calls == ["learning_rate=0.001_max_steps=3_seed=0"] * 2
    assert list(read_sweep(out)["run"]) == list(first["run"])


def test_numpy_seeds_are_seeds(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(train, "sft", _fake_sft(calls))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    frame = sweep(data, {"learning_rate": [1e-3]}, seeds=np.arange(2), sweep_dir=tmp_path / "s", progress=False)
    assert list(frame["seed"]) == [0, 1] and calls == ["learning_rate=0.001_seed=0", "learning_rate=0.001_seed=1"]
    manifest = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert manifest["seeds"] == [0, 1]
    with pytest.raises(TypeError, match=r"seeds=\[0, 1, 2\]"):
        sweep(data, {"learning_rate": [1e-3]}, seeds=3, sweep_dir=tmp_path / "t", progress=False)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("manifest, field", [
    ({"grid": {"learning_rate": 0.001}, "seeds": [0]}, "grid"),
    ({"grid": {}, "seeds": [0]}, "grid"),
    ({"grid": {"lr": [0.001]}, "seeds": [0]}, "grid"),
    ({"grid": {"learning_rate": [0.001, 0.001]}, "seeds": [0]}, "grid"),
    ({"grid": {"learning_rate": [0.001]}, "seeds": ["a"]}, "seeds"),
    ({"grid": {"learning_rate": [0.001]}, "seeds": [0, 0]}, "seeds"),
    ({"grid": {"learning_rate": [0.001]}, "seeds": [True]}, "seeds"),
    ({"grid": {"learning_rate": [0.001]}, "seeds": [0], "settings": [1]}, "settings"),
])
def test_a_damaged_sweep_json_is_named_with_its_field(tmp_path, manifest, field):
    (tmp_path / "sweep.json").write_text(json.dumps(manifest))
    with pytest.raises(MachineFormatError) as err:
        read_sweep(tmp_path)
    assert "sweep.json" in str(err.value) and field in str(err.value)


def test_a_damaged_sweep_json_refuses_a_resume_and_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "sft", _fake_sft([]))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "sweep"
    out.mkdir()
    text = json.dumps({"grid": {"learning_rate": 0.001}, "seeds": [0]})
    (out / "sweep.json").write_text(text)
    with pytest.raises(MachineFormatError, match="sweep.json"):
        sweep(data, {"learning_rate": [1e-3]}, sweep_dir=out, progress=False)
    assert (out / "sweep.json").read_text() == text


def test_string_values_that_would_share_a_run_dir_are_refused():
    with pytest.raises(ValueError, match="run"):
        sweeps_module.grid_points({"lr_schedule": ["a b", "a-b"]})


# ----------------------------------------------------------------------------- pricing


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("inf"), "0.5", True])
def test_a_price_that_is_not_a_price_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="train"):
        set_price("someorg/model", train=bad)
    with pytest.raises(ValueError, match="train"):
        estimate_cost(ROWS, INKLING, price={"train": bad}, max_usd=1.0)
    with pytest.raises(ValueError, match="prefill"):
        Price(bad, None, None, None)


def test_a_cost_that_is_not_a_number_never_passes_a_budget():
    with pytest.raises(BudgetExceeded, match="cannot be bounded"):
        check_budget(float("nan"), 1.0)


@pytest.mark.parametrize("usd, max_usd, cost, budget, by", [
    (0.0051, 0.005, "$0.0051", "$0.005", "$0.0001"),
    (0.000001, 0.0, "$0.000001", "$0.00", "$0.000001"),
    (12.5, 10.0, "$12.5000", "$10.00", "$2.5000"),
    (12.34567, 12.3456, "$12.3457", "$12.3456", "$0.0001"),
])
def test_budget_messages_show_amounts_that_tell_cost_and_budget_apart(usd, max_usd, cost, budget, by):
    with pytest.raises(BudgetExceeded) as err:
        check_budget(usd, max_usd)
    assert f"would cost about {cost}, over the budget of {budget} by {by};" in str(err.value)


def test_usd_text_keeps_small_amounts_and_writes_no_exponent():
    assert pricing.usd_text(0.0) == "$0.0000" and pricing.usd_text(0.0, None) == "$0.00"
    assert pricing.usd_text(0.005) == "$0.0050" and pricing.usd_text(0.005, None) == "$0.005"
    assert pricing.usd_text(-0.00002) == "$-0.00002"
    assert pricing.usd_text(1234.5) == "$1,234.5000" and pricing.usd_text(1234.5, None) == "$1,234.50"
    assert pricing.usd_text(3e-9) == "$0.000000003"
    assert pricing.usd_text(0.00424) == "$0.0042" and pricing.usd_text(12.3456, None) == "$12.3456"


# ----------------------------------------------------------------------------- cost meter


def test_the_meter_refuses_a_budget_that_is_not_an_amount():
    from machine_nb.widgets.cost_meter import CostMeter

    for bad in (float("nan"), -1.0, "5"):
        with pytest.raises(ValueError, match="max_usd"):
            CostMeter(ROWS, model=INKLING, max_usd=bad, background=False)


def test_over_a_budget_of_less_than_a_cent_says_by_how_much():
    from machine_nb.widgets.cost_meter import CostMeter

    m = CostMeter(ROWS, model=INKLING, max_usd=0.00001, background=False)
    assert m.over_by > 0
    over = pricing.usd_text(m.over_by)
    assert over != "$0.00"
    assert f"over budget by {over}" in m.summary()
    html = m.static_html()
    assert "$0.00001 · " in html and f"over budget by {over}" in html
    assert "$0.00 " not in html


# ----------------------------------------------------------------------------- loss plot


def test_one_infinite_loss_leaves_the_smoothed_line_drawn_after_it(tmp_path):
    from machine_nb.widgets.loss_plot import LossPlot, ema, figure

    assert all(math.isfinite(v) for i, v in enumerate(ema([2.0, 1.5, float("inf"), 1.0, 0.8])) if i != 2)
    assert math.isnan(ema([2.0, float("inf")])[1])
    d = tmp_path / "run"
    d.mkdir()
    losses = [2.0, 1.5, float("inf"), 1.0, 0.8, 0.7]
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "train_mean_nll": v}) + "\n"
                                             for i, v in enumerate(losses)))
    plot = LossPlot(d, live=False)
    line = figure(plot.frame).axes[0].get_lines()[0]
    assert np.isfinite(np.asarray(line.get_ydata(), dtype=float)[3:]).all()


def test_the_view_shows_the_metric_asked_for_and_names_a_wrong_one(tmp_path):
    from machine_nb.widgets.sweep_view import SweepView

    frame = _frame_of("learning_rate", [1e-3, 3e-3], [1.0, 0.5, 0.3, 0.2], tmp_path)
    view = SweepView(frame, metric="wall_s")  # a numeric run column outside METRICS
    assert view.metric == "wall_s" and list(view.summary_frame["metric"]) == ["wall_s"] * 2
    assert SweepView(frame).metric == "final_loss"  # the default falls back to what the frame has
    with pytest.raises(ValueError, match="final_los.*final_loss"):
        SweepView(frame, metric="final_los")
    with pytest.raises(ValueError, match="lr.*learning_rate"):
        SweepView(frame, x="lr")



def test_a_hand_edited_row_without_a_step_leaves_the_plot_and_its_line_working(tmp_path):
    from machine_nb.widgets.loss_plot import LossPlot

    d = tmp_path / "run"
    d.mkdir()
    rows = [{"step": "x", "test/accuracy": 0.9, "train_mean_nll": 2.0}, {"step": 1, "train_mean_nll": 1.0},
            {"step": 2, "train_mean_nll": 0.5, "test/accuracy": 0.5}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot = LossPlot(d, live=False)
    assert "held-out 50.0% at step 2" in plot.summary() and "last loss 0.5" in plot.summary()


@pytest.mark.parametrize("kw, field", [({"epochs": 0}, "epochs"), ({"epochs": -3}, "epochs"),
                                       ({"epochs": 2.7}, "epochs"), ({"batch_size": 2.5}, "batch_size"),
                                       ({"max_steps": 1.5}, "max_steps")])
def test_the_meter_refuses_a_schedule_it_would_price_as_another(kw, field):
    from machine_nb.widgets.cost_meter import CostMeter

    with pytest.raises(ValueError, match=field):
        CostMeter(ROWS, model=INKLING, background=False, **kw)


def test_the_meter_takes_numpy_whole_numbers():
    from machine_nb.widgets.cost_meter import CostMeter

    m = CostMeter(ROWS, model=INKLING, background=False, epochs=np.int64(2), batch_size=np.int64(4))
    assert (m.estimate.epochs, m.estimate.steps) == (2, 4)
    with pytest.raises(ValueError, match="epochs"):
        m.epochs = 0  # the slider would show 1 and price it
    assert m.epochs == 2 and m.estimate.epochs == 2


def test_a_cost_below_a_tenth_of_a_cent_is_not_shown_as_nothing(tmp_path):
    from machine_nb.widgets.cost_meter import CostMeter
    from machine_nb.widgets.sweep_view import summary_table_html

    set_price(INKLING, train=0.001)
    m = CostMeter(ROWS, model=INKLING, background=False)
    shown = pricing.usd_text(m.estimate.usd)
    assert 0 < m.estimate.usd < 1e-6 and shown != "$0.0000"
    assert f"{shown} training" in m.summary() and shown in m.static_html() and "$0.0000<" not in m.static_html()
    assert shown in m.estimate._repr_html_().replace("&#36;", "$")
    frame = _frame_of("learning_rate", [1e-3], [1.0, 0.5], tmp_path)
    frame["cost_usd"] = 2e-5
    html = summary_table_html(sweep_summary(frame, "final_loss"), ["learning_rate"], "final_loss")
    assert "$0.00004 ($0.0000)" in html


@pytest.mark.parametrize("kw, field", [({"smoothing": 1.0}, "smoothing"), ({"smoothing": -0.5}, "smoothing"),
                                       ({"smoothing": float("nan")}, "smoothing"), ({"refresh_s": 0}, "refresh_s"),
                                       ({"refresh_s": -1}, "refresh_s")])
def test_the_plot_refuses_a_smoothing_or_poll_interval_it_cannot_use(tmp_path, kw, field):
    from machine_nb.widgets.loss_plot import LossPlot, ema

    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "train_mean_nll": 1.0}) + "\n")
    with pytest.raises(ValueError, match=field):
        LossPlot(d, **kw)
    if field == "smoothing":
        with pytest.raises(ValueError, match="weight"):
            ema([1.0, 2.0], kw["smoothing"])


def test_rows_given_as_a_generator_reach_every_run(tmp_path, monkeypatch):
    seen: list = []

    @functools.wraps(train.sft)
    def fake(data, model=None, engine=None, **kwargs):
        seen.append((len(list(data)), len(list(kwargs["eval_data"]))))
        raise RuntimeError("not trained in this test")

    monkeypatch.setattr(train, "sft", fake)
    frame = sweep((r for r in ROWS), {"learning_rate": [1e-3]}, seeds=[0, 1], eval_data=iter(ROWS[:3]),
                  sweep_dir=tmp_path / "s", progress=False)
    assert seen == [(8, 3), (8, 3)] and list(frame["status"]) == ["failed", "failed"]
    manifest = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert manifest["data_sha256"] == sweeps_module._sha(ROWS)[1]


def test_the_plot_of_a_sweep_frame_or_a_result_draws_their_runs(tmp_path):
    import pandas as pd

    from machine_nb.widgets.loss_plot import LossPlot, read_metrics

    dirs = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "train_mean_nll": 1.0}) + "\n")
        dirs.append(str(d))
    frame = pd.DataFrame({"run": ["a", "b", "c"], "learning_rate": [1e-3, 3e-3, 1e-2], "log_dir": dirs + [None]})
    assert sorted(read_metrics(frame)["run"]) == ["a", "b"]
    plot = LossPlot(frame, live=False)
    assert plot.summary() == "LossPlot: a: 1 steps, last loss 1; b: 1 steps, last loss 1"

    class Result:
        log_dir = dirs[0]

    assert list(read_metrics(Result())["run"]) == ["a"]
    with pytest.raises(ValueError, match="log_dir"):
        read_metrics(pd.DataFrame({"run": ["a"]}))


def test_two_calls_adding_seeds_to_one_sweep_dir_at_once_both_stay_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "sft", _fake_sft([]))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "sweep"
    sweep(data, {"learning_rate": [1e-3]}, seeds=[0], sweep_dir=out, progress=False)
    real_state, other = sweeps_module._state, []

    def state_then_the_other_kernel(log_dir, heldout):
        if not other:  # the other call runs whole between this call's reading sweep.json and writing it
            other.append("started")
            sweep(data, {"learning_rate": [1e-3]}, seeds=[0, 2], sweep_dir=out, progress=False)
        return real_state(log_dir, heldout)

    monkeypatch.setattr(sweeps_module, "_state", state_then_the_other_kernel)
    sweep(data, {"learning_rate": [1e-3]}, seeds=[0, 1], sweep_dir=out, progress=False)
    assert sorted(json.loads((out / "sweep.json").read_text())["seeds"]) == [0, 1, 2]
    assert sorted(read_sweep(out)["seed"]) == [0, 1, 2]


def test_ctrl_c_while_the_runs_are_handed_out_stops_the_started_ones_and_waits_for_them(monkeypatch):
    """A Ctrl-C can land while parallel runs are still being handed to their threads: the runs
    already started are told to stop and waited for, and none of the rest starts."""
    import concurrent.futures
    import threading
    import time

    from machine_nb.training import sweeps

    started, ended = threading.Event(), []
    stop = threading.Event()

    def one(name, *rest):
        started.set()
        stop.wait(timeout=60)  # a run in progress ends once the sweep says stop
        time.sleep(0.2)
        ended.append(name)
        return {"run": name}

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            if args[0] == "b":  # the Ctrl-C lands as the second run is handed out
                started.wait(timeout=60)
                raise KeyboardInterrupt
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Pool)
    runs = [("a", {}, 0, None), ("b", {}, 0, None), ("c", {}, 0, None)]
    with pytest.raises(KeyboardInterrupt):
        sweeps._parallel(runs, one, 2, stop, {}, None)
    assert stop.is_set() and ended == ["a"]
