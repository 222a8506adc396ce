"""CostMeter: what a training run (and an eval) will cost, updated as the data, model or epochs change.

A view over `machine_nb.estimate_cost` / `estimate_eval_cost` (pricing.py decides prices and
counts tokens through tokens.py); this file only caches the per-model token counts so that moving
the epochs slider does not re-render the data, and turns the total red past a budget.
"""

from __future__ import annotations

import os
from typing import Any

import ipywidgets as widgets

from ..errors import BudgetExceeded, EngineError
from ._base import StaticFallback, escape

RED, GREEN = "#dc2626", "#059669"


def model_choices(model: str | None = None) -> list[str]:
    """The models the dropdown offers: the local engine's default, every priced model, and `model`."""
    from ..engines.local import DEFAULT_MODEL
    from ..pricing import PRICES

    names = [DEFAULT_MODEL, *sorted(PRICES)]
    if model and model not in names:
        names.insert(0, model)
    return names


def _as_rows(data: Any) -> Any:
    """A path stays a path (streamed by the estimator); a runs DataFrame becomes training lines;
    a DataFrame of lines becomes its records; a list of lines is used as it is."""
    if data is None or isinstance(data, (str, os.PathLike)):
        return data
    if hasattr(data, "columns") and hasattr(data, "to_dict"):
        if "messages" in data.columns:
            return data.to_dict("records")
        from .. import training_lines

        return training_lines(data)
    return list(data)


