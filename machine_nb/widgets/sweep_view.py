"""SweepView: a sweep's metric against one of its settings, with the spread across seeds.

A view over the frame `machine_nb.sweep` (or `read_sweep`) returns; the numbers and words come
from sweeps.py (`sweep_summary`, `verdict`). The plot puts the chosen setting on the x axis, one
line per combination of the other settings: every seed as a dot, the mean over seeds as the line,
and a bar for its interval (held-out accuracy: the Wilson interval over questions) or, for other
metrics, the range over seeds. Below: the summary table and the verdict in words. The PNG and the
table are also the static fallback a saved notebook keeps.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from ..core.theme import BG, BG_ALT, BORDER, FG, FG_MUTED
from ._base import NoMathHTML, StaticPlot, escape
from .loss_plot import plot_text, png_bytes

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: Run columns the metric dropdown offers, when the frame has values for them.
METRICS = ("heldout_accuracy", "best_accuracy", "heldout_format_rate", "final_loss", "cost_usd")


def _label(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def metric_choices(frame: "pd.DataFrame") -> list[str]:
    """The metrics the dropdown offers for a sweep frame.

    Args:
        frame: a sweep frame.

    Returns:
        The METRICS it has values for, in METRICS' order (held-out accuracy first when present).
    """
    return [m for m in METRICS if m in frame.columns and frame[m].notna().any()]


def sweep_figure(frame: "pd.DataFrame", summary: "pd.DataFrame", x: str, metric: str, *,
                 level: float = 0.95) -> "Figure":
    """A sweep's metric against one setting, one line per combination of the other settings.

    Args:
        frame: a sweep frame.
        summary: its `sweep_summary` for `metric`.
        x: the setting on the x axis.
        metric: the run column on the y axis.
        level: the interval's confidence level, named on the plot (default 0.95).

    Returns:
        A matplotlib Figure (Agg, no pyplot state): dots per seed, the mean as the line, bars
        for the interval (held-out accuracy) or the seeds' range (other metrics).
    """
    from matplotlib.figure import Figure

    from ..training.sweeps import axes_of, setting_groups, setting_key

    axes = axes_of(frame)
    others = [a for a in axes if a != x]
    # the grid's order; a setting left at its default (None) is a position of its own
    xs = [values[0] for values, _ in setting_groups(frame, [x])]
    pos = {setting_key((v,)): i for i, v in enumerate(xs)}
    at = lambda v: pos[setting_key((v,))]  # noqa: E731
    fig = Figure(figsize=(7.5, 4.0), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ok = frame[frame["status"].isin(["ran", "resumed", "read back"]) & frame[metric].notna()]
    groups = setting_groups(summary, others)
    dots = {setting_key(k): runs for k, runs in setting_groups(ok, others)}
    width = 0.24  # side by side, so the bars of settings with equal means do not hide each other
    n_groups = max(1, len(groups) if others else 1)
    interval = metric == "heldout_accuracy"
    named: list = []  # one line per combination, in the legend by name (a name may start with "_")
    for i, (key, g) in enumerate(groups):
        colour = f"C{i % 10}"
        offset = (i - (n_groups - 1) / 2) * (width / max(1, n_groups))
        name = plot_text(", ".join(f"{a}={_label(v)}" for a, v in zip(others, key)) or metric)
        g = g.iloc[sorted(range(len(g)), key=lambda j: at(g[x].iloc[j]))]
        px = [at(v) + offset for v in g[x]]
        low = g["ci_low"] if interval else g["min"]
        high = g["ci_high"] if interval else g["max"]
        yerr = [(g["mean"] - low).clip(lower=0), (high - g["mean"]).clip(lower=0)]
        named.append(ax.errorbar(px, g["mean"], yerr=yerr, fmt="o-", color=colour, capsize=4,
                                 lw=1.6, ms=5, label=name))
        runs = dots.get(setting_key(key), ok.iloc[:0])
        ax.scatter([at(v) + offset for v in runs[x]], runs[metric], s=14, color=colour, alpha=0.45, zorder=3)
    ax.set_xticks(range(len(xs)), [plot_text(_label(v)) for v in xs])
    ax.set_xlabel(plot_text(x))
    ax.set_ylabel(plot_text(metric))
    if metric.endswith("accuracy") or metric.endswith("rate"):
        ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    if others or len(groups):
        ax.legend(named, [c.get_label() for c in named], fontsize=8, loc="best")
    what = (f"bars: {level:.0%} Wilson interval over questions (seeds pooled)" if interval
            else "bars: range over seeds")
    fig.text(0.01, 0.01, f"dots: one run (seed) each · line: mean over seeds · {what}", fontsize=8, color="#444")
    fig.subplots_adjust(bottom=0.2, left=0.1, right=0.97, top=0.95)
    return fig


def summary_table_html(summary: "pd.DataFrame", axes: list[str], metric: str) -> str:
    """A sweep summary as an HTML table in the theme's colours.

    Args:
        summary: a `sweep_summary` frame.
        axes: the grid's settings (its first columns).
        metric: the metric it summarises (percentages for accuracies and rates).

    Returns:
        The table.
    """
    from ..checks.pricing import usd_text

    pct = metric.endswith("accuracy") or metric.endswith("rate")
    val = (lambda v: "–" if v is None or v != v else f"{v:.1%}") if pct else (
        lambda v: "–" if v is None or v != v else f"{v:.4g}")
    usd = lambda v: "unknown" if v is None or v != v else usd_text(v)  # noqa: E731
    cell = f"padding:2px 10px;border-bottom:1px solid {BORDER};color:{FG};white-space:nowrap"
    head_cell = f"{cell};background:{BG_ALT};text-align:left"
    heads = [*axes, "seeds", f"mean {metric}", "range over seeds", "interval", "cost: observed (estimated)"]
    rows = []
    for _, r in summary.iterrows():
        interval = "–" if r["ci_low"] is None or r["ci_low"] != r["ci_low"] else f"{val(r['ci_low'])}–{val(r['ci_high'])}"
        cells = [*(escape(_label(r[a])) for a in axes), str(r["seeds"]), f"<b>{val(r['mean'])}</b>",
                 f"{val(r['min'])}–{val(r['max'])}", interval, f"{usd(r['cost_usd'])} ({usd(r['estimated_usd'])})"]
        rows.append("<tr>" + "".join(f'<td style="{cell}">{c}</td>' for c in cells) + "</tr>")
    head = "<tr>" + "".join(f'<th style="{head_cell}">{escape(h)}</th>' for h in heads) + "</tr>"
    return f'<table class="mnb-sweep-table" style="border-collapse:collapse;font-size:12px">{head}{"".join(rows)}</table>'


class SweepView(StaticPlot, widgets.VBox):
    """A sweep's metric against one of its settings, the spread across seeds, a table and the verdict.

    Args:
        frame: what `machine_nb.sweep` or `read_sweep` returned, or a sweep dir (read with read_sweep).
        metric: the run column to show: one of METRICS or another numeric run column (it joins
            the dropdown). Default "heldout_accuracy" (the final checkpoints' held-out accuracy),
            or the first of METRICS the frame has when it has none.
        x: the setting on the x axis. Default None: the grid's first axis.
        level: the confidence level of the intervals. Default 0.95.
        **kwargs: passed to ipywidgets.VBox (layout and the like).

    `.summary_frame` is `sweep_summary(frame, metric)`, `.verdict` the words (sweeps.verdict); the
    dropdowns choose the metric and the setting, and the saved notebook keeps the last choice.

    Raises:
        ValueError: a frame that is not a sweep's, a metric that is not one of its columns, or an
            x that is not one of its settings.
    """

    def __init__(self, frame: Any, metric: str = "heldout_accuracy", x: str | None = None, level: float = 0.95,
                 **kwargs: Any) -> None:
        from ..training.sweeps import axes_of, read_sweep

        if isinstance(frame, (str, os.PathLike)):
            frame = read_sweep(frame)
        self.frame = frame
        self.axes = axes_of(frame)
        if not self.axes:
            raise ValueError("SweepView needs a sweep frame (columns run, the grid's settings, seed, …)")
        choices = metric_choices(frame) or ["final_loss"]
        if metric not in choices:
            if metric != "heldout_accuracy" and metric in frame.columns:
                choices.append(metric)  # another numeric run column, asked for by name
            elif metric != "heldout_accuracy":
                raise ValueError(f"metric={metric!r} is not a column of the sweep frame; pick one of "
                                 f"{', '.join(choices)} (or another numeric run column)")
            else:
                metric = choices[0]
        if x is not None and x not in self.axes:
            raise ValueError(f"x={x!r} is not a setting of this sweep; its settings: {', '.join(self.axes)}")
        self.level = float(level)
        self._metric = widgets.Dropdown(options=choices, value=metric, description="metric",
                                        layout=widgets.Layout(width="320px"))
        self._x = widgets.Dropdown(options=self.axes, value=x or self.axes[0], description="x axis",
                                   layout=widgets.Layout(width="320px"))
        self._image = widgets.Image(format="png")
        self._table = NoMathHTML()
        self._png = b""
        super().__init__(children=[widgets.HBox([self._metric, self._x]), self._image, self._table], **kwargs)
        self._metric.observe(lambda _: self.refresh(), names="value")
        self._x.observe(lambda _: self.refresh(), names="value")
        self.refresh()

    @property
    def metric(self) -> str:
        """The metric shown (the dropdown's value)."""
        return self._metric.value

    @metric.setter
    def metric(self, value: str) -> None:
        self._metric.value = value

    @property
    def x(self) -> str:
        """The setting on the x axis (the dropdown's value)."""
        return self._x.value

    @x.setter
    def x(self, value: str) -> None:
        self._x.value = value

    def refresh(self) -> None:
        """Recompute the summary and the words, redraw, and update the saved copy."""
        from ..training.sweeps import sweep_summary, verdict

        self.summary_frame = sweep_summary(self.frame, self.metric, level=self.level)
        self.verdict = verdict(self.frame, self.metric, level=self.level, summary=self.summary_frame)
        self._png = png_bytes(sweep_figure(self.frame, self.summary_frame, self.x, self.metric, level=self.level))
        self._image.value = self._png
        self._table.value = self._body_html()
        self._static_changed()

    def _body_html(self) -> str:
        runs = len(self.frame)
        left = self.frame.loc[~self.frame["status"].isin(["ran", "resumed", "read back"]), "status"]
        counts = left.astype(str).value_counts().sort_index()
        note = (" · left out: " + ", ".join(f"{n} {status}" for status, n in counts.items())) if len(left) else ""
        return (f'<div class="mnb-sweep" style="font-family:system-ui,sans-serif;font-size:13px;color:{FG};'
                f'background:{BG}">{summary_table_html(self.summary_frame, self.axes, self.metric)}'
                f'<p class="mnb-sweep-verdict" style="max-width:60em;color:{FG}">{escape(self.verdict)}</p>'
                f'<small style="color:{FG_MUTED}">{runs} runs{note}</small></div>')

    def summary(self) -> str:
        """The view in one line: settings, seeds and the best setting by mean.

        Returns:
            The line (also the text/plain of a saved notebook).
        """
        s = self.summary_frame
        if s.empty:
            return f"SweepView: {len(self.frame)} runs, none finished"
        from ..training.sweeps import lower_is_better

        best = s.sort_values("mean", ascending=lower_is_better(self.metric), kind="stable").iloc[0]
        setting = ", ".join(f"{a}={_label(best[a])}" for a in self.axes)
        pct = self.metric.endswith("accuracy") or self.metric.endswith("rate")
        value = f"{best['mean']:.1%}" if pct else f"{best['mean']:.4g}"
        return (f"SweepView: {len(s)} settings x {int(s['seeds'].max())} seeds, best {setting} "
                f"({self.metric} {value})")

    def static_html(self) -> str:
        """The plot, table and verdict as self-contained HTML (the saved notebook's copy).

        Returns:
            The HTML.
        """
        return (f'<div class="mnb-sweep-view">{self._img_html(f"sweep: {self.metric} by {self.x}")}'
                f'{self._body_html()}</div>')
