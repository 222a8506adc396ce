"""Reports: execute a notebook with parameters and write a shareable, self-contained HTML.

Execution is papermill's (parameters injected after the cell tagged `parameters`, the
convention every notebook here follows; a parameter that cell does not set is refused first). The
notebook runs in memory (papermill saves it through an in-memory handler, never to disk), so neither
a run in progress nor one stopped by Ctrl-C or a crash leaves an unredacted file anywhere; only the
redacted notebook and HTML are written.

What is redacted (`[redacted]`), everywhere in the notebook (outputs, sources, metadata), in the
HTML and in the error a failing cell raises: what `machine_nb.core.redact` redacts (the rule's one
home; its docstring lists it: the values of secret-named environment variables, the report's
secret-named `parameters` too, URL passwords and key-shaped strings), in what a cell printed between
two flushes as one text (scrub_notebook).
Local paths (path_rewriter), in the same pass over the notebook and the HTML, after the secrets:
a path under the notebook's folder is written relative to it (`cache/a.json`), one under the folder
above it (the project a `notebooks/` folder sits in) as `../…`, one elsewhere under the home folder
as `~/…`, so a report names no folder of the machine that made it (the raised error, read on this
machine, keeps them). Other text, path-like or not, is left as it is.
Live-widget views are dropped from outputs that carry a static `text/html` fallback, with the
widget-state metadata GitHub refuses to render; a machine_nb widget's live output goes whole, its
static twin holding the final state (clean_notebook).

The page (to_html) is a report, not a notebook dump: the title, a headline with its interval and n,
the cost, an accuracy chart and the loss curve, the settings and links to every section come first,
code is hidden until the reader asks for it, and nothing is fetched, so it reads with no kernel and
no network. A notebook states its headline by displaying `report_summary(...)`: an output whose
JSON (SUMMARY_MIME) the page reads back; without one it still gets the rest.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ..core.jsonl import atomic_write_text
from ..core.progress import resolve_progress
from ..core.redact import REDACTED, is_secret_name, scrub, secret_values  # noqa: F401  (the rule's home)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

KERNEL_PRELOAD = ("torch", "tinker", "tinker_cookbook.renderers")
"""What the IPython kernel of a report on a notebook that imports machine_nb imports before the
notebook's first cell, with the garbage collector paused, and then freezes (core.process.preload):
the stack such a notebook loads (the tinker SDK brings torch; the cookbook's renderers count and
preview tokens). Imported later, in a cell, its several hundred thousand objects would be walked
by full collections again and again while they are made, and by every full collection after:
notebook 01's kernel takes about a tenth less CPU preloaded. Nothing of the notebook's exists yet
when it is frozen. A notebook that does not import machine_nb is not made to load it (about a
second of CPU)."""

_IMPORTS_MACHINE_NB = re.compile(r"^[ \t]*(?:import|from)[ \t]+machine_nb\b", re.M)


def imports_machine_nb(nb: Mapping[str, Any]) -> bool:
    """Whether a code cell of the notebook imports machine_nb (`import machine_nb…`, `from machine_nb…`).

    Args:
        nb: the notebook as JSON.

    Returns:
        True when one does.
    """
    return any(cell.get("cell_type") == "code" and _IMPORTS_MACHINE_NB.search(_text(cell.get("source", "")))
               for cell in nb.get("cells", []))


@dataclass
class Report:
    """Where a report went and how long it took.

    notebook: the notebook run. html: the HTML report written. executed: the executed notebook
    written beside it. wall_s: seconds the run took. redactions: secrets replaced. stopped: the
    reason the notebook gave when it stopped early (`stop_notebook`), else None: it ran to its end.
    """

    notebook: Path
    html: Path
    executed: Path
    wall_s: float
    redactions: int
    stopped: str | None = None

    @property
    def path(self) -> Path:
        """The HTML report written (the file to share)."""
        return self.html

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data.

        Returns:
            {notebook, html, executed (paths as strings), wall_s, redactions, stopped}.
        """
        return {"notebook": str(self.notebook), "html": str(self.html), "executed": str(self.executed),
                "wall_s": self.wall_s, "redactions": self.redactions, "stopped": self.stopped}

    def _repr_html_(self) -> str:
        from ..core.theme import escape, no_math

        return no_math(f"Report: <code>{escape(self.html)}</code> (executed notebook <code>{escape(self.executed)}</code>), "
                       f"{self.wall_s:.1f} s", "p")


# A character that continues a file name: a folder's path followed by one is another folder's name
# (a full stop too, unless it ends the sentence: `/home/me.bak` is another folder, `… in /home/me.` not).
_NAME_CHAR = r"[\w.~+\-]"
_NAME_GOES_ON = r"[\w~+\-]|\.[\w.~+\-]"


def path_rewriter(folder: str | os.PathLike, home: str | os.PathLike | None = None) -> Callable[[str], str]:
    """A function that writes this machine's absolute paths in a text as a reader elsewhere can read them.

    Args:
        folder: the notebook's folder. A path under it becomes relative (`<folder>/cache/a.json` ->
            `cache/a.json`, `<folder>/../runs` -> `../runs`, the folder itself `.`); a path under the
            folder above it becomes `../…` (unless that folder is `/` or holds the home folder).
        home: the home folder (default: the current user's, `~`); a path under it elsewhere becomes `~/…`.

    Returns:
        rewrite(text) -> text. Only those folders' own paths change, raw, JSON-escaped or HTML-escaped,
        where they stand as a path (`/data/home/me/x` or `<home>2/x` is not under `<home>`); symlinked
        folders are matched by both their given and their real path.
    """
    folder = Path(os.path.abspath(folder))
    home = Path(os.path.abspath(os.path.expanduser("~") if home is None else home))
    forms = lambda p: {str(p), os.path.realpath(p)}  # noqa: E731
    shown: dict[str, str] = {}

    def claim(base: Path | str, name: str) -> None:
        for form in forms(base):
            if Path(form).parent == Path(form):  # the root: every absolute path is under it
                continue
            for escaped in (form, json.dumps(form)[1:-1], html.escape(form)):
                shown.setdefault(escaped, name)

    claim(folder, ".")
    parent = folder.parent
    if not any(Path(h).is_relative_to(p) for h in forms(home) for p in forms(parent)):
        claim(parent, "..")
    claim(home, "~")
    # not after "scheme:/": `mysql://root:pw@h` names a user, not the folder /root
    pattern = re.compile(f"(?<!{_NAME_CHAR})(?<!:/)(" + "|".join(re.escape(b) for b in sorted(shown, key=len, reverse=True))
                         + f")(?:(/)|(?!{_NAME_GOES_ON}))")

    def replace(m: re.Match[str]) -> str:
        name, sep = shown[m.group(1)], m.group(2) or ""
        if name == "." and sep and re.match(_NAME_CHAR, m.string[m.end():m.end() + 1]):
            return ""  # <folder>/x -> x
        return name + sep

    return lambda text: pattern.sub(replace, text) if text else text


