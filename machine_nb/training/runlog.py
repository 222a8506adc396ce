"""A training run's log dir: its files, and what they read back as.

tinker-cookbook's loops (`supervised.train`, `preference.train_dpo`) write `metrics.jsonl` (one
row per step), `checkpoints.jsonl` (one row per saved checkpoint) and `config.json`; this toolkit
adds its run record (`machine_nb.json`: the settings a run started with, its estimate, what a
resume changed), the rows the loop read (`train.jsonl` or `pairs.jsonl`) and, with held-out
evals, `heldout_data.jsonl` and `heldout.jsonl` (one line per eval step with its per-row
results). This module reads them back (`read_training_log`, `training_metrics`,
`heldout_curve`, `heldout_results`), makes and claims log dirs, and keeps their files private.

It imports neither the trainer nor tinker-cookbook: widgets, sweeps and the held-out evaluator
read runs through it, whatever is training them.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import stat
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from ..errors import MachineFormatError, user_stacklevel
from ..core.jsonl import iter_jsonl, parse_json

if TYPE_CHECKING:
    import pandas as pd

    from ..evaluation.results import EvalResult

#: The loss a step logs: supervised runs `train_mean_nll`, the cookbook's DPO `dpo_loss`.
SFT_LOSS = "train_mean_nll"
DPO_LOSS = "dpo_loss"
LOSS_METRICS = (SFT_LOSS, DPO_LOSS)
#: Held-out scores in metrics.jsonl (the cookbook's `test/` prefix for evaluator metrics).
HELDOUT_PREFIX = "test/"
#: Where the Inspect tasks run while training log their metrics: `test/inspect/<task>/<metric>`.
INSPECT_PREFIX = f"{HELDOUT_PREFIX}inspect/"
HELDOUT_ACCURACY = "test/accuracy"
HELDOUT_FORMAT_RATE = "test/format_rate"
#: The cookbook's files in a log dir: one row per step, one row per saved checkpoint.
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_FILE = "checkpoints.jsonl"
#: The run's console output (the child process's stdout and stderr).
TRAIN_LOG = "train.log"
#: In a log dir: one line per eval step with its per-row results, and the eval rows it scored.
HELDOUT_FILE = "heldout.jsonl"
HELDOUT_DATA = "heldout_data.jsonl"
#: The run record of a log dir this toolkit made (what a resume accepts, and a new run refuses to reuse).
MARKER = "machine_nb.json"
#: Top-level files a run writes in its log dir (the cookbook's and this toolkit's): tightened
#: after every run, also when they were there before it (a resumed run appends to them).
RUN_FILES = frozenset({
    METRICS_FILE, CHECKPOINTS_FILE, "config.json", "code.diff", "logs.log", "timing_spans.jsonl",
    "trace_events.jsonl", TRAIN_LOG, "train.jsonl", HELDOUT_FILE, HELDOUT_DATA, "pairs.jsonl", MARKER})


# ---------------------------------------------------------------------------------------------
# the result


@dataclass
class TrainResult:
    """What a training run (sft or dpo) produced, read from its log dir (see `read_training_log`).

    Args:
        checkpoint: the last sampler checkpoint (`tinker://…`), None if the run saved none.
        steps: optimizer steps logged.
        tokens: tokens processed over all steps (what Tinker bills; for DPO both sequences of every pair).
        first_loss: the loss of the first step (`loss_metric`).
        last_loss: the loss of the last step.
        log_dir: the run's directory.
        cost_usd: the observed cost: tokens actually trained x the model's price (for DPO the
            three passes a step makes, pricing.dpo_cost), plus the held-out evals' prompt and
            output tokens x its prefill and sample prices; 0 on the local engine, None when a
            price is unknown.
        model: the base model trained (default None: not recorded).
        engine: "local" or "tinker" (default None: not recorded).
        complete: whether the run saved its "final" checkpoint (False after a Ctrl-C or a crash).
        state_path: the last resumable training state (default None: none saved).
        loss_metric: `train_mean_nll` (SFT) or `dpo_loss` (DPO); None before the first step.
        estimated_usd: what the run was estimated to cost before it started (None when not recorded).
        estimated_tokens: the training tokens that estimate priced (the renderer's count of each
            row, one token a row more than the loop trains: a datum's input drops its last token).
        eval_cost_usd: the held-out evals' part of cost_usd.
        heldout_accuracy: with held-out evals, the final checkpoint's accuracy.
        heldout_format_rate: its format rate (None without format regexes).
        best_step: the eval step with the highest accuracy, the earliest such (step s = the
            weights after s optimizer steps, 0 = the starting weights; a NaN accuracy is never
            the best). Choose on a validation set, report on another.
        best_accuracy: that step's accuracy.
        evals: how many eval steps were logged.
        unconfirmed_steps: steps a resumed sft run trained again because no metrics row showed
            them finished before the interrupt ([] in the usual case). The engine may have failed
            them (training them again was exact) or the interrupt came in the moments between a
            checkpoint and their rows (they were trained twice); the log cannot tell which.
        kind: "sft" or "dpo" (default "sft").
        resumed_at: for DPO, the steps at which the run was resumed (default []: never).
        note: what those resumes changed, in words (default None): the cookbook takes a resumed
            DPO run's reference model from the checkpoint it resumes from, so from that step on
            the run differs from an uninterrupted one (see `resume_note`).
    """

    checkpoint: str | None
    steps: int
    tokens: int
    first_loss: float | None
    last_loss: float | None
    log_dir: str
    cost_usd: float | None
    model: str | None = None
    engine: str | None = None
    complete: bool = False
    state_path: str | None = None
    loss_metric: str | None = None
    estimated_usd: float | None = None
    estimated_tokens: int | None = None
    eval_cost_usd: float | None = None
    heldout_accuracy: float | None = None
    heldout_format_rate: float | None = None
    best_step: int | None = None
    best_accuracy: float | None = None
    evals: int = 0
    unconfirmed_steps: list[int] = field(default_factory=list)
    kind: str = "sft"
    resumed_at: list[int] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as plain values.

        Returns:
            Every field by name (JSON-serialisable).
        """
        return asdict(self)

    def _repr_html_(self) -> str:
        from ..core.theme import escape, no_math

        def f(v: float | None) -> str:
            return "–" if v is None else f"{v:.4f}"

        def usd(v: float | None) -> str:
            return "unknown" if v is None else f"&#36;{v:.4f}"

        cost = f"{usd(self.cost_usd)} observed" + ("" if self.estimated_usd is None
                                                    else f" (estimated {usd(self.estimated_usd)})")
        state = "complete" if self.complete else "<b>incomplete</b> (no final checkpoint)"
        held = ""
        if self.evals:
            fmt = "" if self.heldout_format_rate is None else f", format {self.heldout_format_rate:.1%}"
            best = "" if self.best_step is None else f" · best {self.best_accuracy:.1%} at step {self.best_step}"
            final = "–" if self.heldout_accuracy is None else f"{self.heldout_accuracy:.1%}"
            held = f"<br>held-out accuracy {final}{fmt} (final){best} · {self.evals} evals"
        if self.unconfirmed_steps:
            state += (f" · resumed: steps {', '.join(map(str, self.unconfirmed_steps))} trained again (their "
                      "rows were missing; if the saved state held them, they were trained twice)")
        note = f"<br><small><b>note</b>: {escape(self.note)}</small>" if self.note else ""
        return no_math(f"<div class='machine-nb-train'><b>{escape(self.model)}</b> on {escape(self.engine)}: "
                       f"{self.steps} steps · {self.tokens:,} tokens · loss {f(self.first_loss)} → {f(self.last_loss)} · "
                       f"{cost} · {state}{held}<br><code>{escape(self.checkpoint)}</code><br>"
                       f"<small>{escape(_shown_path(self.log_dir))}</small>{note}</div>")


def _shown_path(path: str) -> str:
    """A path as a report shows it: relative to the current directory (the notebook's) when inside it,
    so a shared report does not print where the author's files live."""
    try:
        return os.path.relpath(path) if Path(path).absolute().is_relative_to(Path.cwd()) else path
    except ValueError:  # another drive
        return path


def resume_note(resumed_at: list[int], steps: int | None = None) -> str | None:
    """What a resumed DPO run does differently from an uninterrupted one, in words.

    Args:
        resumed_at: the steps the run was resumed at (ascending).
        steps: the run's steps, when known (default None).

    Returns:
        The sentence `TrainResult.note` carries; None when the run was never resumed.
    """
    if not resumed_at:
        return None
    first = resumed_at[0]
    where = (f"step {first}: the cookbook took the reference model from the step-{first} checkpoint"
             if len(resumed_at) == 1 else
             f"steps {', '.join(map(str, resumed_at))}: each time the cookbook took the reference model from "
             f"the checkpoint it resumed from")
    later = f"steps {first}-{steps - 1}" if steps else f"the steps from {first} on"
    return (f"resumed at {where}, not from the weights the run started from, so {later} are measured "
            f"against that checkpoint (dpo_loss restarts at log 2, margin and rewards at 0) and train "
            f"differently: their losses, weights and held-out scores, and the final checkpoint, differ from an "
            f"uninterrupted run's. Steps 0-{first - 1}, and the weights they reach (scored as step {first}), "
            f"are the same.")


# ---------------------------------------------------------------------------------------------
# reading a log dir


#: What each field the readers use holds, per log file: a value of another type (a hand-edited or
#: damaged line) is refused naming its file, line and field, rather than read as something else
#: (JSON true as a loss of 1.0) or failing deep in a reader. A missing field, or null, is allowed.
#: "int": a whole number; "number": any number (NaN and infinity included: a diverged run logs
#: them); "count": a finite number, 0 or more; "text": a string; "object": a JSON object;
#: "ints": a list of whole numbers; "objects": a list of JSON objects; "bool": true or false.
FIELD_KINDS: dict[str, dict[str, str]] = {
    METRICS_FILE: {"step": "int", "num_tokens": "count", SFT_LOSS: "number", DPO_LOSS: "number",
                   HELDOUT_ACCURACY: "number", HELDOUT_FORMAT_RATE: "number"},
    CHECKPOINTS_FILE: {"name": "text", "sampler_path": "text", "state_path": "text", "epoch": "int", "batch": "int",
                       "elapsed_tokens": "count", "steps_in_state": "int", "unconfirmed": "ints"},
    HELDOUT_FILE: {"step": "int", "final": "bool", "n": "int", "correct": "int", "errors": "int",
                   "prompt_tokens": "int", "output_tokens": "int", "accuracy": "number", "format_rate": "number",
                   "parameters": "object", "rows": "objects"},
}
_KIND_WORDS = {"int": "a whole number", "number": "a number", "count": "a finite number, 0 or more",
               "text": "a string", "object": "a JSON object", "ints": "a list of whole numbers",
               "objects": "a list of JSON objects", "bool": "true or false"}
#: Metrics fields that mean nothing without their step (the held-out scores of an eval step).
_NEEDS_STEP = (HELDOUT_ACCURACY, HELDOUT_FORMAT_RATE)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: FIELD_KINDS' kinds, each the test a value must pass.
_FITS: dict[str, Any] = {
    "int": _is_int, "number": _is_number, "count": lambda v: _is_number(v) and math.isfinite(v) and v >= 0,
    "text": lambda v: isinstance(v, str), "object": lambda v: isinstance(v, dict),
    "ints": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "objects": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "bool": lambda v: isinstance(v, bool)}


def _check_row(path: Path, line: int, row: dict) -> None:
    """Refuse a row of a log file whose fields do not hold what FIELD_KINDS says, naming the field."""
    kinds = FIELD_KINDS.get(path.name, {})
    for name, kind in kinds.items():
        value = row.get(name)
        if value is not None and not _FITS[kind](value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise MachineFormatError(path, f"{name} is {shown}, not {_KIND_WORDS[kind]}: no training run writes "
                                     "that (the line was edited or damaged). Correct or delete the line, then "
                                     "read the log dir again.", line=line, field=name)
    if path.name == METRICS_FILE and row.get("step") is None:
        for name in _NEEDS_STEP:
            if row.get(name) is not None:
                raise MachineFormatError(path, f"a row with {name} has no step, so its eval step is unknown: "
                                         "add the step or delete the line, then read the log dir again.",
                                         line=line, field="step")


def read_log_lines(path: str | os.PathLike, *, strict: bool = False) -> list[dict]:
    """The JSON objects of a log dir's JSONL file, as far as they can be read.

    Args:
        path: the file (metrics.jsonl, checkpoints.jsonl, heldout.jsonl, …).
        strict: refuse a row whose fields do not hold what FIELD_KINDS says (default False: rows
            are returned as written, for a plot that shows a value of the wrong type as a gap).
            The readers whose numbers a user relies on (`read_training_log`, `heldout_steps`)
            read strictly.

    Returns:
        Its objects in order; [] when the file is not there. A partial last line (a run still
        writing, or a crash, cut it, even inside a character) is skipped quietly, any other
        unreadable line with a warning naming it.

    Raises:
        MachineFormatError: with `strict`, a row with a field of the wrong type, naming the file,
            line and field.
    """
    path = Path(path)
    if not path.exists():
        return []
    skipped: list[MachineFormatError] = []
    rows = []
    for line, value in iter_jsonl(path, on_error="skip", skipped=skipped):
        if isinstance(value, dict):
            if strict:
                _check_row(path, line, value)
            rows.append(value)
    loud = [e for e in skipped if "truncated last line" not in str(e)]  # a partial last line is expected
    if loud:
        warnings.warn(f"skipped {len(loud)} unreadable line(s) of {path}: " + "; ".join(str(e) for e in loud[:5]),
                      stacklevel=user_stacklevel())
    return rows


def unique_steps(rows: list[dict]) -> list[dict]:
    """One row per step: a step's rows merged, the later written winning where they share a key (a
    resumed run logs again the steps it continues from; the final checkpoint's Inspect scores and
    held-out scores are two rows of one step).

    Args:
        rows: log rows with a `step` (rows without a whole-number one are kept, each on its own).

    Returns:
        The rows, ordered by step.
    """
    by_step: dict[Any, dict] = {}
    for i, m in enumerate(rows):
        key = m["step"] if _is_int(m.get("step")) else ("row", i)
        by_step[key] = {**by_step.get(key, {}), **m}
    # rows whose step is not a whole number (None, or text in a hand-edited file) go last, in order
    return sorted(by_step.values(), key=lambda m: (0, m["step"]) if _is_int(m.get("step")) else (1, 0))


def loss_metric(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The loss a run logs.

    Args:
        rows: its metrics rows.

    Returns:
        `train_mean_nll` (SFT) if any row has it, else `dpo_loss` (DPO), else None.
    """
    rows = list(rows)
    for key in LOSS_METRICS:
        if any(isinstance(m.get(key), (int, float)) for m in rows):
            return key
    return None


def read_marker(log_dir: str | os.PathLike) -> dict:
    """A log dir's run record (machine_nb.json), as far as it can be read.

    Args:
        log_dir: the run's log dir.

    Returns:
        The record; {} when it is missing, unreadable or not a JSON object (a reader of a run
        makes do without it; `load_marker` is the strict read a resume needs).
    """
    try:
        return load_marker(log_dir)
    except (OSError, ValueError):  # MachineFormatError is a ValueError
        return {}


def load_marker(log_dir: str | os.PathLike) -> dict:
    """A log dir's run record (machine_nb.json), read strictly.

    Args:
        log_dir: the run's log dir.

    Returns:
        The record.

    Raises:
        FileNotFoundError: no record there.
        MachineFormatError: a record that is not JSON, nested too deep, or not a JSON object,
            naming the file.
    """
    path = Path(log_dir) / MARKER
    data = parse_json(path.read_bytes(), path)
    if not isinstance(data, dict):
        raise MachineFormatError(path, "not a machine_nb run record (a JSON object)")
    return data


def _engine_of_log(marker: Mapping[str, Any], checkpoints: list[dict]) -> str | None:
    """The engine a run was started on (its run record), else the one its checkpoints name."""
    from ..engines import engine_for

    engine = marker.get("engine")
    if isinstance(engine, str):
        return engine
    for row in checkpoints:
        for key in ("sampler_path", "state_path"):
            if isinstance(row.get(key), str):
                return engine_for(row[key])
    return None


def _model_of_log(log_dir: Path) -> str | None:
    for name in (MARKER, "config.json"):
        try:
            data = parse_json((log_dir / name).read_bytes(), log_dir / name)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        model = data.get("model") or data.get("model_name")
        if model:
            return str(model)
    return None


def _train_cost(model: str | None, engine: str | None, tokens: int, kind: str) -> float | None:
    """Observed training cost: 0 locally; for DPO pricing.dpo_cost (three passes a step); for SFT
    tokens trained x the train price; None when a price is unknown."""
    from ..checks.pricing import dpo_cost, price_for

    if kind == "dpo":
        return dpo_cost(model, engine, tokens)
    if engine == "local":
        return 0.0
    price = None if model is None else price_for(model, strict=False)
    return None if price is None or price.train is None else tokens * price.train / 1e6


def _eval_cost(model: str | None, engine: str | None, steps: list[dict]) -> float | None:
    """Observed cost of the held-out evals' sampling (pricing.sample_cost); None when unknown."""
    from ..checks.pricing import sample_cost

    if model is None and engine != "local":
        return None
    return sample_cost(str(model), engine, sum(int(s.get("prompt_tokens") or 0) for s in steps),
                       sum(int(s.get("output_tokens") or 0) for s in steps))["usd"]


def read_training_log(log_dir: str | os.PathLike) -> TrainResult:
    """The checkpoint, steps, tokens, losses, held-out scores and costs of a log dir (finished or not).

    Reads `checkpoints.jsonl` (the last row with a `sampler_path` is the checkpoint; a "final" row
    means complete), `metrics.jsonl` (rows with the run's loss are steps: `train_mean_nll`, or
    `dpo_loss` for a DPO run; its held-out rows give the best step), `heldout.jsonl` when present
    (the held-out evals' tokens, for their cost) and the run record (the estimate made before the
    run, its kind, what a DPO resume changed). A dir interrupted by Ctrl-C reads back with
    `complete=False`. An sft and a dpo log dir read back the same way.

    Args:
        log_dir: the run's log dir.

    Returns:
        The TrainResult; `kind` is the run record's, else "dpo" when the steps log `dpo_loss`.

    Raises:
        FileNotFoundError: when `log_dir` does not exist.
        MachineFormatError: a row of metrics.jsonl, checkpoints.jsonl or heldout.jsonl with a field
            of the wrong type (FIELD_KINDS), or a held-out score without its step, naming the
            file, line and field.
    """
    path = Path(log_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"No training log dir at {path}")
    marker = read_marker(path)
    checkpoints = read_log_lines(path / CHECKPOINTS_FILE, strict=True)
    all_rows = unique_steps(read_log_lines(path / METRICS_FILE, strict=True))
    loss_key = DPO_LOSS if marker.get("kind") == "dpo" else loss_metric(all_rows)
    kind = "dpo" if loss_key == DPO_LOSS else "sft"
    metrics = [m for m in all_rows if loss_key and isinstance(m.get(loss_key), (int, float))]
    sampler = [c for c in checkpoints if isinstance(c.get("sampler_path"), str)]
    states = [c for c in checkpoints if isinstance(c.get("state_path"), str)]
    tokens = int(sum(m.get("num_tokens", 0) or 0 for m in metrics))
    model = _model_of_log(path)
    engine = _engine_of_log(marker, checkpoints)
    cost = _train_cost(model, engine, tokens, kind)
    evals = [m for m in all_rows if isinstance(m.get(HELDOUT_ACCURACY), (int, float))]
    eval_cost, last_eval = None, None
    if (path / HELDOUT_FILE).exists():
        steps = heldout_steps(path)
        eval_cost = _eval_cost(model, engine, steps)
        cost = None if cost is None or eval_cost is None else cost + eval_cost
        finals = [s for s in steps if s.get("final")]
        last_eval = finals[-1] if finals else None
    scored = [m for m in evals if math.isfinite(m[HELDOUT_ACCURACY])]  # a NaN score is never the best
    best = max(scored, key=lambda m: m[HELDOUT_ACCURACY]) if scored else None  # max keeps the earliest tie
    estimate = marker.get("estimate") if isinstance(marker.get("estimate"), dict) else {}
    usd, estimated_tokens = estimate.get("usd"), estimate.get("tokens")
    resumed = marker.get("resumed_at")
    resumed_at = sorted({k for k in resumed if _is_int(k)}) if isinstance(resumed, list) else []
    total = marker.get("steps") if _is_int(marker.get("steps")) else None
    return TrainResult(
        checkpoint=sampler[-1]["sampler_path"] if sampler else None,
        steps=len(metrics), tokens=tokens,
        first_loss=float(metrics[0][loss_key]) if metrics else None,
        last_loss=float(metrics[-1][loss_key]) if metrics else None,
        log_dir=str(path), cost_usd=cost, model=model, engine=engine,
        complete=any(c.get("name") == "final" for c in checkpoints),
        state_path=states[-1]["state_path"] if states else None, loss_metric=loss_key,
        estimated_usd=float(usd) if _is_number(usd) else None,
        estimated_tokens=estimated_tokens if _is_int(estimated_tokens) else None, eval_cost_usd=eval_cost,
        heldout_accuracy=None if last_eval is None else last_eval.get("accuracy"),
        heldout_format_rate=None if last_eval is None else last_eval.get("format_rate"),
        best_step=None if best is None else int(best["step"]),
        best_accuracy=None if best is None else float(best[HELDOUT_ACCURACY]),
        evals=len(evals),
        unconfirmed_steps=sorted({int(step) for c in checkpoints if c.get("machine_nb_resume")
                                  for step in (c.get("unconfirmed") or []) if isinstance(step, int)}),
        kind=kind, resumed_at=resumed_at, note=resume_note(resumed_at, total))


def heldout_steps(log_dir: str | os.PathLike) -> list[dict]:
    """The eval steps a run logged in heldout.jsonl.

    Args:
        log_dir: the run's log dir.

    Returns:
        One line per eval step (the last written when a resumed run repeated one), by step.

    Raises:
        MachineFormatError: a line with a field of the wrong type (FIELD_KINDS), naming the file,
            line and field.
    """
    rows = [r for r in read_log_lines(Path(log_dir) / HELDOUT_FILE, strict=True) if isinstance(r.get("rows"), list)]
    return unique_steps(rows)


#: Columns of `heldout_curve`, in order.
CURVE_COLUMNS = ["step", "accuracy", "ci_low", "ci_high", "format_rate", "correct", "n", "final",
                 "max_tokens", "temperature", "prompt_tokens", "output_tokens", "errors"]


def heldout_curve(log_dir: str | os.PathLike, *, level: float = 0.95) -> "pd.DataFrame":
    """Held-out accuracy per eval step of a run trained with `eval_data`, as a DataFrame.

    Args:
        log_dir: the run's log dir (reads its heldout.jsonl; a partial last line is skipped).
        level: the confidence level of the interval. Default 0.95.

    Returns:
        One row per eval step, CURVE_COLUMNS: step (the weights after that many optimizer steps;
        0 = the starting weights), accuracy, ci_low / ci_high (Wilson score interval over the
        rows), format_rate (None without format regexes), correct, n, final (the run's final
        checkpoint), max_tokens / temperature (the sampling the scores were taken with),
        prompt_tokens / output_tokens, errors (rows whose request failed); then, for a run given
        `inspect_tasks`, one column per Inspect task, `inspect:<task>`, its accuracy at that step
        (every metric: `inspect_bridge.inspect_curve`; a score on a metrics row without a
        whole-number step is left out). Empty when the run had no held-out evals.
    """
    import pandas as pd

    from ..evaluation.stats import proportion_interval

    out = []
    for s in heldout_steps(log_dir):
        n, k = int(s.get("n") or 0), int(s.get("correct") or 0)
        low, high = (round(x, 12) for x in proportion_interval(k, n, level=level)) if n else (None, None)
        params = s.get("parameters") or {}
        out.append({"step": s.get("step"), "accuracy": s.get("accuracy"), "ci_low": low, "ci_high": high,
                    "format_rate": s.get("format_rate"), "correct": k, "n": n, "final": bool(s.get("final")),
                    "max_tokens": params.get("max_tokens"), "temperature": params.get("temperature"),
                    "prompt_tokens": s.get("prompt_tokens"), "output_tokens": s.get("output_tokens"),
                    "errors": s.get("errors", 0)})
    curve = pd.DataFrame(out, columns=CURVE_COLUMNS)
    inspect = _inspect_accuracy(log_dir)
    if inspect:
        steps = sorted(set(curve["step"]) | set(inspect))
        curve = curve.set_index("step").reindex(steps).rename_axis("step").reset_index()
        for task in sorted({task for scores in inspect.values() for task in scores}):
            curve[f"inspect:{task}"] = [inspect.get(step, {}).get(task) for step in curve["step"]]
    return curve


def inspect_accuracy_task(key: Any) -> str | None:
    """The Inspect task whose accuracy a metrics key holds (`test/inspect/<task>/accuracy`), else None."""
    if isinstance(key, str) and key.startswith(INSPECT_PREFIX) and key.endswith("/accuracy"):
        return key[len(INSPECT_PREFIX):-len("/accuracy")]
    return None


def _inspect_accuracy(log_dir: str | os.PathLike) -> dict[int, dict[str, float]]:
    """{step: {task: accuracy}} of the Inspect tasks a run scored while training (metrics.jsonl's
    `test/inspect/<task>/accuracy`); empty for a run without them."""
    out: dict[int, dict[str, float]] = {}
    for row in read_log_lines(Path(log_dir) / METRICS_FILE):
        if not _is_int(row.get("step")):  # a score with no step (a hand-edited line) has no place on the curve
            continue
        for key, value in row.items():
            task = inspect_accuracy_task(key)
            if task is not None and isinstance(value, (int, float)):
                out.setdefault(row.get("step"), {})[task] = float(value)
    return out


def heldout_results(log_dir: str | os.PathLike, step: int | str | None = None) -> "EvalResult | pd.DataFrame":
    """The per-row held-out results of a run's evals: one step's as an EvalResult, or every step's as a table.

    Args:
        log_dir: the run's log dir.
        step: default None = every eval step, as one DataFrame (a `step` column first); an int =
            that step's rows alone, as evaluate() returns them, so `mnb.compare(heldout_results(d,
            0), heldout_results(d, "final"))` pairs the starting weights with the checkpoint row
            by row; "final" / "best" = the final checkpoint's / the best step's.

    Returns:
        For one step, an EvalResult: `rows` with results.RESULT_COLUMNS, `summary` its name
        ("<log dir name> step N", "(final)" added for the final checkpoint), step, accuracy,
        format_rate, n, parameters (the sampling), data (the eval file and its sha256) and
        log_dir; `path` None (no results JSON is written). For step None, a DataFrame with
        `step` then RESULT_COLUMNS, one row per eval row per step.

    Raises:
        KeyError: when the run logged no eval at that step (the message lists the steps it has).
    """
    import pandas as pd

    from ..evaluation.results import RESULT_COLUMNS, EvalResult

    path = Path(log_dir)
    steps = heldout_steps(path)
    if step is None:
        rows = [{"step": s.get("step"), **r} for s in steps for r in s["rows"]]
        return pd.DataFrame(rows, columns=["step", *RESULT_COLUMNS])
    if step == "final":
        chosen = [s for s in steps if s.get("final")]
    elif step == "best":
        best = read_training_log(path).best_step
        chosen = [s for s in steps if best is not None and s.get("step") == best]
    else:
        chosen = [s for s in steps if s.get("step") == step]
    if not chosen:
        have = ", ".join(str(s.get("step")) for s in steps) or "none"
        raise KeyError(f"{path} logged no held-out eval at step {step!r} (steps: {have})")
    s = chosen[-1]
    label = f"{path.name} step {s.get('step')}" + (" (final)" if s.get("final") else "")
    summary = {"name": label, "step": s.get("step"), "accuracy": s.get("accuracy"), "format_rate": s.get("format_rate"),
               "n": s.get("n"), "parameters": s.get("parameters"), "data": s.get("data"), "log_dir": str(path)}
    return EvalResult(pd.DataFrame(s["rows"], columns=RESULT_COLUMNS), summary)


#: Columns `training_metrics` always has, first, in this order (then any others the log has).
METRIC_COLUMNS = ["run", "step", "epoch", "progress", "learning_rate", "num_sequences", "num_tokens",
                  "num_loss_tokens", "train_mean_nll", "train_mean_bpb"]


def training_metrics(log_dirs: str | os.PathLike | Iterable[str | os.PathLike]) -> "pd.DataFrame":
    """One row per `metrics.jsonl` step of one or more log dirs, as a DataFrame.

    Args:
        log_dirs: a log dir or several.

    Returns:
        Columns METRIC_COLUMNS: `run` (the log dir's name, or its path when two of the dirs share
        a name), then step, epoch, progress, learning_rate, num_sequences, num_tokens,
        num_loss_tokens, train_mean_nll, train_mean_bpb (NaN where a line lacks them), then
        whatever else the cookbook logged (time/…, test/…, and for DPO dpo_loss, accuracy,
        margin, chosen_reward, rejected_reward). A partial last line (a run still writing) is
        skipped, so a live plot can poll this; a step logged twice (a resumed run) appears once,
        as last written.
    """
    import pandas as pd

    dirs = [Path(d).absolute() for d in ([log_dirs] if isinstance(log_dirs, (str, os.PathLike)) else log_dirs)]
    names = [d.name for d in dirs]
    rows = []
    for d in dirs:
        run = d.name if names.count(d.name) == 1 else str(d)  # two runs of one name stay apart
        for m in unique_steps(read_log_lines(d / METRICS_FILE)):
            rows.append({"run": run, **m})
    df = pd.DataFrame(rows)
    for col in METRIC_COLUMNS:
        if col not in df.columns:
            df[col] = pd.Series(dtype="object" if col == "run" else "float64")
    rest = [c for c in df.columns if c not in METRIC_COLUMNS]
    return df[METRIC_COLUMNS + rest].reset_index(drop=True)


class MetricsTail:
    """The rows appended to a metrics.jsonl since the last call (whole lines only), for a progress bar.

    Args:
        path: the metrics.jsonl to follow (it may not exist yet).
    """

    def __init__(self, path: Path):
        self.path, self.offset = Path(path), 0

    def new_rows(self) -> list[dict]:
        """The JSON objects of the lines completed since the last call.

        Returns:
            The new rows, in order; a partial last line waits for the next call, and an
            unreadable line is left out.
        """
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a partial last line waits for the next call
        self.offset += end
        rows = []
        for line in chunk[:end].splitlines():
            try:
                value = parse_json(line, self.path)
            except ValueError:  # MachineFormatError is one
                continue
            if isinstance(value, dict):
                rows.append(value)
        return rows


# ---------------------------------------------------------------------------------------------
# making, claiming and tightening log dirs


def new_log_dir(prefix: str = "sft", *, workspace: str | os.PathLike | None = None,
                name: str | None = None) -> Path:
    """A fresh log dir path (not created).

    Args:
        prefix: the run's kind, first in the name (default "sft").
        workspace: default None = under `runs/` in the cwd; a workspace = under
            `<workspace>/.machine/training/` (where Machine's dashboard looks for training runs).
        name: the dir's name (default None: `<prefix>-<UTC time>-<4 hex>`): a folder name, not a
            path (`log_dir` takes a path).

    Returns:
        The absolute path.

    Raises:
        ValueError: a `name` holding a path separator (/ or \\), or "." or "..": it would put
            the run outside the folder it belongs in.
    """
    stamp = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    parent = (Path(workspace).absolute() / ".machine" / "training" if workspace is not None
              else Path("runs").absolute())
    if name and (name in (".", "..") or any(sep in name for sep in ("/", "\\", os.sep))):
        raise ValueError(f"name={name!r} is a path, not a folder name: the log dir goes in {parent}. Pass a name "
                         "without / or \\ (and not . or ..), or log_dir= to put the run somewhere else.")
    return parent / (name or stamp)


def claim_log_dir(log_dir: Path, *, resume: bool) -> None:
    """Make sure a run may write here, before a byte is written.

    A log dir must be new or empty, or (with `resume`) hold this toolkit's own run. A folder with
    anything else in it is refused: the cookbook would overwrite its files, and tightening
    permissions would touch files that are not ours. A new one is created 0700.

    Args:
        log_dir: the dir.
        resume: whether a run continues there.

    Raises:
        FileNotFoundError: resume, and no checkpoints.jsonl there.
        FileExistsError: resume, and not a dir this toolkit made; or a new run, and the dir is a
            file, a link to nothing, or holds anything (a run of this toolkit's that stopped before
            its first checkpoint included: there is nothing to resume in it).
    """
    ours = (log_dir / MARKER).is_file()
    if resume:
        if not (log_dir / CHECKPOINTS_FILE).exists():
            raise FileNotFoundError(f"resume={str(log_dir)!r}: no {CHECKPOINTS_FILE} there, so nothing to resume")
        if not ours:
            raise FileExistsError(f"resume={str(log_dir)!r}: not a log dir machine_nb made (no {MARKER}); "
                                  "resume only runs started by sft() or dpo()")
        return
    if log_dir.exists() and not log_dir.is_dir():
        raise FileExistsError(f"log_dir={str(log_dir)!r} is a file, not a directory")
    if log_dir.is_symlink() and not log_dir.exists():
        raise FileExistsError(f"log_dir={str(log_dir)!r} is a link to {os.readlink(log_dir)!r}, which does not "
                              "exist: create that folder (the run then writes there), or pick another log_dir.")
    if log_dir.is_dir() and any(log_dir.iterdir()):
        if ours and not (log_dir / CHECKPOINTS_FILE).exists():
            raise FileExistsError(
                f"{log_dir} holds a run with no checkpoint (it stopped before its first one, or is still starting), "
                "so there is nothing to resume there: pick another log_dir (or leave it None for a fresh one), or "
                "delete that folder to start over in it.")
        if ours or (log_dir / CHECKPOINTS_FILE).exists():
            raise FileExistsError(
                f"{log_dir} already holds a run; the cookbook would silently resume it. Pass "
                f"resume={str(log_dir)!r} to continue that run, or leave log_dir=None for a fresh one.")
        raise FileExistsError(
            f"log_dir={str(log_dir)!r} is not empty and is not a machine_nb run: a run needs a new or empty "
            "folder (nothing there was changed). Pick another log_dir, or leave it None for a fresh one.")
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(log_dir, 0o700)


class LogDirInUse(FileExistsError):
    """A run is training in the log dir now (in another kernel, thread or process)."""


@contextlib.contextmanager
def hold_log_dir(log_dir: Path) -> Iterator[None]:
    """Hold a log dir for one run, from its claim to its end: two runs in one dir would interleave
    their metrics and checkpoints.

    The hold is an flock on the folder itself, so the folder gains no lock file. No other run, in
    this process or another, can take it while it is held, and it is let go when the run ends or
    its process dies. Where the folder cannot be locked (a file system without flock), the run
    goes on unheld.

    Args:
        log_dir: an existing dir.

    Returns:
        A context manager holding the dir while it is entered.

    Raises:
        LogDirInUse: a run holds `log_dir` now.
    """
    from ..core.jsonl import held_folder

    with contextlib.ExitStack() as hold:
        try:
            hold.enter_context(held_folder(log_dir, wait=False))
        except BlockingIOError:
            raise LogDirInUse(f"{log_dir} is in use: a run is training there now (in another kernel, thread or "
                              f"process). Wait for it to end, then pass resume={str(log_dir)!r} to continue it, "
                              "or pick another log_dir for a new run.") from None
        yield


def log_entries(log_dir: Path) -> set[str]:
    """What is under a log dir now, so `private_files` can leave alone what the run did not write.

    Args:
        log_dir: the dir.

    Returns:
        Relative paths of every file and folder (symlinked folders listed, not entered).
    """
    found: set[str] = set()
    for root, dirs, files in os.walk(log_dir):
        rel = os.path.relpath(root, log_dir)
        found.update(os.path.normpath(os.path.join(rel, name)) for name in dirs + files)
    return found


def _tighten(path: str, mode: int, *, folder: bool) -> None:
    """chmod a plain file or folder through a descriptor opened without following a symlink (a
    symlink, or anything else, is left as it is, and so is its target)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_DIRECTORY if folder else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # a symlink (ELOOP), gone, or not ours to open
        return
    try:
        kind = os.fstat(fd).st_mode
        if stat.S_ISDIR(kind) if folder else stat.S_ISREG(kind):
            os.fchmod(fd, mode)
    except OSError:
        pass
    finally:
        os.close(fd)


def private_files(log_dir: Path, before: set[str] | None = None) -> None:
    """Machine's habit: the log dir 0700, the run's files 0600 (the cookbook creates them 0644).

    Only what the run wrote is touched: the RUN_FILES at the top, and with `before` every file
    and folder that was not there as the run started. A file or folder a user added (before a
    resume, say) keeps its mode, and no symlink is followed, so nothing outside the log dir changes.

    Args:
        log_dir: the run's dir.
        before: `log_entries(log_dir)` taken as the run started (default None: RUN_FILES only).
    """
    _tighten(str(log_dir), 0o700, folder=True)
    for root, dirs, files in os.walk(log_dir):
        rel_root = os.path.relpath(root, log_dir)

        def own(name: str) -> bool:
            rel = os.path.normpath(os.path.join(rel_root, name))
            return (before is not None and rel not in before) or (rel_root == "." and name in RUN_FILES)

        dirs[:] = [d for d in dirs if own(d)]  # a user's folder is not entered
        for d in dirs:
            _tighten(os.path.join(root, d), 0o700, folder=True)
        for f in files:
            if own(f):
                _tighten(os.path.join(root, f), 0o600, folder=False)


__all__ = ["TrainResult", "read_training_log", "training_metrics", "heldout_curve", "heldout_results",
           "heldout_steps", "loss_metric", "resume_note", "read_marker", "load_marker", "read_log_lines",
           "unique_steps", "MetricsTail", "new_log_dir", "claim_log_dir", "hold_log_dir",
           "LogDirInUse", "log_entries", "private_files",
           "SFT_LOSS", "DPO_LOSS", "LOSS_METRICS", "HELDOUT_PREFIX", "INSPECT_PREFIX", "inspect_accuracy_task",
           "HELDOUT_ACCURACY",
           "HELDOUT_FORMAT_RATE", "METRICS_FILE", "CHECKPOINTS_FILE", "TRAIN_LOG", "HELDOUT_FILE", "HELDOUT_DATA",
           "MARKER", "RUN_FILES", "CURVE_COLUMNS", "METRIC_COLUMNS"]
