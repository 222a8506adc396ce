"""Sampling eval prompts through an engine: which model and engine, a sampling client, rendered
prompts, replies with their tokens and latency, and running the work from a notebook.

evaluate(), probe(), held-out evals during training, cases and sweeps all sample through these.
The client is the real tinker SDK's (the local engine's server or Tinker, see engines/); tinker
and tinker-cookbook load on the first call that needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..core.redact import redacted
from ..core.tasks import call_in_worker_thread, cancel_and_wait
from ..errors import EngineError, MachineFormatError


class SamplingClientLike(Protocol):
    """What evaluate() needs of a sampler: tinker's `sample_async(prompt, num_samples, sampling_params)`
    (or `sample(...)` returning an awaitable / a future) that yields a `tinker.SampleResponse`."""

    async def sample_async(self, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        """Sample replies to one prompt.

        Args:
            prompt: a tinker.ModelInput.
            num_samples: replies wanted (evaluate asks for 1).
            sampling_params: a tinker.SamplingParams.

        Returns:
            A tinker.SampleResponse (or an awaitable or future of one).
        """
        ...


@dataclasses.dataclass(frozen=True)
class SamplerTarget:
    """What a sampling client is opened on, resolved once (`sampler_target`) and passed down to
    `open_sampler`, so the checkpoint is looked up in one place.

    Args:
        model: the base model: its renderer formats the prompts ("" when only the checkpoint's
            server knows it; the client's `get_base_model()` then says).
        checkpoint: the sampler path (`tinker://<run>/sampler_weights/<name>`), or None for the
            base model itself.
        engine: "local" | "tinker", the engine that serves it.
    """

    model: str
    checkpoint: str | None
    engine: str

    @property
    def base(self) -> SamplerTarget:
        """The same base model and engine, without the checkpoint."""
        return dataclasses.replace(self, checkpoint=None)


def sampler_target(model: str | None, checkpoint: str | None, engine: str | None) -> SamplerTarget:
    """The model whose renderer formats the prompts, the checkpoint, and the engine that serves them.

    Args:
        model: the base model, or None: a local checkpoint's recorded base model, else the
            local engine's default model.
        checkpoint: a sampler path (`tinker://<run>/sampler_weights/<name>`) or None for the base model.
        engine: "local" | "tinker", or None: the engine that serves the checkpoint or model
            (engines.engine_for). Needed only to point a local model's checkpoint at a
            Tinker-compatible server (`engine="tinker"` with TINKER_BASE_URL).

    Returns:
        The SamplerTarget.

    Raises:
        EngineError: not a checkpoint path, a Tinker checkpoint without model=, or an engine asked
            for the other's model.
    """
    from .. import engines

    if checkpoint:
        engines.check_checkpoint(str(checkpoint))
    if model is None:
        if checkpoint and engines.engine_for(str(checkpoint)) == "local":
            model = engines.checkpoint_base_model(str(checkpoint))  # a local checkpoint records it
        elif checkpoint:
            raise EngineError(f"Pass model= (the base model of {checkpoint!r}): its renderer formats the prompts")
        else:
            model = engines.default_model("local")
    engine = engine or engines.engine_for(str(checkpoint or model))
    # asking one engine for the other's model: a clear error now, not a failed request later
    engines.check_model(engine, str(checkpoint or model))
    return SamplerTarget(model, str(checkpoint) if checkpoint else None, engine)


def open_sampler(target: SamplerTarget, service_client: Any = None) -> Any:
    """A sampling client (the real tinker SDK's) for the base model or a checkpoint.

    Args:
        target: the base model, checkpoint and engine (sampler_target's).
        service_client: a ServiceClient to use (default None: the engine's own, from
            engines.service_client, which on Tinker checks the key and the service first, within
            5 s, never leaving the SDK to hang for minutes).

    Returns:
        The SDK's SamplingClient itself (not a future of it).

    Raises:
        EngineError or MachineFormatError: a refused checkpoint (missing, corrupt), explained.
    """
    from .. import engines

    model, checkpoint, engine = target.model, target.checkpoint, target.engine
    if service_client is None:
        service_client = engines.service_client(engine, models=(model,))

    def create() -> Any:
        try:
            if checkpoint:
                future = service_client.create_sampling_client(model_path=checkpoint)
            else:
                future = service_client.create_sampling_client(base_model=model)
            return future.result() if hasattr(future, "result") else future
        except engines.sdk_errors() as exc:
            raise engines.explain(exc) from None

    if engine != "tinker":
        return create()
    with engines.watchdog(engine) as dog:  # a service whose work calls fail: EngineError in seconds
        return dog.run(create)


def renderer_for(model: str, renderer: Any = None) -> tuple[Any, str]:
    """The renderer that formats prompts and parses replies, and its label for the results.

    Args:
        model: the base model.
        renderer: a renderer name, a renderer object, or None (the model's recommended renderer).

    Returns:
        (renderer, its name; a renderer object's class name).
    """
    from ..checks.render import get_renderer, renderer_name

    if renderer is None or isinstance(renderer, str):
        name = renderer or renderer_name(model)
        return get_renderer(model, name), name
    return renderer, type(renderer).__name__


def sampling_params(max_tokens: int, temperature: float, seed: int | None, renderer: Any) -> Any:
    """tinker.SamplingParams for one reply per prompt, stopping at the renderer's stop sequences.

    Args:
        max_tokens: the reply budget.
        temperature: 0.0 is greedy.
        seed: the sampling seed (or None).
        renderer: the renderer whose stop sequences end a reply.

    Returns:
        A tinker.SamplingParams.
    """
    import tinker

    return tinker.SamplingParams(max_tokens=int(max_tokens), temperature=float(temperature), seed=seed,
                                 stop=renderer.get_stop_sequences())


def render_prompts(renderer: Any, rows: list[dict], path: str | None) -> list[Any]:
    """Every row's generation prompt, rendered before anything is sent.

    Args:
        renderer: the model's renderer.
        rows: checked rows with "messages" (and "line").
        path: the rows' file, named in the error (None for in-memory rows).

    Returns:
        One tinker.ModelInput per row.

    Raises:
        MachineFormatError: a row the renderer cannot format, naming its line (not a failure
            halfway through a paid eval).
    """
    from ..checks.render import renderer_messages  # tool calls as training gives them to the renderer

    prompts = []
    for row in rows:
        try:
            prompts.append(renderer.build_generation_prompt(renderer_messages(row["messages"])))
        except Exception as exc:  # the cookbook raises ValueError/KeyError/TypeError on odd messages
            raise MachineFormatError(path, redacted(f"the renderer cannot format this prompt: {type(exc).__name__}: "
                                                    f"{exc}"),  # its text may quote the row: no key in it
                                     line=row.get("line"), field="messages") from None
    return prompts


async def call_sampler(client: Any, prompt: Any, params: Any, num_samples: int = 1) -> Any:
    """One sample request, whichever way the client answers.

    Args:
        client: tinker's SamplingClient (whose `sample()` returns an awaitable APIFuture), or a
            stand-in with `sample_async` returning an awaitable, a future or the response.
        prompt: a tinker.ModelInput.
        params: tinker.SamplingParams.
        num_samples: replies wanted (default 1).

    Returns:
        The tinker.SampleResponse.
    """
    import tinker

    if isinstance(client, tinker.SamplingClient) or not hasattr(client, "sample_async"):
        # tinker's own client: sample() returns an awaitable APIFuture (sample_async is deprecated)
        result = client.sample(prompt=prompt, num_samples=num_samples, sampling_params=params)
    else:
        result = client.sample_async(prompt=prompt, num_samples=num_samples, sampling_params=params)
    if hasattr(result, "__await__"):
        result = await result
    if hasattr(result, "result_async"):
        result = await result.result_async()
    elif isinstance(result, concurrent.futures.Future) or (hasattr(result, "result") and not hasattr(result, "sequences")):
        result = await asyncio.get_running_loop().run_in_executor(None, result.result)
    return result


def reply_tool_calls(message: Any) -> list[dict] | None:
    """A parsed reply's tool calls as chat rows hold them, or None when it made none.

    Args:
        message: the renderer's parsed message (its "tool_calls" are the cookbook's ToolCall).

    Returns:
        `[{"id", "type": "function", "function": {"name", "arguments": JSON text}}, ...]`, a call
        the renderer could not parse as `{"type": "unparsed", "raw_text", "error"}`; None when
        the reply holds no call.
    """
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.function
        calls.append({"id": call.id, "type": "function", "function": {"name": fn.name, "arguments": fn.arguments}})
    for bad in message.get("unparsed_tool_calls") or []:
        calls.append({"type": "unparsed", "raw_text": getattr(bad, "raw_text", None), "error": getattr(bad, "error", None)})
    return calls or None


async def sample_rows(client: Any, renderer: Any, prompts: list[Any], params: Any, concurrency: int,
                      bar: Any = None) -> list[dict]:
    """Sample one reply per prompt, at most `concurrency` requests in flight.

    Args:
        client: a sampling client (see call_sampler).
        renderer: parses each reply's tokens into text.
        prompts: rendered prompts (render_prompts).
        params: tinker.SamplingParams.
        concurrency: requests in flight at once (at least 1).
        bar: a progress bar updated once per reply (default None).

    Returns:
        Per prompt, in order: {"prompt_tokens", "output" (the reply's text), "output_tokens",
        "stop_reason", "latency_s", "error", "tool_calls" (the reply's tool calls, OpenAI-style,
        or None: reply_tool_calls)}; a request that failed, or a reply the renderer cannot parse,
        has its reason (redacted) in "error" and an empty output, and the other rows go on.

    Raises:
        EngineError: the engine refused the job (wrong model, no key), or every request failed;
            the requests still in flight are cancelled first, as they are when this is cancelled.
    """
    from tinker_cookbook import renderers

    semaphore = asyncio.Semaphore(max(1, int(concurrency)))

    async def one(prompt: Any) -> dict:
        async with semaphore:
            start = time.perf_counter()
            try:
                response = await call_sampler(client, prompt, params)
                error = None
            except EngineError:
                raise  # the engine refuses the whole job (wrong model, no key): stop at once
            except Exception as exc:  # one failed request: record it (redacted), keep the other rows
                response, error = None, redacted(f"{type(exc).__name__}: {exc}")
            latency = time.perf_counter() - start
        out = {"prompt_tokens": prompt.length, "output": "", "output_tokens": 0, "stop_reason": None,
               "latency_s": round(latency, 4), "error": error, "tool_calls": None}
        if response is not None:
            try:
                seq = response.sequences[0]
                tokens = list(seq.tokens)
                out.update(output_tokens=len(tokens), stop_reason=getattr(seq, "stop_reason", None))
                message, _ = renderer.parse_response(tokens)
                out["output"] = renderers.get_text_content(message)
                out["tool_calls"] = reply_tool_calls(message)
            except Exception as exc:  # a reply the renderer cannot parse: an error on its row, not the eval's
                out["error"] = redacted(f"{type(exc).__name__}: {exc}")
        if bar is not None:
            bar.update(1)
        return out

    tasks = [asyncio.ensure_future(one(p)) for p in prompts]
    try:
        results = list(await asyncio.gather(*tasks))
    except BaseException:
        # gather leaves the other requests running when one raises: end them before the error goes up
        for task in tasks:
            await cancel_and_wait(task)
        raise
    if results and all(r["error"] for r in results):  # nothing to score: an engine problem, not the rows
        raise EngineError(f"All {len(results)} sampling requests failed; the first: {results[0]['error']}")
    return results


def watchdog(engine: str) -> Any:
    """A context manager that watches the service while work runs on it (engines.watchdog at
    Tinker's URL).

    Args:
        engine: "local" | "tinker".

    Returns:
        On Tinker, a Watchdog on the service's URL (its `failed` says why the service stopped
        answering); locally, a context manager that watches nothing.
    """
    from .. import engines

    return engines.watchdog(engine)


def run_coroutine(coro_factory: Callable[[], Coroutine[Any, Any, Any]], watchdog: Any = None) -> Any:
    """Run a coroutine to completion, also from Jupyter.

    Args:
        coro_factory: makes the coroutine (called once, in the thread that runs it).
        watchdog: a Watchdog (see `watchdog`) or None. When the service stops answering, the work
            is cancelled until it has ended (`core.tasks.cancel_and_wait`: a task can absorb a cancel) and
            EngineError raised within seconds.

    Returns:
        The coroutine's result. Where an event loop already runs (a notebook kernel), the
        coroutine runs on its own loop in a worker thread; Ctrl-C (KeyboardInterrupt) cancels it
        there and returns once it has ended.
    """
    async def guarded() -> Any:
        task = asyncio.ensure_future(coro_factory())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.5)
                if done:
                    return task.result()
                if watchdog is not None and watchdog.failed:
                    await cancel_and_wait(task)
                    raise EngineError(watchdog.failed)
        except asyncio.CancelledError:  # Ctrl-C: the work ends (its requests cancelled) before this returns
            await cancel_and_wait(task)
            raise

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the work runs outside this handler: its errors are not chained to this one
        in_loop = False
    else:
        in_loop = True
    if not in_loop:
        return asyncio.run(guarded())  # Ctrl-C cancels guarded() (asyncio.Runner), then KeyboardInterrupt
    return _in_worker_thread(guarded)


def _in_worker_thread(coro_factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine on its own loop in a worker thread, waiting here; a KeyboardInterrupt here
    (Ctrl-C in a kernel) cancels it and waits until it has ended, then goes up."""
    import threading

    lock, held = threading.Lock(), {}

    async def main() -> Any:
        with lock:
            if held.get("interrupted"):
                raise asyncio.CancelledError
            held["loop"], held["task"] = asyncio.get_running_loop(), asyncio.current_task()
        return await coro_factory()

    def cancel() -> None:
        # interrupted (or failed) while the work may run: cancel it, not leave it sampling; work not
        # started yet sees `interrupted` and ends at once
        with lock:
            held["interrupted"] = True
            loop, task = held.get("loop"), held.get("task")
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop ended meanwhile
                loop.call_soon_threadsafe(task.cancel)

    return call_in_worker_thread(lambda: asyncio.run(main()), cancel)


__all__ = ["SamplingClientLike", "SamplerTarget", "sampler_target", "open_sampler", "renderer_for", "sampling_params",
           "render_prompts", "call_sampler", "reply_tool_calls", "sample_rows", "watchdog", "run_coroutine"]
