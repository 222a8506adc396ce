"""LossPlot: training (and eval) loss per step from tinker-cookbook log dirs, live while a run writes.

Reads each log dir's `metrics.jsonl` (one row per step) and draws loss with an EMA whose meaning
is written on the plot, several runs overlaid, learning rate on a second axis. The loss is the
supervised `train_mean_nll`, or `dpo_loss` for the cookbook's DPO runs. Below it, on axes of their
own when the runs log them: held-out accuracy and format rate (`sft(eval_data=…)`'s
`test/accuracy`, `test/format_rate`) with each Inspect task's accuracy (`inspect_tasks=…`'s
`test/inspect/<task>/accuracy`), and DPO's preference `accuracy` and `margin`. Handed to
`sft(on_metrics=plot.update)` its data (`.frame`, the summary line) moves in the same poll as the
progress bar, so the two never disagree; the picture is redrawn at most every REDRAW_EVERY_S, and
no sooner than REDRAW_COST_RATIO times the last drawing's duration after it, the steps in between
drawn together once that has passed (a PNG per step, at the local engine's pace of several steps a
second, would take the CPU the training needs; on a busy machine each drawing takes longer, and
drawing keeps to a fixed share of the time). Otherwise (a run started
elsewhere) a daemon thread polls the files' size and mtime so the kernel stays free; it stops at
the run's "final" row in `checkpoints.jsonl` or on `.stop()`. The PNG is also the static fallback
kept in saved notebooks, brought up to date as the run goes (at most every STATIC_EVERY_S) and
when it ends.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import ipywidgets as widgets

from ..training.runlog import DPO_LOSS, HELDOUT_ACCURACY, HELDOUT_FORMAT_RATE, SFT_LOSS, inspect_accuracy_task
from ..core.theme import RED, text_colour
from ._base import NoMathHTML, StaticPlot, escape

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

LOSS = SFT_LOSS
HELDOUT = ((HELDOUT_ACCURACY, "o-", "held-out accuracy"), (HELDOUT_FORMAT_RATE, "s:", "format rate"))
DPO_ACCURACY, DPO_MARGIN = "accuracy", "margin"
#: The line styles of the Inspect tasks' accuracies in the held-out panel, one per task (the runs'
#: colours are the loss legend's).
INSPECT_STYLES = ("^-.", "v:", "D-.", "x:")


def inspect_columns(frame: "pd.DataFrame") -> list[tuple[str, str]]:
    """(column, task) of every Inspect task's accuracy the frame holds (`test/inspect/<task>/accuracy`,
    logged by sft/dpo(inspect_tasks=…)), in column order."""
    return [(c, inspect_accuracy_task(c)) for c in frame.columns
            if inspect_accuracy_task(c) is not None and frame[c].notna().any()]
# Seconds between updates of the saved notebook's copy of the plot while a run goes: each sends
# the PNG again (~40 KB), the live image already shows every step.
STATIC_EVERY_S = 2.0
# Seconds between redraws of the picture while `update` is fed faster than this: later steps wait
# for the next redraw, which comes when this has passed even if no step follows.
REDRAW_EVERY_S = 0.5
# The least time between redraws as a multiple of the last drawing's duration: drawing takes at most
# 1 / (1 + this) of the time while `update` is fed, however slow the machine makes each drawing.
REDRAW_COST_RATIO = 4


def _as_dirs(log_dirs: Any) -> list[Path]:
    """Log dirs from a path, a list of paths, a frame with a `log_dir` column (a sweep's: its runs
    that have one) or a result with a `log_dir` (sft's TrainResult). A frame iterates over its
    column names, so one without `log_dir` is refused rather than read as dirs of those names."""
    if isinstance(log_dirs, (str, os.PathLike)):
        return [Path(log_dirs)]
    if hasattr(log_dirs, "columns"):
        if "log_dir" not in log_dirs.columns:
            raise ValueError("a frame of runs needs a log_dir column (what machine_nb.sweep returns); got the "
                             f"columns {', '.join(map(str, log_dirs.columns))}")
        return [Path(d) for d in log_dirs["log_dir"] if isinstance(d, (str, os.PathLike))]
    if isinstance(getattr(log_dirs, "log_dir", None), (str, os.PathLike)):
        return [Path(log_dirs.log_dir)]
    return [Path(d) for d in log_dirs]


def read_metrics(log_dirs: Any) -> "pd.DataFrame":
    """The metrics of one or several log dirs as one DataFrame.

    Args:
        log_dirs: a log dir, a list of them, a frame with a `log_dir` column (what `machine_nb.sweep`
            returns) or a result with a `log_dir` (what `machine_nb.sft` returns).

    Returns:
        `machine_nb.training_metrics`'s frame (one row per step, a partial last line skipped, any
        other bad line skipped with a warning), with `run` the log dir's name, or its path when
        two dirs share a name.

    Raises:
        ValueError: a frame without a `log_dir` column.
    """
    import pandas as pd

    from ..training.runlog import training_metrics

    dirs = _as_dirs(log_dirs)
    names = [d.name for d in dirs]
    frames = []
    for d in dirs:
        df = training_metrics(d)
        if len(df):
            frames.append(df.assign(run=d.name if names.count(d.name) == 1 else str(d)))
    if not frames:
        return training_metrics([])
    return _numbers(pd.concat(frames, ignore_index=True))


def _numbers(frame: "pd.DataFrame") -> "pd.DataFrame":
    """The frame with every column the plot draws as numbers: a value written as text ("nan",
    "n/a") is missing, a gap in its line, as a JSON NaN is (a column of text would make
    matplotlib read the axis as categories and refuse the numbers beside it)."""
    import pandas as pd

    drawn = {"step", LOSS, DPO_LOSS, "learning_rate", DPO_ACCURACY, DPO_MARGIN, *(c for c, _, _ in HELDOUT),
             *eval_loss_columns(frame), *(c for c in frame.columns if inspect_accuracy_task(c) is not None)}
    for col in drawn:
        if col in frame.columns and not pd.api.types.is_numeric_dtype(frame[col]):
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def ema(values: Iterable[float], weight: float = 0.6) -> list[float]:
    """Debiased exponential moving average, as TensorBoard smooths.

    s_t = w·s_{t-1} + (1−w)·x_t, divided by (1 − w^t) so early points are not pulled toward 0.

    Args:
        values: the raw values (None, NaN and ±inf give NaN and are skipped: one diverged step
            would otherwise make every later smoothed value infinite, a line that stops there).
        weight: the share kept from the previous smoothed value (default 0.6; 0 = raw, near 1 = flat).

    Returns:
        The smoothed values, one per input.

    Raises:
        ValueError: a weight outside [0, 1) (at 1 nothing moves and the debiasing divides by 0).
    """
    import math

    if not 0 <= weight < 1:
        raise ValueError(f"the EMA weight must be 0 or more and below 1, got {weight!r}")
    out, s, n = [], 0.0, 0
    for x in values:
        if x is None or not math.isfinite(x):
            out.append(float("nan"))
            continue
        n += 1
        s = weight * s + (1 - weight) * float(x)
        out.append(s / (1 - weight ** n) if weight > 0 else float(x))
    return out


def loss_column(frame: "pd.DataFrame") -> str:
    """The loss the runs in a metrics frame log (runlog.loss_metric's rule, on a frame).

    Args:
        frame: a `read_metrics` frame.

    Returns:
        `train_mean_nll` when any row has it, else `dpo_loss` when any has that (DPO), else `train_mean_nll`.
    """
    for col in (LOSS, DPO_LOSS):
        if col in frame.columns and frame[col].notna().any():
            return col
    return LOSS


def _has(frame: "pd.DataFrame", col: str) -> bool:
    return col in frame.columns and frame[col].notna().any()


def eval_loss_columns(frame: "pd.DataFrame") -> list[str]:
    """The eval-loss columns a metrics frame has.

    Args:
        frame: a `read_metrics` frame.

    Returns:
        Its `test/…nll` and `test/…loss` columns ([] when none).
    """
    return [c for c in frame.columns if str(c).startswith("test/") and (str(c).endswith("nll") or str(c).endswith("loss"))]


def finished(log_dir: str | os.PathLike) -> bool:
    """Whether a run is over.

    Args:
        log_dir: the run's log dir.

    Returns:
        True once it wrote its final checkpoint (a row named "final" in checkpoints.jsonl) and,
        when it scores held-out rows (its run record says so), the final checkpoint's score (a
        "final" line in heldout.jsonl, written after the checkpoint).
    """
    from ..core.jsonl import iter_jsonl
    from ..training.runlog import CHECKPOINTS_FILE, HELDOUT_FILE, read_marker

    log_dir = Path(log_dir)
    path = log_dir / CHECKPOINTS_FILE
    if not path.exists():
        return False
    if not any(isinstance(v, dict) and v.get("name") == "final" for _, v in iter_jsonl(path, on_error="skip")):
        return False
    if not read_marker(log_dir).get("heldout"):  # a broken record reads as none (the run says no more)
        return True
    scores = log_dir / HELDOUT_FILE
    return scores.exists() and any(isinstance(v, dict) and v.get("final")
                                   for _, v in iter_jsonl(scores, on_error="skip"))


def plot_text(text: Any) -> str:
    """A name (a log dir, a setting's value) as matplotlib text that draws it as written.

    Matplotlib reads text between two "$" as TeX: "lr_$1e-3_$2" would not parse (the figure could
    not be drawn) and "$5 to $6" would show in italics. "\\$" is its literal dollar sign.

    Args:
        text: the name (str() is taken).

    Returns:
        The text with each "$" written "\\$".
    """
    return str(text).replace("$", r"\$")


def smoothing_note(weight: float) -> str:
    """The sentence written on the plot saying what the smoothed line is.

    Args:
        weight: the EMA weight.

    Returns:
        The sentence.
    """
    return (f"lines: EMA, weight {weight:g} on the previous smoothed value (debiased); "
            "faint dots: raw loss per step")


def figure(frame: "pd.DataFrame", smoothing: float = 0.6, title: str = "training loss") -> "Figure":
    """Loss per step for every run in a metrics frame, with panels below for held-out accuracy
    (Inspect tasks' included) and DPO's accuracy and margin when the runs log them.

    Args:
        frame: a `read_metrics` frame.
        smoothing: the EMA weight of the loss lines (default 0.6).
        title: the plot's title (default "training loss").

    Returns:
        A matplotlib Figure (Agg, no pyplot state).
    """
    from matplotlib.figure import Figure

    inspect = inspect_columns(frame)
    heldout = any(_has(frame, col) for col, _, _ in HELDOUT) or bool(inspect)
    dpo = _has(frame, DPO_ACCURACY) or _has(frame, DPO_MARGIN)
    panels = 1 + heldout + dpo
    fig = Figure(figsize=(8, 4.2 + 2.0 * (panels - 1)), dpi=100)
    grid = fig.add_gridspec(panels, 1, height_ratios=[2.2] + [1] * (panels - 1), hspace=0.12)
    ax = fig.add_subplot(grid[0])
    acc_ax = fig.add_subplot(grid[1], sharex=ax) if heldout else None
    pref_ax = fig.add_subplot(grid[panels - 1], sharex=ax) if dpo else None
    loss = loss_column(frame)
    ax.set_title(title)
    ax.set_ylabel(f"loss ({loss})")
    (pref_ax or acc_ax or ax).set_xlabel("step")
    for upper in (ax, acc_ax)[:panels - 1]:
        upper.tick_params(labelbottom=False)
    lr_ax = margin_ax = None
    colours = [f"C{i}" for i in range(10)]
    has_data = False
    named: list = []  # the loss panel's lines, in the legend by name (see below)
    for i, (run, df) in enumerate(frame.groupby("run", sort=False)):
        colour = colours[i % len(colours)]
        df = df.sort_values("step") if "step" in df.columns else df
        steps = df["step"] if "step" in df.columns else range(len(df))
        if loss in df.columns and df[loss].notna().any():
            has_data = True
            sel = df[loss].notna()
            ax.scatter(steps[sel], df.loc[sel, loss], s=8, alpha=0.25, color=colour)
            named += ax.plot(list(steps[sel]), ema(df.loc[sel, loss].tolist(), smoothing), color=colour, lw=1.8,
                             label=f"{plot_text(run)} train")
        for col in eval_loss_columns(df):
            sel = df[col].notna()
            if sel.any():
                has_data = True
                named += ax.plot(list(steps[sel]), df.loc[sel, col], "o--", color=colour, ms=4, lw=1,
                                 label=f"{plot_text(run)} eval ({plot_text(col)})")
        if "learning_rate" in df.columns and df["learning_rate"].notna().any():
            if lr_ax is None:
                lr_ax = ax.twinx()
                lr_ax.set_ylabel("learning rate (dotted)")
            sel = df["learning_rate"].notna()
            lr_ax.plot(list(steps[sel]), df.loc[sel, "learning_rate"], ":", color=colour, lw=1, alpha=0.8)
        if acc_ax is not None:
            for col, style, label in HELDOUT:
                if col in df.columns and df[col].notna().any():
                    sel = df[col].notna()
                    # one legend entry per line style: the runs' colours are in the loss legend above
                    acc_ax.plot(list(steps[sel]), df.loc[sel, col], style, color=colour, ms=4, lw=1.2,
                                label=label if i == 0 else None)
            for k, (col, task) in enumerate(inspect):
                if col in df.columns and df[col].notna().any():
                    sel = df[col].notna()
                    acc_ax.plot(list(steps[sel]), df.loc[sel, col], INSPECT_STYLES[k % len(INSPECT_STYLES)],
                                color=colour, ms=4, lw=1.0, label=f"Inspect {plot_text(task)}" if i == 0 else None)
        if pref_ax is not None:
            if DPO_ACCURACY in df.columns and df[DPO_ACCURACY].notna().any():
                sel = df[DPO_ACCURACY].notna()
                pref_ax.plot(list(steps[sel]), df.loc[sel, DPO_ACCURACY], "-", color=colour, lw=1.4,
                             label="preference accuracy" if i == 0 else None)
            if DPO_MARGIN in df.columns and df[DPO_MARGIN].notna().any():
                if margin_ax is None:
                    margin_ax = pref_ax.twinx()
                    margin_ax.set_ylabel("margin (dashed)")
                sel = df[DPO_MARGIN].notna()
                margin_ax.plot(list(steps[sel]), df.loc[sel, DPO_MARGIN], "--", color=colour, lw=1.2)
    if has_data:
        # handed over explicitly: `ax.legend()` leaves out labels starting with "_", its mark for
        # "no label", and a run in a log dir named "_draft" would be drawn but not named
        ax.legend(named, [line.get_label() for line in named], loc="upper right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no metrics logged yet", transform=ax.transAxes, ha="center", color="grey")
    if acc_ax is not None:
        acc_ax.set_ylim(-0.05, 1.05)
        acc_ax.set_ylabel("held-out")
        acc_ax.grid(alpha=0.3)
        acc_ax.legend(loc="lower right", fontsize=7)
    if pref_ax is not None:
        pref_ax.set_ylim(-0.05, 1.05)
        pref_ax.set_ylabel("preference acc.")
        pref_ax.grid(alpha=0.3)
        pref_ax.legend(loc="lower right", fontsize=7)
    fig.text(0.01, 0.01, smoothing_note(smoothing), fontsize=8, color="#444")
    twin = lr_ax is not None or margin_ax is not None
    fig.subplots_adjust(bottom=0.2 / panels + 0.03 * (panels - 1), top=1 - 0.08 / panels, left=0.09,
                        right=0.86 if twin else 0.97)
    return fig


def png_bytes(fig: "Figure") -> bytes:
    """A figure as PNG.

    Args:
        fig: a matplotlib Figure.

    Returns:
        The PNG bytes (Agg backend).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class LossPlot(StaticPlot, widgets.VBox):
    """Loss per step from one or several tinker-cookbook log dirs, updated live while they grow.

    In a notebook cell that trains, display it first and hand its `update` to sft:

        plot = mnb.LossPlot(log_dir)
        display(plot)
        result = mnb.sft(data, log_dir=log_dir, on_metrics=plot.update)
        plot.stop()  # the final curve, also in the saved notebook

    Args:
        log_dirs: a log dir or a list of them (each with metrics.jsonl; several are overlaid), a
            sweep frame (its runs' log dirs) or an sft result.
        smoothing: EMA weight on the previous smoothed value. Default 0.6 (TensorBoard's UI
            default), enough to read a trend in a few dozen steps without hiding it.
        refresh_s: seconds between checks of the files. Default 1.0: a step on the local engine
            takes about a second; a check is two stat() calls.
        live: poll in a background thread until every run wrote its final checkpoint. Default
            True; False draws once (`.refresh()` / `.update()` redraw).
        **kwargs: passed to ipywidgets.VBox (layout and the like).

    Raises:
        ValueError: a smoothing outside [0, 1), a refresh_s not above 0, or a frame without a
            `log_dir` column.

    `.frame` is the metrics DataFrame (see `read_metrics`); `.poll()` checks the files once, as
    the thread does; `.wait()` waits for the thread to end; `.stop()` ends the polling and draws
    the final state. Displaying it again in the same cell updates the one output in place.
    """

    def __init__(self, log_dirs: Any, smoothing: float = 0.6, refresh_s: float = 1.0, live: bool = True,
                 **kwargs: Any) -> None:
        self.log_dirs = _as_dirs(log_dirs)
        self.smoothing = float(smoothing)
        self.refresh_s = float(refresh_s)
        if not 0 <= self.smoothing < 1:
            raise ValueError(f"smoothing must be 0 or more and below 1 (the EMA weight), got {smoothing!r}")
        if not self.refresh_s > 0:  # 0 would poll the files in a loop that takes a core
            raise ValueError(f"refresh_s must be a number of seconds above 0, got {refresh_s!r}")
        seen = self._signature()  # taken before reading, so a write in between is not missed
        self.frame = read_metrics(self.log_dirs)
        self._seen = seen
        self.redraws = 0
        self._png = b""
        self._image = widgets.Image(format="png")
        self._status = NoMathHTML()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._static_at = 0.0  # when the saved notebook's copy was last sent
        self._drawn_at = 0.0  # when the picture was last drawn
        self._draw_s = 0.0  # how long that drawing took
        self._pending: threading.Timer | None = None  # the redraw `update` put off, if any
        self._behind = False  # whether `.frame` holds steps the picture does not show yet
        super().__init__(children=[self._image, self._status], **kwargs)
        self._draw()
        if live and not self.finished():
            self._thread = threading.Thread(target=self._poll, name="LossPlot", daemon=True)
            self._thread.start()

    def finished(self) -> bool:
        """Whether every run is over (see the module's `finished`).

        Returns:
            True when all are.
        """
        return all(finished(d) for d in self.log_dirs)

    @property
    def live(self) -> bool:
        """Whether the background poll is running."""
        return self._thread is not None and self._thread.is_alive()

    def _signature(self) -> tuple:
        sig = []
        for d in self.log_dirs:
            for name in ("metrics.jsonl", "checkpoints.jsonl", "heldout.jsonl"):
                try:
                    st = (d / name).stat()
                    sig.append((st.st_size, st.st_mtime_ns))
                except OSError:
                    sig.append(None)
        return tuple(sig)

    def poll(self) -> bool:
        """Check the log dirs once, as the background thread does every `refresh_s`.

        Redraws when their files changed since the last draw, and draws the final state (also
        into the saved notebook) once every run has finished.

        Returns:
            Whether every run has finished (the thread stops then).
        """
        if self._signature() != self._seen:
            self.refresh()
        if self.finished():
            self.refresh(final=True)
            return True
        return False

    def _poll(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                if self._poll_due():
                    break
            except Exception as exc:  # keep the kernel's thread quiet; show what went wrong
                self._show_error(exc)

    def _poll_due(self) -> bool:
        """The background thread's poll: `poll()` once a redraw is due (as for `update`) or every
        run has finished; until then nothing. Returns whether every run has finished."""
        if self._redraw_wait() > 0 and not self.finished():
            return False
        return self.poll()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the background poll ends: every run finished, or `stop()` was called.

        Args:
            timeout: seconds to wait at most (default None: as long as it takes).

        Returns:
            Whether the poll has ended (False: still live after `timeout`).
        """
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return not self.live

    def stop(self) -> None:
        """Stop the live polling and draw what the files hold now; the saved notebook keeps it."""
        self._end_polling()
        self.refresh(final=True)

    def close(self) -> None:
        """Stop the live polling (and a redraw put off) and close the widget."""
        if getattr(self, "_stop", None) is not None:  # also called from __del__, maybe of a half-made plot
            self._end_polling()
        super().close()

    def _end_polling(self) -> None:
        """End the background poll and cancel a redraw `update` put off."""
        self._stop.set()
        pending = self._pending
        if pending is not None:
            pending.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def update(self, rows: Any = None) -> None:
        """Take in what the log dirs hold now (what `sft(on_metrics=…)` calls): `.frame` and the
        summary line at once, the picture too unless it was drawn less than REDRAW_EVERY_S (or
        REDRAW_COST_RATIO times the last drawing's duration, if longer) ago, then when that has
        passed; and the final state in the saved notebook once every run ended.

        Args:
            rows: the new metrics rows, as sft hands them (default None); they are already on
                disk, so the files are read whole.
        """
        done, seen = self.finished(), self._signature()  # taken before reading, as refresh does
        if not done and seen == self._seen:  # nothing new on disk: nothing to draw
            return
        wait = self._redraw_wait()
        if done or wait <= 0:
            self.refresh(final=done)
            return
        with self._lock:  # the data now, the picture when the wait has passed
            self.frame = read_metrics(self.log_dirs)
            self._seen = seen  # after the frame it describes: `update` compares it without the lock
            self._status.value = escape(self.summary())
            self._behind = True
            if self._pending is None:
                self._pending = self._later(wait, self._redraw_pending)

    def _redraw_wait(self) -> float:
        """Seconds until the picture may be redrawn (0 or less: now): REDRAW_EVERY_S after the last
        drawing, or REDRAW_COST_RATIO times its duration if that is longer."""
        return self._drawn_at + max(REDRAW_EVERY_S, REDRAW_COST_RATIO * self._draw_s) - time.monotonic()

    @staticmethod
    def _later(wait: float, fn: Any) -> threading.Timer:
        timer = threading.Timer(wait, fn)
        timer.daemon = True
        timer.start()
        return timer

    def _redraw_pending(self) -> None:
        with self._lock:
            self._pending = None
            if self._stop.is_set() or not self._behind:  # stop() draws the final state itself
                return
        try:
            self.refresh()
        except Exception as exc:  # keep the kernel's thread quiet; show what went wrong
            self._show_error(exc)

    def _show_error(self, exc: Exception) -> None:
        """What went wrong in a background redraw, in the status line."""
        self._status.value = f'<span style="color:{text_colour(RED)}">{escape(exc)}</span>'

    def refresh(self, final: bool = False) -> None:
        """Re-read the metrics and redraw.

        Args:
            final: also update the saved notebook's copy at once (default False: at most every STATIC_EVERY_S).
        """
        with self._lock:  # the poll thread and a user's call never interleave a redraw
            seen = self._signature()
            self._draw(read_metrics(self.log_dirs), seen)
            if final or time.monotonic() - self._static_at >= STATIC_EVERY_S:
                self._static_at = time.monotonic()
                try:
                    self._static_changed()
                except Exception:  # the kernel or display went away; the live view is all there is
                    pass

    def _draw(self, frame: "pd.DataFrame | None" = None, seen: tuple | None = None) -> None:
        frame = self.frame if frame is None else frame
        started = time.monotonic()
        png = png_bytes(figure(frame, self.smoothing))
        self.redraws += 1
        self._drawn_at, self._behind = time.monotonic(), False
        self._draw_s = self._drawn_at - started
        self.frame, self._png = frame, png  # published together, after the drawing
        if seen is not None:  # the files' signature `frame` was read at, published after it: `update`
            self._seen = seen  # takes an unchanged signature to mean `.frame` holds the files already
        self._image.value = png
        self._status.value = escape(self.summary())

    def summary(self) -> str:
        """The plot in one line: each run's steps, last loss and held-out or preference accuracy.

        Returns:
            The line (also the text/plain of a saved notebook).
        """
        parts = []
        loss_col = loss_column(self.frame)
        for run, df in self.frame.groupby("run", sort=False):
            # the last loss is the latest step's; a row without a step (a hand-edited line) comes first
            df = df.sort_values("step", na_position="first", kind="stable")
            loss = df[loss_col].dropna() if loss_col in df.columns else []
            steps = len(loss) if len(loss) or loss_col in df.columns else len(df)
            last = f", last loss {loss.iloc[-1]:.4g}" if len(loss) else ""
            held = ""
            if HELDOUT[0][0] in df.columns and (df[HELDOUT[0][0]].notna() & df["step"].notna()).any():
                scored = df[df[HELDOUT[0][0]].notna() & df["step"].notna()]
                best = scored.loc[scored[HELDOUT[0][0]].idxmax()]
                held = (f", held-out {scored[HELDOUT[0][0]].iloc[-1]:.1%} at step {int(scored['step'].iloc[-1])}"
                        f" (best {best[HELDOUT[0][0]]:.1%} at step {int(best['step'])})")
            if DPO_ACCURACY in df.columns and df[DPO_ACCURACY].notna().any():
                held += f", preference accuracy {df[DPO_ACCURACY].dropna().iloc[-1]:.1%}"
            parts.append(f"{run}: {steps} steps{last}{held}")
        body = "; ".join(parts) or "no metrics yet"
        return f"LossPlot: {body}"

    def static_html(self) -> str:
        """The plot and its summary as self-contained HTML (the saved notebook's copy).

        Returns:
            The HTML.
        """
        return (f'<div class="mnb-loss-plot">{self._img_html("training loss")}'
                f'<div style="font-size:12px">{escape(self.summary())}</div></div>')