def _scrub_tree(value: Any, secrets: list[str],
                rewrite: Callable[[str], str] | None = None) -> tuple[Any, int]:
    """Every string in a JSON-like value (dict keys too) scrubbed in place, then rewritten by `rewrite`
    (path_rewriter's) when given; returns (value, secret replacements).

    Iterative, so an output nested however deep is scrubbed, never a RecursionError. Secrets go
    first: a secret value that holds a path is still found whole.
    """
    if rewrite is not None:
        def scrub_one(text: str, secrets: list[str]) -> tuple[str, int]:
            text, n = scrub(text, secrets)
            return rewrite(text), n
    else:
        scrub_one = scrub
    if isinstance(value, str):
        return scrub_one(value, secrets)
    total, stack = 0, [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            items = list(enumerate(node))
        elif isinstance(node, dict):
            pairs = list(node.items())
            node.clear()
            for key, item in pairs:
                if isinstance(key, str):
                    key, n = scrub_one(key, secrets)
                    total += n
                node[key] = item
            items = list(node.items())
        else:
            continue
        for index, item in items:
            if isinstance(item, str):
                node[index], n = scrub_one(item, secrets)
                total += n
            elif isinstance(item, (list, dict)):
                stack.append(item)
    return value, total


def scrub_notebook(nb: dict[str, Any], secrets: list[str], folder: str | os.PathLike,
                   home: str | os.PathLike | None = None) -> tuple[dict[str, Any], int]:
    """Redact `secrets` (redact.scrub) and rewrite local paths (path_rewriter) in every string of a
    notebook: sources, every output's every mime type, error tracebacks, metadata, in place.

    A cell's consecutive stream outputs of one name (what a program prints between two flushes of
    stdout, or of stderr) become one output first, as Jupyter shows them, so a secret printed in
    pieces is redacted whole.

    Args:
        nb: the notebook as JSON-like data.
        secrets: values to redact (redact.secret_values), longest first.
        folder: the notebook's folder, which its paths are written relative to.
        home: the home folder (default `~`).

    Returns:
        (nb, number of secret redactions).
    """
    _join_streams(nb)
    joined = _join_lines(nb)
    try:
        return _scrub_tree(nb, secrets, path_rewriter(folder, home))
    finally:
        for container, key in joined:
            container[key] = container[key].splitlines(True)


def _join_streams(nb: dict[str, Any]) -> None:
    """Merge, in place, each run of consecutive stream outputs of one name in a cell into its first."""
    for cell in nb.get("cells") or []:
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        if not isinstance(outputs, list):
            continue
        merged: list[Any] = []
        for out in outputs:
            last = merged[-1] if merged else None
            if (isinstance(out, dict) and isinstance(last, dict) and out.get("output_type") == "stream"
                    and last.get("output_type") == "stream" and out.get("name") == last.get("name")):
                last["text"] = (_text(last.get("text")) + _text(out.get("text"))).splitlines(True)  # as nbformat saves
            else:
                merged.append(out)
        outputs[:] = merged


def _join_lines(nb: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Join, in place, the texts nbformat saves as lists of lines (cell sources, stream text, an
    output's or attachment's text mime types; not JSON ones), so a secret that spans lines (a private
    key's block, a multi-line value) is found whole. Returns (container, key) of each, to split back."""
    joined: list[tuple[dict[str, Any], str]] = []

    def join(container: Any, key: str) -> None:
        value = container.get(key) if isinstance(container, dict) else None
        if isinstance(value, list) and value and all(isinstance(line, str) for line in value):
            container[key] = "".join(value)
            joined.append((container, key))

    def join_bundle(bundle: Any) -> None:
        for mime in list(bundle) if isinstance(bundle, dict) else []:
            if not (mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))):
                join(bundle, mime)

    for cell in nb.get("cells") or []:
        if not isinstance(cell, dict):
            continue
        join(cell, "source")
        for bundle in (cell.get("attachments") or {}).values():
            join_bundle(bundle)
        for out in cell.get("outputs") or []:
            join(out, "text")
            join_bundle(out.get("data") if isinstance(out, dict) else None)
    return joined


# A machine_nb widget's static output (widgets/_base.py) names the widget's model id.
_STATIC_KEY = re.compile(r'data-mnb-static="([^"]+)"')


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else value if isinstance(value, str) else ""


def clean_notebook(nb: dict[str, Any]) -> dict[str, Any]:
    """Drop live-widget views that have a static fallback, and the widget-state metadata.

    A widget view without its kernel renders as an error on GitHub/nbviewer; the `text/html` (and
    `image/png`) our widgets put beside it renders everywhere. A machine_nb widget is shown as two
    outputs, its static view (kept up to date) and its live view, whose text/plain is the state it
    was first shown in: the live output goes whole, its stale text with it ("LossPlot: no metrics
    yet" beside the final curve). Outputs with nothing but a widget view (a third-party widget)
    keep it, with a text note, so nothing silently disappears.

    Args:
        nb: the notebook as a dict (nbformat 4 JSON), changed in place.

    Returns:
        The same notebook.
    """
    nb.get("metadata", {}).pop("widgets", None)
    cells = nb.get("cells", [])
    static = {key for cell in cells for out in cell.get("outputs", []) or []
              for key in _STATIC_KEY.findall(_text((out.get("data") or {}).get("text/html")))}
    for cell in cells:
        outputs = cell.get("outputs") or []
        live_twins = [out for out in outputs if isinstance((out.get("data") or {}).get(WIDGET_VIEW), dict)
                      and out["data"][WIDGET_VIEW].get("model_id") in static
                      and not _text(out["data"].get("text/html")).strip()]
        if live_twins:
            cell["outputs"] = outputs = [out for out in outputs if not any(out is twin for twin in live_twins)]
        for out in outputs:
            data = out.get("data")
            if not data or WIDGET_VIEW not in data:
                continue
            if any(k in data for k in ("text/html", "image/png")):
                del data[WIDGET_VIEW]
            else:
                data.setdefault("text/plain", "[interactive widget: open the notebook in Jupyter to use it]")
                del data[WIDGET_VIEW]
    return nb


# ---------------------------------------------------------------------------------------------
# What a report shows at its top, and the page itself

#: The output type a notebook's `report_summary(...)` carries for the report (JSON: ReportSummary.to_dict()).
SUMMARY_MIME = "application/vnd.machine-nb.report-summary+json"


@dataclass
class ReportSummary:
    """A notebook's result as its report shows it at the top: a one-sentence headline, the
    accuracies to chart (each with its interval), and the cost. Displayed in the notebook, it
    shows the same card there; `run_report` reads the last one a notebook displays.

    headline: the result in one sentence, with its interval and n (None: none stated).
    points: the accuracies to chart, each {label, accuracy, low, high, n, group} (fractions 0–1;
        low/high the interval's ends, None when unknown; group: "compared" or "sweep").
    cost_usd: what the notebook spent, observed (None: not known). estimated_usd: what it was
        estimated to cost before it ran (None: not estimated). cost_note: a few words on what the
        cost covers (e.g. "training; evals on the local engine are free"). level: the intervals'
        confidence level.
    """

    headline: str | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    cost_usd: float | None = None
    estimated_usd: float | None = None
    cost_note: str = ""
    level: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain data (what the notebook's output carries under SUMMARY_MIME).

        Returns:
            {headline, points, cost_usd, estimated_usd, cost_note, level}.
        """
        return {"headline": self.headline, "points": [dict(p) for p in self.points], "cost_usd": self.cost_usd,
                "estimated_usd": self.estimated_usd, "cost_note": self.cost_note, "level": self.level}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReportSummary:
        """A summary back from `to_dict()`'s data (unknown keys ignored).

        Args:
            data: the output's JSON.

        Returns:
            A ReportSummary.

        Raises:
            ValueError: a field of the wrong kind, named (e.g. "points[1].accuracy: not a number").
        """
        def number(value: Any, where: str, optional: bool = True) -> float | None:
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where}: not a number ({value!r})")
            return float(value)

        points = data.get("points") or []
        if not isinstance(points, list):
            raise ValueError(f"points: not a list ({type(points).__name__})")
        checked = []
        for i, point in enumerate(points):
            if not isinstance(point, Mapping):
                raise ValueError(f"points[{i}]: not an object")
            checked.append(_point(str(point.get("label", "")), number(point.get("accuracy"), f"points[{i}].accuracy",
                                                                      optional=False),
                                  number(point.get("low"), f"points[{i}].low"), number(point.get("high"), f"points[{i}].high"),
                                  number(point.get("n"), f"points[{i}].n"), str(point.get("group", "compared"))))
        headline = data.get("headline")
        return cls(headline=None if headline is None else str(headline), points=checked,
                   cost_usd=number(data.get("cost_usd"), "cost_usd"),
                   estimated_usd=number(data.get("estimated_usd"), "estimated_usd"),
                   cost_note=str(data.get("cost_note") or ""), level=number(data.get("level"), "level") or 0.95)

    def cost_text(self) -> str | None:
        """The cost in words, e.g. "$0.0000 observed (estimated $0.0000; training)", or None when unknown."""
        if self.cost_usd is None and self.estimated_usd is None:
            return None
        parts = [] if self.cost_usd is None else [f"${self.cost_usd:.4f} observed"]
        extra = [] if self.estimated_usd is None else [f"estimated ${self.estimated_usd:.4f}"]
        extra += [self.cost_note] if self.cost_note else []
        if not parts:
            return "; ".join(extra)
        return parts[0] + (f" ({'; '.join(extra)})" if extra else "")

    def __repr__(self) -> str:
        return f"ReportSummary: {self.headline or '(no headline)'} Cost: {self.cost_text() or 'not stated'}."

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from ..core.theme import FG, FG_MUTED, escape, no_math

        chart = accuracy_chart_png(self.points, self.level)
        img = (f"<img alt='accuracy with {self.level:.0%} intervals' style='max-width:100%;background:#fff' "
               f"src='data:image/png;base64,{base64.b64encode(chart).decode('ascii')}'/>" if chart else "")
        cost = self.cost_text()
        html_view = no_math(
            f"<div class='mnb-report-summary' style='color:{FG}'>"
            + (f"<p style='margin:2px 0'><b>{escape(self.headline)}</b></p>" if self.headline else "")
            + (f"<p style='margin:2px 0;color:{FG_MUTED}'>Cost: {escape(cost)}</p>" if cost else "")
            + f"{img}</div>")
        return {SUMMARY_MIME: self.to_dict(), "text/html": html_view, "text/plain": repr(self)}


def _point(label: str, accuracy: float, low: float | None, high: float | None, n: float | None,
           group: str) -> dict[str, Any]:
    def num(v: Any) -> float | None:
        return None if v is None or v != v else float(v)
    return {"label": str(label), "accuracy": float(accuracy), "low": num(low), "high": num(high),
            "n": num(n), "group": group}


def _compare_points(result: Any, baseline: str | None, checkpoint: str | None) -> list[dict[str, Any]]:
    if hasattr(result, "results") and hasattr(result, "table"):  # CompareManyResult
        points = [_point(baseline or result.baseline_name, result.baseline_accuracy, result.baseline_ci_low,
                         result.baseline_ci_high, None, "compared")]
        points += [_point(r.checkpoint, r.accuracy, r.accuracy_low, r.accuracy_high, None, "compared")
                   for r in result.table.itertuples()]
        return points
    n = result.cases or result.n
    return [_point(baseline or result.baseline_name, result.baseline_accuracy, result.baseline_ci_low,
                   result.baseline_ci_high, n, "compared"),
            _point(checkpoint or result.checkpoint_name, result.checkpoint_accuracy, result.checkpoint_ci_low,
                   result.checkpoint_ci_high, n, "compared")]


def _compare_headline(result: Any, baseline: str | None, checkpoint: str | None, rows: str) -> str:
    if hasattr(result, "results") and hasattr(result, "table"):  # CompareManyResult
        best = result.table.sort_values("accuracy", ascending=False, kind="stable").iloc[0]
        name = best["checkpoint"]
        r = result.results[name]
        return _compare_headline(r, baseline, f"{checkpoint or name} (best of {len(result.table)})", rows)
    lv = f"{result.level:.0%}"
    n = f"n = {result.n} {rows}"
    if result.cases and result.cases != result.n:
        n += f" ({result.cases} distinct questions)"
    return (f"{checkpoint or result.checkpoint_name} scores {result.checkpoint_accuracy:.1%} ({lv} CI "
            f"{result.checkpoint_ci_low:.1%}–{result.checkpoint_ci_high:.1%}) against "
            f"{baseline or result.baseline_name}'s {result.baseline_accuracy:.1%} "
            f"({result.baseline_ci_low:.1%}–{result.baseline_ci_high:.1%}) on {n}: delta {result.delta_text}, "
            f"{result.p_method}, p = {result.p_value:.2g}.")


def _sweep_points(summary: Any) -> list[dict[str, Any]]:
    cols = list(summary.columns)
    axes = cols[:cols.index("seeds")] if "seeds" in cols else []
    out = []
    for row in summary.to_dict("records"):
        label = ", ".join(f"{a}={row[a]:g}" if isinstance(row[a], float) else f"{a}={row[a]}" for a in axes)
        out.append(_point(f"{label} ({row['seeds']} seeds)", row["mean"], row.get("ci_low"), row.get("ci_high"),
                          row.get("effective_n"), "sweep"))
    return out


def report_summary(result: Any = None, *, headline: str | None = None, baseline: str | None = None,
                   checkpoint: str | None = None, rows: str = "held-out rows", sweep: Any = None,
                   cost_usd: float | None = None, estimated_usd: float | None = None,
                   cost_note: str = "") -> ReportSummary:
    """What this notebook's report shows at its top; display it (the last cell of a notebook, say).

    `machine-nb report` puts the headline, the cost and an accuracy chart (with intervals) above
    the notebook, next to the settings (read from the cell tagged `parameters`) and links to each
    section. A notebook that displays none still gets its title, settings, links and hidden code.

    Args:
        result: a `compare()` result (baseline vs checkpoint) or a `compare_many()` one; its
            accuracies and intervals are charted and, unless `headline` is given, make the headline
            (default None: nothing compared).
        headline: the result in one sentence (default None: written from `result`).
        baseline, checkpoint: names for the two sides in the headline and chart (default None:
            the result's own names).
        rows: what n counts, in the headline (default "held-out rows").
        sweep: a `sweep_summary()` frame (a SweepView's `summary_frame`): every setting's mean
            accuracy over seeds with its interval, charted beside the comparison (default None).
        cost_usd: the observed cost in USD (default None: not known).
        estimated_usd: the estimate made before running (default None).
        cost_note: what the cost covers, in a few words (default "").

    Returns:
        A ReportSummary (displays as a card; the report reads it).
    """
    points = [] if result is None else _compare_points(result, baseline, checkpoint)
    if sweep is not None:
        points += _sweep_points(sweep)
    if headline is None and result is not None:
        headline = _compare_headline(result, baseline, checkpoint, rows)
        headline = headline[:1].upper() + headline[1:]
    usd = lambda v: None if v is None or v != v else float(v)  # noqa: E731  (numpy numbers too)
    level = getattr(result, "level", 0.95) if result is not None else 0.95
    return ReportSummary(headline=headline, points=points, cost_usd=usd(cost_usd), estimated_usd=usd(estimated_usd),
                         cost_note=cost_note, level=level)


def accuracy_chart_png(points: list[Mapping[str, Any]], level: float = 0.95) -> bytes | None:
    """Accuracies with their intervals as a PNG: one row per point, the compared pair first, then a
    sweep's settings; dark ink on an opaque white background, so it reads on light and dark pages.

    Args:
        points: ReportSummary.points.
        level: the intervals' confidence level, for the axis label (default 0.95).

    Returns:
        The PNG, or None with no point to draw.
    """
    if not points:
        return None
    from matplotlib.figure import Figure

    colours = {"compared": "#1d4ed8", "sweep": "#b45309"}
    n = len(points)
    fig = Figure(figsize=(6.0, 0.9 + 0.42 * n), dpi=110, facecolor="white")
    ax = fig.add_subplot(1, 1, 1, facecolor="white")
    for i, p in enumerate(points):
        y = n - 1 - i
        acc = 100 * p["accuracy"]
        colour = "#4b5563" if i == 0 and p["group"] == "compared" else colours.get(p["group"], "#1d4ed8")
        if p.get("low") is not None and p.get("high") is not None:
            below, above = max(0.0, acc - 100 * p["low"]), max(0.0, 100 * p["high"] - acc)  # rounding at 0% / 100%
            ax.errorbar([acc], [y], xerr=[[below], [above]], fmt="o",
                        color=colour, ecolor=colour, elinewidth=2, capsize=4, markersize=6)
        else:
            ax.plot([acc], [y], "o", color=colour, markersize=6)
        ax.annotate(f"{acc:.1f}%", (acc, y), textcoords="offset points", xytext=(0, 7), ha="center",
                    fontsize=8, color="#111111")
    ax.set_yticks(range(n), [p["label"] for p in reversed(points)], fontsize=8, color="#111111")
    ax.set_xlim(-3, 103)
    ax.set_ylim(-0.7, n - 0.3)
    groups = {p["group"] for p in points}
    legend = "\nblue: compared · orange: a sweep's settings, mean over seeds" if groups >= {"compared", "sweep"} else ""
    ax.set_xlabel(f"accuracy (%) with {level:.0%} interval{legend}", fontsize=8, color="#111111")
    ax.tick_params(axis="x", labelsize=8, colors="#111111")
    ax.grid(axis="x", color="#d1d5db", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title("Accuracy", fontsize=10, color="#111111", loc="left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()


def notebook_title(nb: Mapping[str, Any]) -> str:
    """The notebook's title: its metadata `title`, else its first `# ` heading (markup dropped),
    else "Report".

    Args:
        nb: the notebook as JSON-like data.

    Returns:
        The title as plain text.
    """
    title = (nb.get("metadata") or {}).get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        m = re.search(r"^#\s+(.+?)\s*#*\s*$", _text(cell.get("source")), re.M)
        if m:
            return re.sub(r"[*_`]|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).strip()
    return "Report"


@dataclass
class Setting:
    """One parameter of a report: name, value (its source text), note (its line's comment),
    and whether the report's run set it (papermill's injected parameters)."""

    name: str
    value: str
    note: str = ""
    injected: bool = False


def _assignments(source: str) -> list[tuple[str, str, str]]:
    """(name, value source, trailing comment) of each top-level `name = value` in a cell's source."""
    import ast
    import io as _io
    import tokenize

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    comments: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(_io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError):
        pass
    out = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) and node.value is not None else []
        if len(targets) != 1 or not isinstance(targets[0], ast.Name):
            continue
        value = ast.get_source_segment(source, node.value) or ""
        out.append((targets[0].id, " ".join(value.split()), comments.get(node.end_lineno or node.lineno, "")))
    return out


def notebook_settings(nb: Mapping[str, Any]) -> list[Setting]:
    """The report's settings: each assignment of the cell tagged `parameters`, with its comment,
    the values papermill injected (cell tagged `injected-parameters`) in their place.

    A secret-named setting's value is shown as `[redacted]`.

    Args:
        nb: the (executed) notebook as JSON-like data.

    Returns:
        The settings in the parameters cell's order, injected ones it lacks after them.
    """
    settings: dict[str, Setting] = {}
    for cell in nb.get("cells", []):
        tags = (cell.get("metadata") or {}).get("tags") or []
        if cell.get("cell_type") != "code":
            continue
        if "parameters" in tags:
            for name, value, note in _assignments(_text(cell.get("source"))):
                settings[name] = Setting(name, value, note)
        elif "injected-parameters" in tags:
            for name, value, _ in _assignments(_text(cell.get("source"))):
                old = settings.get(name)
                settings[name] = Setting(name, value, old.note if old else "", injected=True)
    for s in settings.values():
        if is_secret_name(s.name):
            s.value = REDACTED
    return list(settings.values())


def _summary_of(nb: Mapping[str, Any]) -> ReportSummary | None:
    """The last report summary a notebook displays (None when it displays none)."""
    found = None
    for index, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs") or []:
            data = (out.get("data") or {}).get(SUMMARY_MIME)
            if data is None:
                continue
            try:
                if not isinstance(data, Mapping):
                    raise ValueError("not a JSON object")
                found = ReportSummary.from_dict(data)
            except ValueError as exc:
                raise ValueError(f"cell {cell.get('id') or index + 1}: its report summary output ({SUMMARY_MIME}) "
                                 f"is malformed: {exc}; display mnb.report_summary(...) again in that cell") from None
    return found


def _loss_plot_png(nb: Mapping[str, Any]) -> str | None:
    """The base64 PNG of the last loss plot a notebook shows (a LossPlot's static output)."""
    found = None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs") or []:
            data = out.get("data") or {}
            if "image/png" in data and ("mnb-loss-plot" in _text(data.get("text/html"))
                                        or _text(data.get("text/plain")).startswith("LossPlot:")):
                found = _text(data["image/png"]).replace("\n", "")
    return found


def _header_html(nb: Mapping[str, Any]) -> str:
    """The report's top: title, headline, cost, charts, settings, and the slot for the section links."""
    from html import escape as _html_escape

    from ..core.theme import escape, no_math

    summary = _summary_of(nb)
    parts = [f"<h1 class='mnb-title'>{escape(notebook_title(nb))}</h1>"]
    if summary and summary.headline:
        parts.append(f"<p class='mnb-headline'>{escape(summary.headline)}</p>")
    cost = summary.cost_text() if summary else None
    if cost:
        parts.append(f"<p class='mnb-cost'><b>Cost</b>: {escape(cost)}</p>")
    charts = []
    chart = accuracy_chart_png(summary.points, summary.level) if summary else None
    if chart:
        charts.append("<figure class='mnb-chart mnb-accuracy-chart'><img alt='accuracy with "
                      f"{summary.level:.0%} intervals' src='data:image/png;base64,{base64.b64encode(chart).decode('ascii')}'/>"
                      "<figcaption>Accuracy, each with its interval</figcaption></figure>")
    loss = _loss_plot_png(nb)
    if loss:
        charts.append(f"<figure class='mnb-chart mnb-loss-chart'><img alt='training loss' "
                      f"src='data:image/png;base64,{_html_escape(loss)}'/><figcaption>Training loss</figcaption></figure>")
    if charts:
        parts.append(f"<div class='mnb-charts'>{''.join(charts)}</div>")
    settings = notebook_settings(nb)
    side = []
    if settings:
        rows = "".join(f"<tr><th scope='row'><code>{escape(s.name)}</code></th><td><code>{escape(s.value)}</code>"
                       + (" <span class='mnb-set'>(set for this report)</span>" if s.injected else "")
                       + f"</td><td>{escape(s.note)}</td></tr>" for s in settings)
        side.append("<section class='mnb-settings'><h2 class='mnb-aside-title'>Settings</h2><table>"
                    f"<thead><tr><th>name</th><th>value</th><th>note</th></tr></thead><tbody>{rows}</tbody>"
                    "</table></section>")
    side.append(f"<nav class='mnb-toc' aria-label='Sections'><h2 class='mnb-aside-title'>Sections</h2>{_TOC_SLOT}</nav>")
    parts.append(f"<div class='mnb-aside'>{''.join(side)}</div>")
    parts.append("<p class='mnb-code-note'>Code is hidden: <button type='button' id='mnb-code-toggle' "
                 "aria-pressed='false'>Show code</button></p>")
    return no_math("".join(parts), "header")


_TOC_SLOT = "<!--mnb-section-links-->"
_HEADING = re.compile(r"<h2 id=\"([^\"]+)\">(.*?)(?:<a class=\"anchor-link\"[^>]*>.*?</a>)?</h2>", re.S)

_REPORT_CSS = """
body { background: var(--jp-layout-color0); color: var(--jp-content-font-color1); }
main { max-width: 1100px; margin: 0 auto; padding: 8px 16px 48px; }
main > header { margin-bottom: 24px; padding-bottom: 12px;
  border-bottom: 1px solid var(--jp-border-color2); font-family: var(--jp-content-font-family); }
.mnb-title { font-size: 1.9em; margin: 12px 0 8px; }
.mnb-headline { font-size: 1.15em; line-height: 1.45; margin: 6px 0; }
.mnb-cost { margin: 4px 0 10px; color: var(--jp-content-font-color2); }
.mnb-charts { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; margin: 10px 0; }
.mnb-chart { margin: 0; flex: 1 1 420px; max-width: 540px; }
.mnb-chart figcaption { font-size: 12px; color: var(--jp-content-font-color2); margin-top: 2px; }
/* charts and every output image on white: their ink is dark, and they read on a dark page too */
.mnb-chart img, .jp-OutputArea-output img { max-width: 100%; background: #fff; border-radius: 4px; padding: 4px; }
.mnb-aside { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.mnb-settings { flex: 2 1 520px; } .mnb-toc { flex: 1 1 220px; }
.mnb-aside-title { font-size: 1.05em; margin: 10px 0 4px; }
.mnb-settings table { border-collapse: collapse; font-size: 12px; }
.mnb-settings th, .mnb-settings td { text-align: left; vertical-align: top; padding: 2px 8px 2px 0;
  border-bottom: 1px solid var(--jp-border-color2); }
.mnb-settings td:last-child { color: var(--jp-content-font-color2); }
.mnb-set { color: var(--jp-content-font-color2); font-size: 11px; }
.mnb-toc ol { margin: 0; padding-left: 20px; line-height: 1.6; }
.mnb-toc a { color: var(--jp-content-link-color, #1d4ed8); }
#mnb-code-toggle { font: inherit; padding: 2px 10px; cursor: pointer; color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color2); border: 1px solid var(--jp-border-color1); border-radius: 4px; }
/* code hidden until the reader asks for it */
body:not(.mnb-show-code) .jp-CodeCell .jp-Cell-inputWrapper { display: none; }
body:not(.mnb-show-code) .jp-CodeCell.jp-mod-noOutputs { display: none; }
"""

_REPORT_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}
<meta name="color-scheme" content="light dark">
{{ resources.include_css("static/theme-dark.css") | replace('<style type="text/css">', '<style type="text/css" media="(prefers-color-scheme: dark)">') }}
<style type="text/css">{{ resources.mnb_css }}</style>
{%- endblock html_head_css -%}
{%- block body_header -%}
<body class="jp-Notebook mnb-report" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<main>
{{ resources.mnb_header }}
{%- endblock body_header -%}
{% block footer_js %}
<script>
(function () {
  var button = document.getElementById("mnb-code-toggle");
  if (!button) return;
  button.addEventListener("click", function () {
    var shown = document.body.classList.toggle("mnb-show-code");
    button.setAttribute("aria-pressed", shown ? "true" : "false");
    button.textContent = shown ? "Hide code" : "Show code";
  });
})();
</script>
{% endblock footer_js %}
"""


def to_html(notebook_json: str) -> str:
    """An executed notebook as a report page (nbconvert's lab template, reshaped).

    The page reads with no kernel and no network: nothing is fetched (no MathJax, require.js or
    widget script; math stays as its TeX text), images are embedded, and code is hidden until the
    reader clicks "Show code". At the top: the notebook's title (also the page's), the headline
    and cost of the last `report_summary` it displays, an accuracy chart with intervals beside its
    last loss plot, the settings (its `parameters` cell, with what the run set), and links to each
    `##` section. It follows the reader's light or dark colour scheme; images sit on white.

    Args:
        notebook_json: the notebook's JSON text.

    Returns:
        The HTML page.
    """
    import copy

    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.reads(notebook_json, as_version=4)
    title = notebook_title(nb)
    header = _header_html(nb)
    nb = copy.deepcopy(nb)
    nb.metadata["title"] = title
    for cell in nb.cells:  # the title is the page's heading: the notebook's own `# ` line goes
        if cell.cell_type == "markdown":
            text = _text(cell.source)
            if re.match(r"\s*#\s", text):
                cell.source = re.sub(r"^\s*#\s[^\n]*\n?", "", text, count=1)
            break
    nb.cells = [c for c in nb.cells if c.cell_type != "markdown" or _text(c.source).strip()]
    exporter = HTMLExporter(template_name="lab", template_file="machine_nb_report.html.j2", embed_images=True,
                            exclude_output_prompt=True,
                            extra_loaders=[jinja2.DictLoader({"machine_nb_report.html.j2": _REPORT_TEMPLATE})])
    page, _ = exporter.from_notebook_node(nb, resources={"mnb_header": header, "mnb_css": _REPORT_CSS})
    links = "".join(f"<li><a href='#{m.group(1)}'>{m.group(2).strip()}</a></li>" for m in _HEADING.finditer(page))
    return page.replace(_TOC_SLOT, f"<ol>{links}</ol>" if links else "<p>(no sections)</p>", 1)


class _MemoryNotebooks:
    """A papermill I/O handler for `machine-nb-memory://…` paths: what papermill saves (after every
    cell, and the error-marked notebook when a cell fails) stays in this process's memory."""

    scheme = "machine-nb-memory://"

    def __init__(self) -> None:
        self._buffers: dict[str, str] = {}
        self._lock = threading.Lock()

    def read(self, path: str) -> str:
        with self._lock:
            return self._buffers[path]

    def write(self, buf: str, path: str) -> None:
        with self._lock:
            self._buffers[path] = buf

    def pop(self, path: str) -> str | None:
        with self._lock:
            return self._buffers.pop(path, None)

    def listdir(self, path: str) -> list[str]:
        return []

    def pretty_path(self, path: str) -> str:
        return path


_MEMORY = _MemoryNotebooks()
_registered = threading.Lock()


def _memory_path() -> str:
    from papermill.iorw import papermill_io

    path = f"{_MEMORY.scheme}{uuid.uuid4().hex}.ipynb"
    with _registered:
        if papermill_io.get_handler(path) is not _MEMORY:
            papermill_io.register(_MEMORY.scheme, _MEMORY)
    return path


def _redacted_error(exc: BaseException, secrets: list[str]) -> BaseException | None:
    """A copy of `exc` whose text holds no secret, or None when it held none (raise it as it is)."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        fields, n = _scrub_tree([exc.source, exc.ename, exc.evalue, list(exc.traceback or [])], secrets)
        return PapermillExecutionError(exc.cell_index, exc.exec_count, *fields) if n else None
    text, n = scrub(str(exc), secrets)
    return RuntimeError(f"{type(exc).__name__}: {text}") if n else None


#: The longest path of a Unix socket's name that every POSIX system takes (Linux takes 107 bytes, macOS 103).
_SOCKET_PATH_MAX = 100


def kernel_manager() -> dict[str, Any]:
    """How a report's kernel is reached (papermill's keyword arguments for nbclient): on POSIX, over
    local sockets in the Jupyter runtime folder (ZeroMQ's IPC transport) rather than loopback TCP
    ports, so no other program can reach it through a port and ipykernel has no unencrypted TCP to
    warn about in the terminal; elsewhere, where that folder's path is too long for a socket's
    name, or where its file system holds no Unix socket, nbclient's default (TCP on 127.0.0.1).

    Returns:
        `{"kernel_manager_class": …}`, or {} for the default.
    """
    if os.name != "posix":
        return {}
    from jupyter_core.paths import jupyter_runtime_dir

    folder = jupyter_runtime_dir()
    # a socket is named <runtime folder>/kernel-<uuid>-ipc-<n>: 55 characters past the folder's path
    if len(os.fsencode(folder)) + 55 > _SOCKET_PATH_MAX or not _holds_sockets(folder):
        return {}
    return {"kernel_manager_class": _ipc_kernel_manager()}


@lru_cache(maxsize=8)
def _holds_sockets(folder: str) -> bool:
    """Whether a Unix socket can be made in `folder` (Jupyter's runtime folder, made as Jupyter
    makes it, private to the user, when missing): a probe bound there and removed at once."""
    import socket

    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        probe = os.path.join(folder, f"machine-nb-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(probe)
        finally:
            sock.close()
            if os.path.lexists(probe):
                os.unlink(probe)
    except OSError:
        return False
    return True


@lru_cache(maxsize=1)
def _ipc_kernel_manager() -> type:
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        """nbclient's kernel manager, with the IPC transport as its default."""

        @default("transport")
        def _default_transport(self) -> str:
            return "ipc"

    return IPCKernelManager


def kernel_arguments(kernel_name: str = "python3") -> list[str]:
    """Extra command-line arguments for a report's kernel: for an IPython kernel (its spec runs
    ipykernel), an exec line that preloads KERNEL_PRELOAD when the kernel's Python has machine_nb;
    for any other kernel, none.

    Args:
        kernel_name: the Jupyter kernel's name (default "python3").

    Returns:
        The arguments (nbclient's `extra_arguments`).
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        argv = KernelSpecManager().get_kernel_spec(kernel_name).argv
    except NoSuchKernel:
        return []
    if not any("ipykernel" in arg for arg in argv):
        return []
    line = ("__import__('importlib.util').util.find_spec('machine_nb') and getattr(__import__("
            f"'machine_nb.core.process').core.process, 'preload', lambda modules: None)({list(KERNEL_PRELOAD)!r})")
    return [f"--IPKernelApp.exec_lines={json.dumps([line])}"]


def _writable(name: str, value: Any) -> Any:
    """`value` as papermill writes it faithfully into the notebook's injected cell: None, str, bool,
    int, float, and lists and str-keyed dicts of them; a tuple becomes a list, a numpy scalar its
    Python number, a path its text. Raises ValueError naming the parameter for anything else (papermill
    would write its text as a string, or code that does not run)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_writable(name, item) for item in value]
    if isinstance(value, Mapping):
        bad = next((key for key in value if not isinstance(key, str)), None)
        if bad is not None:
            raise ValueError(f"parameter {name!r}: dict key {bad!r} is not a string; a notebook's parameters "
                             "are written as Python source, and a non-string key would arrive as a string")
        return {key: _writable(name, item) for key, item in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # np.int64(3), np.float32(0.5)
        item = value.item()
        if item is None or isinstance(item, (str, bool, int, float)):
            return item
    raise ValueError(f"parameter {name!r}: a {type(value).__name__} cannot be passed to a notebook; pass a str, "
                     "number, bool, None, or a list or dict of them (e.g. str(value) or value.isoformat())")


def _checked_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameters as papermill writes them, each name a Python variable name (_writable)."""
    import keyword

    checked = {}
    for name, value in (parameters or {}).items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"parameter {name!r} is not a Python variable name, so the notebook cannot be given it; "
                             "name a variable of the notebook's cell tagged 'parameters' (e.g. learning_rate)")
        checked[name] = _writable(name, value)
    return checked


def _bound_names(source: str) -> list[str] | None:
    """The names a Python cell binds (assignments of every form, `for`, `with`, imports, defs), first
    bound first, its IPython magic and shell lines left out; None when it is not Python that parses."""
    import ast

    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return None
    names: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names[node.id] = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(dict.fromkeys((a.asname or a.name).split(".")[0] for a in node.names))
    return list(names)


def _unknown_parameters(nb: Mapping[str, Any], names: list[str], where: str | os.PathLike) -> str | None:
    """Why the notebook cannot be given `names`, or None when its cell tagged `parameters` sets every one.

    papermill injects a name that cell does not set with a warning only, and a mistyped name leaves the
    notebook on its default. A notebook that is not Python, or whose parameters cell does not parse, is
    not checked (its kernel says what is wrong with the cell)."""
    import difflib

    if not names:
        return None
    meta = nb.get("metadata") or {}
    language = (meta.get("language_info") or {}).get("name") or (meta.get("kernelspec") or {}).get("language")
    if language and str(language).lower() != "python":
        return None
    cells = nb.get("cells") or []
    tagged = (i for i, cell in enumerate(cells)
              if isinstance(cell, dict) and "parameters" in ((cell.get("metadata") or {}).get("tags") or []))
    index = next(tagged, None)
    shown = ", ".join(repr(name) for name in names)
    if index is None:
        return (f"{where}: no cell tagged 'parameters', so it cannot be given {shown}; tag the cell that sets the "
                "notebook's settings 'parameters' (JupyterLab: Property Inspector, Cell Tags)")
    known = _bound_names(_text(cells[index].get("source")))
    if known is None:
        return None
    unknown = [name for name in names if name not in known]
    if not unknown:
        return None

    def closest(name: str) -> str:
        near = difflib.get_close_matches(name, known, n=3)
        return f"{name!r} (did you mean {' or '.join(repr(n) for n in near)}?)" if near else f"{name!r}"

    sets = ", ".join(known) or "nothing"
    return (f"{where}, cell {index + 1} (tagged 'parameters'): no parameter {', '.join(map(closest, unknown))}; "
            f"the cell sets {sets}. Pass one of those names, or add the variable to that cell")


def _secret_leaves_as_text(value: Any, secrets: list[str]) -> Any:
    """`value` with every number whose text is one of `secrets` made that text (so scrub redacts it)."""
    if isinstance(value, dict):
        return {key: _secret_leaves_as_text(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_secret_leaves_as_text(item, secrets) for item in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and str(value) in secrets:
        return str(value)
    return value


def run_report(notebook: str | os.PathLike, parameters: dict[str, Any] | None = None,
               output: str | os.PathLike | None = None, *, kernel_name: str = "python3",
               cwd: str | os.PathLike | None = None, progress: bool | None = None,
               timeout: float | None = None) -> Report:
    """Execute a notebook with parameters and write a shareable report: `<output>.html` and
    `<output>.ipynb`, redacted, with local paths written relative to the notebook's folder or as
    `~/…` (this module's docstring).

    Args:
        notebook: the notebook to run (never overwritten).
        parameters: values injected after the cell tagged `parameters` (default None: none); each
            name one that cell sets (a Python notebook's).
        output: the HTML path; default None: `reports/<notebook stem>.html` under the current
            directory. The executed notebook lands next to it with the same stem.
        kernel_name: the Jupyter kernel (default "python3"). An IPython kernel of a notebook that
            imports machine_nb starts with KERNEL_PRELOAD imported and frozen (kernel_arguments).
        cwd: the kernel's working directory; default None: the notebook's own folder (as Jupyter
            and nbval run it), so relative paths in the notebook mean the same everywhere.
        progress: papermill's progress bar over cells (default None: on unless
            MACHINE_NB_PROGRESS=0).
        timeout: per-cell limit in seconds (default None: none).

    Returns:
        A Report (notebook, html, executed, wall_s, redactions).

    Raises:
        FileNotFoundError: a missing notebook, before anything is created.
        ValueError: the executed notebook would overwrite `notebook`, or `output` ends in .ipynb; a parameter whose name is not a
            Python variable name or whose value papermill cannot write (named), or that the notebook's
            cell tagged `parameters` does not set (named, with the closest names it sets), before
            anything runs; a malformed report summary, with neither report file written.
        PapermillExecutionError: a failing cell, its text redacted, after both files are written
            (the error shows in place). A Ctrl-C writes nothing and re-raises.
    """
    parameters = _checked_parameters(parameters)
    folder = Path(os.path.abspath(notebook)).parent  # as given: path_rewriter adds its real path
    notebook = Path(notebook).resolve()
    if not notebook.is_file():
        raise FileNotFoundError(f"no notebook at {notebook}")
    html_path = Path(output) if output else Path("reports") / f"{notebook.stem}.html"
    if html_path.suffix.lower() == ".ipynb":  # the page would be written over the executed notebook
        raise ValueError(f"output {html_path} names a notebook: it is the page's path (the executed notebook goes "
                         f"beside it as .ipynb); give a path ending in .html, e.g. {html_path.with_suffix('.html')}")
    html_path = html_path.resolve()
    executed = html_path.with_suffix(".ipynb")
    if executed == notebook:
        raise ValueError(f"the executed notebook would overwrite its input {notebook}: choose another output "
                         f"than {html_path.name}")
    # papermill reads the file again: a NotebookNode given to it instead is written out and parsed again,
    # and kept whole as the executed notebook's metadata.papermill.input_path
    try:
        source_nb = json.loads(notebook.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # papermill says what is wrong with the file
        source_nb = {}
    problem = _unknown_parameters(source_nb, list(parameters), notebook) if isinstance(source_nb, dict) else None
    if problem:
        raise ValueError(problem)
    preload = isinstance(source_nb, dict) and imports_machine_nb(source_nb)
    import papermill  # after the checks above: seconds of imports (nbformat, nbclient)

    # a secret-named parameter is a secret whatever its type (the CLI reads `-p pin 4821` as a number),
    # inside a dict or list too: a number is redacted as the text `print` shows it as
    secrets = sorted(set(secret_values()) | set(secret_values(parameters)), key=len, reverse=True)
    memory = _memory_path()
    start = time.monotonic()
    error: BaseException | None = None
    try:
        try:
            papermill.execute_notebook(
                str(notebook), memory, parameters=parameters, kernel_name=kernel_name,
                extra_arguments=kernel_arguments(kernel_name) if preload else [], cwd=str(cwd or notebook.parent),
                progress_bar=resolve_progress(progress), **kernel_manager(),
                **({"execution_timeout": timeout} if timeout else {}))
        except Exception as exc:  # keep going: the partial notebook shows where it failed
            error = exc
        wall = time.monotonic() - start
        text = _MEMORY.pop(memory)
    finally:
        _MEMORY.pop(memory)  # Ctrl-C or a crash: drop the unredacted notebook
    if error is not None:
        safe = _redacted_error(error, secrets)
    if text is None:
        if error is None:
            raise RuntimeError(f"papermill saved no executed notebook for {notebook}")
        if safe is not None:
            raise safe from None
        raise error
    nb = clean_notebook(json.loads(text))
    nb.get("metadata", {}).get("papermill", {})["output_path"] = str(executed)
    papermill_meta = nb.get("metadata", {}).get("papermill", {})
    if isinstance(papermill_meta.get("parameters"), dict):  # as text, so the scrub below redacts it with the rest
        papermill_meta["parameters"] = _secret_leaves_as_text(papermill_meta["parameters"], secrets)
    nb, n1 = scrub_notebook(nb, secrets, folder)
    text = json.dumps(nb, ensure_ascii=False, indent=1)
    # the page first: a notebook it cannot be made from leaves the previous pair of files as it was
    page, n2 = _scrub_tree(to_html(text), secrets, path_rewriter(folder))
    html_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(executed, text + "\n", mode=0o644)
    atomic_write_text(html_path, page, mode=0o644)
    if error is not None:
        if safe is not None:
            raise safe from None
        raise error
    from ..core.stop import STOPPED_KEY

    stopped = next((out["metadata"][STOPPED_KEY] for cell in nb.get("cells", []) for out in cell.get("outputs") or []
                    if STOPPED_KEY in (out.get("metadata") or {})), None)
    return Report(notebook=notebook, html=html_path, executed=executed, wall_s=wall, redactions=n1 + n2,
                  stopped=stopped)
