"""CostMeter: real token counts (Inkling's renderer, offline) priced by pricing.py, live updates, budget."""

import json

import pandas as pd
import pytest
import traitlets

from machine_nb.checks.pricing import estimate_cost, price_for
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
    m = CostMeter(LINES, model=INKLING, max_usd=1e-6)
    assert m.over_by > 0
    assert "over budget by $" in m.static_html() and "mnb-over-budget" in m.static_html()
    assert "#dc2626" in m.static_html()
    ok = CostMeter(LINES, model=INKLING, max_usd=1000)
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

    class Picker(traitlets.HasTraits):  # the RunPicker surface CostMeter uses: selected, observe_selection
        selected_ids = traitlets.List(traitlets.Unicode())

        @property
        def selected(self):
            return pd.DataFrame([x for x in LINES if x["run"] in self.selected_ids])

        def observe_selection(self, callback):
            def handler(_change):
                callback(self.selected)
            self.observe(handler, names="selected_ids")
            return handler

    picker = Picker(selected_ids=["r1", "r2"])
    m = CostMeter(LINES, model=INKLING, eval_data=eval_path, batch_size=1)
    assert m.eval_estimate is not None and m.eval_estimate.rows == 4
    m.link(picker)
    assert m.estimate.rows == 2 and m.estimate.steps == 2
    picker.selected_ids = ["r1", "r2", "r3", "r4", "r5"]
    assert m.estimate.rows == 5
    assert abs(m.total_usd - (m.estimate.usd + m.eval_estimate.usd)) < 1e-12
    assert "eval" in m.static_html()
    m.unlink()  # stops following: the next selection is not priced
    picker.selected_ids = ["r1"]
    assert m.estimate.rows == 5
    m.link(picker)
    assert m.estimate.rows == 1
    m.close()  # closing stops following too
    picker.selected_ids = ["r1", "r2", "r3"]
    assert m.estimate.rows == 1


def test_trained_tokens_are_what_sft_trains():
    from machine_nb.checks.tokens import count_tokens
    from machine_nb.core.chat import prepare_data

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
    assert few.estimate.steps == 0 and "3 rows make no full batch of 8" in few.static_html()
    assert not m.warnings()
    bad = CostMeter([{"messages": [{"role": "user", "content": "no answer"}]}], model=INKLING)
    assert bad.estimate is None and "no assistant message" in bad.error


def test_a_model_it_cannot_price_says_so_and_never_within_budget(tmp_path):
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text("".join(json.dumps(x) + "\n" for x in LINES[:4]))
    # Inkling-Small has sampling prices (the eval part) but no training price
    m = CostMeter(LINES, model="thinkingmachines/Inkling-Small", eval_data=eval_path, max_usd=1000)
    html = m.static_html()
    assert m.eval_estimate is not None and m.estimate is None
    assert m.total_usd is None and m.over_by == 0
    assert "within budget" not in html and "cannot price" in html
    assert "cannot price" in m.summary()
    m.model = INKLING
    assert "within budget" in m.static_html() and "cannot price" not in m.static_html()


def test_the_dropdown_marks_models_it_cannot_price():
    m = CostMeter(LINES, model=INKLING)
    labels = dict((value, label) for label, value in m._model.options)
    assert labels[INKLING] == INKLING
    assert "cannot price training" in labels["thinkingmachines/Inkling-Small"]
    assert "cannot price" not in labels["local/arith-tiny"]
    import pytest

    from machine_nb.checks.tokens import TokenEstimateWarning

    with pytest.warns(TokenEstimateWarning):  # no tokenizer offline: estimated (and no price)
        m.model = "someone/unknown-model"  # an unlisted model is added, marked too
    labels = dict((value, label) for label, value in m._model.options)
    assert "cannot price" in labels["someone/unknown-model"] and m.model == "someone/unknown-model"


def test_max_steps_is_honoured_whatever_the_epochs():
    m = CostMeter(LINES, model=INKLING, epochs=1, batch_size=4, max_steps=6)
    assert m.estimate.steps == 4  # 16 rows / 4 = 4 steps, under the cap
    full = m.estimate.usd
    m.epochs = 3  # 12 steps without the cap
    assert m.estimate.steps == 6 and abs(m.estimate.usd - full * 3 * 6 / 12) < 1e-12
    assert estimate_cost(LINES, INKLING, epochs=3, batch_size=4, max_steps=6).usd == m.estimate.usd
    assert "max 6 steps" in m.static_html()


