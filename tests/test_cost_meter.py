"""CostMeter: real token counts (Inkling's renderer, offline) priced by pricing.py, live updates, budget."""

import json

import pandas as pd
import traitlets

from machine_nb.pricing import estimate_cost, price_for
from machine_nb.widgets.cost_meter import CostMeter

INKLING = "thinkingmachines/Inkling"


def line(i):
    return {"machine": "calc", "run": f"r{i}", "score": 1.0, "messages": [
        {"role": "user", "content": f"What is {i} + {i}?"},
        {"role": "assistant", "content": f"answer: {2 * i}"}]}


LINES = [line(i) for i in range(16)]


def test_numbers_match_the_estimator_and_epochs_update_live(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    m = CostMeter(path, model=INKLING, epochs=1, batch_size=8)
    ref = estimate_cost(path, INKLING, epochs=1, batch_size=8)
    assert m.estimate.tokens == ref.tokens > 0 and m.estimate.trained_tokens == ref.trained_tokens
    assert m.estimate.steps == 2 and abs(m.estimate.usd - ref.usd) < 1e-12
    html = m.static_html()
    assert f"{ref.tokens:,}" in html and f"${ref.usd:.4f}" in html
    price = price_for(INKLING)
    assert price.source in html or price.source[:40] in html
    m._epochs.value = 3  # the slider, as a user moves it
    assert m.estimate.steps == 6 and abs(m.estimate.usd - 3 * ref.usd) < 1e-12
    assert len(m._counts) == 1  # epochs reuse the token counts
    assert "× 3 epoch(s)" in m.summary()


def test_budget_turns_red_and_says_by_how_much():
    m = CostMeter(LINES, model=INKLING, budget=1e-6)
    assert m.over_by > 0
    assert "over budget by $" in m.static_html() and "mnb-over-budget" in m.static_html()
    assert "#dc2626" in m.static_html()
    ok = CostMeter(LINES, model=INKLING, budget=1000)
    assert ok.over_by == 0 and "within budget" in ok.static_html()


def test_model_without_train_price_explains_instead_of_crashing():
    m = CostMeter(LINES, model=INKLING)
    m._model.value = "thinkingmachines/Inkling-Small"  # Machine's table has no train price for it
    assert m.estimate is None and "No training price" in m.error
    assert "no estimate" in m.summary()
    m._model.value = INKLING
    assert m.estimate is not None and not m.error


def test_eval_cost_and_linking_to_a_picker(tmp_path):
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text("".join(json.dumps(x) + "\n" for x in LINES[:4]))

    class Picker(traitlets.HasTraits):  # the RunPicker surface CostMeter uses
        selected_ids = traitlets.List(traitlets.Unicode())

        @property
        def selected(self):
            return pd.DataFrame([x for x in LINES if x["run"] in self.selected_ids])

    picker = Picker(selected_ids=["r1", "r2"])
    m = CostMeter(LINES, model=INKLING, eval_data=eval_path, batch_size=1)
    assert m.eval_estimate is not None and m.eval_estimate.rows == 4
    m.link(picker)
    assert m.estimate.rows == 2 and m.estimate.steps == 2
    picker.selected_ids = ["r1", "r2", "r3", "r4", "r5"]
    assert m.estimate.rows == 5
    assert abs(m.total_usd - (m.estimate.usd + m.eval_estimate.usd)) < 1e-12
    assert "eval" in m.static_html()


def test_trained_tokens_are_what_sft_trains():
    from machine_nb.tokens import count_tokens
    from machine_nb.train import prepare_data

    two_steps = [{**line(i), "messages": line(i)["messages"] + [
        {"role": "user", "content": "and doubled?"}, {"role": "assistant", "content": f"answer: {4 * i}"}]}
        for i in range(8)]
    m = CostMeter(two_steps, model=INKLING)
    rows, mode = prepare_data(two_steps)
    assert mode == "last_assistant_message"
    want = count_tokens(rows, INKLING, train_on_what=mode)["trained_tokens"].sum()
    assert m.estimate.trained_tokens == want
    # only the last answer of each line: fewer than if every assistant message were trained
    assert want < count_tokens(two_steps, INKLING, train_on_what="all_assistant_messages")["trained_tokens"].sum()
    few = CostMeter(LINES[:3], model=INKLING, batch_size=8)
    assert few.estimate.steps == 0 and "0 steps: 3 rows is fewer than one batch of 8" in few.static_html()
    assert not m.warnings()
    bad = CostMeter([{"messages": [{"role": "user", "content": "no answer"}]}], model=INKLING)
    assert bad.estimate is None and "no assistant message" in bad.error
