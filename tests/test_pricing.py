"""Prices and cost: the table carries sources, unknown models refuse, estimates follow the documented rules."""

import json
import math

import pytest

from machine_nb.errors import BudgetExceeded
from machine_nb.checks.pricing import (PRICES, CostEstimate, Price, UnknownPrice, check_budget, clear_prices,
                                estimate_cost, estimate_eval_cost, price_for, prices_frame, set_price)
from machine_nb.checks.tokens import count_prompt_tokens, count_tokens

INKLING = "thinkingmachines/Inkling"


def rows(n):
    return [{"messages": [{"role": "user", "content": f"What is {10 + i} plus {20 + i}?"},
                          {"role": "assistant", "content": f"answer: {30 + 2 * i}"}]} for i in range(n)]


@pytest.fixture(autouse=True)
def _no_overrides():
    clear_prices()
    yield
    clear_prices()


def test_every_row_has_a_source_and_date_and_machines_numbers():
    for model, p in PRICES.items():
        assert p.source and p.date, model
        assert p.prefill > 0 and p.sample > 0 and p.cached_prefill < p.prefill, model
    assert PRICES[INKLING] == Price(3.74, 0.374, 9.36, 11.22, PRICES[INKLING].source, "2026-10-07")
    assert "transcription" in PRICES[INKLING].source and "unverified" in PRICES[INKLING].source
    assert PRICES["Qwen/Qwen3.6-35B-A3B"].sample == 1.335
    frame = prices_frame()
    assert list(frame.columns) == ["model", "prefill", "cached_prefill", "sample", "train", "source", "date"]
    assert len(frame) == len(PRICES)


def test_price_for_exact_id_then_base_then_local():
    assert price_for("thinkingmachines/Inkling-Small:peft:262144").prefill == 2.32  # exact id wins
    assert price_for("thinkingmachines/Inkling-Small:peft:131072").prefill == 1.16  # falls back to the base
    local = price_for("local/arith-tiny")
    assert (local.prefill, local.sample, local.train) == (0.0, 0.0, 0.0) and "local" in local.source
    with pytest.raises(UnknownPrice, match="cannot bound the cost") as info:
        price_for("acme/unknown-7B")
    assert isinstance(info.value, BudgetExceeded)
    assert price_for("acme/unknown-7B", strict=False) is None
    with pytest.raises(UnknownPrice, match="base model's rate"):
        price_for("tinker://abc/sampler_weights/final")


def test_user_overrides():
    set_price("acme/unknown-7B", prefill=0.1, sample=0.2, train=0.3, source="our quote", date="2026-12-01")
    assert price_for("acme/unknown-7B").train == 0.3
    p = set_price("thinkingmachines/Inkling-Small", train=3.0)
    assert p.prefill == 1.16 and p.train == 3.0 and p.source == "user override"
    assert price_for("thinkingmachines/Inkling-Small", prices={"thinkingmachines/Inkling-Small": {"train": 9.0}}).train == 9.0
    clear_prices()
    assert price_for("thinkingmachines/Inkling-Small").train is None
    with pytest.raises(TypeError, match="unknown price field"):
        set_price("x/y", cost=1)