def test_estimated_models_do_not_count_every_token_as_trained():
    import pytest

    from machine_nb.checks.tokens import TokenEstimateWarning

    long = [{**x, "messages": [{"role": "system", "content": "You are a careful calculator. " * 10}] + x["messages"]}
            for x in LINES]
    with pytest.warns(TokenEstimateWarning):
        m = CostMeter(long, model="Qwen/Qwen3-8B")  # priced, but its tokenizer needs the hub: estimated
    e = m.estimate
    assert not e.exact and 0 < e.trained_tokens < e.tokens / 4
    assert "estimated" in m.static_html()


@pytest.mark.filterwarnings("ignore::machine_nb.checks.tokens.TokenEstimateWarning")  # Qwen is counted by estimate
def test_counting_runs_off_the_kernel_thread_and_stale_results_are_dropped(monkeypatch):
    """A slow count (a tokenizer being fetched) must not hold the caller; the meter says
    "computing…" meanwhile and never shows one model's numbers under another model's name."""
    import threading

    import machine_nb.checks.tokens as tokens

    release = threading.Event()
    real = tokens.count_tokens

    def slow_for_qwen(rows, model, **kwargs):
        if model == "Qwen/Qwen3-8B":
            release.wait(60)
        return real(rows, model, **kwargs)

    monkeypatch.setattr(tokens, "count_tokens", slow_for_qwen)
    m = CostMeter(LINES, model=INKLING, background=True)
    m.wait()
    assert m.estimate.model == INKLING
    chooser = threading.Thread(target=lambda: setattr(m, "model", "Qwen/Qwen3-8B"), daemon=True)
    chooser.start()
    chooser.join(30)  # a deadline, not a timing: choosing a model returns at once
    try:
        assert not chooser.is_alive(), "choosing a model waited for the token count"
        assert m.computing and m.estimate is None
        assert "computing…" in m.static_html() and "Qwen/Qwen3-8B" in m.summary()
        m.model = "local/arith-tiny"  # chosen while the Qwen count still runs
        m.wait(30)
        assert m.model == "local/arith-tiny" and m.estimate.model == "local/arith-tiny"
    finally:
        release.set()
    import time

    deadline = time.monotonic() + 60
    while m._pending and time.monotonic() < deadline:  # the Qwen count finishes late
        time.sleep(0.01)
    assert not m._pending
    assert m.model == "local/arith-tiny" and m.estimate.model == "local/arith-tiny"  # the late Qwen result was dropped
    assert "local/arith-tiny" in m.summary() and "computing" not in m.static_html()


def test_a_picker_can_be_the_data():
    import machine_nb as mnb

    runs = pd.DataFrame({"id": ["a", "b"], "machine": "calc", "run": [
        {"id": i, "machine": "calc", "history": [], "trajectory": [
            {"role": "user", "content": f"What is {n} + {n}?"}, {"role": "assistant", "content": f"answer: {2 * n}"}]}
        for i, n in (("a", 1), ("b", 2))]})
    picker = mnb.RunPicker(runs)
    m = CostMeter(picker, model=INKLING, batch_size=1)
    assert m.estimate is None and "no data" in m.summary()
    picker.click("a")
    assert m.estimate.rows == 1
    picker.select(["a", "b"])
    assert m.estimate.rows == 2


