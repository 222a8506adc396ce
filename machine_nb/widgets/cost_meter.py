"""CostMeter: what a training run (and an eval) will cost, updated as the data, model or epochs change.

A view over `machine_nb.estimate_cost` / `estimate_eval_cost` (pricing.py decides prices and
counts tokens through tokens.py); this file caches the per-model token counts so that moving the
epochs slider does not re-render the data, counts in a worker thread so the kernel stays free
(a model's tokenizer may have to be fetched), drops a count that finishes after the user chose
another model, and turns the total red past `max_usd`. Its history sets the runs it is handed
(`record`) beside their estimates: what each was estimated to cost before it ran, and what it
cost (tokens actually trained and sampled x price, from the run's log dir).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from ..errors import BudgetExceeded, EngineError, MachineFormatError
from ..core.redact import redacted
from ..core.theme import BG, BORDER, FG, FG_MUTED, GREEN, ORANGE, RED, text_colour
from ._base import FollowsPicker, NoMathHTML, StaticFallback, escape

if TYPE_CHECKING:
    import pandas as pd

# Seconds the constructor waits for the first count before showing "computing…": long enough for
# any offline count of a notebook-sized file, so an executed notebook or report shows the numbers;
# short enough that a slow tokenizer does not hold the cell.
FIRST_WAIT_S = 5.0
CANNOT_PRICE = "cannot price training"
#: Columns of `CostMeter.history`.
HISTORY_COLUMNS = ["run", "model", "engine", "steps", "estimated_tokens", "tokens", "estimated_usd", "cost_usd",
                   "eval_cost_usd", "log_dir"]


def history_rows(item: Any) -> list[dict]:
    """History entries for a TrainResult, a log dir, or a sweep frame (one per run that has a log).

    Args:
        item: a TrainResult (as sft returns it), a log dir path, or a DataFrame with a `log_dir`
            column (what `machine_nb.sweep` returns).

    Returns:
        Dicts with HISTORY_COLUMNS: estimated_* as recorded before the run, tokens / cost_usd
        observed (tokens actually trained, and the held-out evals' sampling, x price; None when a
        price is unknown).
    """
    from ..training.runlog import TrainResult, read_training_log

    if hasattr(item, "columns") and "log_dir" in getattr(item, "columns", ()):
        status = item["status"] if "status" in item.columns else None
        dirs = [d for i, d in enumerate(item["log_dir"])
                if status is None or status.iloc[i] in ("ran", "resumed", "read back")]
        return [row for d in dirs for row in history_rows(d)]
    result = item if isinstance(item, TrainResult) else read_training_log(item)
    return [{"run": Path(result.log_dir).name, "model": result.model, "engine": result.engine, "steps": result.steps,
             "estimated_tokens": result.estimated_tokens, "tokens": result.tokens,
             "estimated_usd": result.estimated_usd, "cost_usd": result.cost_usd,
             "eval_cost_usd": result.eval_cost_usd, "log_dir": result.log_dir}]


def model_choices(model: str | None = None) -> list[str]:
    """The models the dropdown offers.

    Args:
        model: a model to offer too (default None).

    Returns:
        `model` (when not listed otherwise), the local engine's default, then every priced model.
    """
    from ..engines import DEFAULT_LOCAL_MODEL
    from ..checks.pricing import PRICES

    names = [DEFAULT_LOCAL_MODEL, *sorted(PRICES)]
    if model and model not in names:
        names.insert(0, model)
    return names


def model_label(model: str) -> str:
    """The dropdown's text for a model.

    Args:
        model: a model name.

    Returns:
        The name, with " (cannot price training)" when no training price is known for it.
    """
    from ..checks.pricing import price_for

    price = price_for(model, strict=False)
    return model if price is not None and price.train is not None else f"{model} ({CANNOT_PRICE})"


def _as_rows(data: Any) -> Any:
    """A path stays a path (streamed by the estimator); a runs DataFrame becomes training lines;
    a DataFrame of lines becomes its records; a list of lines is used as it is."""
    if data is None or isinstance(data, (str, os.PathLike)):
        return data
    if hasattr(data, "columns") and hasattr(data, "to_dict"):
        if "messages" in data.columns:
            return data.to_dict("records")
        if not len(data):
            return []
        from .. import training_lines

        return training_lines(data)
    return list(data)


def in_kernel() -> bool:
    from ..core.progress import in_kernel

    return in_kernel()


def _quiet_worker_estimates() -> None:
    """A count in the meter's worker thread has no user line above it, so its TokenEstimateWarning
    would name threading.py (once per count) in the log console; the meter shows that note itself.
    One filter, for warnings located in threading.py only: counts called from user code still warn."""
    import warnings

    from ..checks.tokens import TokenEstimateWarning

    warnings.filterwarnings("ignore", category=TokenEstimateWarning, module=r"threading\Z")


class CostMeter(FollowsPicker, StaticFallback, widgets.VBox):
    """Tokens, trained tokens, steps and USD for training (and an eval), with the price row used.

    Args:
        data: the training lines: a chat JSONL path, a list of lines, a DataFrame of lines, a
            runs DataFrame (through `machine_nb.training_lines`), or a RunPicker to follow (its
            picked runs; see `link`).
        model: the base model to price. Default "thinkingmachines/Inkling" (the model Machine's
            whole-run export targets and one with a known training price).
        epochs: passes over the data. Default 1, the cookbook's.
        batch_size: rows per optimizer step. Default 8, the minimal-SFT example's.
        max_steps: stop after this many steps, as `sft(max_steps=)` does. Default None: no cap.
        eval_data: eval rows (path or rows) to price an eval too. Default None: no eval line.
        max_usd: USD limit for training + eval; the meter turns red and says by how much when over,
            and says it cannot check it when a part cannot be priced. Default None: no budget.
        max_tokens: sampled tokens per eval answer, as evaluate() uses. Default 32.
        background: count tokens in a worker thread ("computing…" meanwhile). Default None: in a
            Jupyter kernel yes, elsewhere no (a script gets the numbers when the call returns).
        history: runs to list under the estimate from the start (what `record` takes). Default
            None: none until `record` is called.
        **kwargs: passed to ipywidgets.VBox (layout and the like).

    Raises:
        ValueError: a budget that is not a finite amount, 0 or more, or a schedule the trainers
            refuse (epochs, batch_size or max_steps not a whole number, or below 1), naming it.

    Trained tokens are counted as `machine_nb.sft` trains the rows (its `prepare_data`: step lines
    train their last assistant message, whole runs their flagged ones). The dropdown marks models
    it cannot price. `.estimate` / `.eval_estimate` are the pricing module's CostEstimate /
    EvalCostEstimate (None when a price or the data is missing: `.error` says why, or while
    `.computing`); `.total_usd`, `.over_by`; `.wait()` waits for a running count. `.record(result)`
    adds a finished run to `.history` (estimated vs observed tokens and USD), shown under the estimate.
    """

    def __init__(self, data: Any, model: str = "thinkingmachines/Inkling", epochs: int = 1, batch_size: int = 8,
                 eval_data: Any = None, max_usd: float | None = None, max_tokens: int = 32, *,
                 max_steps: int | None = None, background: bool | None = None, history: Any = None,
                 **kwargs: Any) -> None:
        from ..checks.pricing import check_max_usd, check_schedule
        from .previewer import is_picker

        check_max_usd(max_usd)  # a NaN budget would read "within budget" whatever the cost
        check_schedule(epochs, batch_size, max_steps)  # the slider would price 0 epochs as 1, 2.7 as 2
        picker = data if is_picker(data) else None
        self.data = None if picker is not None else _as_rows(data)
        self.eval_data = _as_rows(eval_data)
        self.batch_size = int(batch_size)
        self.max_steps = None if max_steps is None else int(max_steps)
        self.max_usd = max_usd
        self.max_tokens = int(max_tokens)
        self.background = in_kernel() if background is None else bool(background)
        if self.background:
            _quiet_worker_estimates()
        self.estimate = None
        self.eval_estimate = None
        self.error = ""
        self.eval_error = ""
        self.computing = False
        self._lock = threading.RLock()
        self._generation = 0  # bumped by every request; a result for an older one is dropped
        self._counts: dict[str, Any] = {}  # model -> count_tokens frame of the current data
        self._evals: dict[str, Any] = {}  # model -> EvalCostEstimate or the error text
        self._pending: dict[tuple, Future] = {}
        self._settled = threading.Condition(self._lock)  # notified when a count is filed and when it is priced
        self._prepared: tuple[list[dict], str] | None = None  # the data as sft would train it
        self._history: list[dict] = []
        for item in ([] if history is None else history if isinstance(history, (list, tuple)) else [history]):
            self._history += history_rows(item)
        self._hold = True
        self._model = widgets.Dropdown(options=self._options(model), value=model, description="model",
                                       layout=widgets.Layout(width="460px"))
        self._epochs = widgets.IntSlider(value=int(epochs), min=1, max=max(20, int(epochs)), description="epochs")
        self._out = NoMathHTML()
        super().__init__(children=[widgets.HBox([self._model, self._epochs]), self._out], **kwargs)
        self._model.observe(lambda _: self.recompute(), names="value")
        self._epochs.observe(lambda _: self.recompute(), names="value")
        self._hold = False
        if picker is not None:
            self.link(picker)
        else:
            self.recompute()
        if self.computing:
            self.wait(FIRST_WAIT_S)

    def close(self) -> None:
        """Stop following the picker, drop the counts still running (a worker that finishes later
        draws nothing; `wait()` returns at once) and close the meter with its controls."""
        lock = getattr(self, "_lock", None)  # None: a half-made meter
        if lock is not None:
            with lock:
                self._generation += 1  # a pricing under way for the old one is dropped (_apply)
                self._pending.clear()  # a count that lands finds its future gone (_work)
                self.computing = False
                self._settled.notify_all()
        super().close()

    # inputs
    @staticmethod
    def _options(model: str) -> list[tuple[str, str]]:
        return [(model_label(m), m) for m in model_choices(model)]

    @property
    def model(self) -> str:
        """The model priced (the dropdown's value; setting it adds an unlisted model to the list)."""
        return self._model.value

    @model.setter
    def model(self, value: str) -> None:
        if value not in [v for _, v in self._model.options]:
            self._hold = True
            try:
                self._model.options = self._options(value)
            finally:
                self._hold = False
        if self._model.value == value:
            self.recompute()
        else:
            self._model.value = value

    @property
    def epochs(self) -> int:
        """Passes over the data (the slider's value)."""
        return self._epochs.value

    @epochs.setter
    def epochs(self, value: int) -> None:
        from ..checks.pricing import check_schedule

        check_schedule(value, self.batch_size, self.max_steps)
        self._epochs.max = max(self._epochs.max, int(value))
        self._epochs.value = int(value)

    def update_data(self, data: Any) -> None:
        """Price new training data (e.g. a picker's selection) and redraw.

        Args:
            data: as the constructor takes it (not a picker).
        """
        with self._lock:
            self.data = _as_rows(data)
            self._counts.clear()
            self._pending = {k: f for k, f in self._pending.items() if k[0] != "train"}
            self._prepared = None
        self.recompute()

    def link(self, picker: Any) -> Any:
        """Follow a RunPicker: each change of its selection re-prices `picker.selected`; `unlink()`
        (or closing the meter) stops following.

        Args:
            picker: the RunPicker (through its `observe_selection`).

        Returns:
            The handler it registered.
        """
        self.unlink()
        self.picker = picker
        self._picker_handler = picker.observe_selection(self.update_data)
        self.update_data(picker.selected)
        return self._picker_handler

    # history
    def record(self, run: Any) -> "CostMeter":
        """Add finished runs to the history and redraw.

        Each entry sets the run's estimate (made before it started) beside what it cost: tokens
        actually trained (and sampled by held-out evals) x price.

        Args:
            run: a TrainResult, a log dir, or a sweep frame (one entry per run that has a log).

        Returns:
            The meter.
        """
        rows = history_rows(run)
        with self._lock:
            self._history += rows
        self._redraw()
        return self

    @property
    def history(self) -> "pd.DataFrame":
        """The recorded runs as a DataFrame (HISTORY_COLUMNS), oldest first."""
        import pandas as pd

        with self._lock:
            return pd.DataFrame(list(self._history), columns=HISTORY_COLUMNS)

    def _history_html(self) -> str:
        from ..checks.pricing import usd_text

        with self._lock:
            rows = list(self._history)
        if not rows:
            return ""

        def usd(v: Any) -> str:
            return "unknown" if v is None else usd_text(v)

        def toks(v: Any) -> str:
            return "–" if v is None else f"{v:,}"

        cell = "padding:1px 10px 1px 0;white-space:nowrap"
        head = "".join(f'<th style="{cell};text-align:left;color:{FG_MUTED};font-weight:normal">{h}</th>'
                       for h in ("run", "steps", "tokens: estimated → observed", "USD: estimated → observed"))
        body = "".join(
            f'<tr><td style="{cell}">{escape(r["run"])}</td><td style="{cell}">{r["steps"]}</td>'
            f'<td style="{cell}">{toks(r["estimated_tokens"])} → {toks(r["tokens"])}</td>'
            f'<td style="{cell}">{usd(r["estimated_usd"])} → <b>{usd(r["cost_usd"])}</b></td></tr>' for r in rows)
        observed = [r["cost_usd"] for r in rows]
        total = "unknown" if any(v is None for v in observed) else usd_text(sum(observed))
        return (f'<div class="mnb-cost-history" style="margin-top:6px"><b>history</b> ({len(rows)} run(s), '
                f'observed {total})<table>{head}{body}</table></div>')

    # numbers
    def _has_data(self) -> bool:
        return self.data is not None and (not isinstance(self.data, list) or bool(self.data))

    def _count(self, model: str) -> Any:
        """Training token counts of the current data for `model` (runs in the worker when background)."""
        from ..checks.tokens import count_tokens
        from ..core.chat import prepare_data

        with self._lock:
            data, prepared = self.data, self._prepared
        if prepared is None:
            # trained tokens as sft trains them: its own row preparation and train_on_what
            prepared = prepare_data(data)
            with self._lock:
                if data is self.data:
                    self._prepared = prepared
        rows, mode = prepared
        return count_tokens(rows, model, train_on_what=mode)

    def _eval(self, model: str) -> Any:
        from ..checks.pricing import estimate_eval_cost

        return estimate_eval_cost(self.eval_data, model, max_tokens=self.max_tokens)

    def _needs(self, model: str) -> list[tuple]:
        """The counts the current numbers still need: ("train", model) / ("eval", model)."""
        out = []
        if self._has_data() and model not in self._counts:
            out.append(("train", model))
        if self.eval_data is not None and model not in self._evals:
            out.append(("eval", model))
        return out

    def _run(self, key: tuple) -> Any:
        kind, model = key
        try:
            return self._count(model) if kind == "train" else self._eval(model)
        except (BudgetExceeded, EngineError, ValueError, MachineFormatError) as exc:
            return exc  # unknown price, no tokenizer, bad row: shown, not raised in a thread

    def _store(self, key: tuple, value: Any) -> None:
        kind, model = key
        (self._counts if kind == "train" else self._evals)[model] = value

    def recompute(self) -> None:
        """Re-estimate training (and eval) cost for the current data, model and epochs.

        Counts already made for the model are reused at once; missing ones run in the worker
        thread when `background` (the meter shows "computing…" until they are in)."""
        if self._hold:
            return
        with self._lock:
            self._generation += 1
            generation, model = self._generation, self.model
            needs = self._needs(model)
            if needs and self.background:
                self.computing = True
                self.estimate = self.eval_estimate = None
                self.error = self.eval_error = ""
                for key in needs:
                    if key not in self._pending:
                        # a thread per count: a slow one (a tokenizer being fetched) must not
                        # hold the count of the model chosen after it
                        future: Future = Future()
                        self._pending[key] = future
                        threading.Thread(target=self._work, args=(key, future), daemon=True,
                                         name=f"CostMeter {key[0]} {key[1]}").start()
            else:
                for key in needs:
                    self._store(key, self._run(key))
        if needs and self.background:
            self._redraw()
        else:
            self._apply(generation)

    def _work(self, key: tuple, future: Future) -> None:
        value = self._run(key)
        try:
            with self._lock:
                if self._pending.get(key) is not future:
                    return  # the data changed while it counted: this count is of old data
                del self._pending[key]
                self._store(key, value)
                generation, ready = self._generation, not self._needs(self.model)
            if ready:
                self._apply(generation)  # dropped inside when the choice changed meanwhile
        finally:
            future.set_result(value)
            with self._settled:
                self._settled.notify_all()

    def _apply(self, generation: int) -> None:
        """Price the counts in hand for the current choice (dropped when a newer request came)."""
        from ..checks.pricing import estimate_cost

        with self._lock:
            if generation != self._generation:
                return
            model = self.model
            estimate = eval_estimate = None
            error = eval_error = ""
            counts = self._counts.get(model)
            if self._has_data():
                if isinstance(counts, Exception):
                    error = redacted(str(counts))  # a count's error may quote a row
                else:
                    try:
                        estimate = estimate_cost(self.data, model, self.epochs, self.batch_size,
                                                 max_steps=self.max_steps, counts=counts)
                    except (BudgetExceeded, EngineError, ValueError) as exc:  # no training price
                        error = redacted(str(exc))
            ev = self._evals.get(model)
            if isinstance(ev, Exception):
                eval_error = redacted(str(ev))
            else:
                eval_estimate = ev
            self.estimate, self.eval_estimate = estimate, eval_estimate
            self.error, self.eval_error = error, eval_error
            self.computing = False
            self._settled.notify_all()  # wait() returns with the estimate in
        self._redraw()

    def _redraw(self) -> None:
        self._out.value = self.static_html()
        self._static_changed()

    def wait(self, timeout: float | None = None) -> CostMeter:
        """Wait for the counts the current choice needs, and for their estimate (`.computing` false).

        Args:
            timeout: seconds at most (default None: as long as it takes).

        Returns:
            The meter.
        """
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        with self._settled:
            # a count is filed, then priced a moment later (_apply): done once the meter stops computing
            while self.computing or (self._needs(self.model) and self._pending):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._settled.wait(left)
        return self

    @property
    def unpriced(self) -> list[str]:
        """The parts asked for that cannot be priced: "training" and/or "eval" (empty while computing)."""
        if self.computing:
            return []
        out = []
        if self._has_data() and self.estimate is None:
            out.append("training")
        if self.eval_data is not None and self.eval_estimate is None:
            out.append("eval")
        return out

    @property
    def total_usd(self) -> float | None:
        """Training + eval USD; None while computing or when any part asked for cannot be priced."""
        parts = [e.usd for e in (self.estimate, self.eval_estimate) if e is not None]
        if self.computing or self.unpriced or not parts:
            return None
        return sum(parts)

    @property
    def over_by(self) -> float:
        """USD over `max_usd` (0.0 when within it, with no budget, or when it cannot be priced)."""
        if self.max_usd is None or self.total_usd is None:
            return 0.0
        return max(0.0, self.total_usd - float(self.max_usd))

    def warnings(self) -> list[str]:
        """What would make this run train nothing.

        Returns:
            Sentences for 0 steps (fewer rows than a batch) and 0 trained tokens; [] when neither.
        """
        e, out = self.estimate, []
        if e is None:
            return out
        if e.steps == 0:
            from ..checks.pricing import no_full_batch

            out.append(no_full_batch(e.rows, e.batch_size))
        if e.rows and e.trained_tokens == 0:
            out.append("0 trained tokens: no message carries loss weight, so the loss would be flat.")
        return out

    def summary(self) -> str:
        """The meter in one line: tokens, steps, USD, the budget and the recorded runs.

        Returns:
            The line (also the text/plain of a saved notebook).
        """
        from ..checks.pricing import usd_text

        with self._lock:
            recorded = list(self._history)
        text = self._summary()
        if recorded:
            observed = [r["cost_usd"] for r in recorded]
            total = "unknown" if any(v is None for v in observed) else usd_text(sum(observed))
            text += f" · {len(recorded)} run(s) recorded, observed {total}"
        return text

    def _summary(self) -> str:
        from ..checks.pricing import usd_text

        head = f"CostMeter: {self.model} × {self.epochs} epoch(s)"
        if self.computing:
            return f"{head}: computing…"
        if self.estimate is None and self.eval_estimate is None:
            why = self.error or self.eval_error or "no data"
            return f"CostMeter: {self.model}: no estimate ({'cannot price: ' if self.unpriced else ''}{why})"
        e = self.estimate
        train = (f"{e.tokens:,} tokens, {e.trained_tokens:,} trained, {e.steps} steps, {usd_text(e.usd)} training"
                 if e is not None else ("cannot price training" if "training" in self.unpriced else "no training data"))
        ev = f", ≤ {usd_text(self.eval_estimate.usd)} eval" if self.eval_estimate is not None else ""
        if "eval" in self.unpriced:
            ev = ", cannot price the eval"
        over = f" · over budget by {usd_text(self.over_by)}" if self.over_by > 0 else ""
        return f"{head}: {train}{ev}{over}"

    def static_html(self) -> str:
        """The meter as self-contained HTML (the saved notebook's copy).

        Returns:
            The HTML.
        """
        from ..checks.pricing import usd_text

        e, ev = self.estimate, self.eval_estimate
        rows = []
        if self.computing:
            rows.append(("status", f'<i class="mnb-computing">computing… (counting tokens for '
                                   f'{escape(self.model)})</i>'))
        if e is not None:
            kind = "exact" if e.exact else "estimated"
            cap = f", max {self.max_steps} steps" if self.max_steps is not None else ""
            rows += [("rows", f"{e.rows:,}"), ("tokens (one epoch)", f"{e.tokens:,} ({kind})"),
                     ("trained tokens", f"{e.trained_tokens:,}{'' if e.exact else ' (estimated)'}"),
                     ("steps", f"{e.steps:,} ({e.epochs} epoch(s) at batch {e.batch_size}{cap})"),
                     ("training", usd_text(e.usd))]
        elif "training" in self.unpriced:
            rows.append(("training", f'<b style="color:{text_colour(RED)}">cannot price</b>'))
        if ev is not None:
            rows += [("eval", f"≤ {usd_text(ev.usd)} ({ev.rows} rows, {ev.prompt_tokens:,} prompt tokens, "
                              f"≤ {ev.max_output_tokens:,} output tokens)")]
        elif "eval" in self.unpriced:
            rows.append(("eval", f'<b style="color:{text_colour(RED)}">cannot price</b>'))
        total = self.total_usd
        if total is not None:
            colour = text_colour(RED) if self.over_by > 0 else (text_colour(GREEN) if self.max_usd is not None else FG)
            rows.append(("total", f'<b style="color:{colour}">{usd_text(total)}</b>'))
        if self.max_usd is not None:
            if self.computing:
                verdict = "checked once the counts are in"
            elif total is None:
                verdict = (f'<b style="color:{text_colour(ORANGE)}" class="mnb-cannot-price">cannot price '
                           f'{" and ".join(self.unpriced) or "it"}, so the budget cannot be checked</b>')
            elif self.over_by > 0:
                verdict = (f'<b style="color:{text_colour(RED)}" class="mnb-over-budget">over budget by '
                           f'{usd_text(self.over_by)}</b>')
            else:
                verdict = f'<span style="color:{text_colour(GREEN)}">within budget</span>'
            rows.append(("budget", f"{usd_text(float(self.max_usd), None)} · {verdict}"))
        price = (e or ev).price if (e or ev) is not None else None
        if price is not None:
            f = lambda v: "?" if v is None else f"{v:g}"  # noqa: E731
            rows.append(("price ($/M tokens)", f"train {f(price.train)} · prefill {f(price.prefill)} · "
                                             f"sample {f(price.sample)}"))
            rows.append(("price source", f"{escape(price.source)}{' · ' + escape(price.date) if price.date else ''}"))
        note = (e.note if e is not None else "") or ""
        if e is not None and e.steps == 0:  # its sentence stands among the warnings
            from ..checks.pricing import no_full_batch

            note = note.replace(no_full_batch(e.rows, e.batch_size), "").strip()
        body = "".join(f'<tr><td style="padding:1px 10px 1px 0;color:{FG_MUTED};white-space:nowrap;'
                       f'vertical-align:top">{k}</td><td>{v}</td></tr>' for k, v in rows)
        errors = [x for x in (self.error, self.eval_error) if x] + self.warnings()
        err = "".join(f'<div class="mnb-cost-warning" style="color:{text_colour(RED)}">{escape(w)}</div>'
                      for w in errors)
        border = text_colour(RED) if self.over_by > 0 else BORDER
        return (f'<div class="mnb-cost-meter" style="border:2px solid {border};border-radius:6px;padding:6px 10px;'
                f'font-family:system-ui,sans-serif;font-size:13px;color:{FG};background:{BG}">'
                f'<b>{escape(self.model)}</b> × {self.epochs} epoch(s)<table>{body}</table>{err}'
                f'{"<small>" + escape(note) + "</small>" if note else ""}{self._history_html()}</div>')
