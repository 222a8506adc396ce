"""Inspect tasks through inspect_eval's model API, with a stand-in sampler: what the model is sent
(the task's system message), which settings are honoured (logprobs) and which are refused before
anything is sent (a budget of 0, no requests in flight).

The prompts are rendered with the local engine's shipped model (`local/arith-tiny`); the stand-in
sampler records each prompt and answers "5", so nothing here runs a model.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

pytest.importorskip("inspect_ai")

MODEL = "local/arith-tiny"
QUESTION = "What is 2 plus 3?"


class Sampler:
    """Answers "5" (then the renderer's stop token) with the given log-probabilities, recording each prompt."""

    def __init__(self, logprobs=(-0.25, -0.5)):
        from machine_nb import engines
        from machine_nb.checks.render import get_renderer, renderer_name

        engines.use_local_models()
        self.renderer = get_renderer(MODEL, renderer_name(MODEL))
        self.logprobs = list(logprobs)
        self.prompts: list[str] = []

    async def sample_async(self, prompt, num_samples, sampling_params):
        self.prompts.append(self.renderer.tokenizer.decode(prompt.to_ints()))
        tokens = [*self.renderer.tokenizer.encode("5", add_special_tokens=False), *self.renderer.get_stop_sequences()]
        assert len(tokens) == len(self.logprobs)
        return SimpleNamespace(sequences=[SimpleNamespace(tokens=tokens, stop_reason="stop", logprobs=self.logprobs)
                                          for _ in range(num_samples)])


def task(config=None, system=None):
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import GenerateConfig
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate, system_message

    solver = [system_message(system), generate()] if system else generate()
    return Task(dataset=MemoryDataset([Sample(id="q1", input=QUESTION, target="5")], name="sums"), solver=solver,
                scorer=match(), config=config or GenerateConfig(), name="sums")


def run(tmp_path, the_task, sampler, **options):
    from machine_nb.evaluation.inspect_bridge import inspect_eval

    return inspect_eval(the_task, MODEL, sampling_client=sampler, log_dir=tmp_path / "logs", **options)


def test_a_tasks_system_message_is_sent_once(tmp_path):
    """GenerateConfig(system_message=…) reached the model twice: Inspect inserts it, and the model API again."""
    from inspect_ai.model import GenerateConfig

    sampler = Sampler()
    res = run(tmp_path, task(GenerateConfig(system_message="Answer with digits only.")), sampler)
    assert res[0].rows["output"].tolist() == ["5"]
    assert sampler.prompts[0].count("Answer with digits only.") == 1


def test_a_system_message_solver_is_sent_once(tmp_path):
    sampler = Sampler()
    run(tmp_path, task(system="Answer with digits only."), sampler)
    assert sampler.prompts[0].count("Answer with digits only.") == 1


def test_logprobs_asked_by_a_task_come_back_on_the_output(tmp_path):
    """logprobs=True was warned about and dropped, though the sampler returns each token's log-probability."""
    from inspect_ai.model import GenerateConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = run(tmp_path, task(GenerateConfig(logprobs=True)), Sampler(logprobs=(-0.25, -0.5)))
    assert not [w for w in caught if "logprobs" in str(w.message)]
    logprobs = res.logs[0].samples[0].output.choices[0].logprobs
    assert [lp.logprob for lp in logprobs.content] == [-0.25, -0.5]
    assert logprobs.content[0].token == "5"


def test_logprobs_not_asked_for_are_not_attached(tmp_path):
    res = run(tmp_path, task(), Sampler())
    assert res.logs[0].samples[0].output.choices[0].logprobs is None


@pytest.mark.parametrize("setting, value", [("concurrency", 0), ("max_tokens", 0), ("temperature", -1.0),
                                            ("temperature", None), ("temperature", float("nan")),
                                            ("max_tokens", None)])
def test_a_sampling_setting_no_sampler_can_use_is_refused_before_anything_is_sent(tmp_path, setting, value):
    """concurrency=0 hung Inspect (no request could start); max_tokens=0 became a 2048-token budget;
    a negative temperature was sent; None was a bare TypeError from float()."""
    sampler = Sampler()
    with pytest.raises(ValueError, match=setting):
        run(tmp_path, task(), sampler, **{setting: value})
    assert sampler.prompts == []


# --------------------------------------------------------------------------- tool calls in prompts

TOOL_ROW = {"messages": [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "5"},
    {"role": "user", "content": "So what is it?"}], "expected": "5"}


