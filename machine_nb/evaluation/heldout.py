"""The held-out evaluator that tinker-cookbook's training loop calls every `eval_every` steps.

`HeldOutEvaluator` is a cookbook `SamplingClientEvaluator`: the loop hands it a sampling client
on a fresh snapshot of the weights (the real SDK's, on either engine), it samples every eval row
(sampling.py) and scores it with evaluate()'s own rules (scoring.py: match modes, format regexes,
the regex time bound),
appends the per-row results of that step to `<log dir>/heldout.jsonl` (the cookbook's interface
returns floats only) and returns held-out accuracy and format rate, which the loop logs into
`metrics.jsonl` itself (`supervised.train` for sft, `preference.train_dpo` for dpo). It runs in the
training child process (runner.run_loop puts it in the loop); `HeldOutEvalBuilder` is the plain,
JSON-shaped builder the cookbook's Config holds (its fields land in config.json). Reading the
results back is runlog.py's (`heldout_curve`, `heldout_results`).

`InspectEvalBuilder` does the same for Inspect AI tasks (`sft(inspect_tasks=…)`): the cookbook's own
`InspectEvaluatorBuilder` runs them on the loop's sampling client, their scores go into
`metrics.jsonl` as `test/inspect/<dataset>/<metric>` beside `test/accuracy`, and Inspect's logs of
each step into `<log dir>/inspect/`.

This module imports tinker-cookbook at the top (a class must subclass the cookbook's), so only
the child and code that already loaded the cookbook import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tinker_cookbook.eval.evaluators import SamplingClientEvaluator

from ..training.loop import eval_schedule  # noqa: F401 (importable from here too: the held-out evals' schedule)
from ..training.runlog import (HELDOUT_ACCURACY, HELDOUT_FILE, HELDOUT_FORMAT_RATE, HELDOUT_PREFIX,
                               INSPECT_PREFIX, METRICS_FILE)


@dataclass(frozen=True)
class HeldOutEvalBuilder:
    """Builds the evaluator for the cookbook's `evaluator_builders` (called once, in the child).

    Its fields land in the run's config.json, so they are plain values.

    Args:
        eval_path: the checked eval rows the run copied into its log dir.
        model: the base model, whose renderer formats prompts and parses replies.
        renderer: that renderer's name.
        log_dir: where heldout.jsonl goes.
        steps: the loop steps at which it will be called, in order (loop.eval_schedule); each
            result is filed under its step (default (): none).
        source: the eval file the user gave, recorded with every score (default None: rows in memory).
        source_sha256: its SHA-256 (default None).
        max_tokens: a reply's budget, as evaluate() takes it (default 32); recorded with every score.
        temperature: the sampling temperature (default 0.0: greedy); recorded too.
        seed: the sampling seed (default 0).
        concurrency: requests in flight (default 8).
    """

    eval_path: str
    model: str
    renderer: str
    log_dir: str
    steps: tuple[int, ...] = ()
    source: str | None = None
    source_sha256: str | None = None
    max_tokens: int = 32
    temperature: float = 0.0
    seed: int | None = 0
    concurrency: int = 8

    def __call__(self) -> "HeldOutEvaluator":
        return HeldOutEvaluator(self)

    @classmethod
    def from_spec(cls, spec: dict, steps: list[int]) -> "HeldOutEvalBuilder":
        """The builder for a training spec's `heldout` settings (what sft and dpo write).

        Args:
            spec: the run's spec (loop.child_spec).
            steps: the loop steps at which the evaluator will be called (loop.eval_schedule).

        Returns:
            The builder.
        """
        h = spec["heldout"]
        return cls(eval_path=h["path"], model=spec["model"], renderer=spec["renderer"], log_dir=spec["log_dir"],
                   steps=tuple(steps), source=h.get("source"), source_sha256=h.get("source_sha256"),
                   max_tokens=int(h["max_tokens"]), temperature=float(h["temperature"]), seed=h.get("seed"),
                   concurrency=int(h.get("concurrency", 8)))


@dataclass
class HeldOutEvaluator(SamplingClientEvaluator):
    """Samples and scores the held-out rows through the sampling client the loop hands it.

    Called with the client, it returns `{"test/accuracy", "test/format_rate" (rows with a format
    only), "test/max_tokens", "test/temperature"}` and appends the step's results to heldout.jsonl:
    step, final, n, correct, accuracy, format_rate, errors (rows whose request failed),
    regex_timeouts (rows whose regex ran past its time bound), tokens, parameters, data, wall_s and
    the per-row results (evaluate()'s columns, `error` saying why a row was not scored in full).

    Args:
        builder: its settings.
        calls: how many times the loop called it so far (default 0; picks the step of the next call).
    """

    builder: HeldOutEvalBuilder
    calls: int = 0
    _prepared: Any = field(default=None, repr=False)

    def _prepare(self) -> tuple[list[dict], Any, list[Any], Any]:
        if self._prepared is None:
            from ..core.chat import load_eval_rows
            from .sampling import render_prompts, renderer_for, sampling_params

            b = self.builder
            rows = load_eval_rows(b.eval_path)
            renderer, _ = renderer_for(b.model, b.renderer)
            prompts = render_prompts(renderer, rows, b.eval_path)
            params = sampling_params(b.max_tokens, b.temperature, b.seed, renderer)
            self._prepared = (rows, renderer, prompts, params)
        return self._prepared

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        step = self.builder.steps[self.calls] if self.calls < len(self.builder.steps) else None
        self.calls += 1
        return await self.run(sampling_client, step)

    async def run(self, sampling_client: Any, step: int | None, *, final: bool = False) -> dict[str, float]:
        """Sample and score every eval row, and append the step's results to heldout.jsonl.

        Args:
            sampling_client: the SDK's sampling client on the weights to score.
            step: the step the results are filed under (None: past the schedule).
            final: whether these are the final checkpoint's (default False).

        Returns:
            The metrics the loop logs: test/accuracy, test/format_rate (rows with a format only),
            test/max_tokens, test/temperature.
        """
        from ..core.chat import prompt_text
        from .sampling import sample_rows
        from .scoring import score_row

        b = self.builder
        rows, renderer, prompts, params = self._prepare()
        t0 = time.perf_counter()
        sampled = await sample_rows(sampling_client, renderer, prompts, params, b.concurrency)
        wall = time.perf_counter() - t0
        per_row, timed_out = [], 0
        for i, (row, got) in enumerate(zip(rows, sampled)):
            correct, format_ok, problem = (False, None, None) if got["error"] else score_row(got["output"], row)
            timed_out += problem is not None
            per_row.append({"row": i, "prompt": prompt_text(row["messages"]), "expected": row["expected"],
                            "match": row["match"], "output": got["output"], "correct": bool(correct),
                            "format_ok": format_ok, "prompt_tokens": got["prompt_tokens"],
                            "output_tokens": got["output_tokens"], "latency_s": got["latency_s"],
                            "stop_reason": got["stop_reason"], "error": got["error"] or problem})
        with_format = [r["format_ok"] for r in per_row if r["format_ok"] is not None]
        correct = sum(r["correct"] for r in per_row)
        summary = {
            "step": step, "final": final, "n": len(per_row), "correct": correct, "accuracy": correct / len(per_row),
            "format_rate": sum(with_format) / len(with_format) if with_format else None,
            "errors": sum(1 for got in sampled if got["error"]),  # failed requests, as evaluate() counts them
            "regex_timeouts": timed_out,
            "prompt_tokens": sum(r["prompt_tokens"] for r in per_row),
            "output_tokens": sum(r["output_tokens"] for r in per_row),
            "parameters": {"max_tokens": b.max_tokens, "temperature": b.temperature, "seed": b.seed,
                           "renderer": b.renderer},
            "data": {"path": b.source, "sha256": b.source_sha256},
            "wall_s": round(wall, 3),
        }
        _append(os.path.join(b.log_dir, HELDOUT_FILE), {**summary, "rows": per_row})
        metrics = {HELDOUT_ACCURACY: summary["accuracy"], f"{HELDOUT_PREFIX}max_tokens": float(b.max_tokens),
                   f"{HELDOUT_PREFIX}temperature": float(b.temperature)}
        if summary["format_rate"] is not None:
            metrics[HELDOUT_FORMAT_RATE] = summary["format_rate"]
        return metrics


def _append(path: str, record: dict) -> None:
    """One eval step as one line, in one write (a reader never sees half of it, save a crash mid-write,
    which the readers skip as a truncated last line)."""
    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def evaluate_final(builder: HeldOutEvalBuilder, base_url: str | None, total_steps: int) -> dict[str, float] | None:
    """Score the run's final sampler checkpoint (the weights after the last step, which the loop
    itself never evaluates) and log it as the metrics row of step `total_steps`.

    Args:
        builder: the run's evaluator builder.
        base_url: the engine's URL (the SDK's key comes from the environment, as for the loop).
        total_steps: steps the run trained.

    Returns:
        The metrics, or None when the run saved no final sampler checkpoint.
    """
    from .sampling import run_coroutine

    def failed(exc: BaseException) -> None:  # say the run is over (a live plot stops waiting)
        from ..core.redact import redacted  # the error goes into a results file: no key or password in it

        _append(os.path.join(builder.log_dir, HELDOUT_FILE),
                {"step": total_steps, "final": True, "error": redacted(f"{type(exc).__name__}: {exc}")})

    return _on_final_checkpoint(builder.log_dir, builder.model, base_url, total_steps,
                                lambda client: run_coroutine(lambda: HeldOutEvaluator(builder).run(
                                    client, total_steps, final=True)), on_error=failed)


def _on_final_checkpoint(log_dir: str, model: str, base_url: str | None, total_steps: int,
                         score: Any, on_error: Any = None) -> dict[str, float] | None:
    """`score(sampling_client)` on a run's final sampler checkpoint, its metrics appended to
    metrics.jsonl as step `total_steps`; None when the run saved no final sampler checkpoint.

    The SDK client is closed afterwards: the training process is kept for the next run, and a client
    left open would keep its session heart-beating against the engine until the process ends. A
    failure is handed to `on_error` first, then raised."""
    import tinker
    from tinker_cookbook import checkpoint_utils

    from .sampling import SamplerTarget, open_sampler

    final = [c for c in checkpoint_utils.load_checkpoints_file(log_dir) if c.name == "final" and c.sampler_path]
    if not final:
        return None
    service = tinker.ServiceClient(base_url=base_url)
    status = "errored"
    try:
        metrics = score(open_sampler(SamplerTarget(model, final[-1].sampler_path, "tinker"), service_client=service))
        status = "success"
    except BaseException as exc:
        if on_error is not None:
            on_error(exc)
        raise
    finally:
        with contextlib.suppress(Exception):  # a server already gone has no session to finish
            service.close(status).result(timeout=30)
    _append(os.path.join(log_dir, METRICS_FILE), {"step": total_steps, **metrics})
    return metrics


# --------------------------------------------------------------------------- Inspect AI tasks while training


INSPECT_DIR = "inspect"
"""The log dir's folder for the Inspect logs of each eval step (load_results reads them)."""


