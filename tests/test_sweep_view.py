"""SweepView over a real (small) sweep on the local engine: the plot's points are the runs and the
summary's means and intervals, the dropdowns redraw and update the saved copy, the static fallback
carries the table and the words in theme colours, and a sweep dir is read without training."""

from __future__ import annotations

import pytest

from machine_nb.data.corpus import make_corpus
from machine_nb.training.sweeps import read_sweep, sweep, sweep_summary
from machine_nb.widgets.sweep_view import SweepView, metric_choices, sweep_figure


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sv")
    c = make_corpus(root / "corpus", seed=0)
    valid = root / "valid6.jsonl"
    valid.write_text("".join(c.valid.read_text().splitlines(keepends=True)[:6]))
    # two axes of two values and two seeds: the plot's x and legend axes, a dot a run beside each
    # setting's mean; a step or two a run gives every run a loss and a held-out score to draw
    frame = sweep(c.train, {"learning_rate": [1e-3, 3e-3], "max_steps": [1, 2]}, seeds=[0, 1], eval_data=valid,
                  eval_every=3, eval_max_tokens=12, sweep_dir=root / "sweep", progress=False)
    return root / "sweep", frame


def test_the_plot_draws_every_run_and_each_settings_mean_with_its_interval(swept):
    _, frame = swept
    summary = sweep_summary(frame)
    fig = sweep_figure(frame, summary, "learning_rate", "heldout_accuracy")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.001", "0.003"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["max_steps=1", "max_steps=2"]
    from matplotlib.collections import PathCollection

    dots = sorted(y for coll in ax.collections if isinstance(coll, PathCollection) for y in coll.get_offsets()[:, 1])
    assert dots == sorted(frame["heldout_accuracy"])  # one dot a run (2 seeds per setting)
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) == 2 and line.get_linestyle() == "-"]
    means = sorted(y for line in lines for y in line.get_ydata())
    assert means == pytest.approx(sorted(summary["mean"]))
    assert ax.get_ylim() == (-0.05, 1.05)


def test_dropdowns_redraw_and_the_saved_copy_follows(swept, monkeypatch):
    out, frame = swept
    view = SweepView(frame)
    assert view.metric == "heldout_accuracy" and view.x == "learning_rate"
    assert metric_choices(frame)[:2] == ["heldout_accuracy", "best_accuracy"]
    assert view.summary().startswith("SweepView: 4 settings x 2 seeds, best ")
    sent = []
    monkeypatch.setattr(view, "_static_changed", lambda: sent.append(view.static_html()))
    png = view.static_png()
    view._x.value = "max_steps"  # as a user picks it
    assert view.static_png() != png and "by max_steps" in sent[-1]
    view._metric.value = "final_loss"
    assert list(view.summary_frame["metric"]) == ["final_loss"] * 4 and view.verdict.startswith("Best by mean final_loss")
    assert "mean final_loss" in sent[-1] and view.summary().endswith(
        f"(final_loss {view.summary_frame['mean'].min():.4g})")


def test_static_fallback_has_the_table_and_words_in_theme_colours(swept):
    from test_theme import hard_coded, html_of

    out, frame = swept
    view = SweepView(out)  # a sweep dir: read back, nothing trained
    assert list(view.frame["status"]) == ["read back"] * 8
    bundle = view.static_bundle()
    html = bundle["text/html"]
    assert "image/png" in bundle and "mnb-sweep-table" in html and "mnb-sweep-verdict" in html
    assert view.verdict.split(".")[0] in html.replace("&#x27;", "'")
    s = view.summary_frame
    best = s.loc[s["mean"].idxmax()]
    assert f"{best['mean']:.1%}" in html and f"{best['ci_low']:.1%}–{best['ci_high']:.1%}" in html
    assert not hard_coded(html_of(view))
    assert bundle["text/plain"] == view.summary()


def test_failed_runs_are_left_out_and_said(swept):
    _, frame = swept
    broken = frame.copy()
    broken.loc[0, "status"] = "failed"
    broken.loc[2, "status"] = "no checkpoint"
    broken.loc[3, "status"] = "incomplete"
    view = SweepView(broken)
    assert view.summary_frame["seeds"].tolist()[0] == 1
    assert "left out: 1 failed, 1 incomplete, 1 no checkpoint" in view.static_html()
    with pytest.raises(ValueError, match="sweep frame"):
        SweepView(frame[["seed", "status"]])
    assert len(read_sweep(swept[0])) == 8