def test_eval_task_keeps_a_rows_tool_call_and_its_result():
    """eval_task dropped the tool result and the assistant's call, so Inspect asked another prompt than evaluate()."""
    from machine_nb.evaluation.inspect_bridge import eval_task

    messages = eval_task([TOOL_ROW]).dataset[0].input
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "user"]
    [call] = messages[2].tool_calls
    assert (call.id, call.function, call.arguments) == ("c1", "add", {"a": 2, "b": 3})
    assert (messages[3].tool_call_id, messages[3].function, messages[3].text) == ("c1", "add", "5")


def test_a_tool_row_reaches_the_model_as_evaluate_renders_it(tmp_path):
    from machine_nb.checks.render import renderer_messages
    from machine_nb.evaluation.inspect_bridge import eval_task

    sampler = Sampler()
    run(tmp_path, eval_task([TOOL_ROW]), sampler)
    prompt = sampler.renderer.build_generation_prompt(renderer_messages(TOOL_ROW["messages"]))
    assert sampler.prompts == [sampler.renderer.tokenizer.decode(prompt.to_ints())]


def test_a_logs_tool_messages_read_back_and_write_again(tmp_path):
    """Reading a log dropped the assistant's tool calls; writing it again dropped the tool messages.
    Arguments read back as the model was shown them (compact JSON)."""
    import machine_nb as mnb
    from machine_nb.evaluation.inspect_bridge import eval_task

    res = run(tmp_path, eval_task([TOOL_ROW]), Sampler())[0]
    expected = [dict(m, content=m["content"] or "") for m in TOOL_ROW["messages"]]  # a call's None text reads as ""
    assert res.rows["messages"][0] == expected
    again = mnb.load_results(res.write_inspect_log(tmp_path / "again.eval"))
    assert again.rows["messages"][0] == expected


def test_eval_task_refuses_tool_arguments_that_are_not_an_object():
    from machine_nb.errors import MachineFormatError
    from machine_nb.evaluation.inspect_bridge import eval_task

    row = {**TOOL_ROW, "messages": [dict(m) for m in TOOL_ROW["messages"]]}
    row["messages"][2]["tool_calls"] = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "[2, 3]"}}]
    with pytest.raises(MachineFormatError, match=r"messages\.2\.tool_calls\.0\.function\.arguments.*JSON object"):
        eval_task([row])


# --------------------------------------------------------------------------- Ctrl-C in a notebook

def test_ctrl_c_in_a_notebook_stops_an_inspect_run_without_waiting_for_every_sample(tmp_path):
    """In a kernel, Ctrl-C waited until Inspect had sampled every sample (still sending requests) before it
    came back."""
    import asyncio
    import threading

    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    from interrupt import interrupted_in_a_kernel

    started, seen = threading.Event(), []

    class Slow(Sampler):
        async def sample_async(self, prompt, num_samples, sampling_params):
            self.prompts.append(prompt)
            started.set()
            try:
                await asyncio.sleep(20)
                seen.append("finished")
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return await super().sample_async(prompt, num_samples, sampling_params)

    sampler = Slow()
    many = Task(dataset=MemoryDataset([Sample(id=i, input=QUESTION, target="5") for i in range(1, 4)], name="sums"),
                solver=generate(), scorer=match(), name="sums")

    interrupted_in_a_kernel(lambda: run(tmp_path, many, sampler, concurrency=1), ctrl_c_once=started)
    assert seen == ["cancelled"] and len(sampler.prompts) == 1