@dataclass(frozen=True)
class InspectEvalBuilder:
    """Builds the Inspect evaluator the cookbook's loop calls (its infrequent evaluators, on their
    own schedule): InspectEvaluator on the sampling client the loop hands it, its scores logged
    under INSPECT_PREFIX.

    Its fields land in the run's config.json, so they are plain values.

    Args:
        tasks: Inspect tasks by registry name or task file ("tasks.py@name").
        model: the base model (the cookbook's Inspect model API renders with its renderer).
        renderer: that renderer's name.
        log_dir: the run's log dir (Inspect's logs go to its INSPECT_DIR folder).
        max_tokens: a reply's budget (default 32, as evaluate()).
        temperature: default 0.0 (greedy).
        seed: the sampling seed (default 0).
        concurrency: requests in flight (default 8).
    """

    tasks: tuple[str, ...]
    model: str
    renderer: str
    log_dir: str
    max_tokens: int = 32
    temperature: float = 0.0
    seed: int | None = 0
    concurrency: int = 8

    def __call__(self) -> "InspectEvaluator":
        return InspectEvaluator(self)

    @classmethod
    def from_spec(cls, spec: dict) -> "InspectEvalBuilder":
        """The builder for a training spec's `inspect` settings (what sft writes).

        Args:
            spec: the run's spec (loop.child_spec).

        Returns:
            The builder.
        """
        i = spec["inspect"]
        return cls(tasks=tuple(i["tasks"]), model=spec["model"], renderer=spec["renderer"], log_dir=spec["log_dir"],
                   max_tokens=int(i["max_tokens"]), temperature=float(i["temperature"]), seed=i.get("seed"),
                   concurrency=int(i.get("concurrency", 8)))