class CostMeter(StaticFallback, widgets.VBox):
    """Tokens, trained tokens, steps and USD for training (and an eval), with the price row used.

    Args:
        data: the training lines: a chat JSONL path, a list of lines, a DataFrame of lines, or a
            runs DataFrame (through `machine_nb.training_lines`).
        model: the base model to price. Default "thinkingmachines/Inkling" (the model Machine's
            whole-run export targets and one with a known training price).
        epochs: passes over the data. Default 1, the cookbook's.
        batch_size: rows per optimizer step. Default 8, the minimal-SFT example's.
        eval_data: eval rows (path or rows) to price an eval too. Default None: no eval line.
        budget: USD limit for training + eval; the meter turns red and says by how much when over.
            Default None: no budget.
        max_tokens: sampled tokens per eval answer, as evaluate() uses. Default 32.

    Trained tokens are counted as `machine_nb.sft` trains the rows (its `prepare_data`: step lines
    train their last assistant message, whole runs their flagged ones).
    `.estimate` / `.eval_estimate` are the pricing module's CostEstimate / EvalCostEstimate
    (None when a price or tokenizer is missing: `.error` says why); `.total_usd`, `.over_by`.
    """

    def __init__(self, data: Any, model: str = "thinkingmachines/Inkling", epochs: int = 1, batch_size: int = 8,
                 eval_data: Any = None, budget: float | None = None, max_tokens: int = 32, **kwargs: Any):
        self.data = _as_rows(data)
        self.eval_data = _as_rows(eval_data)
        self.batch_size = int(batch_size)
        self.budget = budget
        self.max_tokens = int(max_tokens)
        self.estimate = None
        self.eval_estimate = None
        self.error = ""
        self._counts: dict[str, Any] = {}  # model -> count_tokens frame of the current data
        self._prepared: tuple[list[dict], str] | None = None  # the data as sft would train it
        self._model = widgets.Dropdown(options=model_choices(model), value=model, description="model",
                                       layout=widgets.Layout(width="420px"))
        self._epochs = widgets.IntSlider(value=int(epochs), min=1, max=max(20, int(epochs)), description="epochs")
        self._out = widgets.HTML()
        super().__init__(children=[widgets.HBox([self._model, self._epochs]), self._out], **kwargs)
        self._model.observe(lambda _: self.recompute(), names="value")
        self._epochs.observe(lambda _: self.recompute(), names="value")
        self.recompute()

    # inputs
    @property
    def model(self) -> str:
        """The model priced (the dropdown's value; setting it adds an unlisted model to the list)."""
        return self._model.value

    @model.setter
    def model(self, value: str) -> None:
        if value not in self._model.options:
            self._model.options = model_choices(value)
        self._model.value = value

    @property
    def epochs(self) -> int:
        """Passes over the data (the slider's value)."""
        return self._epochs.value

    @epochs.setter
    def epochs(self, value: int) -> None:
        self._epochs.max = max(self._epochs.max, int(value))
        self._epochs.value = int(value)

    def update_data(self, data: Any) -> None:
        """Price new training data (e.g. a picker's selection) and redraw."""
        self.data = _as_rows(data)
        self._counts.clear()
        self._prepared = None
        self.recompute()

    def link(self, picker: Any) -> Any:
        """Follow a RunPicker: each change of its selection re-prices `picker.selected`. Returns the handler."""
        def handler(_change: Any) -> None:
            self.update_data(picker.selected)

        picker.observe(handler, names="selected_ids")
        handler(None)
        return handler

    # numbers
    def recompute(self) -> None:
        """Re-estimate training (and eval) cost for the current data, model and epochs."""
        from ..pricing import estimate_cost, estimate_eval_cost
        from ..tokens import count_tokens
        from ..train import prepare_data

        self.estimate = self.eval_estimate = None
        self.error = ""
        model = self.model
        try:
            if self.data is not None and (not isinstance(self.data, list) or self.data):
                if model not in self._counts:
                    # trained tokens as sft trains them: its own row preparation and train_on_what
                    # (step lines: the last assistant message; whole runs: the flagged ones)
                    if self._prepared is None:
                        self._prepared = prepare_data(self.data)
                    rows, mode = self._prepared
                    self._counts[model] = count_tokens(rows, model, train_on_what=mode)
                self.estimate = estimate_cost(self.data, model, self.epochs, self.batch_size,
                                              counts=self._counts[model])
            if self.eval_data is not None:
                self.eval_estimate = estimate_eval_cost(self.eval_data, model, max_tokens=self.max_tokens)
        except (BudgetExceeded, EngineError, ValueError) as exc:  # unknown price, no tokenizer, bad row
            self.error = str(exc)
        self._out.value = self.static_html()

    @property
    def total_usd(self) -> float | None:
        """Training + eval USD (None when neither could be priced)."""
        parts = [e.usd for e in (self.estimate, self.eval_estimate) if e is not None]
        return sum(parts) if parts else None

    @property
    def over_by(self) -> float:
        """USD over the budget (0.0 when within it or with no budget)."""
        if self.budget is None or self.total_usd is None:
            return 0.0
        return max(0.0, self.total_usd - float(self.budget))

    def warnings(self) -> list[str]:
        """What would make this run train nothing: 0 steps (fewer rows than a batch) or 0 trained tokens."""
        e, out = self.estimate, []
        if e is None:
            return out
        if e.steps == 0:
            out.append(f"0 steps: {e.rows} rows is fewer than one batch of {e.batch_size} (the cookbook drops "
                       "the partial batch), so nothing would be trained; lower batch_size or add rows.")
        if e.rows and e.trained_tokens == 0:
            out.append("0 trained tokens: no message carries loss weight, so the loss would be flat.")
        return out

    def summary(self) -> str:
        if self.total_usd is None:
            return f"CostMeter: {self.model}: no estimate ({self.error or 'no data'})"
        e = self.estimate
        train = (f"{e.tokens:,} tokens, {e.trained_tokens:,} trained, {e.steps} steps, ${e.usd:.4f} training"
                 if e is not None else "no training data")
        ev = f", ≤ ${self.eval_estimate.usd:.4f} eval" if self.eval_estimate is not None else ""
        over = f" · over budget by ${self.over_by:.2f}" if self.over_by > 0 else ""
        return f"CostMeter: {self.model} × {self.epochs} epoch(s): {train}{ev}{over}"

    def static_html(self) -> str:
        e, ev = self.estimate, self.eval_estimate
        rows = []
        if e is not None:
            kind = "exact" if e.exact else "estimated"
            rows += [("rows", f"{e.rows:,}"), ("tokens (one epoch)", f"{e.tokens:,} ({kind})"),
                     ("trained tokens", f"{e.trained_tokens:,}"),
                     ("steps", f"{e.steps:,} ({e.epochs} epoch(s) at batch {e.batch_size})"),
                     ("training", f"${e.usd:.4f}")]
        if ev is not None:
            rows += [("eval", f"≤ ${ev.usd:.4f} ({ev.rows} rows, {ev.prompt_tokens:,} prompt tokens, "
                              f"≤ {ev.max_output_tokens:,} output tokens)")]
        total = self.total_usd
        colour = RED if self.over_by > 0 else (GREEN if self.budget is not None else "#111")
        if total is not None:
            rows.append(("total", f'<b style="color:{colour}">${total:.4f}</b>'))
        if self.budget is not None:
            verdict = (f'<b style="color:{RED}" class="mnb-over-budget">over budget by ${self.over_by:.2f}</b>'
                       if self.over_by > 0 else f'<span style="color:{GREEN}">within budget</span>')
            rows.append(("budget", f"${float(self.budget):.2f} · {verdict}"))
        price = (e or ev).price if (e or ev) is not None else None
        if price is not None:
            f = lambda v: "?" if v is None else f"{v:g}"  # noqa: E731
            rows.append(("price ($/M tokens)", f"train {f(price.train)} · prefill {f(price.prefill)} · "
                                             f"sample {f(price.sample)}"))
            rows.append(("price source", f"{escape(price.source)}{' · ' + escape(price.date) if price.date else ''}"))
        note = (e.note if e is not None else "") or ""
        body = "".join(f'<tr><td style="padding:1px 10px 1px 0;color:#4b5563;white-space:nowrap;vertical-align:top">{k}</td><td>{v}</td></tr>'
                       for k, v in rows)
        err = "".join(f'<div class="mnb-cost-warning" style="color:{RED}">{escape(w)}</div>'
                      for w in ([self.error] if self.error else []) + self.warnings())
        border = RED if self.over_by > 0 else "#d1d5db"
        return (f'<div class="mnb-cost-meter" style="border:2px solid {border};border-radius:6px;padding:6px 10px;'
                f'font-family:system-ui,sans-serif;font-size:13px"><b>{escape(self.model)}</b> × {self.epochs} '
                f'epoch(s)<table>{body}</table>{err}'
                f'{"<small>" + escape(note) + "</small>" if note else ""}</div>')
