"""Inspect AI tasks on a base model or checkpoint, on the local engine (offline) or Tinker.

`inspect_eval` runs Inspect tasks (task objects, registry names or task files) through
tinker-cookbook's Tinker-backed Inspect model API (`eval.inspect_utils.InspectAPIFromTinkerSampling`:
the model's own renderer formats the chat and parses the reply, and the model API reports its own
token usage), on the same sampling client evaluate() uses, so the local engine's server or Tinker
answers. Each log comes back with an EvalResult view (inspect_logs.read_log), so compare() and
CompareView take Inspect runs like evaluate()'s. `eval_task` turns evaluate()'s eval rows into an
Inspect task scored by evaluate()'s own rules (`rows_scorer`), so both paths give the same scores
on the same replies.

Inspect never waits on the network here: its opt-in telemetry and API-key hooks are switched off
for the run, the cookbook's model API counts tokens with the model's tokenizer (Inspect's own
counting would fetch a tiktoken encoding), and logs are written to local files.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import html
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.tasks import call_in_worker_thread
from .inspect_logs import NETWORK_HOOKS, offline_inspect, require_inspect  # noqa: F401 (public here too)
from .results import RESULTS_DIR, EvalResult, from_inspect_log

if TYPE_CHECKING:
    import pandas as pd

# --------------------------------------------------------------------------- evaluate()'s rows as a task

def rows_scorer() -> Any:
    """An Inspect scorer with evaluate()'s rules: each sample's `match` mode (its metadata, default
    "exact") against its target, and its `format` regex (scoring.score_row).

    Returns:
        The Inspect Scorer: C / I with the mode, format check and any regex time-out in the
        score's metadata; metrics accuracy and stderr.
    """
    require_inspect("rows_scorer")
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, scorer, stderr

    from .scoring import DEFAULT_MATCH, score_row

    @scorer(metrics=[accuracy(), stderr()], name="match")
    def machine_nb_match() -> Any:
        async def score(state: Any, target: Any) -> Any:
            meta = state.metadata or {}
            row = {"expected": target.text, "match": meta.get("match") or DEFAULT_MATCH, "format": meta.get("format")}
            reply = state.output.completion if state.output is not None else ""
            correct, format_ok, problem = score_row(reply, row)
            return Score(value=CORRECT if correct else INCORRECT, answer=reply,
                         explanation=f"{row['match']} match against {row['expected']!r}",
                         metadata={"match": row["match"], "expected": row["expected"], "format_ok": format_ok,
                                   "error": problem})
        return score

    return machine_nb_match()


def eval_task(data: str | os.PathLike | list[dict], *, name: str | None = None, scorer: Any = None) -> Any:
    """evaluate()'s eval rows as an Inspect task: one sample per row, generate(), evaluate()'s scoring.

    Args:
        data: an eval JSONL path or a list of row dicts (Machine's `{"messages", "expected",
            "match", "format"?}`), checked as evaluate() checks them.
        name: the task's name (default None: the file's stem, or "eval_rows").
        scorer: an Inspect scorer (default None: rows_scorer(), evaluate()'s match modes).

    Returns:
        The inspect_ai Task. Sample ids are row + 1 (row as evaluate() numbers them), inputs the
        rows' messages (tool calls and tool results included), targets their expected answers,
        metadata their match, format and row.

    Raises:
        MachineFormatError: a bad row, or a tool call whose arguments are not a JSON object (Inspect
            holds them as one), naming its file, line and field.
    """
    require_inspect("eval_task")
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.solver import generate

    from ..core.chat import eval_rows
    from ..errors import MachineFormatError
    from .inspect_logs import inspect_messages

    rows, path = eval_rows(data)
    samples = []
    for i, row in enumerate(rows):
        messages = inspect_messages(row["messages"])
        for at, message in enumerate(messages):
            for j, call in enumerate(getattr(message, "tool_calls", None) or []):
                if call.parse_error:  # Inspect's ToolCall holds an object: the prompt would change
                    raise MachineFormatError(path, f"{call.parse_error}; Inspect takes a tool call's arguments as "
                                                   "a JSON object", line=row.get("line"),
                                             field=f"messages.{at}.tool_calls.{j}.function.arguments")
        samples.append(Sample(id=i + 1, input=messages, target=str(row["expected"]),
                              metadata={"row": i, "match": row["match"], "format": row["format"],
                                        "line": row.get("line")}))
    label = name or (Path(path).stem if path else "eval_rows")
    return Task(dataset=MemoryDataset(samples, name=label, location=path), solver=generate(),
                scorer=scorer if scorer is not None else rows_scorer(), name=label)


# --------------------------------------------------------------------------- running tasks

@dataclass(repr=False)
class InspectRun:
    """What inspect_eval returns: Inspect's logs and an EvalResult view of each, in task order.

    Iterating, indexing and len() go over the EvalResults; `compare(run_a, run_b)` takes a run of
    one task as its EvalResult.

    Args:
        logs: the inspect_ai EvalLogs (with their samples).
        results: one EvalResult per log (rows: evaluate()'s columns plus sample_id, epoch,
            score, scorer, messages; path: the log file).
    """

    logs: list = field(default_factory=list)
    results: list[EvalResult] = field(default_factory=list)

    @property
    def eval_result(self) -> EvalResult:
        """The one task's EvalResult (a ValueError naming the tasks when the run has several)."""
        if len(self.results) != 1:
            names = ", ".join(str(r.name) for r in self.results) or "none"
            raise ValueError(f"this Inspect run has {len(self.results)} tasks ({names}): pick one, e.g. run[0]")
        return self.results[0]

    @property
    def paths(self) -> list[str]:
        """The log files written, in task order."""
        return [str(r.path) for r in self.results]

    def __getitem__(self, i: int) -> EvalResult:
        return self.results[i]

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[EvalResult]:
        return iter(self.results)

    def __repr__(self) -> str:
        return f"InspectRun({', '.join(repr(r) for r in self.results)})"

    def _repr_html_(self) -> str:
        return "".join(r._repr_html_() for r in self.results) or html.escape(repr(self))


#: GenerateConfig settings that change what is sampled and that no tinker.SamplingParams field
#: carries: a task that sets one is sampled without it, and inspect_eval says so in a warning.
#: temperature, top_p, top_k, max_tokens, seed, num_choices and system_message are applied;
#: stop_seqs end the reply text (the sampler stops at the renderer's own stop tokens); logprobs
#: gives each sampled token's log-probability (the sampler returns them with every reply; they
#: cover the whole sampled reply, also where stop_seqs cut its text).
UNAPPLIED_SETTINGS = ("best_of", "frequency_penalty", "presence_penalty", "logit_bias", "top_logprobs",
                      "prompt_logprobs", "response_schema", "effort", "reasoning_effort", "reasoning_tokens",
                      "verbosity", "extra_body")

#: Content parts a renderer formats; any other (images, audio, video, documents) refuses its sample.
TEXT_CONTENT = ("ContentText", "ContentReasoning")

# the SampleResponses of the generate() call running in this asyncio task (one list per call)
_responses: contextvars.ContextVar[list | None] = contextvars.ContextVar("machine_nb_sample_responses", default=None)


def unrenderable(messages: list) -> str | None:
    """Why a renderer cannot take these Inspect chat messages as they mean, or None.

    Args:
        messages: the inspect_ai ChatMessages of one generate() call.

    Returns:
        A sentence naming the message, or None. Content other than text (an image, audio) would
        be dropped and the model answer without it; a last assistant message (a prefill) would
        be rendered as a finished turn with a new reply sampled after it.
    """
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            continue
        kinds = sorted({type(part).__name__ for part in message.content} - set(TEXT_CONTENT))
        if kinds:
            return (f"message {i} ({message.role}) holds {', '.join(kinds)}, which the renderer cannot take (text "
                    f"only): the sample is refused rather than answered without it")
    if messages and messages[-1].role == "assistant":
        return ("the last message is the assistant's (a prefill), which the renderer closes as a finished turn "
                "before sampling a new one: end the messages with a user or tool message")
    return None


def token_logprobs(tokenizer: Any, tokens: list[int], logprobs: Any) -> Any:
    """Inspect's Logprobs of one reply: each sampled token (decoded alone) with its log-probability.

    Args:
        tokenizer: the model's tokenizer (decodes each token).
        tokens: the reply's sampled tokens, the renderer's stop token included.
        logprobs: the sampler's log-probability per token, or None where it returned none.

    Returns:
        The inspect_ai Logprobs, or None when the sampler returned none or a count that does
        not match the tokens.
    """
    from inspect_ai.model import Logprob, Logprobs

    if logprobs is None:
        return None
    logprobs = [float(x) for x in logprobs]
    if len(logprobs) != len(tokens):
        return None
    content = []
    for token, logprob in zip(tokens, logprobs):
        text = tokenizer.decode([int(token)])
        content.append(Logprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8"))))
    return Logprobs(content=content)


def cut_at_stop(text: str, stops: list[str]) -> str | None:
    """`text` up to the first of `stops` (which is not kept), or None when none occurs in it."""
    found = [i for i in (text.find(stop) for stop in stops if stop) if i >= 0]
    return text[:min(found)] if found else None


INTERRUPTED = "inspect_eval was interrupted (Ctrl-C) before this sample's reply came back"


class _RecordingClient:
    """The sampling client, handing each response to the generate() call that asked for it, so
    its stop reasons reach Inspect's output; `interrupt()` (from any thread) ends the requests in
    flight and refuses new ones, each as an error on its sample, so Inspect's run ends at once."""

    def __init__(self, client: Any):
        self.client = client
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.in_flight: set = set()  # (loop, task) of each request being sampled

    def interrupt(self) -> None:
        """End the requests in flight and refuse any later one (callable from any thread)."""
        self.stopped.set()
        with self.lock:
            held = list(self.in_flight)
        for loop, task in held:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nothing left to end
                loop.call_soon_threadsafe(task.cancel)

    async def sample_async(self, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        from .sampling import call_sampler

        if self.stopped.is_set():
            raise RuntimeError(INTERRUPTED)
        request = asyncio.ensure_future(call_sampler(self.client, prompt, sampling_params, num_samples))
        entry = (asyncio.get_running_loop(), request)
        with self.lock:
            self.in_flight.add(entry)
        if self.stopped.is_set():  # interrupted while it was being registered
            request.cancel()
        try:
            response = await request
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.stopped.is_set() and not (current is not None and current.cancelling()):
                raise RuntimeError(INTERRUPTED) from None  # only the request was ended: an error on its sample
            request.cancel()
            raise
        finally:
            with self.lock:
                self.in_flight.discard(entry)
        held = _responses.get()
        if held is not None:
            held.append(response)
        return response


def model_api(renderer_name: str, model_name: str, sampling_client: Any) -> Any:
    """The Inspect model API inspect_eval samples through: tinker-cookbook's
    `InspectAPIFromTinkerSampling`, with each choice's stop reason ("max_tokens" for a reply cut at
    its budget), a task's stop_seqs applied to the reply, each sampled token's log-probability on
    its choice when the task asks for logprobs, the system_message (which Inspect has already put
    first in the messages) sent once, a failed tool call's result sent as "Error: <its message>"
    (as Inspect's own providers send it), messages a renderer cannot take refused
    on their sample (`unrenderable`), and settings no sampler field carries collected in
    `.unapplied` (name: value) for the caller to report; `.interrupt()` (from any thread) ends
    the requests in flight and refuses later ones, each an error on its sample.

    Args:
        renderer_name: the renderer that formats the chat and parses replies.
        model_name: the base model (its tokenizer).
        sampling_client: the sampler (tinker's SamplingClient, or a stand-in call_sampler takes).

    Returns:
        The inspect_ai ModelAPI.
    """
    from tinker_cookbook.eval.inspect_utils import InspectAPIFromTinkerSampling

    class TinkerSamplerAPI(InspectAPIFromTinkerSampling):
        async def generate(self, input: list, tools: list, tool_choice: Any, config: Any) -> Any:
            problem = unrenderable(input)
            if problem:
                raise ValueError(f"inspect_eval: {problem}")
            for name in UNAPPLIED_SETTINGS:
                value = getattr(config, name, None)
                if value not in (None, False) and value != {}:
                    self.unapplied.setdefault(name, value)
            # a failed tool call's result is its error, as Inspect's own providers send it
            input = [m.model_copy(update={"content": f"Error: {m.error.message}"})
                     if m.role == "tool" and getattr(m, "error", None) is not None else m for m in input]
            held: list = []
            token = _responses.set(held)
            try:
                # Inspect's Model.generate has put config.system_message first in `input` already
                output = await super().generate(input, tools, tool_choice,
                                                 config.model_copy(update={"system_message": None}))
            finally:
                _responses.reset(token)
            sequences = held[-1].sequences if held else []
            for choice, seq in zip(output.choices, sequences):
                if getattr(seq, "stop_reason", None) == "length":
                    choice.stop_reason = "max_tokens"
                if config.logprobs:
                    choice.logprobs = token_logprobs(self.renderer.tokenizer, list(seq.tokens),
                                                     getattr(seq, "logprobs", None))
                    if choice.logprobs is None:
                        self.unapplied.setdefault("logprobs", config.logprobs)
                if config.stop_seqs and isinstance(choice.message.content, str):
                    cut = cut_at_stop(choice.message.content, list(config.stop_seqs))
                    if cut is not None:
                        choice.message.content, choice.stop_reason = cut, "stop"
            if output.choices:  # Inspect keeps the first choice's text apart
                output.completion = output.choices[0].message.text
            return output

    client = _RecordingClient(sampling_client)
    api = TinkerSamplerAPI(renderer_name=renderer_name, model_name=model_name, sampling_client=client)
    api.unapplied = {}
    api.interrupt = client.interrupt
    return api


def _call(fn: Any, interrupt: Any) -> Any:
    """fn() here, or in a worker thread where an event loop already runs (a notebook kernel):
    inspect_ai.eval runs its own loop. Ctrl-C (KeyboardInterrupt) while the worker runs calls
    `interrupt()` and waits for fn to end (a second Ctrl-C stops waiting), then goes up."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # fn runs outside this handler: Inspect reads an error's context as its cause
        in_loop = False
    else:
        in_loop = True
    if not in_loop:
        return fn()  # Inspect's own loop takes Ctrl-C here
    # Inspect's samples end with an error each once interrupted, so its run returns soon
    return call_in_worker_thread(fn, interrupt)


def inspect_eval(tasks: Any, model: str | None = None, checkpoint: str | None = None, engine: str | None = None, *,
                 max_tokens: int = 32, temperature: float = 0.0, seed: int | None = 0, concurrency: int | None = None,
                 renderer: str | None = None, log_dir: str | os.PathLike | None = None,
                 sampling_client: Any = None, service_client: Any = None, progress: bool | None = None,
                 **inspect_options: Any) -> InspectRun:
    """Run Inspect AI tasks on a base model or checkpoint through tinker-cookbook's Inspect model API.

    The sampler is the engine's (the real tinker SDK's client on the local server or Tinker, as
    evaluate() opens it); the cookbook's `InspectAPIFromTinkerSampling` renders each chat with
    the model's renderer, samples, parses the reply and reports its token usage. Inspect writes
    a `.eval` log per task; load_results reads it back.

    Args:
        tasks: what inspect_ai.eval takes: a Task, a registry name ("inspect_evals/gsm8k"), a
            task file ("tasks.py" or "tasks.py@name"), or a list of them; eval_task(data) makes
            one from evaluate()'s eval rows.
        model: the base model, as evaluate() takes it (default None: the local engine's model, or
            a local checkpoint's recorded base model; required for a Tinker checkpoint).
        checkpoint: a sampler path to evaluate instead of the base model (default None).
        engine: "local" | "tinker" (default None: the engine that serves the model or checkpoint).
        max_tokens: the reply budget (default 32, as evaluate(); a task's own GenerateConfig
            wins where it sets one).
        temperature: default 0.0 (greedy), as evaluate().
        seed: the sampling seed (default 0).
        concurrency: requests in flight (Inspect's max_connections). Default None: 32 on Tinker,
            8 locally, as evaluate().
        renderer: a renderer name (default None: the model's recommended one).
        log_dir: where Inspect writes its logs (default None: `eval_results/`).
        sampling_client: a sampler to use instead of the engine's (default None).
        service_client: the ServiceClient that opens the sampler (default None: the engine's).
        progress: Inspect's progress display. Default None or False: none (display="log", at
            Inspect's default log level only warnings and errors show); True: its plain text
            display. A `display=` in inspect_options wins.
        **inspect_options: any other inspect_ai.eval argument (limit, epochs, sample_id,
            task_args, solver, metadata, ...).

    Returns:
        An InspectRun: `.logs` (inspect_ai EvalLogs), `.results` (an EvalResult per log, named
        after its task, with model, checkpoint, engine, renderer and parameters in its summary
        and the log file as its path), `.paths`.

    Raises:
        ImportError: inspect_ai is not installed (`pip install "machine_nb[inspect]"`).
        ValueError: max_tokens, temperature, concurrency or seed is a setting no sampler can use
            (as evaluate() refuses it), named, before anything is sent.
        EngineError: the engine cannot serve the model or checkpoint.
        KeyboardInterrupt: Ctrl-C; in a notebook the requests in flight are ended and no more
            are sent (each an error on its sample in the log Inspect writes) before it goes up.
    """
    require_inspect("inspect_eval")
    import inspect_ai
    from inspect_ai.model import GenerateConfig, Model

    from .. import engines
    from ..checks import render
    from .evaluate import check_sampling
    from .sampling import open_sampler, renderer_for, sampler_target

    check_sampling(max_tokens, temperature, concurrency, seed)  # before the engine is asked for anything
    target = sampler_target(model, checkpoint, engine)
    model, engine = target.model, target.engine
    if renderer is not None and not isinstance(renderer, str):
        raise TypeError("inspect_eval: renderer must be a renderer name (the cookbook's Inspect model API builds it)")
    if render.is_local_model(model):
        engines.use_local_models()  # the cookbook looks the local model's tokenizer and renderer up by name
    _, renderer_label = renderer_for(model, renderer)
    if concurrency is None:
        concurrency = 32 if engine == "tinker" else 8
    client = sampling_client if sampling_client is not None else open_sampler(target, service_client)
    api = model_api(renderer_label, model, client)
    config = GenerateConfig(max_tokens=int(max_tokens), temperature=float(temperature), seed=seed,
                            max_connections=int(concurrency))
    run = {"model": model, "checkpoint": checkpoint, "engine": engine, "renderer": renderer_label,
           "parameters": {"max_tokens": int(max_tokens), "temperature": float(temperature), "seed": seed,
                          "concurrency": int(concurrency)}}
    # the SDK retries requests itself; logs are written once, at the end (as the cookbook's evaluator runs Inspect)
    # "log": Inspect's progress goes to logging (quiet at its default level), where "none" still draws
    # a rich live view, which in a notebook leaves an empty output widget behind
    options = {"display": "plain" if progress else "log", "log_dir": os.fspath(log_dir or RESULTS_DIR),
               "retry_on_error": 0, "fail_on_error": False, "log_realtime": False, "score_display": False,
               **inspect_options}
    options["metadata"] = {**(options.get("metadata") or {}), "machine_nb_run": run}

    def go() -> list:
        with offline_inspect(), warnings.catch_warnings():
            # the cookbook's model API calls the SDK's sample_async, which the SDK marks deprecated
            warnings.filterwarnings("ignore", message=".*sample_async", category=FutureWarning)
            return list(inspect_ai.eval(tasks, model=Model(api=api, config=config), **options))

    logs = _call(go, api.interrupt)
    if api.unapplied:
        from ..errors import user_stacklevel

        asked = ", ".join(f"{name}={value!r}" for name, value in sorted(api.unapplied.items()))
        warnings.warn(f"inspect_eval: the task asks for {asked}, which the tinker sampler does not apply: the "
                      f"replies were sampled without it", stacklevel=user_stacklevel())
    return InspectRun(logs=logs, results=[from_inspect_log(log) for log in logs])


# --------------------------------------------------------------------------- Inspect scores while training

def inspect_curve(log_dir: str | os.PathLike) -> pd.DataFrame:
    """The Inspect task scores a run logged while training (`sft(inspect_tasks=…)`), one row per
    step, task and metric.

    Args:
        log_dir: the run's log dir (reads metrics.jsonl; a partial last line is skipped).

    Returns:
        A DataFrame with step (the weights after that many steps; 0 = the base model, the last
        the final checkpoint), task (Inspect's dataset name), metric (accuracy, stderr, ...) and
        value; empty when the run ran no Inspect tasks. The per-sample logs are in
        `<log dir>/inspect/` (load_results reads each).
    """
    import pandas as pd

    from ..training.runlog import HELDOUT_PREFIX, METRICS_FILE, read_log_lines

    prefix = f"{HELDOUT_PREFIX}inspect/"
    out = []
    for row in read_log_lines(Path(log_dir) / METRICS_FILE):
        for key, value in row.items():
            if key.startswith(prefix) and isinstance(value, (int, float)):
                task, _, metric = key[len(prefix):].rpartition("/")
                out.append({"step": row.get("step"), "task": task, "metric": metric, "value": float(value)})
    return pd.DataFrame(out, columns=["step", "task", "metric", "value"])


__all__ = ["inspect_curve", "inspect_eval", "InspectRun", "eval_task", "rows_scorer", "offline_inspect",
           "NETWORK_HOOKS"]
