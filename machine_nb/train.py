"""Supervised fine-tuning: tinker-cookbook's own `supervised.train.main`, on the local engine or Tinker.

`sft` prepares one fresh log dir, checks the engine can serve the model (and, on Tinker, the key,
the service and the price: pricing.py decides what a run may cost), then runs the cookbook's loop
unchanged in a child process (runner.py) against the engine's URL, with a progress bar fed from
`metrics.jsonl`. Both engines are the real tinker SDK; only the base URL, key and model differ.
With `eval_data`, the loop also calls the held-out evaluator (heldout.py) every `eval_every`
steps. Reading a finished (or interrupted) log dir back is `read_training_log` /
`training_metrics`, and its held-out scores `heldout_curve` / `heldout_results`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from . import render
from .errors import EngineError, MachineFormatError
from .jsonl import iter_jsonl, parse_json, write_jsonl

#: Defaults for local models, calibrated on the minimal-SFT corpus (48 rows, batch 8, 10 epochs
#: = 60 steps; the measured figures are in benchmarks/bench_sft.py's output and the model card):
#: LoRA rank 8 (alpha 16, attention + MLP) at 3e-3; full fine-tuning (rank 0) at 5e-4.
LOCAL_LORA_RANK = 8
LOCAL_LEARNING_RATE = 3e-3
LOCAL_FULL_LEARNING_RATE = 5e-4
#: Tinker defaults: the cookbook's LoRA rank, and its learning rate when it knows none for the model.
TINKER_LORA_RANK = 32
TINKER_LEARNING_RATE = 1e-4

#: The loss a step logs: supervised runs `train_mean_nll`, the cookbook's DPO `dpo_loss`.
SFT_LOSS = "train_mean_nll"
DPO_LOSS = "dpo_loss"
LOSS_METRICS = (SFT_LOSS, DPO_LOSS)
#: Held-out scores in metrics.jsonl (the cookbook's `test/` prefix for evaluator metrics).
HELDOUT_PREFIX = "test/"
HELDOUT_ACCURACY = "test/accuracy"
HELDOUT_FORMAT_RATE = "test/format_rate"
#: In a log dir: one line per eval step with its per-row results, and the eval rows it scored.
HELDOUT_FILE = "heldout.jsonl"
HELDOUT_DATA = "heldout_data.jsonl"


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class TrainResult:
    """What a training run produced, read from its log dir (see `read_training_log`).

    checkpoint: the last sampler checkpoint (`tinker://…`), None if the run saved none. steps:
    optimizer steps logged. tokens: tokens processed over all steps (what Tinker bills).
    first_loss / last_loss: the loss of the first and last step (`loss_metric`: `train_mean_nll`
    for SFT, `dpo_loss` for DPO). log_dir: the run's directory. cost_usd: the observed cost:
    tokens actually trained x the model's train price, plus the held-out evals' prompt and output
    tokens x its prefill and sample prices (0 on the local engine; None when a price is unknown).
    estimated_usd: what the same was estimated to cost before the run (None when not recorded);
    estimated_tokens: the training tokens that estimate priced (the renderer's count of each row,
    one token a row more than the loop trains: a datum's input drops its last token). eval_cost_usd: the
    held-out evals' part of cost_usd. model / engine: what was trained, where.
    complete: whether the run saved its "final" checkpoint (False after a Ctrl-C or a crash).
    state_path: the last resumable training state.

    With held-out evals (`sft(eval_data=…)`): heldout_accuracy / heldout_format_rate: the final
    checkpoint's scores; best_step / best_accuracy: the eval step with the highest accuracy (the
    earliest such; step s = the weights after s optimizer steps, 0 = the base model); evals: how
    many eval steps were logged. Choose on a validation set, report on another (see README).

    unconfirmed_steps: steps a resume trained again because no metrics row showed them finished
    before the interrupt ([] when the rows showed every step the resumed state held, the usual
    case). The engine may have failed them (training them again was exact) or the interrupt came
    in the moments between a checkpoint and their rows (the state already held them: they were
    trained twice, and the weights differ from an uninterrupted run's); the log cannot tell which.
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _repr_html_(self) -> str:
        import html

        def f(v: float | None) -> str:
            return "–" if v is None else f"{v:.4f}"

        def usd(v: float | None) -> str:
            return "unknown" if v is None else f"${v:.4f}"

        cost = f"{usd(self.cost_usd)} observed" + ("" if self.estimated_usd is None
                                                    else f" (estimated {usd(self.estimated_usd)})")
        state = "complete" if self.complete else "<b>incomplete</b> (no final checkpoint)"
        log_dir = _shown_path(self.log_dir)
        held = ""
        if self.evals:
            fmt = "" if self.heldout_format_rate is None else f", format {self.heldout_format_rate:.1%}"
            best = "" if self.best_step is None else f" · best {self.best_accuracy:.1%} at step {self.best_step}"
            final = "–" if self.heldout_accuracy is None else f"{self.heldout_accuracy:.1%}"
            held = f"<br>held-out accuracy {final}{fmt} (final){best} · {self.evals} evals"
        if self.unconfirmed_steps:
            state += (f" · resumed: steps {', '.join(map(str, self.unconfirmed_steps))} trained again (their "
                      "rows were missing; if the saved state held them, they were trained twice)")
        return (f"<div class='machine-nb-train'><b>{html.escape(str(self.model))}</b> on {html.escape(str(self.engine))}: "
                f"{self.steps} steps · {self.tokens:,} tokens · loss {f(self.first_loss)} → {f(self.last_loss)} · "
                f"{cost} · {state}{held}<br><code>{html.escape(str(self.checkpoint))}</code><br>"
                f"<small>{html.escape(log_dir)}</small></div>")


def _shown_path(path: str) -> str:
    """A path as a report shows it: relative to the current directory (the notebook's) when inside it,
    so a shared report does not print where the author's files live."""
    try:
        return os.path.relpath(path) if Path(path).absolute().is_relative_to(Path.cwd()) else path
    except ValueError:  # another drive
        return path


def _read_log_lines(path: Path) -> list[dict]:
    """JSON objects of a log JSONL file; a partial last line (a run still writing) is skipped quietly,
    any other unreadable line with a warning naming it."""
    if not path.exists():
        return []
    skipped: list[MachineFormatError] = []
    rows = [value for _, value in iter_jsonl(path, on_error="skip", skipped=skipped) if isinstance(value, dict)]
    loud = [e for e in skipped if "truncated last line" not in str(e)]
    if loud:
        warnings.warn(f"skipped {len(loud)} unreadable line(s) of {path}: " + "; ".join(str(e) for e in loud[:5]),
                      stacklevel=3)
    return rows


def _engine_of_log(log_dir: Path, checkpoints: list[dict]) -> str | None:
    """The engine a run was started on (its machine_nb.json), else the one its checkpoints name."""
    from .engines import engine_for

    engine = _read_marker(log_dir).get("engine")
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


def _price(model: str | None) -> Any:
    if model is None:
        return None
    try:
        from .pricing import price_for

        return price_for(model)
    except Exception:  # unknown price: the cost cannot be stated
        return None


def _cost(model: str | None, engine: str | None, tokens: int) -> float | None:
    """Observed training cost: tokens trained x the train price (0 locally, None when unknown)."""
    if engine == "local":
        return 0.0
    price = _price(model)
    return None if price is None or price.train is None else tokens * price.train / 1e6


def _eval_cost(model: str | None, engine: str | None, prompt_tokens: int, output_tokens: int) -> float | None:
    """Observed sampling cost: prompt tokens x prefill price + output tokens x sample price."""
    if engine == "local":
        return 0.0
    price = _price(model)
    if price is None or price.prefill is None or price.sample is None:
        return None
    return (prompt_tokens * price.prefill + output_tokens * price.sample) / 1e6


def _unique_steps(rows: list[dict]) -> list[dict]:
    """One row per step, the last written (a resumed run logs again the steps it continues from)."""
    by_step: dict[Any, dict] = {}
    for i, m in enumerate(rows):
        by_step[m.get("step", f"row{i}")] = m
    return sorted(by_step.values(), key=lambda m: (m.get("step") is None, m.get("step") or 0))


def loss_metric(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The loss a run logs: `train_mean_nll` (SFT) if any row has it, else `dpo_loss` (DPO), else None."""
    rows = list(rows)
    for key in LOSS_METRICS:
        if any(isinstance(m.get(key), (int, float)) for m in rows):
            return key
    return None


def _read_marker(path: Path) -> dict:
    try:
        data = parse_json((path / MARKER).read_bytes(), path / MARKER)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_training_log(log_dir: str | os.PathLike) -> TrainResult:
    """The checkpoint, steps, tokens, losses, held-out scores and costs of a tinker-cookbook log dir
    (finished or not).

    Reads `checkpoints.jsonl` (the last row with a `sampler_path` is the checkpoint; a "final" row
    means complete), `metrics.jsonl` (rows with `train_mean_nll`, or `dpo_loss` for a DPO run,
    are steps; its held-out rows give the best step) and, when present, `heldout.jsonl` (the
    held-out evals' tokens, for their cost) and the run's machine_nb.json (the estimate made
    before it). A dir interrupted by Ctrl-C reads back with `complete=False`.

    Args:
        log_dir: the run's log dir.

    Returns:
        The TrainResult.

    Raises:
        FileNotFoundError: when `log_dir` does not exist.
    """
    path = Path(log_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"No training log dir at {path}")
    checkpoints = _read_log_lines(path / "checkpoints.jsonl")
    all_rows = _unique_steps(_read_log_lines(path / "metrics.jsonl"))
    loss_key = loss_metric(all_rows)
    metrics = [m for m in all_rows if loss_key and isinstance(m.get(loss_key), (int, float))]
    sampler = [c for c in checkpoints if isinstance(c.get("sampler_path"), str)]
    states = [c for c in checkpoints if isinstance(c.get("state_path"), str)]
    tokens = int(sum(m.get("num_tokens", 0) or 0 for m in metrics))
    model = _model_of_log(path)
    engine = _engine_of_log(path, checkpoints)
    marker = _read_marker(path)
    kind = marker.get("kind") if marker.get("kind") in ("sft", "dpo") else ("dpo" if loss_key == DPO_LOSS else "sft")
    if kind == "dpo":  # each step passes every sequence three times (pricing.DPOCostEstimate)
        from .pricing import dpo_cost

        cost = dpo_cost(model, engine, tokens)
    else:
        cost = _cost(model, engine, tokens)
    evals = [m for m in all_rows if isinstance(m.get(HELDOUT_ACCURACY), (int, float))]
    eval_cost, last_eval = None, None
    if (path / HELDOUT_FILE).exists():
        steps = _heldout_steps(path)
        eval_cost = _eval_cost(model, engine, sum(int(s.get("prompt_tokens") or 0) for s in steps),
                               sum(int(s.get("output_tokens") or 0) for s in steps))
        cost = None if cost is None or eval_cost is None else cost + eval_cost
        finals = [s for s in steps if s.get("final")]
        last_eval = finals[-1] if finals else None
    best = max(evals, key=lambda m: m[HELDOUT_ACCURACY]) if evals else None  # max keeps the earliest tie
    estimate = marker.get("estimate") if isinstance(marker.get("estimate"), dict) else {}
    return TrainResult(
        checkpoint=sampler[-1]["sampler_path"] if sampler else None,
        steps=len(metrics), tokens=tokens,
        first_loss=float(metrics[0][loss_key]) if metrics else None,
        last_loss=float(metrics[-1][loss_key]) if metrics else None,
        log_dir=str(path), cost_usd=cost, model=model, engine=engine,
        complete=any(c.get("name") == "final" for c in checkpoints),
        state_path=states[-1]["state_path"] if states else None, loss_metric=loss_key,
        estimated_usd=estimate.get("usd"), estimated_tokens=estimate.get("tokens"), eval_cost_usd=eval_cost,
        heldout_accuracy=None if last_eval is None else last_eval.get("accuracy"),
        heldout_format_rate=None if last_eval is None else last_eval.get("format_rate"),
        best_step=None if best is None else int(best["step"]),
        best_accuracy=None if best is None else float(best[HELDOUT_ACCURACY]),
        evals=len(evals),
        unconfirmed_steps=sorted({int(step) for c in checkpoints if c.get("machine_nb_resume")
                                  for step in (c.get("unconfirmed") or []) if isinstance(step, int)}),
        kind=kind)


def _heldout_steps(log_dir: Path) -> list[dict]:
    """The lines of heldout.jsonl, one per eval step (the last written when a resumed run repeated one)."""
    rows = [r for r in _read_log_lines(log_dir / HELDOUT_FILE) if isinstance(r.get("rows"), list)]
    return _unique_steps(rows)


#: Columns of `heldout_curve`, in order.
CURVE_COLUMNS = ["step", "accuracy", "ci_low", "ci_high", "format_rate", "correct", "n", "final",
                 "max_tokens", "temperature", "prompt_tokens", "output_tokens", "errors"]


def heldout_curve(log_dir: str | os.PathLike, *, level: float = 0.95):
    """Held-out accuracy per eval step of a run trained with `sft(eval_data=…)`, as a DataFrame.

    Args:
        log_dir: the run's log dir (reads its heldout.jsonl; a partial last line is skipped).
        level: the confidence level of the interval. Default 0.95.

    Returns:
        One row per eval step, CURVE_COLUMNS: step (the weights after that many optimizer steps;
        0 = the base model), accuracy, ci_low / ci_high (Wilson score interval over the rows),
        format_rate (None without format regexes), correct, n, final (the run's final
        checkpoint), max_tokens / temperature (the sampling the scores were taken with),
        prompt_tokens / output_tokens, errors (rows whose request failed). Empty when the run had
        no held-out evals.
    """
    import pandas as pd

    from .stats import proportion_interval

    out = []
    for s in _heldout_steps(Path(log_dir)):
        n, k = int(s.get("n") or 0), int(s.get("correct") or 0)
        low, high = (round(x, 12) for x in proportion_interval(k, n, level=level)) if n else (None, None)
        params = s.get("parameters") or {}
        out.append({"step": s.get("step"), "accuracy": s.get("accuracy"), "ci_low": low, "ci_high": high,
                    "format_rate": s.get("format_rate"), "correct": k, "n": n, "final": bool(s.get("final")),
                    "max_tokens": params.get("max_tokens"), "temperature": params.get("temperature"),
                    "prompt_tokens": s.get("prompt_tokens"), "output_tokens": s.get("output_tokens"),
                    "errors": s.get("errors", 0)})
    return pd.DataFrame(out, columns=CURVE_COLUMNS)


def heldout_results(log_dir: str | os.PathLike, step: int | str | None = None):
    """The per-row held-out results of a run's evals, as a DataFrame.

    Args:
        log_dir: the run's log dir.
        step: default None = every eval step (a `step` column first); an int = that step's rows
            alone, in evaluate()'s result shape, so `mnb.compare(heldout_results(d, 0),
            heldout_results(d, "final"))` pairs the base model with the checkpoint row by row;
            "final" / "best" = the final checkpoint's / the best step's.

    Returns:
        evaluate()'s RESULT_COLUMNS (with `step` first when step is None); for one step,
        `attrs["summary"]` holds its name, accuracy, format rate and sampling parameters.

    Raises:
        KeyError: when the run logged no eval at that step (the message lists the steps it has).
    """
    import pandas as pd

    from .evaluate import RESULT_COLUMNS

    path = Path(log_dir)
    steps = _heldout_steps(path)
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
    df = pd.DataFrame(s["rows"], columns=RESULT_COLUMNS)
    label = f"{path.name} step {s.get('step')}" + (" (final)" if s.get("final") else "")
    df.attrs["summary"] = {"name": label, "step": s.get("step"), "accuracy": s.get("accuracy"),
                           "format_rate": s.get("format_rate"), "n": s.get("n"),
                           "parameters": s.get("parameters"), "data": s.get("data")}
    return df


#: Columns `training_metrics` always has, first, in this order (then any others the log has).
METRIC_COLUMNS = ["run", "step", "epoch", "progress", "learning_rate", "num_sequences", "num_tokens",
                  "num_loss_tokens", "train_mean_nll", "train_mean_bpb"]


def training_metrics(log_dirs: str | os.PathLike | Iterable[str | os.PathLike]):
    """One row per `metrics.jsonl` line of one or more log dirs, as a DataFrame.

    Columns: `run` (the log dir's name), then step, epoch, progress, learning_rate, num_sequences,
    num_tokens, num_loss_tokens, train_mean_nll, train_mean_bpb (NaN where a line lacks them),
    then whatever else the cookbook logged (time/…, test/…). A partial last line (a run still
    writing) is skipped, so a live plot can poll this.
    """
    import pandas as pd

    dirs = [log_dirs] if isinstance(log_dirs, (str, os.PathLike)) else list(log_dirs)
    rows = []
    for d in dirs:
        for m in _unique_steps(_read_log_lines(Path(d) / "metrics.jsonl")):
            rows.append({"run": Path(d).name, **m})
    df = pd.DataFrame(rows)
    for col in METRIC_COLUMNS:
        if col not in df.columns:
            df[col] = pd.Series(dtype="object" if col == "run" else "float64")
    rest = [c for c in df.columns if c not in METRIC_COLUMNS]
    return df[METRIC_COLUMNS + rest].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# data


def _source_rows(data: Any) -> tuple[str, Iterator[tuple[int, Any]]]:
    """(name for messages, (line number, row) pairs) of a JSONL path or an in-memory list/DataFrame."""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.exists():
            raise FileNotFoundError(f"No training data at {path}")
        return str(path), iter_jsonl(path)
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a DataFrame of export lines
        data = data.to_dict("records")
    return "<data>", enumerate(list(data), start=1)


def prepare_data(data: Any) -> tuple[list[dict], str]:
    """Check chat rows and choose what to train on: (rows for the cookbook, train_on_what value).

    Each row must pass chat.check_row's training-row rules (the shape rules validate applies: known
    roles, content, tool calls, and the assistant's reply last).
    Rows are step examples (train the last assistant message) unless some are whole runs
    (`"whole_run": true`) or carry per-message `trainable` flags: then every row states its flags
    ("customized", chat.trainable_flags): whole-run rows keep theirs (assistant messages without
    one are not trained), other rows train their last assistant message. Stating every flag
    matters because the cookbook loads rows with `datasets`, which gives every message every key
    seen in the file. Raises MachineFormatError naming the file, line and field of the first bad row.
    """
    from .chat import check_row, is_flagged, train_messages

    name, source = _source_rows(data)
    checked = [(line, check_row(row, "train", path=name, line=line)) for line, row in source]
    if not checked:
        raise MachineFormatError(name, "no training rows")
    flagged = any(is_flagged(row) for _, row in checked)
    # only `messages`: the cookbook's loader reads nothing else, and `datasets` would have to
    # unify the schemas of every other key (tools' JSON schemas differ from run to run)
    rows = [{"messages": train_messages(row, customized=flagged, path=name, line=line)} for line, row in checked]
    return rows, ("customized" if flagged else "last_assistant_message")


# ---------------------------------------------------------------------------------------------
# log dirs

#: Marker file of a log dir this toolkit made (what `sft` accepts to resume or refuses to reuse).
MARKER = "machine_nb.json"


def new_log_dir(prefix: str = "sft", *, workspace: str | os.PathLike | None = None,
                name: str | None = None) -> Path:
    """A fresh log dir path: `runs/<prefix>-<UTC time>-<4 hex>` under the cwd (not created).

    With `workspace`, `<workspace>/.machine/training/<name or the same stamp>` (where Machine's
    dashboard looks for training runs).
    """
    stamp = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    if workspace is not None:
        return Path(workspace).absolute() / ".machine" / "training" / (name or stamp)
    return Path("runs").absolute() / (name or stamp)


def _claim_log_dir(log_dir: Path, resume: bool) -> None:
    """Make sure a run may write here, before a byte is written.

    A log dir must be new or empty, or (with `resume`) hold this toolkit's own run. A folder with
    anything else in it is refused: the cookbook would overwrite its files, and tightening
    permissions would touch files that are not ours.
    """
    ours = (log_dir / MARKER).is_file()
    if resume:
        if not (log_dir / "checkpoints.jsonl").exists():
            raise FileNotFoundError(f"resume={str(log_dir)!r}: no checkpoints.jsonl there, so nothing to resume")
        if not ours:
            raise FileExistsError(f"resume={str(log_dir)!r}: not a log dir machine_nb made (no {MARKER}); "
                                  "resume only runs started by sft() or dpo()")
        return
    if log_dir.exists() and not log_dir.is_dir():
        raise FileExistsError(f"log_dir={str(log_dir)!r} is a file, not a directory")
    if log_dir.is_dir() and any(log_dir.iterdir()):
        if ours or (log_dir / "checkpoints.jsonl").exists():
            raise FileExistsError(
                f"{log_dir} already holds a run; the cookbook would silently resume it. Pass "
                f"resume={str(log_dir)!r} to continue that run, or leave log_dir=None for a fresh one.")
        raise FileExistsError(
            f"log_dir={str(log_dir)!r} is not empty and is not a machine_nb run: a run needs a new or empty "
            "folder (nothing there was changed). Pick another log_dir, or leave it None for a fresh one.")
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(log_dir, 0o700)


#: Top-level files a run writes in its log dir (the cookbook's and this toolkit's): tightened
#: after every run, also when they were there before it (a resumed run appends to them).
RUN_FILES = frozenset({
    "metrics.jsonl", "checkpoints.jsonl", "config.json", "code.diff", "logs.log", "timing_spans.jsonl",
    "trace_events.jsonl", "train.log", "train.jsonl", "heldout.jsonl", "heldout_data.jsonl", "pairs.jsonl",
    MARKER})


def _log_entries(log_dir: Path) -> set[str]:
    """The relative paths under a log dir now (symlinked folders listed, not entered): what
    `_private_files` must leave alone unless the run wrote it."""
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


def _private_files(log_dir: Path, before: set[str] | None = None) -> None:
    """Machine's habit: the log dir 0700, the run's files 0600 (the cookbook creates them 0644).

    Only what the run wrote is touched: the RUN_FILES at the top, and with `before` (the
    `_log_entries` taken as the run started) every file and folder that was not there then.
    A file or folder a user added (before a resume, say) keeps its mode, and no symlink is
    followed, so nothing outside the log dir changes.
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


# ---------------------------------------------------------------------------------------------
# running the cookbook (in a child process: runner.py says why)


class _MetricsTail:
    """The rows appended to a metrics.jsonl since the last call (whole lines only), for the progress bar."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new_rows(self) -> list[dict]:
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
            with contextlib.suppress(ValueError):  # MachineFormatError is one
                value = parse_json(line, self.path)
                if isinstance(value, dict):
                    rows.append(value)
        return rows


def _child_env(engine: str) -> dict[str, str]:
    """The run's environment: the caller's, unchanged, except that on the local engine the
    training loop sends a placeholder key (the user's own TINKER_API_KEY never goes to the local server)."""
    from .engines import LOCAL_API_KEY

    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if engine == "local":
        env["TINKER_API_KEY"] = LOCAL_API_KEY
    return env


class _Runner:
    """A child process (runner.py) that runs training loops one after another.

    Kept for the next run, since importing tinker-cookbook and the SDK takes seconds; replaced
    after an error or an interrupt, and ended with this process (it exits when its stdin closes).
    """

    _idle: "list[_Runner]" = []
    _keep = 1  # idle processes kept for the next run (keep_runners raises it while runs go in parallel)
    _lock = threading.Lock()

    def __init__(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-m", "machine_nb.runner"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_child_env("local"))
        self.events: "list[dict]" = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, name="machine-nb-runner-status", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        with self._cond:
            self.events.append({"event": "exit"})
            self._cond.notify_all()

    @classmethod
    def take(cls) -> "_Runner":
        while True:
            with cls._lock:
                runner = cls._idle.pop() if cls._idle else None
            if runner is None:
                return cls()
            if runner.proc.poll() is None:
                return runner

    def give_back(self) -> None:
        with type(self)._lock:
            if len(type(self)._idle) < type(self)._keep and self.proc.poll() is None:
                type(self)._idle.append(self)
                return
        self.close()

    @classmethod
    def trim(cls) -> None:
        """Close idle processes beyond the number kept."""
        with cls._lock:
            extra, cls._idle = cls._idle[cls._keep:], cls._idle[:cls._keep]
        for runner in extra:
            runner.close()

    def send(self, spec: dict) -> int:
        """Start a run; returns the index of the first event that belongs to it."""
        with self._cond:
            start = len(self.events)
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(spec) + "\n").encode("utf-8"))
        self.proc.stdin.flush()
        return start

    def outcome(self, start: int) -> dict | None:
        with self._cond:
            for event in self.events[start:]:
                if event.get("event") in ("done", "error", "interrupted", "exit"):
                    return event
        return None

    def stop(self) -> None:
        """Ctrl-C for the run in progress (SIGINT, then harder), then the process ends."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(Exception):
            self.proc.wait(5)


@contextlib.contextmanager
def keep_runners(n: int) -> Iterator[None]:
    """While the block runs, keep up to `n` training processes for the next runs (one each for
    runs going in parallel: a fresh one takes seconds to import the cookbook); one afterwards."""
    with _Runner._lock:
        before, _Runner._keep = _Runner._keep, max(_Runner._keep, int(n))
    try:
        yield
    finally:
        with _Runner._lock:
            _Runner._keep = before
        _Runner.trim()


def run_cookbook(spec: dict, log_dir: Path, *, engine: str, on_poll: Any = None, poll_s: float = 0.2,
                 watchdog: Any = None) -> None:
    """Run `runner.run(spec)` in the runner process, calling `on_poll()` in this thread meanwhile.

    Its console output goes to `<log dir>/train.log`. A KeyboardInterrupt here (or an error from
    `on_poll`, or a watchdog that saw the service die) stops the run (SIGINT, then harder) before
    re-raising; files it wrote stay whole. An error in the run is raised here as EngineError (or
    MachineFormatError when the server named a corrupt file).
    """
    spec = {**spec, "env": _child_env(engine), "cwd": os.getcwd(), "log": str(log_dir / "train.log")}
    runner = _Runner.take()
    start = runner.send(spec)
    try:
        while True:
            outcome = runner.outcome(start)
            if outcome is not None:
                break
            with runner._cond:
                runner._cond.wait(poll_s)
            if on_poll is not None:
                on_poll()
            if watchdog is not None:
                watchdog.check()
    except BaseException:
        runner.stop()
        raise
    if on_poll is not None:
        on_poll()
    if outcome["event"] == "done":
        runner.give_back()
        return
    runner.close()
    if outcome["event"] == "interrupted":
        raise KeyboardInterrupt("training was interrupted")
    if outcome["event"] == "exit":
        raise EngineError(f"the training process ended unexpectedly (exit code {runner.proc.returncode}); "
                          f"see {log_dir / 'train.log'}")
    from .engines import explain

    if isinstance(outcome.get("body"), dict):
        class _Sdk(Exception):
            body = outcome["body"]
        raise explain(_Sdk(outcome["message"])) from None
    from .redact import redacted

    raise EngineError(redacted(f"training failed: {outcome['type']}: {outcome['message']} "
                               f"(log: {log_dir / 'train.log'})"))


def _sft_config(spec: dict) -> Any:
    """The cookbook's supervised Config for a spec `sft` wrote (runs in the child process)."""
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train as cookbook_train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    builder = FromConversationFileBuilder(
        file_path=spec["data_path"], test_size=0, shuffle_seed=spec["seed"],
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=spec["model"], renderer_name=spec["renderer"],
            max_length=spec["max_length"], batch_size=spec["batch_size"],
            train_on_what=TrainOnWhat(spec["train_on_what"])))
    return cookbook_train.Config(
        log_path=spec["log_dir"], model_name=spec["model"], recipe_name="machine_nb_sft",
        renderer_name=spec["renderer"], dataset_builder=builder, learning_rate=spec["learning_rate"],
        lr_schedule=spec["lr_schedule"], num_epochs=spec["epochs"], lora_rank=spec["lora_rank"],
        base_url=spec["base_url"], save_every=spec["save_every"], eval_every=0, infrequent_eval_every=0,
        max_steps=spec["max_steps"], submit_ahead=spec["submit_ahead"], ttl_seconds=None)


def _total_steps(config: Any) -> tuple[Any, int, int]:
    """(dataset, batches an epoch, the run's steps) for a cookbook supervised Config."""
    dataset, _ = config.dataset_builder()
    n_batches = len(dataset)
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    return dataset, n_batches, total


def exact_resume_point(log_dir: str, config: Any) -> dict | None:
    """Append the record from which the cookbook resumes a run exactly; returns it (None if none).

    The cookbook saves checkpoint N while finishing step N, after it has already submitted steps
    N+1 … N+submit_ahead, yet the record says to resume at batch N: a plain resume would train
    the steps the state already holds twice. Which of N … N+submit_ahead the state holds is told
    by `metrics.jsonl`: a step's row is written once its optimizer step has finished, and the
    engine ran it before the save that was queued after it. The appended record points past the
    steps with rows (epoch, batch, elapsed_tokens) and says how many steps the state holds
    (`steps_in_state`), so the resumed run continues from the exact state and ends with the
    losses and weights of an uninterrupted one; when the state holds every step, `child_run`
    saves the final checkpoint from it. A step without a row is trained again and listed in
    `unconfirmed`: the engine may have failed it (the state lacks it: training it again is
    exact), or an interrupt came between the checkpoint and its row (the state holds it: it is
    trained twice); the log cannot tell which. A record this function wrote is returned as it is.
    """
    from tinker_cookbook import checkpoint_utils

    last = checkpoint_utils.get_last_checkpoint(log_dir)
    if last is None or last.batch is None:
        return None
    if last.extra.get("machine_nb_resume"):
        return last.to_dict()
    dataset, n_batches, total = _total_steps(config)
    if n_batches == 0:
        return None
    epoch = last.epoch or 0
    if epoch >= config.num_epochs:  # the final record: nothing left to run
        return None
    saved_step = epoch * n_batches + last.batch
    submitted = min(saved_step + config.submit_ahead, total - 1)
    if submitted < saved_step:
        return None
    logged = {m.get("step") for m in _read_log_lines(Path(log_dir) / "metrics.jsonl")
              if isinstance(m.get(SFT_LOSS), (int, float))}
    done_through = saved_step - 1
    while done_through < submitted and done_through + 1 in logged:
        done_through += 1

    def batch_tokens(step: int) -> int:
        e, b = divmod(step, n_batches)
        dataset.set_epoch(seed=e)
        return sum(d.model_input.length for d in dataset.get_batch(b))

    tokens = int(last.extra.get("elapsed_tokens", 0))  # through step N
    tokens += sum(batch_tokens(step) for step in range(saved_step + 1, done_through + 1))
    if done_through < saved_step:
        tokens -= batch_tokens(saved_step)
    e, b = divmod(done_through + 1, n_batches)
    record = {"name": last.name, "epoch": e, "batch": b, "state_path": last.state_path,
              "sampler_path": last.sampler_path, "elapsed_tokens": tokens, "machine_nb_resume": True,
              "steps_in_state": done_through + 1, "unconfirmed": list(range(done_through + 1, submitted + 1))}
    with open(os.path.join(log_dir, checkpoint_utils.CHECKPOINTS_BASE_NAME), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


async def _final_from_state(config: Any, record: dict) -> None:
    """The final checkpoint of a run whose saved state already holds every step: the state
    loaded (weights and optimizer) and saved again as "final", as the cookbook's loop ends a run
    (its loop would train nothing and so save no final checkpoint)."""
    import tinker
    from tinker_cookbook import checkpoint_utils
    from tinker_cookbook.utils.git_rev import recipe_user_metadata

    service = tinker.ServiceClient(base_url=config.base_url, user_metadata=recipe_user_metadata(config.recipe_name))
    metadata: dict[str, str] = {}
    checkpoint_utils.add_renderer_name_to_user_metadata(metadata, config.renderer_name)
    client = await service.create_training_client_from_state_with_optimizer_async(record["state_path"],
                                                                                   user_metadata=metadata)
    await checkpoint_utils.save_checkpoint_async(
        training_client=client, name="final", log_path=config.log_path, kind="both",
        loop_state={"epoch": config.num_epochs, "batch": 0, "elapsed_tokens": int(record.get("elapsed_tokens", 0))},
        ttl_seconds=None)


def _with_heldout(spec: dict, config: Any) -> tuple[Any, Any, int]:
    """The Config with the held-out evaluator in its `evaluator_builders` (when the spec asks for
    one), the builder, and the run's total steps."""
    import chz
    from tinker_cookbook import checkpoint_utils

    from .heldout import HeldOutEvalBuilder, eval_schedule

    dataset, _ = config.dataset_builder()
    n_batches = len(dataset)
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    last = checkpoint_utils.get_last_checkpoint(spec["log_dir"])
    start = 0 if last is None or last.batch is None else (last.epoch or 0) * n_batches + last.batch
    every = int(spec["heldout"]["every"])
    builder = HeldOutEvalBuilder.from_spec(spec, eval_schedule(start, total, every))
    return chz.replace(config, evaluator_builders=[builder], eval_every=every), builder, total


def child_run(spec: dict) -> None:
    """The sft half that runs in the child (runner.py): the cookbook's loop, unchanged; with
    held-out evals, its evaluator in the loop's `evaluator_builders`, then the final checkpoint
    scored the same way (the loop evaluates before a step, so never the weights after the last)."""
    import asyncio

    from tinker_cookbook.supervised import train as cookbook_train

    config = _sft_config(spec)
    record = exact_resume_point(spec["log_dir"], config) if spec.get("resume") else None
    builder = None
    if spec.get("heldout"):
        config, builder, total = _with_heldout(spec, config)
    if record is not None and "steps_in_state" in record and int(record["steps_in_state"]) >= _total_steps(config)[2]:
        asyncio.run(_final_from_state(config, record))
    else:
        asyncio.run(cookbook_train.main(config))
    if builder is not None:
        from .heldout import evaluate_final

        evaluate_final(builder, spec["base_url"], total)


def _default_lr(engine: str, model: str, lora_rank: int) -> float:
    if render.is_local_model(model):
        return LOCAL_LEARNING_RATE if lora_rank > 0 else LOCAL_FULL_LEARNING_RATE
    try:
        from tinker_cookbook.hyperparam_utils import get_lr

        return float(get_lr(model, is_lora=True))
    except Exception:  # the cookbook knows only Llama/Qwen families
        return TINKER_LEARNING_RATE


def _heldout_settings(eval_data: Any, model: str, eval_every: int | None, per_epoch: int, max_tokens: int,
                      temperature: float, steps_total: int) -> dict:
    """The held-out eval of a run, checked before anything is written: its rows (every one
    checked as evaluate() checks it, and rendered by the model's renderer), how often, how sampled."""
    from .evaluate import _render_prompts, _renderer_for, _sha256, check_row, load_eval_rows

    if isinstance(eval_data, (str, os.PathLike)):
        source = os.fspath(eval_data)
        rows = load_eval_rows(source)
    else:
        source = None
        if hasattr(eval_data, "to_dict") and hasattr(eval_data, "columns"):
            eval_data = eval_data.to_dict("records")
        rows = [check_row(r, line=i + 1) for i, r in enumerate(eval_data)]
        if not rows:
            raise MachineFormatError(None, "eval_data holds no eval rows")
    every = per_epoch if eval_every is None else eval_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"eval_every must be a whole number of steps, at least 1 (got {eval_every!r})")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"eval_max_tokens must be at least 1, got {max_tokens!r}")
    renderer, name = _renderer_for(model, None)
    _render_prompts(renderer, rows, source)  # a row the renderer cannot format fails now, not mid-run
    return {"rows": [{k: v for k, v in r.items() if k != "line"} for r in rows], "source": source,
            "source_sha256": _sha256(source) if source else None, "n": len(rows), "every": every,
            "evals": -(-steps_total // every) + 1,  # steps 0, N, 2N, … before the last, and the final checkpoint
            "max_tokens": int(max_tokens), "temperature": float(temperature), "seed": 0, "renderer": name}


def run_estimate(rows: Any, model: str, engine: str, *, epochs: int, batch_size: int, max_steps: int | None,
                 eval_rows: Any = None, evals: int = 0, eval_max_tokens: int = 32) -> dict:
    """What a training run is estimated to cost before it starts: training plus its held-out evals.

    Args:
        rows: the training rows as sft trains them. model / engine: what and where.
        epochs / batch_size / max_steps: as sft takes them.
        eval_rows: the held-out rows (default None: no evals). evals: how many times they are
            scored (eval steps plus the final checkpoint). eval_max_tokens: output tokens a reply.

    Returns:
        {"usd" (None when a price is unknown), "train_usd", "eval_usd", "tokens" (tokens the
        training is priced on), "evals", "exact", "price_source", "price_date"}: 0 on the local engine.
    """
    from .pricing import UnknownPrice, estimate_cost, estimate_eval_cost

    try:
        train = estimate_cost(rows, model, epochs=epochs, batch_size=batch_size, max_steps=max_steps)
    except UnknownPrice:
        return {"usd": None, "train_usd": None, "eval_usd": None, "tokens": None, "evals": evals, "exact": None,
                "price_source": None, "price_date": None}
    full = (train.rows // batch_size) * epochs
    tokens = round(train.tokens * epochs * (train.steps / full if full else 1.0))
    eval_usd = 0.0
    if eval_rows is not None and evals:
        try:
            eval_usd = estimate_eval_cost(eval_rows, model, max_tokens=eval_max_tokens).usd * evals
        except UnknownPrice:
            eval_usd = None
    if engine == "local":
        train_usd, eval_usd = 0.0, 0.0
    else:
        train_usd = train.usd
    usd = None if eval_usd is None else train_usd + eval_usd
    return {"usd": usd, "train_usd": train_usd, "eval_usd": eval_usd, "tokens": tokens, "evals": evals,
            "exact": train.exact, "price_source": train.price.source, "price_date": train.price.date}


#: Settings a resumed run takes from the run it continues (so the resumed run is the same run).
_RESUMED = ("epochs", "batch_size", "max_steps", "learning_rate", "lora_rank", "seed", "max_length",
            "lr_schedule", "save_every", "submit_ahead", "model", "engine")


def sft(data: Any, model: str | None = None, engine: str | None = None, *, epochs: int = 10,
        max_steps: int | None = None, learning_rate: float | None = None, batch_size: int = 8,
        lora_rank: int | None = None, log_dir: str | os.PathLike | None = None,
        workspace: str | os.PathLike | None = None, name: str | None = None,
        resume: str | os.PathLike | None = None, seed: int = 0, max_length: int | None = None,
        lr_schedule: str = "linear", save_every: int = 20, max_usd: float | None = None,
        base_url: str | None = None, progress: bool = True, on_metrics: Any = None,
        eval_data: Any = None, eval_every: int | None = None, eval_max_tokens: int = 32,
        eval_temperature: float = 0.0) -> TrainResult:
    """Supervised fine-tuning with tinker-cookbook's `supervised.train.main`, on `engine`.

    The cookbook's loop runs unchanged in a child process and reaches the engine through the real
    tinker SDK: the local engine's server (started in this process) or Tinker at `base_url`.
    With `eval_data`, the loop itself calls the held-out evaluator (heldout.py, the cookbook's
    `SamplingClientEvaluator` interface) every `eval_every` steps, and the final checkpoint is
    scored the same way: `metrics.jsonl` gains `test/accuracy` and `test/format_rate` per eval
    step, `heldout.jsonl` keeps the per-row results, and the result says which step was best.

    Args:
        data: chat JSONL path (or a list of export lines / a DataFrame of them); a checked copy is
            written to `<log dir>/train.jsonl` and is what the cookbook reads.
        model: default None = the engine's default (`machine_nb.engines.local.DEFAULT_MODEL`
            locally; Tinker has none). A Tinker model on the local engine is an EngineError.
        engine: "local" or "tinker"; default None = the model's own ("local/…" → local).
            `engine="tinker"` with a local model works against a `machine-nb serve` base URL.
        epochs: passes over the data (default 10: one epoch of 48 rows at batch 8 is 6 steps,
            too few to learn a format).
        max_steps: stop after this many steps (default None: epochs x full batches).
        learning_rate: default None = 3e-3 for a local LoRA (5e-4 at rank 0), the cookbook's
            `get_lr` on Tinker (1e-4 when it knows none); linear decay to 0 (`lr_schedule`).
        batch_size: rows per step (default 8; the partial last batch is dropped, as the cookbook does).
        lora_rank: default None = 8 for local models, 32 on Tinker (the cookbook's); 0 = full
            fine-tuning (local models only).
        log_dir / workspace / name: where the run writes (default: a fresh `runs/sft-<time>-<hex>`
            under the cwd, or `<workspace>/.machine/training/<name>`). It must be new or empty.
        resume: a log dir of an interrupted sft run to continue; its settings are the ones it was
            started with. It continues after the last step its last checkpoint's state holds, as
            `metrics.jsonl` shows (a state holding the last step is saved as the final checkpoint,
            untrained); on the local engine it ends with the steps, tokens, losses and weights of
            an uninterrupted run (tested; on Tinker the same records are written, not tested). A
            step whose row is missing is trained again and named in
            `TrainResult.unconfirmed_steps` (see `exact_resume_point`).
        seed: data shuffling (default 0). On the local engine the same call twice gives the same
            losses and outputs (LoRA adapters start from the engine's fixed seed).
        max_length: tokens per example (default None = the local model's context, 128; no limit on Tinker).
        save_every: checkpoint every N steps (default 20, the cookbook's), so a Ctrl-C loses little.
        max_usd: Tinker budget; refused before spending when the estimate (training plus the
            held-out evals at `eval_max_tokens` a reply) is over it or a price is unknown (default
            None: no budget, but an unknown training price is still refused). Local runs cost 0.
        base_url: Tinker service URL (default None: $TINKER_BASE_URL, else Tinker's).
        progress: show a progress bar (steps, loss, last held-out accuracy).
        on_metrics: default None; a function called in the caller's thread with each list of new
            `metrics.jsonl` rows while the run writes them (e.g. to refresh a LossPlot live).
        eval_data: held-out eval rows to score while training (a JSONL path or a list of row dicts,
            evaluate()'s shape); every row is checked before anything is written, and a copy goes
            to `<log dir>/heldout_data.jsonl`. Default None: no held-out evals. Choose steps and
            settings on a validation set (the corpus's valid.jsonl) and report the chosen
            checkpoint once on another (eval.jsonl): the set you choose on flatters the choice.
        eval_every: score every N steps (the eval at step s sees the weights after s steps; step
            0 is the base model). Default None = once an epoch (rows // batch_size steps).
        eval_max_tokens / eval_temperature: the evals' sampling, as evaluate() takes it (default
            32 tokens, greedy); recorded with every score, since scores move with them.
    Returns:
        The TrainResult read back from the log dir. A Ctrl-C stops the run and re-raises
        KeyboardInterrupt; the log dir then reads back with `read_training_log` (complete=False)
        and `sft(data, resume=log_dir)` finishes it.
    """
    from . import engines

    submit_ahead = 1  # the cookbook's default: the next batch is prepared while one trains
    if resume is not None:
        path = Path(resume).absolute()
        _claim_log_dir(path, resume=True)
        saved = parse_json((path / MARKER).read_bytes(), path / MARKER)
        if not isinstance(saved, dict):
            raise MachineFormatError(path / MARKER, "not a machine_nb run record (a JSON object)")
        if saved.get("kind", "sft") != "sft":
            raise ValueError(f"resume={str(path)!r} is a {saved['kind']} run: continue it with "
                             f"machine_nb.{saved['kind']}(…, resume=…), not sft()")
        epochs, batch_size, max_steps = saved["epochs"], saved["batch_size"], saved.get("max_steps")
        learning_rate, lora_rank, seed = saved["learning_rate"], saved["lora_rank"], saved["seed"]
        max_length, lr_schedule = saved.get("max_length"), saved.get("lr_schedule", lr_schedule)
        save_every, submit_ahead = saved.get("save_every", save_every), saved.get("submit_ahead", submit_ahead)
        model, engine = saved["model"], saved["engine"]
        held = saved.get("heldout")
        eval_data = path / HELDOUT_DATA if held else None
        if held:
            eval_every, eval_max_tokens = held["every"], held["max_tokens"]
            eval_temperature = held["temperature"]
    if engine is None:
        engine = engines.engine_for(model) if model else "local"
    if engine not in engines.ENGINES:
        raise EngineError(f"Unknown engine {engine!r}: use 'local' or 'tinker'.")
    if model is None:
        model = engines.default_model(engine)
    engines.check_model(engine, model)
    local_model = render.is_local_model(model)
    if engine == "tinker":  # refuse an unbounded cost first, before anything else is looked up
        from .pricing import UnknownPrice, price_for

        if price_for(model).train is None:
            raise UnknownPrice(f"No training price is known for {model!r}: cannot bound the cost of training it. "
                               f"Call machine_nb.pricing.set_price({model!r}, train=…) with Tinker's price.")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be at least 1 (got epochs={epochs}, batch_size={batch_size})")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be at least 1 or None, got {max_steps}")
    if lora_rank is None:
        lora_rank = LOCAL_LORA_RANK if local_model else TINKER_LORA_RANK
    if lora_rank < 0 or (lora_rank == 0 and not local_model):
        raise ValueError(f"lora_rank must be at least 1 (0 = full fine-tuning, local models only), got {lora_rank}")

    source = data
    if resume is not None and (Path(resume) / "train.jsonl").exists():
        source = Path(resume).absolute() / "train.jsonl"  # the very rows the run started with
    rows, train_on = prepare_data(source)
    if len(rows) < batch_size:
        raise ValueError(f"{len(rows)} training rows make no full batch of {batch_size}; the cookbook would "
                         "train 0 steps. Lower batch_size or add rows.")
    steps_total = (len(rows) // batch_size) * epochs
    if max_steps is not None:
        steps_total = min(steps_total, max_steps)
    heldout = held_rows = None
    if eval_data is not None:
        heldout = _heldout_settings(eval_data, model, eval_every, len(rows) // batch_size, eval_max_tokens,
                                    eval_temperature, steps_total)
        held_rows = heldout.pop("rows")
        if resume is not None and saved.get("heldout"):  # the file the run was started with, not its copy
            heldout.update(source=saved["heldout"].get("source"), source_sha256=saved["heldout"].get("source_sha256"))

    renderer = render.renderer_name(model)
    if local_model and max_length is None:
        max_length = engines.model_context(render.base_model(model))
    # the very checks validate() runs (shape, secrets, length against the model's context, trained
    # tokens): a row validate rejects is refused here too, on both engines, before anything is written
    from .validate import preflight

    overlap = heldout["source"] if heldout and heldout["source"] and Path(heldout["source"]).is_file() else None
    preflight(rows, model, max_length if max_length is not None else "auto", train_on_what=train_on,
              eval_path=overlap)

    # refuse before spending (and before writing anything): over budget, no key, not Tinker
    estimate = run_estimate(rows, model, engine, epochs=epochs, batch_size=batch_size, max_steps=max_steps,
                            eval_rows=held_rows, evals=heldout["evals"] if heldout else 0,
                            eval_max_tokens=eval_max_tokens)
    if engine == "tinker":
        from .pricing import check_budget

        check_budget(estimate["usd"], max_usd, f"training {model} for {epochs} epoch(s)"
                     + (f" with {estimate['evals']} held-out evals" if heldout else ""))
    url = engines.check_service(engine, base_url, (model,))

    if resume is None:
        path = Path(log_dir).absolute() if log_dir is not None else new_log_dir(workspace=workspace, name=name)
        _claim_log_dir(path, resume=False)
        write_jsonl(rows, path / "train.jsonl")
        if held_rows is not None:
            write_jsonl(held_rows, path / HELDOUT_DATA)
        if learning_rate is None:
            learning_rate = _default_lr(engine, model, lora_rank)
        marker = {"engine": engine, "model": model, "renderer": renderer, "train_on_what": train_on,
                  "rows": len(rows), "epochs": epochs, "batch_size": batch_size, "max_steps": max_steps,
                  "learning_rate": learning_rate, "lora_rank": lora_rank, "seed": seed, "max_length": max_length,
                  "lr_schedule": lr_schedule, "save_every": save_every, "submit_ahead": submit_ahead,
                  "source": str(data) if isinstance(data, (str, os.PathLike)) else "<in-memory rows>",
                  "heldout": heldout, "estimate": estimate}
        from .jsonl import atomic_write_text

        atomic_write_text(path / MARKER, json.dumps(marker, indent=1))

    spec = {"module": __name__, "data_path": str(path / "train.jsonl"), "log_dir": str(path),
            "model": render.base_model(model), "renderer": renderer, "train_on_what": train_on,
            "max_length": max_length, "batch_size": batch_size, "seed": seed, "learning_rate": learning_rate,
            "lr_schedule": lr_schedule, "epochs": epochs, "lora_rank": lora_rank, "base_url": url,
            "save_every": save_every, "max_steps": max_steps, "submit_ahead": submit_ahead,
            "resume": resume is not None, "local_models": local_model,
            "heldout": None if heldout is None else {**heldout, "path": str(path / HELDOUT_DATA)}}

    from .progress import progress as progress_bar

    before = _log_entries(path) if resume is not None else set()
    tail = _MetricsTail(path / "metrics.jsonl")
    seen_steps: set[int] = set()
    watchdog = engines.watchdog(engine, url)
    with progress_bar(total=steps_total, desc="sft", unit="steps", enabled=None if progress else False) as bar, \
            watchdog as dog:

        def poll() -> None:
            new = tail.new_rows()
            steps = [m for m in new if SFT_LOSS in m and m.get("step") not in seen_steps]
            seen_steps.update(m.get("step") for m in steps)
            scored = [m[HELDOUT_ACCURACY] for m in new if isinstance(m.get(HELDOUT_ACCURACY), (int, float))]
            if scored:
                bar.set_postfix(heldout=float(scored[-1]))
            if steps:
                bar.update(len(steps), loss=float(steps[-1][SFT_LOSS]))
            if new and on_metrics is not None:
                on_metrics(new)

        try:
            run_cookbook(spec, path, engine=engine, on_poll=poll, watchdog=dog)
        finally:
            _private_files(path, before)
    result = read_training_log(path)
    result.model, result.engine = model, engine
    return result


def smoke(data: Any, model: str | None = None, engine: str | None = None, *, steps: int = 2,
          batch_size: int | None = None, **kwargs: Any) -> TrainResult:
    """A real 2-step run (`steps`) through the same path as `sft`: proves data, engine and loop work.

    batch_size: default None = min(8, rows) so even a tiny file gives full batches. Other keyword
    arguments go to `sft` (e.g. `log_dir`, `max_usd`; epochs defaults to enough for `steps`).
    """
    rows, _ = prepare_data(data)
    if batch_size is None:
        batch_size = max(1, min(8, len(rows)))
    per_epoch = max(1, len(rows) // batch_size)
    kwargs.setdefault("epochs", -(-steps // per_epoch))
    return sft(data, model, engine, max_steps=steps, batch_size=batch_size, **kwargs)
