"""CompareView: baseline vs checkpoint, the evaluator's paired numbers and the outputs side by side.

The numbers (accuracies, delta, W/T/L, McNemar p, bootstrap CI) come from `machine_nb.evaluation.compare`
(compare.py); this view lays them out, joins the two per-row results into one table
(`side_by_side`), highlights the rows that flipped and can show only those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from ..core.theme import BG, BORDER, FG, FG_MUTED, GREEN, RED, text_colour, tint
from ._base import NoMathHTML, diff_html, word_diff, StaticFallback, escape

if TYPE_CHECKING:
    import pandas as pd

    from ..evaluation.compare import CompareResult, Results
    from ..evaluation.results import EvalResult

# Row backgrounds: the theme's success / error colour tinted over the page, with the theme's text
# colour on them (a fixed pale green under a dark theme's white text would be unreadable).
WIN_BG, LOSS_BG = tint(GREEN), tint(RED)
# Past this many rows the view starts with only the flips: a 1,000-row table buries them.
FLIPS_FIRST_ABOVE = 200
CELL_CHARS = 400  # outputs are cut here in the table (the frame keeps them whole)


def _result(value: Any, what: str) -> EvalResult:
    from ..evaluation.results import as_eval_result

    return as_eval_result(value, what)


def side_by_side(baseline: Results, checkpoint: Results) -> pd.DataFrame:
    """Two results over the same rows as one table, a row per eval row.

    Args:
        baseline: the baseline's results: an EvalResult, a results JSON path, a DataFrame of
            per-row results or a loaded results dict.
        checkpoint: the checkpoint's results, in any of the same forms.

    Returns:
        A DataFrame: row, prompt, expected, baseline_output, checkpoint_output,
        baseline_correct, checkpoint_correct, change ("win" = only the checkpoint is right,
        "loss" = only the baseline is, "tie" otherwise).

    Raises:
        ValueError: the two are not over the same rows (compare.paired_rows pairs them as
            compare() does: by position, or by Inspect sample id and epoch, in the baseline's
            order).
    """
    import pandas as pd

    from ..evaluation.compare import paired_rows, row_numbers
    from ..evaluation.results import correct_values

    a, b = paired_rows(baseline, checkpoint)
    ca, cb = correct_values(a, "baseline"), correct_values(b, "checkpoint")
    change = ["win" if (y and not x) else "loss" if (x and not y) else "tie" for x, y in zip(ca, cb)]
    return pd.DataFrame({
        "row": row_numbers(a),
        "prompt": a["prompt"], "expected": a["expected"],
        "baseline_output": a["output"], "checkpoint_output": b["output"],
        "baseline_correct": ca, "checkpoint_correct": cb, "change": change,
    })


def numbers_html(result: CompareResult) -> str:
    """The compare numbers as a small HTML table, then compare's summary sentences.

    Args:
        result: a CompareResult.

    Returns:
        The HTML: accuracies with their intervals, delta, the bootstrap view, W/T/L, p, rows for
        power and format rates where known, then one paragraph per summary line.
    """
    def pct(v: Any) -> str:
        return "—" if v is None else f"{v:.1%}"

    base, ckpt = escape(getattr(result, "baseline_name", "baseline")), escape(getattr(result, "checkpoint_name", "checkpoint"))
    def with_interval(value: Any, low: Any, high: Any) -> str:
        return pct(value) if low is None else f"{pct(value)} ({pct(low)} to {pct(high)})"

    # intervals that hold at small n (Wilson, Newcombe); the bootstrap as a second view, in words
    # when it has no spread, so a zero-width interval is never printed as if it were one
    rows = [
        (f"{base} accuracy", with_interval(result.baseline_accuracy, getattr(result, "baseline_ci_low", None),
                                           getattr(result, "baseline_ci_high", None))),
        (f"{ckpt} accuracy", with_interval(result.checkpoint_accuracy, getattr(result, "checkpoint_ci_low", None),
                                           getattr(result, "checkpoint_ci_high", None))),
        ("delta", escape(getattr(result, "delta_text", f"{result.delta:+.1%}"))),
        ("paired bootstrap", escape(getattr(result, "bootstrap_text",
                                            f"[{result.ci_low:+.1%}, {result.ci_high:+.1%}]"))),
        ("wins / ties / losses", f'<span style="color:{text_colour(GREEN)}">{result.wins}</span> / {result.ties} / '
                                 f'<span style="color:{text_colour(RED)}">{result.losses}</span>'),
        (escape(getattr(result, "p_method", "exact McNemar p")), f"{result.p_value:.3g}"),
    ]
    if getattr(result, "rows_for_power", None):
        rows.append(("rows for 80% power", f"about {result.rows_for_power}"))
    fr_a, fr_b = getattr(result, "baseline_format_rate", None), getattr(result, "checkpoint_format_rate", None)
    if fr_a is not None or fr_b is not None:
        rows.append(("format rate", f"{pct(fr_a)} → {pct(fr_b)}"))
    body = "".join(f'<tr><td style="padding:1px 12px 1px 0;color:{FG_MUTED}">{k}</td><td>{v}</td></tr>' for k, v in rows)
    paras = "".join(f"<p style='margin:4px 0'>{escape(p)}</p>" for p in str(result.summary).split("\n") if p.strip())
    return f'<table class="mnb-compare-numbers">{body}</table>{paras}'


SHOW = ("all", "win", "tie", "loss")


def rows_html(frame: pd.DataFrame, *, only_flips: bool = False, base: str = "baseline",
              ckpt: str = "checkpoint", show: str = "all") -> str:
    """The side-by-side table as HTML, wins on green and losses on red. Under each win or loss, a
    line that opens (a click, no kernel needed) to both whole outputs side by side, the words that
    differ marked.

    Args:
        frame: a side_by_side table.
        only_flips: leave out the ties (default False).
        base: the baseline's column heading (default "baseline").
        ckpt: the checkpoint's column heading (default "checkpoint").
        show: "all" (default), or only the rows whose change is "win", "tie" or "loss".

    Returns:
        The HTML table (outputs cut at CELL_CHARS characters), or a sentence when no row is left.
    """
    if only_flips:
        frame = frame[frame["change"] != "tie"]
    if show != "all":
        frame = frame[frame["change"] == show]
    if len(frame) == 0:
        return "<p>No row changed.</p>" if only_flips else "<p>No rows.</p>"
    cell = f"padding:2px 6px;border-bottom:1px solid {BORDER};vertical-align:top;white-space:pre-wrap;color:{FG}"

    def out(text: Any, ok: Any) -> str:
        mark = "✓" if bool(ok) else "✗"
        return f"{mark} {escape(str(text)[:CELL_CHARS])}"

    trs = []
    for r in frame.to_dict("records"):
        bg = {"win": WIN_BG, "loss": LOSS_BG}.get(r["change"], BG)
        trs.append(f'<tr class="mnb-{r["change"]}" style="background:{bg}"><td style="{cell}">{r["row"]}</td>'
                   f'<td style="{cell}">{escape(str(r["prompt"])[:CELL_CHARS])}</td><td style="{cell}">{escape(r["expected"])}</td>'
                   f'<td style="{cell}">{out(r["baseline_output"], r["baseline_correct"])}</td>'
                   f'<td style="{cell}">{out(r["checkpoint_output"], r["checkpoint_correct"])}</td>'
                   f'<td style="{cell}">{r["change"]}</td></tr>')
        if r["change"] in ("win", "loss"):
            trs.append(f'<tr data-case="{escape(r["row"])}"><td colspan="6" style="{cell}">{_case_detail(r, base, ckpt)}</td></tr>')
    head = "".join(f'<th style="{cell};text-align:left">{h}</th>'
                   for h in ("row", "prompt", "expected", escape(base), escape(ckpt), "change"))
    return (f'<table class="mnb-compare-rows" style="border-collapse:collapse;font-size:12px">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(trs)}</tbody></table>')


def _case_detail(r: dict, base: str, ckpt: str) -> str:
    """A flipped row's two whole outputs side by side (a <details> that opens on a click), the
    words only one of them has marked."""
    pieces = word_diff(str(r["baseline_output"]), str(r["checkpoint_output"]))
    col = "white-space:pre-wrap;overflow-wrap:anywhere;min-width:0"
    return (f'<details class="mnb-case-detail"><summary>row {escape(r["row"])}: both outputs in full, '
            f'the difference marked</summary><div style="display:grid;grid-template-columns:1fr 1fr;gap:12px">'
            f'<div style="{col}"><b>{escape(base)}</b>\n{diff_html(pieces, ("same", "removed"))}</div>'
            f'<div style="{col}"><b>{escape(ckpt)}</b>\n{diff_html(pieces, ("same", "added"))}</div></div></details>')


class CompareView(StaticFallback, widgets.VBox):
    """Baseline vs checkpoint: the compare numbers, then every row's two outputs side by side.

    `.result` is the CompareResult; `.rows` the side-by-side DataFrame (see `side_by_side`). The
    "show" buttons (`.show`: "all", "win", "tie", "loss") keep one kind of row; a win or loss opens,
    on a click, to both whole outputs side by side with the words that differ marked.

    Args:
        baseline: the baseline's results: an EvalResult (from evaluate, evaluate_cases or
            load_results), a results JSON path, a DataFrame of per-row results or a loaded
            results dict; or a CompareResult (then pass the two results as `frames=(a, b)` to
            see every row).
        checkpoint: the checkpoint's results, in any of the same forms (default None: with a
            CompareResult as `baseline` or `result=`).
        result: a CompareResult already computed (default None: `machine_nb.compare(baseline,
            checkpoint)`).
        frames: the two results when `result` is given, in any of the same forms (default None:
            only the flipped rows, from `result.flips`, are shown).
        only_flips: start with only the rows that changed. Default None: on above 200 rows.
        **kwargs: passed to ipywidgets.VBox.

    Raises:
        ValueError: neither two results nor a CompareResult given, results not over the same
            rows, or `frames` whose rows, wins and losses are not the ones `result` counts.
    """

    def __init__(self, baseline: Results | CompareResult | None = None, checkpoint: Results | None = None, *,
                 result: CompareResult | None = None, frames: tuple[Results, Results] | None = None,
                 only_flips: bool | None = None, **kwargs: Any) -> None:
        if result is None and hasattr(baseline, "flips") and hasattr(baseline, "wins"):
            result, baseline = baseline, None
        if frames is None and baseline is not None and checkpoint is not None:
            frames = (baseline, checkpoint)
        if frames is not None:  # read each once (a results file, a dict); names travel with them
            frames = (_result(frames[0], "baseline"), _result(frames[1], "checkpoint"))
        if result is None:
            if frames is None:
                raise ValueError("CompareView needs baseline and checkpoint results, or result= a CompareResult")
            from ..evaluation.compare import compare

            result = compare(*frames)
        self.result = result
        if frames is not None:
            self.rows = side_by_side(*frames)
            counts = self.rows["change"].value_counts()
            shown = (len(self.rows), int(counts.get("win", 0)), int(counts.get("loss", 0)))
            counted = (getattr(result, "n", shown[0]), result.wins, result.losses)
            if shown != counted:
                raise ValueError(f"frames= give {shown[0]} rows with {shown[1]} win(s) and {shown[2]} loss(es), but "
                                 f"result= counts {counted[0]} rows with {counted[1]} and {counted[2]}: pass the "
                                 "two results the CompareResult was computed from")
        else:  # only the flips are known
            flips = result.flips.copy()
            self.rows = flips[["row", "prompt", "expected", "baseline_output", "checkpoint_output",
                               "baseline_correct", "checkpoint_correct", "change"]].reset_index(drop=True)
        if only_flips is None:
            only_flips = len(self.rows) > FLIPS_FIRST_ABOVE
        self._toggle = widgets.Checkbox(value=bool(only_flips), description="only flips", indent=False)
        self._show = widgets.ToggleButtons(options=[("all", "all"), ("wins", "win"), ("ties", "tie"), ("losses", "loss")],
                                           value="all", tooltips=["every row", "only the checkpoint is right",
                                                                  "both right or both wrong", "only the baseline is right"],
                                           style={"button_width": "auto"})
        self._numbers = NoMathHTML(numbers_html(result))
        self._table = NoMathHTML()
        super().__init__(children=[self._numbers, widgets.HBox([self._show, self._toggle]), self._table], **kwargs)
        self._toggle.observe(lambda _: self._refresh(), names="value")
        self._show.observe(lambda _: self._refresh(), names="value")
        self._refresh()

    @property
    def only_flips(self) -> bool:
        """Whether the table shows only the rows that changed (the "only flips" checkbox)."""
        return self._toggle.value

    @only_flips.setter
    def only_flips(self, value: bool) -> None:
        self._toggle.value = bool(value)

    @property
    def show(self) -> str:
        """Which rows the table shows: "all", "win", "tie" or "loss" (the "show" buttons)."""
        return self._show.value

    @show.setter
    def show(self, value: str) -> None:
        if value not in SHOW:
            raise ValueError(f"show must be one of {SHOW}, not {value!r}")
        self._show.value = value

    def _rows_html(self) -> str:
        return rows_html(self.rows, only_flips=self.only_flips, show=self.show,
                         base=getattr(self.result, "baseline_name", "baseline"),
                         ckpt=getattr(self.result, "checkpoint_name", "checkpoint"))

    def _refresh(self) -> None:
        self._table.value = self._rows_html()
        self._static_changed()

    def summary(self) -> str:
        """The saved notebook's text/plain.

        Returns:
            One line: accuracies, delta, W/T/L and p.
        """
        r = self.result
        return (f"CompareView: {r.baseline_accuracy:.1%} → {r.checkpoint_accuracy:.1%} ({r.delta:+.1%}), "
                f"W/T/L {r.wins}/{r.ties}/{r.losses}, p={r.p_value:.3g}")

    def static_html(self) -> str:
        """The view as it stands, for the saved notebook and HTML exports.

        Returns:
            The numbers, then the table (only the flips when the checkbox is on).
        """
        return (f'<div class="mnb-compare" style="font-family:system-ui,sans-serif;font-size:13px;'
                f'color:{FG};background:{BG}">'
                f'{numbers_html(self.result)}{self._rows_html()}</div>')