def test_history_sets_observed_cost_beside_the_estimate(tmp_path, monkeypatch):
    """A real run on the Tinker path (a local server answering as Tinker, prices set): the meter's
    history shows its estimate from before the run and what it cost, also for a sweep's runs."""
    from test_theme import hard_coded

    from machine_nb.data.corpus import make_corpus
    from machine_nb.engines.local.server import LocalServer
    from machine_nb.checks.pricing import clear_prices, set_price
    from machine_nb.training.train import sft
    from machine_nb.widgets.cost_meter import HISTORY_COLUMNS

    corpus = make_corpus(tmp_path / "corpus")
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    server = LocalServer(key="tml-test-key").start()
    try:
        set_price("local/arith-tiny", train=3.0, prefill=1.0, sample=2.0, source="test price")
        result = sft(corpus.train, "local/arith-tiny", "tinker", base_url=server.url, log_dir=tmp_path / "run",
                     max_steps=2, progress=False)
        m = CostMeter(corpus.train, model="local/arith-tiny", epochs=1, background=False)
        assert m.history.empty and "history" not in m.static_html()
        m.record(result)
        h = m.history
        assert list(h.columns) == HISTORY_COLUMNS and len(h) == 1
        row = h.iloc[0]
        assert row["tokens"] == result.tokens and row["cost_usd"] == pytest.approx(result.tokens * 3.0 / 1e6)
        assert row["estimated_usd"] == result.estimated_usd and row["estimated_usd"] > 0
        assert row["estimated_tokens"] == result.estimated_tokens > result.tokens
        html = m.static_html()
        assert f"{result.estimated_tokens:,} → {result.tokens:,}" in html
        assert f"${result.estimated_usd:.4f} → <b>${result.cost_usd:.4f}</b>" in html
        assert m.summary().endswith(f"1 run(s) recorded, observed ${result.cost_usd:.4f}")
        assert not hard_coded(html)
        # a sweep frame: every run that has a log; a failed one is left out
        frame = pd.DataFrame({"run": ["a", "b"], "status": ["read back", "failed"],
                              "log_dir": [result.log_dir, str(tmp_path / "nothing")]})
        m.record(frame)
        assert len(m.history) == 2 and list(m.history["run"]) == ["run", "run"]
        again = CostMeter(corpus.train, model="local/arith-tiny", background=False, history=[result.log_dir])
        assert len(again.history) == 1
    finally:
        clear_prices()
        server.stop()


def test_a_background_count_does_not_warn_from_its_thread():
    """A count in the worker thread has no user line to point a warning at (it would name
    threading.py, once per count, in the log console): the meter shows the note itself."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = CostMeter(LINES, model="Qwen/Qwen3-8B", background=True)  # estimated: its tokenizer needs the hub
        m.wait(60)
        m.model = INKLING
        m.wait(60)
    assert not m.estimate.exact or m.estimate.model == INKLING
    assert [str(w.message) for w in caught if w.filename.endswith("threading.py")] == []
    m.model = "Qwen/Qwen3-8B"
    assert "estimated" in m.static_html()  # the note is in the meter


def test_wait_returns_with_the_estimate_in_not_just_the_count(monkeypatch):
    """A count is filed, then priced (`_apply`) a moment later in the worker thread: `wait()` (and the
    constructor's first wait, which decides what an executed notebook shows) returns once the
    estimate is in, not in between with "computing…" still showing. The worker is held between the
    two steps, and this thread waits holding the meter's lock, so the order is forced, not timed."""
    import threading

    m = CostMeter(LINES, model=INKLING, background=True)
    m.wait()
    assert m.estimate is not None and m.estimate.model == INKLING
    entered, go = threading.Event(), threading.Event()
    real = CostMeter._apply

    def held(self, generation):
        if threading.current_thread().name.startswith("CostMeter"):
            entered.set()
            go.wait(60)
        real(self, generation)

    monkeypatch.setattr(CostMeter, "_apply", held)
    m.model = "local/arith-tiny"  # a count not made yet: counted in the worker
    assert entered.wait(60) and m.computing
    releaser = threading.Thread(target=lambda: (m._lock.acquire(), go.set(), m._lock.release()), daemon=True)
    with m._lock:  # released only while wait() waits: the releaser lets the worker go on then
        releaser.start()
        m.wait(60)
        shown = (m.computing, None if m.estimate is None else m.estimate.model)
    go.set()
    releaser.join(60)
    assert shown == (False, "local/arith-tiny")


def test_an_error_quoting_the_rows_is_redacted_in_the_meter(monkeypatch):
    """A count or price error can quote a row (a key pasted where a role belongs): the meter shows it
    redacted, in the live view and the saved one, as the previewer does."""
    key = "tml-test-canary-cost-meter-0000000000"
    bad = [{"messages": [{"role": key, "content": "What is 1 + 1?"}, {"role": "assistant", "content": "answer: 2"}]}]
    m = CostMeter(bad, model=INKLING)
    m.wait()
    shown = m.error + m.eval_error + m.static_html() + m._repr_mimebundle_()["text/plain"]
    assert m.error and key not in shown, shown
