"""Evaluation: held-out eval rows → samples through an engine → scores → a results JSON.

Rows are Machine's `{"messages", "expected", "match", "format"?}` (its `/train eval` row format).
Sampling goes through the real tinker SDK's sampling client (local server or Tinker, see engines/);
whether a checkpoint is *good enough* to use is the reader's call, made from compare.py's paired
numbers. Rows are checked in chat.py, replies scored in scoring.py, results (EvalResult, the
results JSON) kept in results.py.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import os
import time
import warnings
from pathlib import Path
from typing import Any

from ..core import patterns
from ..core.chat import eval_rows, probe_rows, prompt_text
from ..errors import user_stacklevel
from ..checks.pricing import estimate_eval_cost, sample_cost
from .results import (PROBE_COLUMNS, RESULT_COLUMNS, EvalResult, file_sha256, free_results_path,
                      results_name, results_stem, utc_now)
from .sampling import (SamplingClientLike, open_sampler, render_prompts, renderer_for, run_coroutine, sample_rows,
                       sampler_target, sampling_params, watchdog)
from .scoring import format_matches, score_row


# --------------------------------------------------------------------------- evaluate

def check_sampling(max_tokens: Any, temperature: Any, concurrency: Any = None, seed: Any = None) -> None:
    """Refuse sampling settings no sampler can use, naming the setting, before a row is sent.

    Raises:
        ValueError: max_tokens not a whole number from 1; temperature not a finite number, 0 or
            more; concurrency (when given) not a whole number from 1; seed not a whole number
            or None (numpy integers are whole numbers; True, 1.5 and "3" are not).
    """
    def integral(value: Any) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    def whole(value: Any) -> bool:
        return integral(value) and value >= 1

    if not whole(max_tokens):
        raise ValueError(f"max_tokens must be a whole number, 1 or more (the reply budget), got {max_tokens!r}")
    if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
            or not 0 <= temperature < math.inf):
        raise ValueError(f"temperature must be a finite number, 0 or more (0: greedy), got {temperature!r}")
    if concurrency is not None and not whole(concurrency):
        raise ValueError(f"concurrency must be a whole number, 1 or more (requests in flight), got {concurrency!r}")
    if seed is not None and not integral(seed):
        raise ValueError(f"seed must be a whole number or None (the sampling seed), got {seed!r}")


def _sampling(model: str | None, checkpoint: str | None, engine: str | None, renderer: Any,
              concurrency: int | None, max_tokens: int, temperature: float, seed: int | None) -> tuple:
    """What evaluate() and probe() sample with: (the sampler's target, the renderer and its label,
    requests in flight: 32 on Tinker, 8 on the local engine unless given, the sampling params)."""
    check_sampling(max_tokens, temperature, concurrency, seed)
    target = sampler_target(model, checkpoint, engine)
    renderer_obj, renderer_label = renderer_for(target.model, renderer)
    if concurrency is None:
        concurrency = 32 if target.engine == "tinker" else 8
    seed = None if seed is None else int(seed)  # a numpy integer reaches the SDK as Python's
    return target, renderer_obj, renderer_label, concurrency, sampling_params(max_tokens, temperature, seed, renderer_obj)


def _check_base_model(client: Any, target: Any) -> None:
    """Refuse a checkpoint trained from another base model than the one whose renderer formats the
    prompts (its tokens would be another vocabulary's), before any request; Tinker's ":peft:…"
    suffix aside (render.base_model). A client that cannot say its base model (a stand-in, or a
    failed lookup) is taken at its word."""
    from ..checks.render import base_model

    ask = getattr(client, "get_base_model", None)
    if not target.checkpoint or not target.model or not callable(ask):
        return
    try:
        base = ask()
    except Exception:  # the lookup is a courtesy: the samples themselves still go through the engine's checks
        return
    if isinstance(base, str) and base and base_model(base) != base_model(target.model):
        raise ValueError(f"{target.checkpoint} was trained from {base}, not {target.model}: its prompts must be "
                         f"rendered with its own base model's renderer; pass model={base!r}")


def _results_path(out: Any, label: str, model: str, checkpoint: str | None, data_path: str | None) -> Path:
    """Where the results JSON goes, settled before any request so that a path that cannot be
    written costs no samples: `out`, or default_results_path for the label made a safe file name.

    Raises:
        ValueError: `out` is a folder, the eval data file itself, or under a file.
    """
    stem = results_stem(label)
    if out is None:
        return default_results_path(stem, model, checkpoint)
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"out={os.fspath(out)!r} is a folder: pass the results file's path, e.g. "
                         f"{os.fspath(path / (stem + '.json'))!r}")
    if data_path is not None and path.exists() and os.path.samefile(path, data_path):
        raise ValueError(f"out={os.fspath(out)!r} is the eval data: the results would replace it; pass another path")
    above = next((p for p in path.parents if p.exists()), None)  # the folder that is there already
    if above is not None and not above.is_dir():
        raise ValueError(f"out={os.fspath(out)!r} cannot be written: {above} is a file, not a folder")
    return path


def evaluate(data: str | os.PathLike | list[dict], model: str | None = None, checkpoint: str | None = None,
             engine: str | None = None, *, max_tokens: int = 32, temperature: float = 0.0, seed: int | None = 0,
             concurrency: int | None = None, renderer: Any = None, out: str | os.PathLike | None = None,
             name: str | None = None, save: bool = True, sampling_client: SamplingClientLike | None = None,
             service_client: Any = None, progress: bool | None = None, max_usd: float | None = None) -> EvalResult:
    """Sample every eval row through the engine, score it, and write a results JSON.

    On Tinker the key and reachability are checked first and fail within seconds with
    EngineError. A request that fails is recorded in `error` (counted wrong, with a warning); an
    EngineError stops the eval.

    Args:
        data: the eval JSONL path, or a list of row dicts (Machine's `{"messages", "expected",
            "match", "format"?}`); every row is checked before any sampling.
        model: the base model, whose renderer formats prompts and parses replies. Default None:
            the local engine's shipped model (so the offline example needs no names); required
            for a Tinker checkpoint.
        checkpoint: a sampler path (`tinker://…`) to evaluate instead of the base model.
            Default None: the base model (the baseline).
        engine: "local" | "tinker". Default None: the engine that serves the model or checkpoint.
        max_tokens: reply budget per row. Default 32 (as pricing.estimate_eval_cost assumes): an
            `answer: <integer>` needs under 10, and a rambling reply is cut there (stop_reason
            "length") instead of paying for prose.
        temperature: default 0.0 (greedy), so two evals of the same model agree and compare()
            sees the model, not the dice.
        seed: the sampling seed for temperature > 0, a whole number or None (default 0;
            recorded in the results).
        concurrency: requests in flight at once. Default None: 32 on Tinker (remote,
            latency-bound), 8 locally (one CPU model; more only queues).
        renderer: a renderer name or object. Default None: the model's recommended renderer.
        out: the results JSON path (not a folder, not the eval file), settled before any
            request. Default None: `eval_results/<name>.json` (the name's characters other than
            letters, digits, ".", "_" and "-" written as "_"), or beside it when that file holds
            another model's or checkpoint's results (default_results_path); chosen again when
            written, so two evaluations under one name at once keep both results.
        name: the results' name. Default None: "baseline" for a base model, else the
            checkpoint's last path segment.
        save: write the results JSON (default True; False writes nothing). A write that fails
            after sampling (a full disk) warns and returns the results unsaved (`path` None).
        sampling_client: a sampler to use instead of the engine's (default None; tests pass
            stand-ins).
        service_client: the ServiceClient that opens the sampler (default None: the engine's own).
        progress: show a progress bar per finished row. Default None: on in a kernel or terminal
            unless MACHINE_NB_PROGRESS=0 (machine_nb.core.progress decides).
        max_usd: a budget. Default None: no limit. When set, the eval is priced first (exact
            prompt tokens + max_tokens per reply, pricing.estimate_eval_cost) and refused with
            BudgetExceeded before any request if it could cost more, or if the price is unknown.
            Local runs cost 0.

    Returns:
        An EvalResult: `rows` with RESULT_COLUMNS (plus "case" when rows carry one, and
        "tool_calls" when a reply called a tool: its calls in OpenAI's shape, None on the other
        rows; `output` is the reply's text), `summary`
        the results JSON without its rows (name, model, checkpoint, engine, renderer,
        parameters, data path and sha256, n, correct, accuracy, format_rate, errors,
        regex_timeouts, tokens, cost, times), `path` the file written (None when save=False).

    Raises:
        MachineFormatError: a bad eval row, naming its file, line and field.
        ValueError: a sampling setting no sampler can use (check_sampling), naming it; `out` a
            folder, a path under a file, or the eval file; a checkpoint trained from another base
            model than `model`. All before any request.
        EngineError: the engine refused the job or every request failed.
        BudgetExceeded: the eval could cost more than max_usd.
    """
    import pandas as pd

    from ..core.progress import progress as progress_bar

    rows, data_path = eval_rows(data)
    data_sha = file_sha256(data_path)  # of the file as read, not as it may be after a long eval
    target, renderer_obj, renderer_label, concurrency, params = _sampling(
        model, checkpoint, engine, renderer, concurrency, max_tokens, temperature, seed)
    model, engine = target.model, target.engine
    prompts = render_prompts(renderer_obj, rows, data_path)
    if max_usd is not None and engine == "tinker":
        estimate_eval_cost(rows, model, max_tokens=int(max_tokens), max_usd=max_usd)  # raises BudgetExceeded
    label = results_name(checkpoint) if name is None else str(name)
    path = _results_path(out, label, model, target.checkpoint, data_path) if save else None
    client = sampling_client if sampling_client is not None else open_sampler(target, service_client)
    _check_base_model(client, target)

    started_at, t0 = utc_now(), time.perf_counter()
    with progress_bar(total=len(rows), desc=f"eval {label}", unit="row", enabled=progress) as bar, \
            watchdog(engine) as dog:
        sampled = run_coroutine(lambda: sample_rows(client, renderer_obj, prompts, params, concurrency, bar), dog)
    wall = time.perf_counter() - t0
    finished_at = utc_now()

    records, timed_out = [], []
    for i, (row, got) in enumerate(zip(rows, sampled)):
        correct, format_ok, problem = (False, None, None) if got["error"] else score_row(got["output"], row)
        if problem:
            timed_out.append((i, problem))
        records.append({
            "row": i, "prompt": prompt_text(row["messages"]), "expected": row["expected"], "match": row["match"],
            "output": got["output"], "correct": bool(correct), "format_ok": format_ok,
            "prompt_tokens": got["prompt_tokens"], "output_tokens": got["output_tokens"],
            "latency_s": got["latency_s"], "stop_reason": got["stop_reason"], "error": got["error"] or problem,
        })
        if row.get("case") is not None:  # rows that share a case are clustered by compare()
            records[-1]["case"] = row["case"]
        if got.get("tool_calls"):  # a reply that calls a tool: its text alone may be empty
            records[-1]["tool_calls"] = got["tool_calls"]
    columns = RESULT_COLUMNS + [c for c in ("case", "tool_calls") if any(c in r for r in records)]
    df = pd.DataFrame.from_records(records, columns=columns)
    errors = [r for i, r in enumerate(records) if sampled[i]["error"]]
    if errors:
        listed = "\n".join(f"  row {r['row']}: {r['error']}" for r in errors[:10])
        warnings.warn(f"{len(errors)} of {len(rows)} eval request(s) failed and count as wrong:\n{listed}", stacklevel=user_stacklevel())
    if timed_out:
        listed = "\n".join(f"  row {i}: {why}" for i, why in timed_out[:10])
        warnings.warn(f"{len(timed_out)} of {len(rows)} row(s) hit the regex time bound "
                      f"({patterns.REGEX_TIMEOUT_S:g} s; machine_nb.core.patterns.REGEX_TIMEOUT_S):\n{listed}", stacklevel=user_stacklevel())

    with_format = [r["format_ok"] for r in records if r["format_ok"] is not None]
    summary = {
        "name": label, "model": model, "checkpoint": target.checkpoint, "engine": engine, "renderer": renderer_label,
        "parameters": {"max_tokens": int(max_tokens), "temperature": float(temperature),
                       "seed": None if seed is None else int(seed), "concurrency": int(concurrency)},
        "data": {"path": data_path, "sha256": data_sha},
        "n": len(records), "correct": sum(r["correct"] for r in records),
        "accuracy": sum(r["correct"] for r in records) / len(records),
        "format_rate": (sum(with_format) / len(with_format)) if with_format else None,
        "errors": len(errors), "regex_timeouts": len(timed_out),
        "prompt_tokens": int(df["prompt_tokens"].sum()), "output_tokens": int(df["output_tokens"].sum()),
        "cost": sample_cost(model, engine, int(df["prompt_tokens"].sum()), int(df["output_tokens"].sum())),
        "started_at": started_at, "finished_at": finished_at, "wall_s": round(wall, 3),
    }
    if path is not None:
        from .results import write_free_results, write_results

        per_row = [{**rec, "line": row["line"], "messages": row["messages"], "format": row["format"]}
                   for rec, row in zip(records, rows)]
        if out is None:  # the default name: another evaluation under it may have written it since the start
            path = write_free_results(path, results_stem(label), summary, per_row)
        else:
            path = write_results(path, summary, per_row)  # None, warned, when it cannot be written
    return EvalResult(df, summary, path)


def default_results_path(label: str, model: str, checkpoint: str | None) -> Path:
    """Where results go when no `out` is given: `eval_results/<label>.json`, unless that file holds
    the results of another model or checkpoint (two runs' `…/sampler_weights/final` share a
    label), or is not a results file of this toolkit's: then the first free `<label>-<n>.json`,
    said in a warning (results.free_results_path). The same model and checkpoint evaluated again
    replaces its own results.

    Args:
        label: the results' name.
        model: the base model sampled.
        checkpoint: the checkpoint sampled, or None for the base model.

    Returns:
        The path to write.
    """
    return free_results_path(label, model, checkpoint)


# --------------------------------------------------------------------------- bleed probe

def _file_source(data: Any) -> str | None:
    """The probe file's path, named in a render error; None for prompts given in memory (a prompt
    string longer than a file name can be, or holding a NUL, is no file either)."""
    if not isinstance(data, (str, os.PathLike)):
        return None
    try:
        return os.fspath(data) if Path(data).is_file() else None
    except (OSError, ValueError):
        return None


def probe(data: str | os.PathLike | list, model: str | None = None, checkpoint: str | None = None,
          engine: str | None = None, *, format: str | None = None, max_tokens: int = 32, temperature: float = 0.0,
          seed: int | None = 0, concurrency: int | None = None, renderer: Any = None,
          baseline_client: SamplingClientLike | None = None, checkpoint_client: SamplingClientLike | None = None,
          service_client: Any = None, progress: bool | None = None) -> EvalResult:
    """Off-distribution prompts through the base model and the checkpoint side by side: where
    does a learned style leak?

    Writes nothing.

    Args:
        data: a probe JSONL path (e.g. the corpus's probe.jsonl), or a list of prompt strings or
            of `{"messages": [...], "format"?}` rows (a trailing assistant message is dropped).
        model: the base model, as in evaluate() (default None: the local engine's model).
        checkpoint: the sampler path set beside the base model; required (it is half the point)
            unless checkpoint_client is given.
        engine: as in evaluate() (default None: the engine that serves the model or checkpoint).
        format: the learned style as a regex (fullmatch on the stripped reply), e.g.
            r"answer: .*". Default None: each row's own "format"; `bled` is None for rows with
            neither.
        max_tokens, temperature, seed, concurrency, renderer: sampling, as in evaluate()
            (defaults 32, 0.0 greedy, 0, the engine's, the model's renderer).
        baseline_client, checkpoint_client: samplers to use instead of the engine's (default
            None; tests pass stand-ins).
        service_client: the ServiceClient that opens the samplers (default None: the engine's).
        progress: show a progress bar per reply (default None: as in evaluate()).

    Returns:
        An EvalResult: `rows` with PROBE_COLUMNS (prompt, baseline_output, checkpoint_output,
        bled, error), `summary` {model, checkpoint, engine, format, n, bled (how many rows
        bled)}, `path` None.

    Raises:
        ValueError: no checkpoint, a `format` that is not a valid regular expression, or a
            checkpoint trained from another base model than `model`.
    """
    import pandas as pd

    from ..core.progress import progress as progress_bar

    if not checkpoint and checkpoint_client is None:
        raise ValueError("probe needs a checkpoint (or checkpoint_client) to set beside the base model")
    rows = probe_rows(data)
    if format is not None:  # a bad pattern fails before any sample (rows' own are checked with the rows)
        try:
            patterns.compile_pattern(format)
        except (patterns.pattern_error(), TypeError) as exc:
            raise ValueError(f"probe: format {format!r} is not a valid regular expression: {exc}") from None
    target, renderer_obj, _, concurrency, params = _sampling(
        model, checkpoint, engine, renderer, concurrency, max_tokens, temperature, seed)
    model, engine = target.model, target.engine
    source = _file_source(data)
    rendered = render_prompts(renderer_obj, rows, source)
    base_client = baseline_client if baseline_client is not None else open_sampler(target.base, service_client)
    ckpt_client = checkpoint_client if checkpoint_client is not None else open_sampler(target, service_client)
    _check_base_model(ckpt_client, target)

    async def both(bar: Any) -> tuple[list[dict], list[dict]]:
        return tuple(await asyncio.gather(sample_rows(base_client, renderer_obj, rendered, params, concurrency, bar),
                                          sample_rows(ckpt_client, renderer_obj, rendered, params, concurrency, bar)))

    with progress_bar(total=2 * len(rows), desc="probe", unit="reply", enabled=progress) as bar, \
            watchdog(engine) as dog:
        base_out, ckpt_out = run_coroutine(lambda: both(bar), dog)
    records, timed_out = [], []
    for i, (row, x, y) in enumerate(zip(rows, base_out, ckpt_out)):
        pattern = format or row["format"]
        try:
            fa, fb = format_matches(x["output"], pattern), format_matches(y["output"], pattern)
            bled, problem = None if pattern is None else bool(fb and not fa), None
        except patterns.RegexTimeout as exc:  # cannot tell whether the style bled
            bled, problem = None, f"'format' timed out, bled unknown: {exc}"
            timed_out.append((i, problem))
        records.append({"prompt": prompt_text(row["messages"]), "baseline_output": x["output"],
                        "checkpoint_output": y["output"], "bled": bled,
                        "error": x["error"] or y["error"] or problem})
    if timed_out:
        listed = "\n".join(f"  row {i}: {why}" for i, why in timed_out[:10])
        warnings.warn(f"{len(timed_out)} of {len(rows)} probe row(s) hit the regex time bound:\n{listed}", stacklevel=user_stacklevel())
    df = pd.DataFrame.from_records(records, columns=PROBE_COLUMNS)
    summary = {"name": "probe", "model": model, "checkpoint": checkpoint, "engine": engine, "format": format,
               "n": len(df), "bled": int(sum(bool(b) for b in df["bled"] if b is not None))}
    return EvalResult(df, summary, None)
