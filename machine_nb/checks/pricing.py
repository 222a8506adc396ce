"""What a training run or an eval will cost before it runs, and a budget guard that refuses first.

Prices are USD per million tokens, each row with its source and date (Machine's `TINKER_PRICES`
table); token counts come from `tokens.count_tokens` (exact where the
model's renderer works offline). `train.sft`, `preference.dpo` and `evaluate` call `check_budget`
before spending; what sampling cost once it ran is `sample_cost`.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import BudgetExceeded
from .render import base_model, is_local_model
from ..core.theme import escape, no_math

if TYPE_CHECKING:
    import pandas as pd

MACHINE_SOURCE = "Machine TINKER_PRICES table (Tinker models page, full undiscounted price)"
MACHINE_DATE = "2026-10-07"


@dataclass(frozen=True)
class Price:
    """USD per million tokens. None means not known: a cost that needs it cannot be bounded.

    Raises:
        ValueError: a price that is not a finite number, 0 or more (nor None), naming its field.
    """

    prefill: float | None
    cached_prefill: float | None
    sample: float | None
    train: float | None
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        # a NaN would price every run at NaN, which passes every budget; a negative one, below 0
        for name in ("prefill", "cached_prefill", "sample", "train"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"price field {name!r} must be USD per million tokens, a finite number 0 or more "
                                 f"(or None: not known), got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """The price as plain data.

        Returns:
            {prefill, cached_prefill, sample, train, source, date}.
        """
        return asdict(self)


class UnknownPrice(BudgetExceeded):
    """No price is known for the model (or for the part of it a cost needs): the cost cannot be bounded."""


def _machine(prefill: float, cached: float, sample: float, train: float | None = None,
             train_note: str = "") -> Price:
    return Price(prefill, cached, sample, train, MACHINE_SOURCE + train_note, MACHINE_DATE)


_INKLING_TRAIN_NOTE = (
    "; train 11.22 = 2 x the $5.61/M (64K, 50%-discounted) of a public third-party transcription of the "
    "Tinker models page of 2026-10-07, undiscounted like the rest of Machine's table (inferred, unverified)")

# Machine's table has no training prices (its TINKER_TRAIN_PRICES values are not public); only
# those with a public source are filled in, the rest stay None so training refuses to guess.
PRICES: dict[str, Price] = {
    "thinkingmachines/Inkling": _machine(3.74, 0.374, 9.36, 11.22, _INKLING_TRAIN_NOTE),
    "thinkingmachines/Inkling:peft:262144": _machine(7.48, 0.748, 18.72),
    "thinkingmachines/Inkling-Small": _machine(1.16, 0.116, 2.88),
    "thinkingmachines/Inkling-Small:peft:262144": _machine(2.32, 0.232, 5.78),
    "Qwen/Qwen3.8-27B": _machine(1.86, 0.372, 5.595),
    "Qwen/Qwen3.8-27B:peft:262144": _machine(2.48, 0.496, 7.46),
    "Qwen/Qwen3.6-35B-A3B": _machine(0.54, 0.108, 1.335),
    "Qwen/Qwen3.6-27B": _machine(1.86, 0.372, 5.595),
    "Qwen/Qwen3.5-397B-A17B": _machine(3.0, 0.6, 7.5),
    # Not in Machine's table; cached prefill at Qwen's 20% rule.
    "Qwen/Qwen3-8B": Price(0.13, 0.026, 0.40, 0.40,
                           "public third-party transcription of the Tinker models page (cached prefill "
                           "inferred as 20% of prefill, Tinker's 80% cached discount for Qwen)", "2026-10-07"),
}

LOCAL_PRICE = Price(0.0, 0.0, 0.0, 0.0, "local engine: free", "")

# user overrides (set_price), looked up before PRICES
_OVERRIDES: dict[str, Price] = {}


def set_price(model: str, **fields: Any) -> Price:
    """Override (or add) a model's price for this session: `set_price("Qwen/X", train=0.5, source="quote")`.

    Args:
        model: the model id.
        **fields: prefill, cached_prefill, sample, train (USD per million tokens), source, date.
            Fields not given keep the table's value (or None for a new model); source defaults to
            "user override".

    Returns:
        The price now in force for the model.

    Raises:
        ValueError: a price that is not a finite number, 0 or more (a NaN would pass every budget).
        TypeError: a field Price does not have.
    """
    price = _with_fields(_OVERRIDES.get(model) or PRICES.get(model), fields)
    _OVERRIDES[model] = price
    return price


def clear_prices() -> None:
    """Forget every `set_price` override (the table's values apply again)."""
    _OVERRIDES.clear()


def price_for(model: str, *, prices: Mapping[str, Price | Mapping[str, Any]] | None = None,
              strict: bool = True) -> Price | None:
    """The price row for a model: overrides and `prices=` first, then PRICES, then the id without ":peft:…".

    Local engine models ("local/…") cost 0.

    Args:
        model: the model id (a checkpoint is priced at its base model's rate: ask for that model).
        prices: per-call overrides: model -> Price or a dict of Price fields (default None).
        strict: an unknown model raises UnknownPrice ("cannot bound the cost"), the default:
            spending on a guess is what the guard exists to stop; False returns None instead.

    Returns:
        The Price, or None (strict False, unknown model).
    """
    tables: list[Mapping[str, Any]] = [prices or {}, _OVERRIDES, PRICES]
    for name in (model, base_model(model)):
        for table in tables:
            if name in table:
                row = table[name]
                if isinstance(row, Price):
                    return row
                # a dict of fields amends the table's row (or a blank one)
                return _with_fields(price_for(name, strict=False), row)
    if is_local_model(model):
        return LOCAL_PRICE
    if not strict:
        return None
    if model.startswith("tinker://"):
        raise UnknownPrice(f"{model!r} is a checkpoint: it is priced at its base model's rate, so ask for that "
                           "model's price (e.g. price_for('thinkingmachines/Inkling-Small')); cannot bound the cost.")
    raise UnknownPrice(
        f"No price is known for {model!r}: cannot bound the cost. Pass price=Price(...) (or prices=), or call "
        f"machine_nb.checks.pricing.set_price({model!r}, prefill=…, sample=…, train=…). Known: {', '.join(sorted(PRICES))}.")


def check_max_usd(max_usd: float | None) -> None:
    """Refuse a budget that is not a finite amount, 0 or more: a NaN would pass every comparison
    and bound nothing (None is "no budget"). Every call that takes `max_usd` checks it here, the
    ones that write before they spend as soon as their settings resolve.

    Args:
        max_usd: the spending limit in USD, or None.

    Raises:
        ValueError: naming max_usd.
    """
    if max_usd is not None and (isinstance(max_usd, bool) or not isinstance(max_usd, numbers.Real)
                                or not math.isfinite(max_usd) or max_usd < 0):
        raise ValueError(f"max_usd must be a finite amount, 0 or more (or None for no budget), got {max_usd!r}")


def check_budget(usd: float | None, max_usd: float | None, what: str = "this run") -> None:
    """Refuse (BudgetExceeded) when `usd` is over `max_usd`, or unknown while a budget is set.

    Args:
        usd: the estimated cost (None: it cannot be bounded).
        max_usd: the spending limit in USD (None: no budget, nothing is refused).
        what: what would cost it, for the message (default "this run").

    Raises:
        BudgetExceeded: over the budget, or no price while a budget is set.
        ValueError: a budget that is not a finite amount, 0 or more (a NaN would pass every
            comparison and bound nothing; None is "no budget").
    """
    check_max_usd(max_usd)
    if max_usd is None:
        return
    if usd is None or usd != usd:  # a NaN cost would pass the comparison below
        raise BudgetExceeded(f"{what}: the cost cannot be bounded (no price), so a budget of {usd_text(max_usd, None)} "
                             "cannot be honoured")
    if usd > max_usd:
        raise BudgetExceeded(f"{what} would cost about {usd_text(usd)}, over the budget of {usd_text(max_usd, None)} "
                             f"by {usd_text(usd - max_usd)}; raise max_usd or use less data/fewer epochs")


def usd_text(usd: float, places: int | None = 4) -> str:
    """An amount of USD as text that keeps what tells two amounts apart, never in exponent form.

    An amount that `places` decimals would write as zero keeps two significant digits
    ("$0.0000012", not "$0.0000"), so a cost of a fraction of a cent is not written as nothing.

    Args:
        usd: the amount.
        places: decimals (default 4, as costs are written). None: the amount as it is, in as few
            decimals as write it exactly and at least two (a budget as it was set: "$1.00",
            "$0.005", "$12.3456").

    Returns:
        The text, with "$" and thousands separators.
    """
    if not math.isfinite(usd):
        return f"${usd}"
    if places is None:
        places = next((d for d in range(2, 10) if round(usd, d) == usd), 10)
        return f"${usd:,.{places}f}" if places == 2 else f"${usd:,.{places}f}".rstrip("0")
    text = f"${usd:,.{places}f}"
    if usd == 0 or float(text[1:].replace(",", "")) != 0:
        return text
    places = 1 - math.floor(math.log10(abs(usd)))  # two significant digits
    return f"${usd:,.{places}f}".rstrip("0")


def _usd_html(usd: float) -> str:
    """usd_text for HTML: "$" as `&#36;`, which no math typesetter reads."""
    return usd_text(usd).replace("$", "&#36;")


def _price_html(price: Price) -> str:
    def f(v: float | None) -> str:
        return "?" if v is None else f"{v:g}"
    return (f"prefill {f(price.prefill)} · cached {f(price.cached_prefill)} · sample {f(price.sample)} · "
            f"train {f(price.train)} &#36;/M <br><small>{escape(price.source)}"
            f"{' (' + escape(price.date) + ')' if price.date else ''}</small>")


class _Estimate:
    """What every cost estimate shares: it serialises as plain data and shows as one HTML card."""

    def _card(self, what: str, body: str) -> str:
        """The card: the model in bold, `what` after it, `body` (counts and cost), the price row
        and the note if any."""
        note = getattr(self, "note", "")
        note = f"<br><small>{escape(note)}</small>" if note else ""
        return no_math(f"<div class='machine-nb-cost'><b>{escape(self.model)}</b>{what}: {body}"
                       f"<br>{_price_html(self.price)}{note}</div>")

    def _schedule_html(self) -> str:
        """A training estimate's epochs, steps and total cost."""
        return (f"{self.epochs} epoch(s) · {self.steps} steps at batch {self.batch_size} · "
                f"<b>{_usd_html(self.usd)}</b>")

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain data.

        Returns:
            Every field, the price as its own dict.
        """
        return asdict(self)


def check_schedule(epochs: int, batch_size: int, max_steps: int | None) -> None:
    """Refuse a schedule no run can use, by the rule the trainers refuse it by.

    Args:
        epochs: passes over the data.
        batch_size: rows per step.
        max_steps: the step cap, or None.

    Raises:
        ValueError: epochs, batch_size or max_steps not a whole number (1.5 epochs would price 1.5x
            the steps no run takes), epochs and batch_size below 1, or max_steps below 1 (a zero
            batch has no steps, a negative epoch no cost); naming the setting.
    """
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("max_steps", max_steps)):
        if (value is not None or name != "max_steps") and (isinstance(value, bool)
                                                           or not isinstance(value, numbers.Integral)):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be at least 1 (got epochs={epochs}, batch_size={batch_size})")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be at least 1 or None, got {max_steps}")


def no_full_batch(items: int, batch_size: int, noun: str = "rows", trainer: str = "sft") -> str:
    """Why a run on fewer items than one batch is refused, or "" when there is a full batch.

    The cookbook's dataset makes items // batch_size batches, so such a run would train 0 steps;
    sft and dpo refuse it before anything is written or spent, and an estimate prices it at 0.

    Args:
        items: rows (or pairs) given.
        batch_size: items a step.
        noun: what an item is, plural (default "rows"; "pairs" for DPO).
        trainer: the call that refuses it (default "sft"; "dpo").

    Returns:
        The sentence, naming the way out; "" when items fill at least one batch.
    """
    if items >= batch_size:
        return ""
    return (f"{items} {noun} make no full batch of {batch_size}: {trainer} refuses this run (the cookbook would "
            f"train 0 steps), so it costs nothing. Lower batch_size or add {noun}.")


def _steps(items: int, batch_size: int, epochs: int, max_steps: int | None) -> tuple[int, float]:
    """(optimizer steps, the share of the full run they make): the cookbook drops the partial
    batch; max_steps stops early; no full batch is no run, so its share is 0."""
    full = (items // batch_size) * epochs
    steps = full if max_steps is None else min(full, max_steps)
    return steps, (0.0 if not full else steps / full)


@dataclass
class CostEstimate(_Estimate):
    """A training run's cost before it runs.

    tokens: rendered tokens of all rows (one epoch); trained_tokens: those with loss weight > 0;
    steps: optimizer steps = (rows // batch_size) * epochs (the cookbook drops the partial batch),
    capped by max_steps; usd: tokens x epochs x train price (Machine's rule; it counts the dropped
    partial batch too, so it errs high), scaled down when max_steps stops early, and 0 for fewer
    rows than one batch (sft refuses that run; `note` says so, `no_full_batch`'s sentence first);
    exact: whether counts come from the model's real renderer (else 2.5-chars-per-token estimates).
    """

    model: str
    rows: int
    tokens: int
    trained_tokens: int
    epochs: int
    batch_size: int
    steps: int
    usd: float
    exact: bool
    price: Price
    note: str = ""

    def _repr_html_(self) -> str:
        kind = "exact" if self.exact else "estimated"
        return self._card("", f"{self.rows} rows · {self.tokens:,} tokens ({kind}) · {self.trained_tokens:,} trained · "
                              f"{self._schedule_html()}")


@dataclass
class EvalCostEstimate(_Estimate):
    """An eval's cost before it runs: prompt tokens at the prefill price plus at most
    `max_tokens` sampled tokens per row at the sample price (an upper bound on output)."""

    model: str
    rows: int
    prompt_tokens: int
    max_output_tokens: int
    usd: float
    exact: bool
    price: Price
    note: str = ""

    def _repr_html_(self) -> str:
        kind = "exact" if self.exact else "estimated"
        return self._card(" eval", f"{self.rows} rows · {self.prompt_tokens:,} prompt tokens ({kind}) · "
                                   f"≤ {self.max_output_tokens:,} output tokens · <b>≤ {_usd_html(self.usd)}</b>")


def _with_fields(base: Price | None, fields: Mapping[str, Any]) -> Price:
    """`base` (or a blank price) with `fields` replaced; source "user override" unless given."""
    unknown = set(fields) - set(Price.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown price field(s) {sorted(unknown)}; known: {list(Price.__dataclass_fields__)}")
    blank = Price(None, None, None, None)
    return replace(base or blank, **{"source": "user override", "date": "", **fields})  # __post_init__ checks them


def _resolve_price(model: str, price: Price | Mapping[str, Any] | None, prices) -> Price:
    if price is None:
        return price_for(model, prices=prices)
    return price if isinstance(price, Price) else _with_fields(price_for(model, prices=prices, strict=False), price)


def estimate_cost(data: str | os.PathLike | Iterable[Mapping[str, Any]], model: str, epochs: int = 1,
                  batch_size: int = 8, price: Price | Mapping[str, Any] | None = None,
                  max_usd: float | None = None, *, max_steps: int | None = None,
                  prices: Mapping[str, Any] | None = None, counts: pd.DataFrame | None = None) -> CostEstimate:
    """Price a training run on a chat JSONL file (or rows) before it runs.

    Args:
        data: a chat JSONL path or rows.
        model: the model to train (its renderer counts the tokens).
        epochs: passes over the data (default 1, the cookbook's).
        batch_size: rows per step (default 8, the minimal-SFT example's).
        price: a Price (or dict of its fields) instead of the table's row (default None:
            `price_for(model)`; an unknown model or a missing train price raises UnknownPrice,
            "cannot bound the cost").
        max_usd: raise BudgetExceeded when the estimate is over it (default None: no budget).
        max_steps: stop after this many steps, as `sft(max_steps=)` does (default None).
        prices: per-call price overrides (see price_for; default None).
        counts: a `count_tokens` DataFrame already computed for these rows (default None: counted
            here; passing it saves rendering twice).

    Returns:
        A CostEstimate; for fewer rows than one batch, 0 steps at $0 with `note` saying that sft
        refuses such a run (`no_full_batch`).

    Raises:
        ValueError: epochs, batch_size or max_steps not a whole number, epochs or batch_size below
            1, or max_steps below 1 (as the trainers refuse them).
    """
    from .tokens import count_tokens

    check_schedule(epochs, batch_size, max_steps)
    row = _resolve_price(model, price, prices)
    if row.train is None:
        raise UnknownPrice(f"No training price is known for {model!r} ({row.source or 'no source'}): cannot bound "
                           f"the cost. Pass price={{'train': …}} or call machine_nb.checks.pricing.set_price({model!r}, train=…).")
    df = counts if counts is not None else count_tokens(data, model)
    rows = len(df)
    tokens = int(df["tokens"].sum()) if rows else 0
    trained = int(df["trained_tokens"].sum()) if rows else 0
    exact = bool(df["exact"].all()) if rows else True
    steps, fraction = _steps(rows, batch_size, epochs, max_steps)
    usd = tokens * epochs * fraction * row.train / 1e6
    note = " ".join(n for n in (no_full_batch(rows, batch_size), df.attrs.get("note", "")) if n)
    est = CostEstimate(model=model, rows=rows, tokens=tokens, trained_tokens=trained, epochs=epochs,
                       batch_size=batch_size, steps=steps, usd=usd, exact=exact, price=row, note=note)
    check_budget(usd, max_usd, f"training {model} for {epochs} epoch(s)")
    return est


def estimate_eval_cost(data: str | os.PathLike | Iterable[Mapping[str, Any]], model: str, max_tokens: int = 32,
                       price: Price | Mapping[str, Any] | None = None, max_usd: float | None = None, *,
                       samples_per_row: int = 1, prices: Mapping[str, Any] | None = None) -> EvalCostEstimate:
    """Price an eval before it runs: each row's generation prompt at the prefill price plus up to
    `max_tokens` sampled tokens at the sample price.

    Args:
        data: an eval JSONL path or rows.
        model: the model sampled (its renderer counts the prompts).
        max_tokens: the sampling limit per answer (default 32: `answer: <integer>` needs under 10).
        price: a Price (or dict of its fields) instead of the table's row (default None: price_for).
        max_usd: raise BudgetExceeded when the estimate is over it (default None: no budget).
        samples_per_row: answers sampled per row (default 1).
        prices: per-call price overrides (default None).

    Returns:
        An EvalCostEstimate (an upper bound: every answer is counted at max_tokens).

    Raises:
        ValueError: max_tokens below 0, samples_per_row below 1, or a bad max_usd (check_budget).
    """
    from .tokens import count_prompt_tokens

    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValueError(f"max_tokens must be a whole number, 0 or more, got {max_tokens!r}")
    if isinstance(samples_per_row, bool) or not isinstance(samples_per_row, int) or samples_per_row < 1:
        raise ValueError(f"samples_per_row must be a whole number, at least 1, got {samples_per_row!r}")
    row = _resolve_price(model, price, prices)
    if row.prefill is None or row.sample is None:
        raise UnknownPrice(f"No sampling price is known for {model!r}: cannot bound the cost of an eval.")
    df = count_prompt_tokens(data, model)
    rows = len(df)
    prompt = int(df["prompt_tokens"].sum()) * samples_per_row if rows else 0
    out = rows * max_tokens * samples_per_row
    usd = _sampling_usd(row, prompt, out)
    est = EvalCostEstimate(model=model, rows=rows, prompt_tokens=prompt, max_output_tokens=out, usd=usd,
                           exact=bool(df["exact"].all()) if rows else True, price=row, note=df.attrs.get("note", ""))
    check_budget(usd, max_usd, f"evaluating {model} on {rows} rows")
    return est


def _sampling_usd(price: Price, prompt_tokens: int, output_tokens: int) -> float:
    """Prompt tokens at the prefill price plus output tokens at the sample price (both known)."""
    return (prompt_tokens * price.prefill + output_tokens * price.sample) / 1e6


def sample_cost(model: str, engine: str | None, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """What sampling cost once it has run (an eval's summary records it).

    Args:
        model: the base model sampled (a checkpoint is priced at its base model's rate).
        engine: "local" (no charge) or "tinker".
        prompt_tokens: prompt tokens sent (prefilled).
        output_tokens: tokens sampled.

    Returns:
        {"usd", "source"} and, when priced, "prefill_per_m" and "sample_per_m". usd is 0.0 on the
        local engine and None, with the reason in source ("unknown: …"), when no prefill or sample
        price is known: an unknown cost is recorded as unknown, never guessed.
    """
    if engine == "local":
        return {"usd": 0.0, "source": "local engine: runs on this machine, no charge"}
    try:
        price = price_for(model)
    except BudgetExceeded as exc:  # UnknownPrice: no price to quote
        return {"usd": None, "source": f"unknown: {exc}"}
    if price.prefill is None or price.sample is None:
        return {"usd": None, "source": f"unknown: no prefill/sample price for {model!r}"}
    source = price.source or "machine_nb.checks.pricing"
    return {"usd": round(_sampling_usd(price, prompt_tokens, output_tokens), 9),
            "source": f"{source} ({price.date})" if price.date else source,
            "prefill_per_m": price.prefill, "sample_per_m": price.sample}


@dataclass
class DPOCostEstimate(_Estimate):
    """A DPO run's cost before it runs.

    Each step passes every pair's two sequences (prompt + chosen, prompt + rejected) three times:
    the reference model's log-probabilities (a forward pass on a sampler snapshot of the starting
    weights, at the prefill price: `reference_usd`), the policy's forward pass that the DPO loss is
    computed from (`forward_usd`) and the forward-backward pass that trains (`train_usd`), both on
    the training client and both at the train price (how Tinker bills a forward-only pass is not
    published, so it is bounded by the training price: the estimate errs high).

    pairs: pairs given; tokens: rendered tokens of both sequences of every pair (one epoch);
    trained_tokens: those of the two completions; steps: (pairs // batch_size) * epochs, capped by
    max_steps; usd: the three parts together (the dropped partial batch counted too, as for SFT; 0
    for fewer pairs than one batch, which dpo refuses, as `note` says); exact: whether counts come
    from the model's real renderer.
    """

    model: str
    pairs: int
    tokens: int
    trained_tokens: int
    epochs: int
    batch_size: int
    steps: int
    train_usd: float
    forward_usd: float
    reference_usd: float
    usd: float
    exact: bool
    price: Price
    note: str = ""

    def _repr_html_(self) -> str:
        kind = "exact" if self.exact else "estimated"
        return self._card(" DPO", f"{self.pairs} pairs · {self.tokens:,} tokens an epoch ({kind}, chosen + rejected) · "
                                  f"{self._schedule_html()} = train {_usd_html(self.train_usd)} + policy forward "
                                  f"{_usd_html(self.forward_usd)} + reference model forward "
                                  f"{_usd_html(self.reference_usd)}")


def estimate_dpo_cost(pairs: Any, model: str, epochs: int = 1, batch_size: int = 8,
                      price: Price | Mapping[str, Any] | None = None, max_usd: float | None = None, *,
                      max_steps: int | None = None, prices: Mapping[str, Any] | None = None) -> DPOCostEstimate:
    """Price a DPO run on preference pairs before it runs (see DPOCostEstimate for what a step costs).

    Args:
        pairs: a pairs frame (`preference_pairs`), pair records, or a pairs JSONL path.
        model: the model to train (its renderer counts the tokens).
        epochs: passes over the pairs (default 1, the cookbook's).
        batch_size: pairs per step (default 8).
        price: a Price (or dict of its fields) instead of the table's row (default None:
            `price_for(model)`).
        max_usd: raise BudgetExceeded when the estimate is over it (default None: no budget).
        max_steps: stop after this many steps, as `dpo(max_steps=)` does (default None).
        prices: per-call price overrides (default None).

    Returns:
        A DPOCostEstimate; for fewer pairs than one batch, 0 steps at $0 with `note` saying that
        dpo refuses such a run (`no_full_batch`).

    Raises:
        UnknownPrice: no train or prefill price is known for the model ("cannot bound the cost").
        ValueError: epochs, batch_size or max_steps not a whole number, epochs or batch_size below
            1, or max_steps below 1 (as the trainers refuse them).
    """
    from ..store.pairs import pair_records
    from .tokens import count_tokens

    check_schedule(epochs, batch_size, max_steps)
    row = _resolve_price(model, price, prices)
    if row.train is None or row.prefill is None:
        missing = "training" if row.train is None else "prefill (the reference model's forward pass)"
        raise UnknownPrice(f"No {missing} price is known for {model!r} ({row.source or 'no source'}): cannot bound the "
                           f"cost of DPO. Call machine_nb.checks.pricing.set_price({model!r}, train=…, prefill=…).")
    records = pair_records(pairs)
    rows = [{"messages": list(p["prompt"]) + list(p[side])} for p in records for side in ("chosen", "rejected")]
    df = count_tokens(rows, model) if rows else None
    tokens = int(df["tokens"].sum()) if rows else 0
    trained = int(df["trained_tokens"].sum()) if rows else 0
    exact = bool(df["exact"].all()) if rows else True
    steps, fraction = _steps(len(records), batch_size, epochs, max_steps)
    passed = tokens * epochs * fraction / 1e6
    train_usd, forward_usd, reference_usd = passed * row.train, passed * row.train, passed * row.prefill
    usd = train_usd + forward_usd + reference_usd
    est = DPOCostEstimate(model=model, pairs=len(records), tokens=tokens, trained_tokens=trained, epochs=epochs,
                          batch_size=batch_size, steps=steps, train_usd=train_usd, forward_usd=forward_usd,
                          reference_usd=reference_usd, usd=usd, exact=exact, price=row,
                          note=" ".join(n for n in (no_full_batch(len(records), batch_size, "pairs", "dpo"),
                                                    df.attrs.get("note", "") if df is not None else "") if n))
    check_budget(usd, max_usd, f"DPO on {model} for {epochs} epoch(s)")
    return est


def dpo_cost(model: str | None, engine: str | None, tokens: int) -> float | None:
    """What a DPO run that processed `tokens` cost (train + policy forward + reference forward, as
    DPOCostEstimate bounds it).

    Args:
        model: the model trained (None: unknown).
        engine: "local" or "tinker".
        tokens: tokens processed.

    Returns:
        USD: 0 on the local engine, None when a price is unknown.
    """
    if engine == "local":
        return 0.0
    if model is None:
        return None
    row = price_for(model, strict=False)
    if row is None or row.train is None or row.prefill is None:
        return None
    return tokens * (2 * row.train + row.prefill) / 1e6


def prices_frame() -> pd.DataFrame:
    """The price table, overrides applied.

    Returns:
        A DataFrame with columns model, prefill, cached_prefill, sample, train, source, date.
    """
    import pandas as pd

    table = {**PRICES, **_OVERRIDES}
    return pd.DataFrame([{"model": m, **p.to_dict()} for m, p in sorted(table.items())],
                        columns=["model", "prefill", "cached_prefill", "sample", "train", "source", "date"])


__all__ = ["PRICES", "Price", "UnknownPrice", "set_price", "clear_prices", "price_for", "check_budget", "check_max_usd",
           "CostEstimate", "EvalCostEstimate", "estimate_cost", "estimate_eval_cost", "sample_cost", "prices_frame",
           "DPOCostEstimate", "estimate_dpo_cost", "dpo_cost", "no_full_batch", "usd_text",
           "check_schedule"]