def test_estimate_cost_uses_exact_counts_and_the_cookbook_step_rule():
    data = rows(20)
    counts = count_tokens(data, INKLING)
    est = estimate_cost(data, INKLING, epochs=3, batch_size=8)
    assert isinstance(est, CostEstimate) and est.exact
    assert est.tokens == counts["tokens"].sum() and est.trained_tokens == counts["trained_tokens"].sum()
    assert est.steps == (20 // 8) * 3 == 6  # the partial batch of 4 rows is dropped
    assert math.isclose(est.usd, est.tokens * 3 * 11.22 / 1e6)
    assert est.price is PRICES[INKLING]
    capped = estimate_cost(data, INKLING, epochs=3, batch_size=8, max_steps=3)
    assert capped.steps == 3 and math.isclose(capped.usd, est.usd / 2)
    html = est._repr_html_()
    assert "2026-10-07" in html and f"{est.tokens:,}" in html


def test_unknown_train_price_refuses_unless_given():
    with pytest.raises(UnknownPrice, match="No training price"):
        estimate_cost(rows(8), "thinkingmachines/Inkling-Small")
    est = estimate_cost(rows(8), "thinkingmachines/Inkling-Small", price={"train": 2.0})
    assert est.usd > 0 and est.price.source == "user override"
    assert estimate_cost(rows(8), "local/arith-tiny", price=Price(0, 0, 0, 0, "free", "")).usd == 0


def test_budget_guard():
    check_budget(5.0, None)
    check_budget(0.5, 1.0)
    with pytest.raises(BudgetExceeded, match="over the budget of \\$1.00 by \\$1.5000"):
        check_budget(2.5, 1.0, "training")
    with pytest.raises(BudgetExceeded, match="cannot be bounded"):
        check_budget(None, 1.0)
    with pytest.raises(BudgetExceeded):
        estimate_cost(rows(16), INKLING, epochs=10, max_usd=1e-6)


def test_estimated_counts_are_labelled():
    with pytest.warns(UserWarning, match="Hugging Face hub"):
        est = estimate_cost(rows(8), "Qwen/Qwen3-8B")
    assert not est.exact and "estimates" in est.note
    assert math.isclose(est.usd, est.tokens * 0.40 / 1e6)


def test_what_sampling_cost_is_priced_or_recorded_as_unknown():
    from machine_nb.checks.pricing import sample_cost

    cost = sample_cost(INKLING, "tinker", 1_000_000, 2_000_000)
    assert math.isclose(cost["usd"], 3.74 + 2 * 9.36) and cost["prefill_per_m"] == 3.74 and cost["sample_per_m"] == 9.36
    assert cost["source"].startswith("Machine TINKER_PRICES") and cost["source"].endswith("(2026-10-07)")
    unknown = sample_cost("acme/NoSuchModel-1B", "tinker", 100, 10)
    assert unknown["usd"] is None and unknown["source"].startswith("unknown: No price is known for 'acme/NoSuchModel-1B'")
    assert sample_cost("local/arith-tiny", "local", 100, 10) == {"usd": 0.0, "source": "local engine: runs on this "
                                                                                       "machine, no charge"}
    set_price("acme/Half-1B", prefill=0.5)  # a price without a sample rate cannot price sampling
    try:
        assert sample_cost("acme/Half-1B", "tinker", 100, 10)["usd"] is None
        set_price("acme/Half-1B", sample=1.0, source="a quote")
        assert sample_cost("acme/Half-1B", "tinker", 2_000_000, 1_000_000) == {
            "usd": 2.0, "source": "a quote", "prefill_per_m": 0.5, "sample_per_m": 1.0}
    finally:
        clear_prices()


def test_eval_cost():
    data = [{"messages": r["messages"][:1], "expected": r["messages"][1]["content"], "match": "exact"} for r in rows(5)]
    prompt = count_prompt_tokens(data, INKLING)["prompt_tokens"].sum()
    est = estimate_eval_cost(data, INKLING, max_tokens=16)
    assert est.exact and est.rows == 5 and est.prompt_tokens == prompt and est.max_output_tokens == 80
    assert math.isclose(est.usd, (prompt * 3.74 + 80 * 9.36) / 1e6)
    with pytest.raises(BudgetExceeded):
        estimate_eval_cost(data, INKLING, max_usd=1e-9)


def test_an_eval_nothing_samples_and_a_budget_that_bounds_nothing_are_refused():
    """A negative reply budget or no sample per row would price an eval below nothing; a NaN, negative
    or infinite max_usd would pass every comparison (None is the way to say "no budget")."""
    data = [{"messages": r["messages"][:1], "expected": r["messages"][1]["content"], "match": "exact"} for r in rows(2)]
    with pytest.raises(ValueError, match="max_tokens"):
        estimate_eval_cost(data, INKLING, max_tokens=-5)
    with pytest.raises(ValueError, match="samples_per_row"):
        estimate_eval_cost(data, INKLING, samples_per_row=0)
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="max_usd"):
            check_budget(0.5, bad)
        with pytest.raises(ValueError, match="max_usd"):
            estimate_eval_cost(data, INKLING, max_usd=bad)
    check_budget(0.5, None)  # no budget
    check_budget(0.5, 1.0)  # one the cost is under


def test_the_input_is_called_data_and_a_price_serialises_with_to_dict():
    """One vocabulary: `data` for what a call reads, `to_dict()` for serialising; one name each."""
    data = rows(8)
    assert estimate_cost(data=data, model=INKLING).usd == estimate_cost(data, INKLING).usd
    evals = [{"messages": r["messages"][:1], "expected": "x"} for r in data]
    assert estimate_eval_cost(data=evals, model=INKLING).usd == estimate_eval_cost(evals, INKLING).usd
    assert count_tokens(data=data, model=INKLING).equals(count_tokens(data, INKLING))
    with pytest.raises(TypeError, match="path_or_rows"):
        estimate_cost(path_or_rows=data, model=INKLING)
    price = PRICES[INKLING]
    assert price.to_dict()["train"] == 11.22 and set(price.to_dict()) == set(prices_frame().columns) - {"model"}
    assert not hasattr(price, "as_dict")


@pytest.mark.parametrize("schedule", [{"batch_size": 0}, {"epochs": 0}, {"epochs": -2}, {"max_steps": 0}])
def test_a_schedule_no_run_can_use_is_refused_not_priced(schedule, tmp_path, capsys):
    """The rules the trainers refuse by (epochs and batch_size at least 1, max_steps at least 1 or
    None) hold for the estimate too: no division by zero, no negative cost."""
    from machine_nb.checks.pricing import estimate_dpo_cost
    from machine_nb.cli import main

    with pytest.raises(ValueError, match="at least 1"):
        estimate_cost(rows(8), INKLING, **schedule)
    pair = {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}]}
    with pytest.raises(ValueError, match="at least 1"):
        estimate_dpo_cost([pair], INKLING, **schedule)
    if "max_steps" in schedule:
        return
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(8)))
    flags = ["--epochs", str(schedule.get("epochs", 1)), "--batch-size", str(schedule.get("batch_size", 8))]
    with pytest.raises(SystemExit) as exit_:  # a usage error, as the training commands' flags are
        main(["validate", str(path), "-m", INKLING, *flags])
    out, err = capsys.readouterr()
    named = "--epochs" if schedule.get("epochs", 1) < 1 else "--batch-size"
    assert exit_.value.code == 2 and "cost: $" not in out and named in err and "at least 1" in err