def test_a_tool_error_reaches_the_model(tmp_path):
    """A tool call that failed (Inspect's ChatMessageTool with an error and no content) reached the
    model as an empty result, where Inspect's own providers send "Error: <message>"."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ChatMessageUser
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate
    from inspect_ai.tool import ToolCall, ToolCallError

    messages = [ChatMessageUser(content=QUESTION),
                ChatMessageAssistant(content="", tool_calls=[ToolCall(id="c1", function="add", arguments={"a": 2})]),
                ChatMessageTool(content="", tool_call_id="c1", function="add",
                                error=ToolCallError("parsing", "missing argument b"))]
    failed = Task(dataset=MemoryDataset([Sample(id=1, input=messages, target="5")], name="sums"), solver=generate(),
                  scorer=match(), name="sums")
    sampler = Sampler()
    run(tmp_path, failed, sampler)
    assert "Error: missing argument b" in sampler.prompts[0]


# --------------------------------------------------------------------------- sample_rows

def test_sample_rows_keeps_a_replys_tool_calls():
    """A reply that called a tool came back as an empty output with nothing saying what it called."""
    import asyncio

    from tinker_cookbook.renderers import ToolCall

    from machine_nb.evaluation.sampling import sample_rows

    class CallingRenderer:
        def parse_response(self, tokens):
            if tokens == [1]:
                return {"role": "assistant", "content": "hi"}, True
            call = ToolCall(id="c1", function=ToolCall.FunctionBody(name="add", arguments='{"a":2}'))
            return {"role": "assistant", "content": "", "tool_calls": [call]}, True

    class Stub:
        async def sample_async(self, prompt, num_samples, sampling_params):
            return SimpleNamespace(sequences=[SimpleNamespace(tokens=[prompt.n], stop_reason="stop")])

    prompts = [SimpleNamespace(length=3, n=1), SimpleNamespace(length=3, n=2)]
    out = asyncio.run(sample_rows(Stub(), CallingRenderer(), prompts, None, 2))
    assert [r["output"] for r in out] == ["hi", ""]
    assert out[0]["tool_calls"] is None
    assert out[1]["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2}'}}]


# --------------------------------------------------------------------------- reading logs

def test_a_model_graded_scorers_tokens_are_not_counted_as_the_models(tmp_path):
    """A row's prompt_tokens and output_tokens summed every model a sample used, a grader's included."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, ModelUsage, get_model, modelapi
    from inspect_ai.scorer import CORRECT, Score, accuracy, scorer
    from inspect_ai.solver import generate

    class Grader(ModelAPI):
        def __init__(self, model_name, base_url=None, api_key=None, config=GenerateConfig()):
            super().__init__(model_name=model_name, base_url=base_url, api_key=api_key, config=config)

        async def generate(self, input, tools, tool_choice, config):
            out = ModelOutput.from_content(self.model_name, "C")
            out.usage = ModelUsage(input_tokens=1000, output_tokens=100, total_tokens=1100)
            return out

    modelapi(name="review-grader")(lambda: Grader)

    @scorer(metrics=[accuracy()])
    def graded():
        async def score(state, target):
            await get_model("review-grader/g").generate("grade this")
            return Score(value=CORRECT)
        return score

    the_task = Task(dataset=MemoryDataset([Sample(id=1, input=QUESTION, target="5")], name="sums"), solver=generate(),
                    scorer=graded(), name="sums")
    res = run(tmp_path, the_task, Sampler())
    sample = res.logs[0].samples[0]
    assert set(sample.model_usage) == {res.logs[0].eval.model, "review-grader/g"}
    row = res[0].rows.iloc[0]
    assert (row["prompt_tokens"], row["output_tokens"]) == (sample.output.usage.input_tokens, 2)
    assert res[0].summary["prompt_tokens"] == sample.output.usage.input_tokens


def test_a_run_of_no_samples_says_so_not_that_samples_were_not_logged(tmp_path):
    """An eval that ran no samples (an empty dataset, limit=0) was told to log its samples (log_samples=True)."""
    from machine_nb.errors import MachineFormatError

    with pytest.raises(MachineFormatError, match=r"ran no samples") as caught:
        run(tmp_path, task(), Sampler(), limit=0)
    assert "log_samples" not in str(caught.value)


def test_a_log_whose_samples_were_not_logged_says_how_to_log_them(tmp_path):
    from machine_nb.errors import MachineFormatError

    with pytest.raises(MachineFormatError, match=r"log_samples=True"):
        run(tmp_path, task(), Sampler(), log_samples=False)


