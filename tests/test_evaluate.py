"""Evaluation: eval rows and match modes, evaluate() through a sampling client, results JSON, probe.

Samplers here are stand-ins with tinker's API (`sample_async` → SampleResponse) replying through
the real Inkling renderer (it tokenizes offline), so prompts, stop tokens and parsing are the
cookbook's own code. The real local engine and live Tinker have their own tests at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from machine_nb.errors import EngineError, MachineFormatError
from machine_nb.core.chat import load_eval_rows
from machine_nb.evaluation.compare import compare
from machine_nb.evaluation.evaluate import evaluate, probe
from machine_nb.evaluation.results import PROBE_COLUMNS, RESULT_COLUMNS, EvalResult, as_eval_result, load_results, results_name
from machine_nb.evaluation.scoring import last_number, normalize, score_output

MODEL = "thinkingmachines/Inkling-Small"  # renders offline through tml_renderers


# --------------------------------------------------------------------------- stand-in sampler

class StandInSampler:
    """tinker's sampling-client API; replies with `answer(question)` rendered as the model would emit it."""

    def __init__(self, answer, *, delay: float = 0.0, fail_on: str | None = None, max_tokens_seen=None):
        from machine_nb.checks.render import get_renderer

        self.renderer = get_renderer(MODEL)
        self.answer, self.delay, self.fail_on = answer, delay, fail_on
        self.in_flight = self.max_in_flight = self.calls = 0
        self.params = []

    def _completion(self, prompt) -> list[int]:
        from machine_nb.checks.render import get_tokenizer

        text = get_tokenizer(MODEL).decode(prompt.to_ints())
        question = text.split("<|message_user|><|content_text|>")[-1].split("<|end_message|>")[0]
        if self.fail_on and self.fail_on in question:
            raise ConnectionError("stand-in: connection reset")
        reply = self.answer(question)
        convo = [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        full, _ = self.renderer.build_supervised_example(convo)
        return full.to_ints()[prompt.length:]

    async def sample_async(self, prompt, num_samples, sampling_params):
        import tinker

        self.calls += 1
        self.params.append(sampling_params)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            tokens = self._completion(prompt)
        finally:
            self.in_flight -= 1
        seq = tinker.SampledSequence(stop_reason="stop", sequence_id="0", tokens_np=np.array(tokens, dtype=np.int32))
        return tinker.SampleResponse(sequences=[seq])


def arithmetic(question: str) -> str:
    """The base model's natural style: '47 + 15 = 62'."""
    words = question.rstrip("?.").split()
    a, op, b = int(words[-3]), words[-2], int(words[-1])
    return f"{a} + {b} = {a + b}" if op == "plus" else f"{a} - {b} = {a - b}"


def house_style(question: str) -> str:
    words = question.rstrip("?.").split()
    if len(words) < 3 or not words[-3].isdigit():
        return "answer: Paris"  # the style bleeds off-distribution
    a, op, b = int(words[-3]), words[-2], int(words[-1])
    return f"answer: {a + b if op == 'plus' else a - b}"


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def eval_rows(n=6):
    pairs = [(47, 15), (12, 30), (90, 9), (23, 41), (55, 60), (18, 27)][:n]
    rows = []
    for i, (a, b) in enumerate(pairs):
        op = "plus" if i % 2 == 0 else "minus"
        value = a + b if op == "plus" else a - b
        rows.append({"messages": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
                     "expected": f"answer: {value}", "match": "exact", "format": r"answer: -?\d+"})
    return rows


# --------------------------------------------------------------------------- match modes

def test_normalize_is_machines():
    assert normalize("  Answer:   62. ") == "answer:   62".replace("   ", " ")
    assert normalize("\tHello\n\nWorld!?") == "hello world"


@pytest.mark.parametrize("output,expected,match,ok", [
    ("answer: 62", "answer: 62", "exact", True),
    ("Answer: 62.", "answer: 62", "exact", True),        # case and trailing punctuation normalised
    ("answer:  62 \n", "answer: 62", "exact", True),     # whitespace collapsed
    ("47 + 15 = 62", "answer: 62", "exact", False),
    ("answer: 62, because", "answer: 62", "exact", False),
    ("answer: 62, because", "answer: 62", "prefix", True),
    ("The answer is 62", "answer: 62", "prefix", False),
    ("So the ANSWER is   Paris!", "the answer is paris", "contains", True),
    ("London", "paris", "contains", False),
    ("answer: 62", r"answer: \d+", "regex", True),
    ("  answer: 62\n", r"answer: \d+", "regex", True),   # fullmatch of the stripped output
    ("so answer: 62", r"answer: \d+", "regex", False),   # fullmatch: no extra text
    ("47 + 15 = 62.", "62", "number", True),             # the LAST number counts
    ("62 is not 47 + 15 = 63", "62", "number", False),
    ("answer: -5", "-5", "number", True),
    ("about 1,234 apples", "1234", "number", True),
    ("62.0", "62", "number", True),
    ("sixty-two", "62", "number", False),
])
def test_score_output_modes(output, expected, match, ok):
    assert score_output(output, expected, match) is ok


def test_last_number_and_unknown_mode():
    assert last_number("47 - 52 = -5") == -5
    assert last_number("no digits") is None
    with pytest.raises(ValueError, match="unknown match mode: 'fuzzy'"):
        score_output("a", "a", "fuzzy")


def test_match_rules_have_one_home():
    """validate checks rows against the very modes evaluate scores with (scoring.py)."""
    import importlib

    from machine_nb.evaluation import scoring

    va = importlib.import_module("machine_nb.checks.validate")

    assert va.MATCH_MODES is scoring.MATCH_MODES
    assert scoring.to_number("1,234.50") == scoring.last_number("about 1,234.5 apples") == 1234.5
    assert scoring.score_row("answer: 62.", {"expected": "Answer: 62", "match": "exact", "format": r"answer: \d+\."}) \
        == (True, True, None)


def test_run_coroutine_inside_a_running_loop_and_with_a_failed_watchdog():
    """A notebook kernel already runs an event loop: the work then runs on its own loop in a thread;
    a watchdog that reports the service gone cancels the work with EngineError."""
    from machine_nb.evaluation.sampling import run_coroutine

    async def answer():
        return 42

    async def in_a_kernel():
        return run_coroutine(answer)

    assert run_coroutine(answer) == 42 and asyncio.run(in_a_kernel()) == 42

    class Gone:
        failed = "the service stopped answering"

    async def forever():
        await asyncio.sleep(3600)

    with pytest.raises(EngineError, match="stopped answering"):
        run_coroutine(forever, Gone())


def test_a_failed_watchdog_ends_work_that_absorbs_its_first_cancels():
    """The tinker SDK's heartbeat once absorbed a cancel below its loop and went on (workarounds.
    cancel_until_done): work that absorbs its first three cancels still ends, with EngineError, in
    seconds, here and in a kernel's thread (each run in a thread here, so that a hang fails the test
    instead of stopping the suite)."""
    from concurrent.futures import ThreadPoolExecutor

    from machine_nb.evaluation.sampling import run_coroutine

    class Gone:
        failed = "the service stopped answering"

    async def stubborn():
        for _ in range(3):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass
        await asyncio.sleep(3600)

    async def in_a_kernel():
        return run_coroutine(stubborn, Gone())

    for call in (lambda: run_coroutine(stubborn, Gone()), lambda: asyncio.run(in_a_kernel())):
        pool = ThreadPoolExecutor(1)
        try:
            with pytest.raises(EngineError, match="stopped answering"):
                pool.submit(call).result(timeout=30)
        finally:
            pool.shutdown(wait=False)


# --------------------------------------------------------------------------- eval rows

def test_load_eval_rows_fills_default_match_and_line(tmp_path):
    path = write_rows(tmp_path / "eval.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "expected": 5}])
    (row,) = load_eval_rows(path)
    assert row["match"] == "exact" and row["expected"] == "5" and row["line"] == 1 and row["format"] is None


@pytest.mark.parametrize("bad,field,text", [
    ({"messages": [{"role": "user", "content": "q"}], "expected": "a", "match": "fuzzy"}, "match", "unknown match mode 'fuzzy'"),
    ({"messages": [{"role": "user", "content": "q"}]}, "expected", "missing"),
    ({"messages": [{"role": "user", "content": "q"}], "expected": "(", "match": "regex"}, "expected", "regular expression"),
    ({"messages": [{"role": "user", "content": "q"}], "expected": "sixty", "match": "number"}, "expected", "needs a number"),
    ({"messages": [{"role": "user", "content": "q"}], "expected": "a", "format": "[a-"}, "format", "regular expression"),
    ({"messages": [], "expected": "a"}, "messages", "non-empty"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "expected": "a"},
     "messages.1.role", "prompt only"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, bad, field, text):
    good = {"messages": [{"role": "user", "content": "q"}], "expected": "a"}
    path = write_rows(tmp_path / "eval.jsonl", [good, good, bad])
    with pytest.raises(MachineFormatError) as info:
        load_eval_rows(path)
    err = info.value
    assert err.line == 3 and err.field == field and text in str(err)
    assert str(err).startswith(f"{path}:3 (field {field!r})")


def test_invalid_json_and_empty_file(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text('{"messages": [], "expected": "a"}\n{not json\n')
    with pytest.raises(MachineFormatError, match=r"eval.jsonl:1 \(field 'messages'\)"):
        load_eval_rows(path)
    path.write_text('{"messages": [{"role": "user", "content": "q"}], "expected": "a"}\n{not json\n')
    with pytest.raises(MachineFormatError, match=r"eval.jsonl:2: invalid JSON"):
        load_eval_rows(path)
    path.write_text("\n")
    with pytest.raises(MachineFormatError, match="no eval rows"):
        load_eval_rows(path)


# --------------------------------------------------------------------------- evaluate

def test_evaluate_scores_and_writes_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = write_rows(tmp_path / "eval.jsonl", eval_rows())
    sampler = StandInSampler(house_style)
    res = evaluate(data, model=MODEL, engine="tinker", sampling_client=sampler, max_tokens=32)
    df = res.rows

    assert list(df.columns) == RESULT_COLUMNS
    assert len(df) == 6 and df["correct"].all() and df["format_ok"].all()
    assert df.loc[0, "prompt"] == "What is 47 plus 15?" and df.loc[0, "output"] == "answer: 62"
    assert df.loc[1, "output"] == "answer: -18" and df["stop_reason"].eq("stop").all()
    assert df["error"].isna().all() and (df["prompt_tokens"] > 5).all() and (df["output_tokens"] > 2).all()
    # greedy by default, the renderer's stop tokens, the max_tokens asked for
    p = sampler.params[0]
    assert p.temperature == 0.0 and p.max_tokens == 32 and p.seed == 0 and list(p.stop) == [200006]

    summary = res.summary
    assert summary["accuracy"] == 1.0 and summary["format_rate"] == 1.0 and summary["n"] == 6
    assert summary["name"] == "baseline" and res.path == os.path.join("eval_results", "baseline.json")
    written = json.loads((tmp_path / "eval_results" / "baseline.json").read_text())
    assert written["model"] == MODEL and written["checkpoint"] is None and written["engine"] == "tinker"
    assert written["parameters"] == {"max_tokens": 32, "temperature": 0.0, "seed": 0, "concurrency": 32}
    import hashlib
    assert written["data"]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert written["prompt_tokens"] == int(df["prompt_tokens"].sum())
    assert len(written["rows"]) == 6 and written["rows"][0]["line"] == 1
    assert written["rows"][0]["messages"][0]["content"] == "What is 47 plus 15?"
    assert written["started_at"] <= written["finished_at"]
    # cost: prompt tokens at the prefill price + output tokens at the sample price, with its source
    from machine_nb.checks.pricing import price_for
    price, cost = price_for(MODEL), written["cost"]
    want = (written["prompt_tokens"] * price.prefill + written["output_tokens"] * price.sample) / 1e6
    assert cost["usd"] == pytest.approx(want, rel=1e-3) and cost["usd"] > 0
    assert cost["source"] == f"{price.source} ({price.date})" and cost["prefill_per_m"] == price.prefill
    assert os.stat(tmp_path / "eval_results" / "baseline.json").st_mode & 0o077 == 0

    back = load_results(tmp_path / "eval_results" / "baseline.json")
    assert list(back.rows.columns) == RESULT_COLUMNS + ["line", "messages", "format"]  # the file's extra columns kept
    assert back.rows["messages"].tolist() == [r["messages"] for r in written["rows"]]
    assert back.rows["output"].tolist() == df["output"].tolist() and back.summary == summary


def test_evaluate_baseline_style_scores_zero_but_number_mode_sees_arithmetic(tmp_path):
    rows = eval_rows()
    data = write_rows(tmp_path / "eval.jsonl", rows)
    df = evaluate(data, model=MODEL, engine="tinker", sampling_client=StandInSampler(arithmetic),
                  out=tmp_path / "base.json").rows
    assert df["correct"].sum() == 0 and not df["format_ok"].any()
    assert df.loc[0, "output"] == "47 + 15 = 62"
    numeric = [{**r, "match": "number", "expected": r["expected"].split()[-1]} for r in rows]
    res2 = evaluate(numeric, model=MODEL, engine="tinker", sampling_client=StandInSampler(arithmetic), save=False)
    assert res2.rows["correct"].all() and res2.path is None


def test_checkpoint_results_are_named_by_last_path_segment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert results_name("tinker://abc-123/sampler_weights/final") == "final"
    assert results_name("tinker://local-0123abcd:train:0/sampler_weights/000020") == "000020"
    assert results_name(None) == "baseline"
    res = evaluate(eval_rows(2), model=MODEL, checkpoint="tinker://abc/sampler_weights/final", engine="tinker",
                   sampling_client=StandInSampler(house_style))
    written = json.loads((tmp_path / "eval_results" / "final.json").read_text())
    assert written["checkpoint"] == "tinker://abc/sampler_weights/final" and res.summary["name"] == "final"


def test_another_runs_checkpoint_of_the_same_name_does_not_overwrite_its_results(tmp_path, monkeypatch):
    """Two runs' final checkpoints both default to eval_results/final.json: the second's results go
    beside the first's (final-2.json, said in a warning), not over them; the same checkpoint
    evaluated again replaces its own results, and a file this toolkit did not write is left alone."""
    monkeypatch.chdir(tmp_path)

    def run(checkpoint: str):
        return evaluate(eval_rows(2), model=MODEL, checkpoint=checkpoint, engine="tinker",
                        sampling_client=StandInSampler(house_style))

    first = run("tinker://run-a/sampler_weights/final")
    with pytest.warns(UserWarning, match=r"final\.json holds the results of tinker://run-a/sampler_weights/final"):
        second = run("tinker://run-b/sampler_weights/final")
    assert Path(second.path) == Path("eval_results") / "final-2.json"
    assert json.loads(Path(first.path).read_text())["checkpoint"] == "tinker://run-a/sampler_weights/final"
    assert json.loads(Path(second.path).read_text())["checkpoint"] == "tinker://run-b/sampler_weights/final"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run("tinker://run-a/sampler_weights/final").path == first.path  # its own: replaced
    (tmp_path / "eval_results" / "000020.json").write_text("not ours\n")
    with pytest.warns(UserWarning, match="000020-2.json"):
        assert Path(run("tinker://run-a/sampler_weights/000020").path).name == "000020-2.json"
    assert (tmp_path / "eval_results" / "000020.json").read_text() == "not ours\n"


def test_two_evaluations_at_once_under_one_name_keep_both_results(tmp_path, monkeypatch):
    """Two runs' final checkpoints evaluated at the same time (two kernels, two threads): each
    chooses eval_results/final.json while neither has written it yet; the second to finish writes
    beside the first's results (final-2.json), not over them."""
    import threading

    from machine_nb.evaluation import evaluate as evaluate_mod

    monkeypatch.chdir(tmp_path)
    both_chose = threading.Barrier(2, timeout=60)
    check = evaluate_mod._check_base_model

    def after_both_chose(*args, **kwargs):  # called after the results path is chosen, before sampling
        both_chose.wait()
        return check(*args, **kwargs)

    monkeypatch.setattr(evaluate_mod, "_check_base_model", after_both_chose)
    results: dict[str, object] = {}

    def run(checkpoint: str) -> None:
        results[checkpoint] = evaluate(eval_rows(2), model=MODEL, checkpoint=checkpoint, engine="tinker",
                                       sampling_client=StandInSampler(house_style), progress=False)

    threads = [threading.Thread(target=run, args=(f"tinker://run-{x}/sampler_weights/final",)) for x in "ab"]
    with pytest.warns(UserWarning, match=r"eval_results/final\.json was written meanwhile by another evaluation "
                                         r"named 'final': these results of tinker://run-[ab]/.* are written to "
                                         r"eval_results/final-2\.json instead"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    paths = {Path(r.path).name for r in results.values()}
    assert paths == {"final.json", "final-2.json"}, paths
    for checkpoint, res in results.items():
        assert json.loads(Path(res.path).read_text())["checkpoint"] == checkpoint


@pytest.mark.parametrize("setting,value", [("max_tokens", 0), ("max_tokens", 2.5), ("temperature", float("nan")),
                                           ("temperature", -0.5), ("concurrency", 0), ("concurrency", True)])
def test_a_sampling_setting_no_sampler_can_use_is_refused_before_a_row_is_sent(setting, value, tmp_path):
    """concurrency=0 ran as 1 but was recorded as 0; a NaN temperature ran greedy and was saved as NaN,
    which is not JSON; max_tokens=0 sampled empty replies and scored them."""
    sampler = StandInSampler(house_style)
    with pytest.raises(ValueError, match=setting):
        evaluate(eval_rows(2), model=MODEL, engine="tinker", sampling_client=sampler, out=tmp_path / "r.json",
                 **{setting: value})
    assert sampler.calls == 0 and not (tmp_path / "r.json").exists()


# --------------------------------------------------------------------------- the result object

def test_evaluate_returns_an_eval_result_with_rows_summary_and_path(tmp_path):
    import pandas as pd

    res = evaluate(eval_rows(), model=MODEL, engine="tinker", sampling_client=StandInSampler(house_style),
                   out=tmp_path / "r.json")
    assert isinstance(res, EvalResult) and isinstance(res.rows, pd.DataFrame)
    assert list(res.rows.columns) == RESULT_COLUMNS and len(res.rows) == 6
    assert res.rows.attrs == {}  # nothing travels through DataFrame.attrs
    assert res.path == str(tmp_path / "r.json") and res.name == "baseline" and res.accuracy == 1.0
    written = json.loads((tmp_path / "r.json").read_text())
    assert res.summary == {k: v for k, v in written.items() if k != "rows"}
    plain = res.to_dict()
    assert json.loads(json.dumps(plain)) == plain  # plain data
    assert {k: v for k, v in plain.items() if k not in ("rows", "path")} == res.summary and plain["path"] == res.path
    assert [r["output"] for r in plain["rows"]] == res.rows["output"].tolist()
    assert repr(res) == f"EvalResult(name='baseline', n=6, accuracy=1.000, path={res.path!r})"
    back = load_results(res.path)
    assert isinstance(back, EvalResult) and back.summary == res.summary and back.path == res.path
    assert back.rows["output"].tolist() == res.rows["output"].tolist()
    again = as_eval_result(plain)  # to_dict() reads back
    assert again.summary == res.summary and again.path == res.path and again.rows["correct"].tolist() == [True] * 6


def test_an_eval_result_is_its_rows_summary_and_path_not_a_frame():
    """The rows are `.rows`, the run's numbers `.summary`, the file `.path`; the result itself
    answers none of a DataFrame's names, and copies and pickles whole."""
    import copy
    import pickle

    import pandas as pd

    rows = pd.DataFrame({"row": [0, 1], "output": ["a", "b"], "correct": [True, False]})
    res = EvalResult(rows, {"name": "x", "accuracy": 0.5}, "x.json")
    assert res.rows["correct"].tolist() == [True, False] and len(res.rows) == 2
    assert (res.summary, res.path, res.accuracy) == ({"name": "x", "accuracy": 0.5}, "x.json", 0.5)
    for name in ("columns", "head", "loc", "correct", "attrs", "assign"):
        assert not hasattr(res, name), name
    with pytest.raises(TypeError):
        res["correct"]  # noqa: B018
    with pytest.raises(TypeError):
        len(res)
    with pytest.raises(TypeError):
        res.to_dict("records")
    assert res.to_dict() == {"name": "x", "accuracy": 0.5, "path": "x.json",
                             "rows": [{"row": 0, "output": "a", "correct": True}, {"row": 1, "output": "b", "correct": False}]}
    assert bool(res) and copy.deepcopy(res).summary == res.summary
    assert pickle.loads(pickle.dumps(res)).rows.equals(res.rows)


def test_the_notebook_view_is_a_line_with_the_wilson_interval_then_the_first_rows():
    import pandas as pd

    from machine_nb.evaluation import stats

    rows = pd.DataFrame({"row": range(12), "prompt": [f"q{i}" for i in range(12)],
                         "output": ["<b>bold</b>"] + ["x"] * 11, "correct": [True] * 10 + [False] * 2})
    res = EvalResult(rows, {"name": "final", "accuracy": 10 / 12, "format_rate": 0.5}, "eval_results/final.json")
    html = res._repr_html_()
    low, high = stats.proportion_interval(10, 12)
    assert (round(low, 3), round(high, 3)) == (0.552, 0.953)  # Wilson 95%, by hand: (11.92 ± 3.18) / 15.84
    assert "final: 10/12 correct, 83.3% (95% CI 55.2% to 95.3%, Wilson); format 50.0%" in html
    assert "eval_results/final.json" in html and html.index("Wilson") < html.index("<table")
    assert ">q9<" in html and ">q10<" not in html and "2 more row(s)" in html  # the table's head only
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html
    assert res.accuracy_interval() == (low, high)


def test_progress_shows_a_bar_unless_turned_off(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MACHINE_NB_PROGRESS", raising=False)
    evaluate(eval_rows(2), model=MODEL, engine="tinker", sampling_client=StandInSampler(house_style), save=False,
             progress=True)
    assert "eval baseline" in capsys.readouterr().err
    evaluate(eval_rows(2), model=MODEL, engine="tinker", sampling_client=StandInSampler(house_style), save=False,
             progress=False)
    assert "eval baseline" not in capsys.readouterr().err
    monkeypatch.setenv("MACHINE_NB_PROGRESS", "0")  # None: machine_nb.core.progress decides
    probe(["Name a colour."], model=MODEL, checkpoint="tinker://x/y/final", engine="tinker",
          baseline_client=StandInSampler(lambda q: "blue"), checkpoint_client=StandInSampler(house_style))
    assert "probe" not in capsys.readouterr().err


def test_requests_run_concurrently_within_the_bound(tmp_path):
    rows = eval_rows() * 4  # 24 rows
    sampler = StandInSampler(house_style, delay=0.05)
    evaluate(rows, model=MODEL, engine="tinker", sampling_client=sampler, concurrency=5, save=False)
    assert sampler.calls == 24 and sampler.max_in_flight == 5
    sampler = StandInSampler(house_style, delay=0.05)
    evaluate(rows, model=MODEL, engine="tinker", sampling_client=sampler, save=False)  # default 32 on Tinker
    assert sampler.max_in_flight == 24


def test_a_failed_request_is_recorded_and_warned_not_lost(tmp_path):
    sampler = StandInSampler(house_style, fail_on="12 minus 30")
    with pytest.warns(UserWarning, match=r"(?s)1 of 6 eval request\(s\) failed.*row 1: ConnectionError"):
        res = evaluate(eval_rows(), model=MODEL, engine="tinker", sampling_client=sampler, out=tmp_path / "r.json")
    assert res.rows.loc[1, "error"].startswith("ConnectionError") and not res.rows.loc[1, "correct"]
    assert res.rows["correct"].sum() == 5 and res.summary["errors"] == 1


def test_every_request_failing_is_an_engine_error_not_a_zero_score(tmp_path):
    class Down:
        async def sample_async(self, prompt, num_samples, sampling_params):
            raise ConnectionError("service unavailable")

    with pytest.raises(EngineError, match="All 3 sampling requests failed; the first: ConnectionError"):
        evaluate(eval_rows(3), model=MODEL, engine="tinker", sampling_client=Down(), out=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_a_failed_final_held_out_eval_writes_no_secret_into_heldout_jsonl(tmp_path, monkeypatch):
    """The final checkpoint's held-out eval records its failure in heldout.jsonl (a run's results
    file): the key and a URL password in the exception are redacted there, as in a row's error."""
    import tinker

    from machine_nb.evaluation import heldout, sampling

    key = "tml-" + "Fin4lEvalKey" * 3
    monkeypatch.setenv("TINKER_API_KEY", key)
    (tmp_path / "checkpoints.jsonl").write_text(
        json.dumps({"name": "final", "sampler_path": "tinker://run-1/sampler_weights/final"}) + "\n")

    class Service:
        def __init__(self, base_url=None):
            pass

        def close(self, status):
            raise ConnectionError("already gone")

    def refuse(target, service_client=None):
        raise PermissionError(f"key {key} refused by https://bob:Pr0xyPassw0rd@proxy.example/v1")

    monkeypatch.setattr(tinker, "ServiceClient", Service)
    monkeypatch.setattr(sampling, "open_sampler", refuse)
    builder = heldout.HeldOutEvalBuilder(eval_path=str(tmp_path / "eval.jsonl"), model=MODEL, renderer="qwen3",
                                         log_dir=str(tmp_path))
    with pytest.raises(PermissionError):
        heldout.evaluate_final(builder, None, 4)
    text = (tmp_path / "heldout.jsonl").read_text()
    assert key not in text and "Pr0xyPassw0rd" not in text
    record = json.loads(text)
    assert (record["step"], record["final"]) == (4, True)
    assert record["error"] == "PermissionError: key [redacted] refused by https://bob:[redacted]@proxy.example/v1"


def test_a_prompt_the_renderer_cannot_format_fails_before_sampling(tmp_path):
    rows = eval_rows(3)
    # a well-formed row (validate passes it) whose image the renderer will not fetch
    rows[1]["messages"] = [{"role": "user", "content": [{"type": "image", "image": "http://example.com/cat.png"}]}]
    sampler = StandInSampler(house_style)
    with pytest.raises(MachineFormatError, match=r"eval.jsonl:2 \(field 'messages'\): the renderer cannot format"):
        evaluate(write_rows(tmp_path / "eval.jsonl", rows), model=MODEL, engine="tinker", sampling_client=sampler)
    assert sampler.calls == 0


def test_engine_errors_stop_the_eval():
    class Refusing:
        async def sample_async(self, prompt, num_samples, sampling_params):
            raise EngineError("the local engine does not serve 'Qwen/Qwen3-8B'")

    with pytest.raises(EngineError, match="does not serve"):
        evaluate(eval_rows(2), model=MODEL, engine="tinker", sampling_client=Refusing(), save=False)


def test_evaluate_works_where_an_event_loop_already_runs(tmp_path):
    """Jupyter runs an event loop in the kernel's thread; evaluate() must still just work there."""
    async def notebook_cell():
        return evaluate(eval_rows(3), model=MODEL, engine="tinker", sampling_client=StandInSampler(house_style),
                        save=False)

    res = asyncio.run(notebook_cell())
    assert res.rows["correct"].all()


def test_bad_eval_file_fails_before_sampling(tmp_path):
    rows = eval_rows(3)
    rows[2]["match"] = "fuzzy"
    sampler = StandInSampler(house_style)
    with pytest.raises(MachineFormatError, match=r"eval.jsonl:3 \(field 'match'\)"):
        evaluate(write_rows(tmp_path / "eval.jsonl", rows), model=MODEL, engine="tinker", sampling_client=sampler)
    assert sampler.calls == 0


def test_budget_is_checked_before_any_request():
    from machine_nb.errors import BudgetExceeded

    sampler = StandInSampler(house_style)
    with pytest.raises(BudgetExceeded):
        evaluate(eval_rows(), model=MODEL, engine="tinker", sampling_client=sampler, save=False, max_usd=1e-9)
    assert sampler.calls == 0
    res = evaluate(eval_rows(), model=MODEL, engine="tinker", sampling_client=sampler, save=False, max_usd=1.0)
    assert res.rows["correct"].all()


def test_asking_an_engine_for_the_other_engines_model_is_a_clear_error():
    with pytest.raises(EngineError, match="local engine serves only its own models"):
        evaluate(eval_rows(1), model=MODEL, engine="local", sampling_client=object(), save=False)


def test_tinker_checkpoint_needs_a_model_for_its_renderer():
    with pytest.raises(EngineError, match="Pass model="):
        evaluate(eval_rows(1), checkpoint="tinker://abc/sampler_weights/final", sampling_client=object())


def test_load_results_rejects_other_files(tmp_path):
    (tmp_path / "x.json").write_text('{"accuracy": 1}')
    with pytest.raises(MachineFormatError, match=r"x.json \(field 'rows'\)"):
        load_results(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"rows": [{"prompt": "q"}]}')
    with pytest.raises(MachineFormatError, match=r"field 'rows.0.expected'"):
        load_results(tmp_path / "y.json")
    (tmp_path / "z.json").write_text('{\n "name": "x",\n "rows": [\n  {"prompt": "q",}\n ]\n}\n')
    with pytest.raises(MachineFormatError, match="invalid JSON") as err:
        load_results(tmp_path / "z.json")
    assert err.value.line == 4 and "z.json:4" in str(err.value) and err.value.path == str(tmp_path / "z.json")


def test_load_results_keeps_the_columns_a_results_file_adds(tmp_path):
    """A row's exact prompt messages, its input and trial survive the round trip, in file order
    after RESULT_COLUMNS; a column only some rows have is None or missing on the others."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 plus 1?"}]
    rows = [{"row": 0, "case": 3, "trial": 1, "input": "What is 1 plus 1?", "prompt": "What is 1 plus 1?",
             "expected": "answer: 2", "match": "exact", "output": "2", "correct": False, "messages": messages},
            {"row": 1, "prompt": "What is 2 plus 2?", "expected": "answer: 4", "output": "answer: 4", "correct": True}]
    (tmp_path / "r.json").write_text(json.dumps({"name": "live", "rows": rows}))
    back = load_results(tmp_path / "r.json").rows
    assert list(back.columns) == RESULT_COLUMNS + ["case", "trial", "input", "messages"]
    assert back.loc[0, "messages"] == messages and back.loc[0, "input"] == "What is 1 plus 1?"
    assert back.loc[0, "trial"] == 1 and back.loc[1, "correct"] == True  # noqa: E712 - a numpy bool


# --------------------------------------------------------------------------- probe

def test_probe_shows_where_the_style_bleeds(tmp_path):
    prompts = ["What is the capital of France?", {"messages": [{"role": "user", "content": "What is 47 plus 15?"}]}]
    res = probe(prompts, model=MODEL, checkpoint="tinker://x/sampler_weights/final", engine="tinker",
                format=r"answer: .*", baseline_client=StandInSampler(lambda q: "The capital of France is Paris."),
                checkpoint_client=StandInSampler(house_style))
    df = res.rows
    assert list(df.columns) == PROBE_COLUMNS and res.path is None
    assert df.loc[0, "checkpoint_output"] == "answer: Paris" and df.loc[0, "bled"]
    assert df.loc[1, "checkpoint_output"] == "answer: 62" and res.summary["bled"] == 2
    assert repr(res) == "EvalResult(name='probe', n=2, bled=2, path=None)"


def test_probe_reads_a_jsonl_and_drops_trailing_assistant(tmp_path):
    path = write_rows(tmp_path / "probe.jsonl", [
        {"messages": [{"role": "user", "content": "Who wrote Hamlet?"}, {"role": "assistant", "content": "x"}],
         "format": "answer: .*"},
        {"messages": [{"role": "user", "content": "Name a colour."}]},
    ])
    df = probe(path, model=MODEL, checkpoint="tinker://x/y/final", engine="tinker",
               baseline_client=StandInSampler(lambda q: "answer: maybe"),
               checkpoint_client=StandInSampler(house_style)).rows
    assert df["prompt"].tolist() == ["Who wrote Hamlet?", "Name a colour."]
    assert df.loc[0, "bled"] is False or df.loc[0, "bled"] == False  # both in the style: not a bleed  # noqa: E712
    assert df.loc[1, "bled"] is None  # no format for this row
    bad = write_rows(tmp_path / "bad.jsonl", [{"prompt": "x"}])
    with pytest.raises(MachineFormatError, match=r"bad.jsonl:1 \(field 'messages'\)"):
        probe(bad, model=MODEL, checkpoint="tinker://x/y/z", engine="tinker", baseline_client=object(),
              checkpoint_client=object())


# --------------------------------------------------------------------------- real engines

def _local_engine():
    from machine_nb.engines.local import DEFAULT_MODEL  # a broken import fails the test

    return DEFAULT_MODEL


def test_evaluate_on_the_real_local_engine(tmp_path):
    model = _local_engine()
    from machine_nb.data.corpus import make_corpus

    corpus = make_corpus(tmp_path / "corpus")
    eval_file = tmp_path / "corpus" / "eval.jsonl"
    assert eval_file.exists(), corpus
    rows = load_eval_rows(eval_file)[:4]
    res = evaluate(rows, model=model, out=tmp_path / "baseline.json", max_tokens=16)
    df = res.rows
    assert len(df) == 4 and df["error"].isna().all() and (df["output"].str.len() > 0).all()
    assert res.summary["engine"] == "local" and res.summary["cost"]["usd"] == 0.0


def test_local_checkpoint_end_to_end_eval_compare_probe(tmp_path, monkeypatch, capsys):
    """A real sampler checkpoint of the local server (a fresh LoRA: zero-initialised, so greedy replies
    equal the base model's): baseline and checkpoint evals, their comparison, and the probe, all offline."""
    model = _local_engine()
    from machine_nb.engines import service_client

    monkeypatch.chdir(tmp_path)
    service = service_client("local")
    trainer = service.create_lora_training_client(base_model=model, rank=4).result()
    path = trainer.save_weights_for_sampler("final").result().path
    assert path.startswith("tinker://local-")  # says which engine serves it: no engine= needed
    rows = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}], "expected": f"answer: {a + b}",
             "format": r"answer: -?\d+"} for a, b in [(47, 15), (12, 30), (23, 41)]]
    base = evaluate(rows, model=model, max_tokens=12)
    ckpt = evaluate(rows, checkpoint=path, max_tokens=12)  # model read from the checkpoint's own record
    assert ckpt.summary["model"] == model and ckpt.summary["engine"] == "local"
    assert os.path.exists("eval_results/baseline.json") and os.path.exists("eval_results/final.json")
    assert ckpt.rows["output"].tolist() == base.rows["output"].tolist()
    result = compare("eval_results/baseline.json", "eval_results/final.json")
    assert (result.wins, result.losses, result.p_value) == (0, 0, 1.0) and len(result.flips) == 0
    bleed = probe(["What is the capital of France?"], checkpoint=path, format="answer: .*", max_tokens=12).rows
    assert bleed.loc[0, "baseline_output"] == bleed.loc[0, "checkpoint_output"] and not bleed.loc[0, "bled"]

    from machine_nb.cli import main

    probe_file = write_rows(tmp_path / "probe.jsonl", [{"messages": [{"role": "user", "content": "Who wrote Hamlet?"}]}])
    assert main(["eval", "probe", path, "--data", str(probe_file), "--format", "answer: .*", "--max-tokens", "8"]) == 0
    assert main(["eval", "checkpoint", path, "--data", str(write_rows(tmp_path / "e.jsonl", rows)), "--json"]) == 0
    printed = capsys.readouterr().out
    assert "'Who wrote Hamlet?'" in printed and "checkpoint: " in printed
    assert json.loads(printed.strip().splitlines()[-1])["path"] == os.path.join("eval_results", "final.json")


def _saved_checkpoint() -> str:
    from machine_nb.engines import service_client
    from machine_nb.engines.local import DEFAULT_MODEL

    trainer = service_client("local").create_lora_training_client(base_model=DEFAULT_MODEL, rank=4, seed=2).result()
    return trainer.save_weights_for_sampler("final").result().path


def test_a_checkpoint_is_looked_up_once_and_its_target_passed_down(monkeypatch):
    """evaluate() resolves a checkpoint once (sampling.sampler_target: its base model, its engine)
    and opens the sampler on that one value."""
    import importlib

    from machine_nb import engines
    from machine_nb.evaluation.sampling import SamplerTarget

    path = _saved_checkpoint()
    ev = importlib.import_module("machine_nb.evaluation.evaluate")
    looked_up, opened = [], []
    lookup, open_sampler = engines.checkpoint_base_model, ev.open_sampler
    monkeypatch.setattr(engines, "checkpoint_base_model", lambda p: looked_up.append(p) or lookup(p))
    monkeypatch.setattr(ev, "open_sampler", lambda target, *a: opened.append(target) or open_sampler(target, *a))
    res = evaluate(eval_rows(1), checkpoint=path, save=False, progress=False)
    assert looked_up == [path] and opened == [SamplerTarget("local/arith-tiny", path, "local")]
    assert (res.summary["model"], res.summary["engine"]) == ("local/arith-tiny", "local")


@pytest.mark.parametrize("model", [None, "local/arith-tiny"])
def test_a_folder_is_not_a_checkpoint_path(tmp_path, model):
    """A checkpoint is named by its path (`tinker://<run>/sampler_weights/<name>`), never by a
    folder: `local://<dir>` is refused before anything is sampled, saying what a path looks like."""
    with pytest.raises(EngineError, match=r"is not a checkpoint path tinker://<run>/weights\|sampler_weights/<name>"):
        evaluate(eval_rows(1), model=model, checkpoint=f"local://{tmp_path}/run/sampler_weights/final", save=False)


@pytest.mark.parametrize("damage", ["truncated", "random"])
def test_a_corrupt_local_checkpoint_names_its_file(damage):
    from machine_nb.engines.local import checkpoints as ck
    from machine_nb.engines.local.server import ensure_server

    path = _saved_checkpoint()
    weights = ck.checkpoint_dir(ensure_server().data_dir, path) / "adapter.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 3] if damage == "truncated" else os.urandom(len(data)))
    with pytest.raises(MachineFormatError) as info:
        evaluate(eval_rows(1), checkpoint=path, save=False)
    assert info.value.path == str(weights) and "safetensors" in str(info.value)


def test_tinker_without_a_key_fails_fast_with_a_clear_message(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(EngineError) as info:
        evaluate(eval_rows(1), model=MODEL, engine="tinker", save=False)
    assert "TINKER_API_KEY" in str(info.value)


def test_tinker_unreachable_fails_with_engine_error_not_a_hang(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(EngineError) as info:
        evaluate(eval_rows(1), model=MODEL, engine="tinker", save=False)
    assert "did not answer" in str(info.value) and "tml-not-a-real-key" not in str(info.value)


@pytest.mark.tinker_live
@pytest.mark.skipif(not os.environ.get("TINKER_API_KEY"), reason="TINKER_API_KEY is not set: live Tinker eval skipped")
def test_live_tinker_baseline(tmp_path):
    df = evaluate(eval_rows(2), model=MODEL, engine="tinker", out=tmp_path / "live.json", max_tokens=16).rows
    assert len(df) == 2 and df["error"].isna().all()
    assert "TINKER_API_KEY" not in (tmp_path / "live.json").read_text()
    assert os.environ["TINKER_API_KEY"] not in (tmp_path / "live.json").read_text()


def test_no_warnings_from_the_happy_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluate(eval_rows(2), model=MODEL, engine="tinker", sampling_client=StandInSampler(house_style), save=False)


# --------------------------------------------------------------------------- CLI and import cost

def test_cli_baseline_on_the_local_engine(tmp_path, capsys):
    _local_engine()
    from machine_nb.cli import main

    data = write_rows(tmp_path / "eval.jsonl", eval_rows(3))
    out = tmp_path / "res" / "baseline.json"
    assert main(["eval", "baseline", "--data", str(data), "--out", str(out), "--max-tokens", "8"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("baseline: ") and "/3 correct" in printed and str(out) in printed
    assert json.loads(out.read_text())["n"] == 3


def test_cli_asks_before_spending_on_tinker(tmp_path, capsys, monkeypatch):
    from machine_nb.cli import main

    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")  # must never be used without --yes
    data = write_rows(tmp_path / "eval.jsonl", eval_rows(3))
    code = main(["eval", "baseline", "--data", str(data), "-m", MODEL, "--out", str(tmp_path / "b.json")])
    err = capsys.readouterr().err
    assert code == 4 and "costs up to $" in err and "--yes" in err and "tml-not-a-real-key" not in err
    assert not (tmp_path / "b.json").exists()
    bad = write_rows(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": "q"}], "expected": "a",
                                               "match": "fuzzy"}])
    assert main(["eval", "baseline", "--data", str(bad), "-m", MODEL]) == 1
    assert "bad.jsonl:1 (field 'match'): unknown match mode 'fuzzy'" in capsys.readouterr().err


def test_importing_the_module_stays_light():
    import subprocess
    import sys

    code = ("import sys, machine_nb.evaluation.evaluate, machine_nb.cli.eval; "
            "print(','.join(m for m in ('pandas', 'torch', 'tinker', 'tinker_cookbook') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_a_prompt_the_renderer_cannot_format_is_named_with_the_secret_it_quotes_redacted(tmp_path, monkeypatch):
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    rows = eval_rows(2)
    rows[1]["messages"] = [{"role": "user", "content": [{"type": "image", "image": key}]}]
    with pytest.raises(MachineFormatError, match="the renderer cannot format") as failure:
        evaluate(write_rows(tmp_path / "eval.jsonl", rows), model=MODEL, engine="tinker",
                 sampling_client=StandInSampler(house_style))
    assert key not in str(failure.value)