@dataclass
class InspectEvaluator(SamplingClientEvaluator):
    """Runs the Inspect tasks on the loop's sampling client and names their scores: as the
    cookbook's InspectEvaluator runs them (Inspect's eval_async, no retries, failures kept on their
    samples, each task's metrics as `<dataset>/<metric>`), through the model API `inspect_eval`
    samples with (inspect_bridge.model_api: a task's system message sent once, its stop
    sequences applied, logprobs when asked).

    Args:
        builder: its settings.
    """

    builder: InspectEvalBuilder

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        from inspect_ai import eval_async
        from inspect_ai.model import GenerateConfig, Model

        from .inspect_bridge import model_api
        from .inspect_logs import offline_inspect

        b = self.builder
        with offline_inspect():  # Inspect reads its settings as its model is made
            os.environ.setdefault("INSPECT_DISPLAY", "log")  # the run's log file, not a live console view
            model = Model(api=model_api(b.renderer, b.model, sampling_client),
                          config=GenerateConfig(temperature=b.temperature, max_tokens=b.max_tokens, seed=b.seed))
            logs = await eval_async(tasks=list(b.tasks), model=[model], retry_on_error=0, fail_on_error=False,
                                    log_dir=os.path.join(b.log_dir, INSPECT_DIR), max_connections=b.concurrency,
                                    log_level="warning", log_realtime=False, log_buffer=1000, debug_errors=False)
        metrics = {}
        for log in logs:
            if log.results is not None and log.results.scores:
                dataset = log.eval.dataset.name if log.eval.dataset is not None else "unknown"
                for name, metric in log.results.scores[0].metrics.items():
                    metrics[f"{INSPECT_PREFIX}{dataset}/{name}"] = float(metric.value)
        return metrics


def inspect_final(builder: InspectEvalBuilder, base_url: str | None, total_steps: int) -> dict[str, float] | None:
    """Run the Inspect tasks on the run's final sampler checkpoint and log them as step `total_steps`.

    Args:
        builder: the run's Inspect builder.
        base_url: the engine's URL.
        total_steps: steps the run trained.

    Returns:
        The metrics, or None when the run saved no final sampler checkpoint.
    """
    from .sampling import run_coroutine

    return _on_final_checkpoint(builder.log_dir, builder.model, base_url, total_steps,
                                lambda client: run_coroutine(lambda: InspectEvaluator(builder)(client)))


__all__ = ["HeldOutEvalBuilder", "HeldOutEvaluator", "eval_schedule", "evaluate_final", "INSPECT_PREFIX",
           "INSPECT_DIR", "InspectEvalBuilder", "InspectEvaluator", "inspect_final"]