def test_a_samples_error_read_from_a_log_is_redacted(tmp_path):
    """A sample's error text went into the rows (and the results a notebook shows) with a key in it."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import match
    from inspect_ai.solver import solver

    key = "sk-" + "abcdefghij0123456789" * 2

    @solver
    def leaky():
        async def solve(state, generate):
            raise ValueError(f"the service refused the key {key}")
        return solve

    failing = Task(dataset=MemoryDataset([Sample(id=1, input=QUESTION, target="5")], name="sums"), solver=leaky(),
                   scorer=match(), name="sums")
    with pytest.warns(UserWarning):  # the errored sample counts as wrong
        res = run(tmp_path, failing, Sampler())
    error = res[0].rows["error"][0]
    assert "the service refused the key" in error and key not in error


# --------------------------------------------------------------------------- writing logs

def result_of(rows: dict):
    import pandas as pd

    from machine_nb.evaluation.results import EvalResult

    n = len(rows["row"])
    frame = pd.DataFrame({"prompt": [f"q{i}" for i in range(n)], "expected": ["1"] * n, "match": ["exact"] * n,
                          "output": ["1"] * n, "correct": [True] * n, **rows})
    return EvalResult(frame, {"name": "sums", "model": "thinkingmachines/Inkling-Small", "checkpoint": None})


def test_rows_of_two_results_joined_are_all_written(tmp_path):
    """Two results' rows joined (row numbers 0, 1, 0) were written as samples 1, 2, 1: Inspect kept one
    sample 1, and the log read back with a row fewer."""
    import machine_nb as mnb

    res = result_of({"row": [0, 1, 0]})
    back = mnb.load_results(res.write_inspect_log(tmp_path / "joined.eval"))
    assert back.rows["prompt"].tolist() == ["q0", "q1", "q2"]


@pytest.mark.parametrize("ids, twice", [(["a", "b", "a"], "a"), ([1, "2", "1"], "1")])
def test_rows_read_from_a_log_that_repeat_a_sample_are_refused_not_half_written(tmp_path, ids, twice):
    """Inspect names a sample's member by its id, so 1 and "1" are one sample too."""
    res = result_of({"row": [0, 1, 2], "sample_id": ids, "epoch": [1, 1, 1]})
    with pytest.raises(ValueError, match=rf"sample {twice} epoch 1.*rows 0 and 2"):
        res.write_inspect_log(tmp_path / "twice.eval")
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes")
def test_a_json_log_that_is_a_named_pipe_is_refused_not_waited_on(tmp_path):
    """read_log on a FIFO named like a .json log waited for a writer for ever."""
    import os

    from machine_nb.errors import MachineFormatError
    from machine_nb.evaluation.inspect_logs import read_log

    os.mkfifo(tmp_path / "log.json")
    with pytest.raises(MachineFormatError, match="FIFO"):
        read_log(tmp_path / "log.json")


def test_inspect_tasks_run_while_training_send_a_tasks_system_message_once(tmp_path):
    """The Inspect tasks a training run scores (sft(inspect_tasks=…)) went through the cookbook's own
    evaluator, whose model API sends a task's system_message again after Inspect has put it first:
    twice, as inspect_eval did. They sample through the same model API as inspect_eval."""
    import asyncio

    from machine_nb.checks.render import renderer_name
    from machine_nb.evaluation.heldout import INSPECT_PREFIX, InspectEvalBuilder, InspectEvaluator

    (tmp_path / "tasks.py").write_text(
        "from inspect_ai import Task, task\n"
        "from inspect_ai.dataset import MemoryDataset, Sample\n"
        "from inspect_ai.model import GenerateConfig\n"
        "from inspect_ai.scorer import match\n"
        "from inspect_ai.solver import generate\n\n"
        "@task\n"
        "def sums():\n"
        f"    return Task(dataset=MemoryDataset([Sample(id='q1', input={QUESTION!r}, target='5')], name='sums'),\n"
        "                solver=generate(), scorer=match(), config=GenerateConfig(system_message='Digits only.'))\n")
    sampler = Sampler()
    builder = InspectEvalBuilder(tasks=(str(tmp_path / "tasks.py@sums"),), model=MODEL, renderer=renderer_name(MODEL),
                                 log_dir=str(tmp_path / "run"))
    metrics = asyncio.run(InspectEvaluator(builder)(sampler))
    assert sampler.prompts and sampler.prompts[0].count("Digits only.") == 1
    assert metrics == {f"{INSPECT_PREFIX}sums/accuracy": 1.0, f"{INSPECT_PREFIX}sums/stderr": 0.0}


def test_ctrl_c_as_the_worker_thread_starts_still_waits_for_the_run_to_end(monkeypatch):
    """A Ctrl-C landing while the pool is still starting its thread (in `submit`, after the run
    began) leaves the pool unaware of that thread: the run is interrupted and `_call` returns only
    once it has ended, as for a Ctrl-C a moment later."""
    import threading
    import time

    from machine_nb.evaluation import inspect_bridge

    from interrupt import ctrl_c_as_the_pool_starts, interrupted_in_a_kernel

    started, interrupted, seen = threading.Event(), threading.Event(), []

    def run():
        started.set()
        interrupted.wait(timeout=60)
        time.sleep(0.2)  # the run takes a moment to end once interrupted
        seen.append("ended")

    ctrl_c_as_the_pool_starts(monkeypatch, started)
    interrupted_in_a_kernel(lambda: inspect_bridge._call(run, interrupted.set))
    assert seen == ["ended"]
