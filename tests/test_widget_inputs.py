"""The widgets given what users' data holds: names with "$" or a leading "_", malformed tool calls,
a previewer shown inside a dashboard, and widgets closed while their sources keep changing.

Each test builds its widget from a few rows in a temporary folder and reads its HTML, its plot or
its state, as a reader of the notebook (or of the saved copy) would see them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

import machine_nb as mnb

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_writer import write_run  # noqa: E402


def metrics_dir(root: Path, name: str, steps: int = 4) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "train_mean_nll": 2.0 - 0.1 * i}) + "\n"
                                             for i in range(steps)))
    return d


def drawn_legend(fig) -> list[str]:
    """The legend's texts as the figure draws them ("\\$" is matplotlib's literal dollar sign)."""
    from machine_nb.widgets.loss_plot import png_bytes

    png_bytes(fig)  # lays out every text: a label matplotlib cannot parse raises here
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


# ---- plots: run names and settings are text, never TeX, and every run is in the legend


def test_a_log_dir_named_with_dollars_or_a_leading_underscore_is_plotted_and_named(tmp_path):
    """A log dir's name is its run's label. Matplotlib reads "$…$" in a label as TeX (a name like
    "lr_$1e-3_$2" does not parse, so the plot could not be made) and leaves a label starting
    with "_" out of the legend. Both runs are drawn and named as their folders are."""
    from machine_nb.widgets.loss_plot import LossPlot, figure

    dollars = metrics_dir(tmp_path, "lr_$1e-3_$2")
    draft = metrics_dir(tmp_path, "_draft")
    plot = LossPlot([dollars, draft], live=False)
    assert plot.static_png() and plot.summary().startswith("LossPlot: lr_$1e-3_$2: 4 steps")
    assert drawn_legend(figure(plot.frame)) == [r"lr_\$1e-3_\$2 train", "_draft train"]


def test_a_sweep_setting_with_dollars_is_drawn_as_text():
    """A sweep's settings label its lines and ticks: a value with two "$" is text, not TeX (read
    as TeX, "$5 to $6" would show as an italic "5 to")."""
    from machine_nb.widgets.sweep_view import SweepView, sweep_figure

    frame = pd.DataFrame({"run": ["r0", "r1", "r2", "r3"], "budget": ["$5 to $6", "$7 to $8"] * 2,
                          "lr": [1e-3, 1e-3, 3e-3, 3e-3], "seed": 0, "status": "ran",
                          "final_loss": [1.0, 0.5, 0.8, 0.4], "cost_usd": None, "estimated_usd": None,
                          "log_dir": "x"})
    view = SweepView(frame, metric="final_loss", x="lr")  # lines per budget
    assert view.static_png()
    fig = sweep_figure(frame, view.summary_frame, "lr", "final_loss")
    assert drawn_legend(fig) == [r"budget=\$5 to \$6", r"budget=\$7 to \$8"]
    fig = sweep_figure(frame, view.summary_frame, "budget", "final_loss")
    drawn_legend(fig)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [r"\$5 to \$6", r"\$7 to \$8"]


# ---- chat cards: a malformed tool call is shown, not a crash


def test_a_tool_call_that_is_not_an_object_is_shown_as_it_came():
    """A hand-written line may carry a tool call as a string, or a function as a bare name; the
    previewer shows the line (the odd call as its text) and its filter still searches it."""
    from machine_nb.widgets.previewer import ExamplePreviewer

    line = {"messages": [{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": "", "tool_calls": ["get_weather(city='Oslo')",
                                                                            {"id": "c1", "function": "lookup"}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                         {"role": "assistant", "content": "Sunny."}]}
    p = ExamplePreviewer([line])
    html = p.static_html()
    assert "get_weather(city=&#x27;Oslo&#x27;)" in html and "lookup" in html and "sunny" in html
    p.set_filter("oslo")
    assert p.matches == [0]


# ---- a previewer inside a dashboard: the saved copy follows what the reader steps to


def test_stepping_through_the_dashboards_previewer_updates_the_saved_dashboard(tmp_path, monkeypatch):
    """The dashboard's static output holds the previewer's; filtering or paging the previewer
    re-sends it, so the saved notebook shows the example on screen, not the first one."""
    from machine_nb.widgets.dashboard import Dashboard

    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    d = Dashboard(ws, follow=False, file_events=False)
    try:
        sent: list[str] = []
        monkeypatch.setattr(d, "_static_changed", lambda: sent.append(d.static_html()))
        d.open_run("support/r1")
        assert sent and "support/r1" in sent[-1]
        n = len(sent)
        d.previewer.set_filter("zzz")
        assert len(sent) > n and "zzz" in sent[-1]
    finally:
        d.close()


# ---- closing: a closed widget stops following what it followed


def test_a_closed_picker_stops_following_its_tag_store(tmp_path):
    """Tagging in the same store after the picker was closed does not redraw it (with a million
    runs each tag would rebuild its filter arrays for a view no one sees)."""
    from machine_nb.widgets.run_picker import RunPicker

    store = tmp_path / "store"
    traj = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    runs = pd.DataFrame({"id": ["r1", "r2"], "machine": "m", "trajectory": [traj, traj]})
    p = RunPicker(runs, store=store)
    mnb.tag(runs.iloc[0], "good", store=store)
    assert p.runs["tags"].tolist() == [["good"], []]
    p.close()
    mnb.tag(runs.iloc[1], "good", store=store)
    assert p.runs["tags"].tolist() == [["good"], []]


def test_a_closed_candidate_view_stops_following_its_candidate(tmp_path):
    from machine_nb.evaluation.candidate import Candidate
    from machine_nb.widgets.candidate_view import CandidateView

    cand = Candidate(workspace=str(tmp_path), machine="tutor", checkpoint="tinker://x", base_model="local/arith-tiny",
                     engine="local", live_version={"id": "v1"}, report=None)
    view = CandidateView(cand)
    assert len(cand._observers) == 1
    view.close()
    assert cand._observers == []


def test_a_metric_written_as_text_is_a_gap_in_the_plot(tmp_path):
    """A log whose loss is text on some steps ("nan", "inf" as strings, as some loggers write them)
    is drawn from the steps that hold numbers; the plot and its summary line are still made."""
    from machine_nb.widgets.loss_plot import LossPlot

    d = tmp_path / "run"
    d.mkdir()
    rows = [{"step": 0, "train_mean_nll": "nan", "learning_rate": "1e-4"}, {"step": 1, "train_mean_nll": 1.5},
            {"step": 2, "train_mean_nll": 1.2, "test/accuracy": "n/a"}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot = LossPlot(d, live=False)
    assert plot.static_png()
    assert plot.summary() == "LossPlot: run: 2 steps, last loss 1.2"
