"""Sweeps: one `sft` run per grid point and seed, resumable, with the total cost guarded first.

`sweep` runs train.py's `sft` (the cookbook's loop, on either engine) for every combination of the
grid's settings and every seed, each in its own log dir under one sweep dir, and returns one row
per run. A finished run is read back, not re-run, so calling `sweep` again with the same sweep dir
(after a Ctrl-C, a crash, or with more seeds or grid values) only runs what is missing. On Tinker
the estimate of every run still to run (training plus its held-out evals) is summed and held to
`max_usd` before the first one starts. `sweep_summary` turns the runs into one row per setting
with the spread across seeds and an interval that holds at small n (stats.py); `verdict` says
what the grid shows in words. Whether a setting is good enough to use is the reader's call.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import numbers
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..core.redact import redacted
from ..errors import BudgetExceeded

if TYPE_CHECKING:
    import pandas as pd

#: The sft settings a grid may sweep (any other sft keyword can be fixed through `**settings`).
AXES = ("learning_rate", "epochs", "lora_rank", "batch_size", "max_steps", "lr_schedule", "max_length",
        "eval_max_tokens", "eval_temperature")
#: sft keywords the sweep sets itself.
_OWN = ("data", "model", "engine", "log_dir", "workspace", "name", "resume", "seed", "progress", "on_metrics",
        "eval_data", "eval_every", "max_usd")
#: The sweep dir's record of what it sweeps (what a resumed call must agree with).
MANIFEST = "sweep.json"

#: Columns of the frame `sweep` returns, after `run` and the grid's axes (in the grid's order).
RUN_COLUMNS = ["seed", "status", "steps", "first_loss", "final_loss", "heldout_accuracy", "heldout_format_rate",
               "best_step", "best_accuracy", "evals", "tokens", "estimated_tokens", "estimated_usd", "cost_usd",
               "eval_max_tokens", "eval_temperature", "wall_s", "checkpoint", "log_dir", "error"]


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        text = format(value, "g")  # short where that loses nothing ("0.001"), exact otherwise
        return text if float(text) == value else repr(value)
    return str(value)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (np.float64(1e-3) -> 1e-3); others as they are."""
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return item()
    return value


def _same_key(value: Any) -> tuple:
    """What two grid values must differ in: numbers by value (1 == 1.0), others by repr."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", float(value))
    return ("other", repr(value))


def run_name(settings: Mapping[str, Any], seed: int) -> str:
    """A run's dir name in a sweep dir.

    Args:
        settings: the grid point (setting -> value, in the grid's order).
        seed: the run's seed.

    Returns:
        `learning_rate=0.003_epochs=10_seed=0` (file-name safe).
    """
    parts = [f"{k}={_value_text(v)}" for k, v in settings.items()] + [f"seed={seed}"]
    return "_".join(_safe(part) for part in parts)


def _safe(text: str) -> str:
    """`text` with each run of characters a file name may not hold written "-"."""
    import re

    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", text)


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first axis slowest (like nested loops).

    Args:
        grid: setting -> its values (settings: AXES).

    Returns:
        One dict per grid point.

    Raises:
        ValueError: no axes, an axis sft cannot sweep (or the seed), or a repeated value: values
            equal as numbers (`1` and `1.0`, `np.float64(1e-3)` and `1e-3`) are one setting; or
            two values whose runs would share a dir ("a b" and "a-b", or "Linear" and "linear"
            on a file system that ignores case).
        TypeError: an axis whose values are not a non-empty list.
    """
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError("grid needs at least one axis, e.g. grid={'learning_rate': [1e-3, 3e-3]}")
    for axis, values in grid.items():
        if axis == "seed":
            raise ValueError("seeds go in seeds=[…], not in the grid")
        if axis not in AXES:
            raise ValueError(f"grid axis {axis!r} is not a setting a sweep varies; use one of {', '.join(AXES)}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not len(values):
            raise TypeError(f"grid axis {axis!r} needs a non-empty list of values, got {values!r}")
        seen: dict[tuple, Any] = {}
        names: dict[str, Any] = {}
        for value in values:
            plain = _plain(value)
            key = _same_key(plain)
            if key in seen:
                raise ValueError(f"grid axis {axis!r} repeats a value: {seen[key]!r} and {value!r} are equal, so "
                                 f"they would be one run reported twice; list each value once ({list(values)!r})")
            seen[key] = value
            # case folded too: "Linear" and "linear" would share one dir on macOS and Windows
            text = _safe(_value_text(plain)).casefold()
            if text in names:
                raise ValueError(f"grid axis {axis!r}: {names[text]!r} and {value!r} would share one run dir "
                                 f"({axis}={_safe(_value_text(plain))}); list values that differ in how they are "
                                 "written")
            names[text] = value
    return [dict(zip(grid, combo)) for combo in itertools.product(*plain_grid(grid).values())]


def plain_grid(grid: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """The grid with numpy scalars as plain Python values (what sweep.json records)."""
    return {axis: [_plain(v) for v in values] for axis, values in grid.items()}


def _sha(data: Any) -> tuple[str | None, str]:
    """(path or None, sha256) of a JSONL path or of in-memory rows (their JSON lines)."""
    if data is None:
        return None, ""
    if isinstance(data, (str, os.PathLike)):
        digest = hashlib.sha256()
        with open(data, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return os.fspath(data), digest.hexdigest()
    if hasattr(data, "to_dict") and hasattr(data, "columns"):
        data = data.to_dict("records")
    body = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in data)
    return None, hashlib.sha256(body.encode("utf-8")).hexdigest()


def _reusable(rows: Any) -> Any:
    """A path, a DataFrame or None as it is; other rows as a list (a generator can be read once)."""
    if rows is None or isinstance(rows, (str, os.PathLike, list, tuple)) or hasattr(rows, "columns"):
        return rows
    return list(rows)


def _read_manifest(sweep_dir: Path) -> dict:
    """A sweep dir's sweep.json, checked: a JSON object with its grid and seeds.

    Raises MachineFormatError naming the file (and the field) when it is not: broken JSON, a value
    nested too deep, or not what `sweep` writes (a grid `grid_points` refuses, seeds that are not
    distinct integers, settings that are not an object).
    """
    from ..errors import MachineFormatError
    from ..core.jsonl import parse_json

    path = sweep_dir / MANIFEST
    manifest = parse_json(path.read_bytes(), path)
    if not isinstance(manifest, dict):
        raise MachineFormatError(path, "not a sweep manifest (a JSON object)")
    if not isinstance(manifest.get("grid"), dict):
        raise MachineFormatError(path, "the grid must be an object of setting -> values", field="grid")
    try:
        grid_points(manifest["grid"])
    except (TypeError, ValueError) as exc:
        raise MachineFormatError(path, f"not a grid a sweep writes: {exc}", field="grid") from None
    seeds = manifest.get("seeds")
    if (not isinstance(seeds, list) or not seeds or len(set(map(repr, seeds))) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise MachineFormatError(path, f"the seeds must be a list of distinct integers, got {seeds!r}", field="seeds")
    if not isinstance(manifest.get("settings", {}), (dict, type(None))):
        raise MachineFormatError(path, "the settings must be an object of sft keyword -> value", field="settings")
    return manifest


def _claim_sweep_dir(sweep_dir: Path, manifest: dict) -> dict:
    """Check the sweep dir is new, empty, or this same sweep's; returns the manifest to write
    (grid values and seeds may grow; data, eval rows, model, engine and fixed settings may not)."""
    path = sweep_dir / MANIFEST
    if path.exists():
        saved = _read_manifest(sweep_dir)
        for key in ("data_sha256", "eval_sha256", "model", "engine", "settings", "eval_every"):
            if saved.get(key) != manifest.get(key):
                raise ValueError(
                    f"{sweep_dir} holds another sweep: its {key} is {saved.get(key)!r}, this call's is "
                    f"{manifest.get(key)!r}. Use another sweep_dir (runs of different data or settings would mix).")
        grid = {k: list(v) for k, v in saved.get("grid", {}).items()}
        if set(grid) != set(manifest["grid"]):
            raise ValueError(f"{sweep_dir} sweeps the axes {sorted(grid)}; this call sweeps {sorted(manifest['grid'])}. "
                             "Use another sweep_dir.")
        for axis, values in manifest["grid"].items():
            grid[axis] += [v for v in values if v not in grid[axis]]
        seeds = list(saved.get("seeds", [])) + [s for s in manifest["seeds"] if s not in saved.get("seeds", [])]
        return {**manifest, "grid": grid, "seeds": seeds, "created": saved.get("created", manifest["created"])}
    if sweep_dir.exists() and (not sweep_dir.is_dir() or any(sweep_dir.iterdir())):
        raise FileExistsError(f"sweep_dir={str(sweep_dir)!r} is not empty and holds no {MANIFEST}: not a sweep "
                              "machine_nb made (nothing there was changed). Pick another sweep_dir.")
    return manifest


def _set_aside(log_dir: Path) -> Path:
    """Move a run dir that cannot be resumed (it stopped before its first checkpoint) out of the
    way, so the run starts afresh; nothing is deleted. A run starting there now (in another sweep
    or kernel: it holds the dir, runlog.hold_log_dir) is left alone, and so is a dir that gained a
    checkpoint since it was read.

    Raises:
        LogDirInUse: a run holds the dir.
        FileExistsError: the dir holds a checkpoint now.
    """
    from .runlog import CHECKPOINTS_FILE, hold_log_dir

    with hold_log_dir(log_dir):
        if (log_dir / CHECKPOINTS_FILE).exists():
            raise FileExistsError(f"{log_dir} gained a checkpoint while the sweep read it: run the sweep again "
                                  "to resume it")
        for i in itertools.count(1):
            target = log_dir.with_name(f"{log_dir.name}.stale-{i}")
            if not target.exists():
                log_dir.rename(target)
                return target
    raise AssertionError("unreachable")


def _state(log_dir: Path, heldout: bool) -> str:
    """"done" (finished, and scored when evals were asked for), "partial" (resumable), "stale"
    (started, no checkpoint: nothing to resume), or "new"."""
    from .runlog import MARKER, read_training_log

    if not log_dir.exists():
        return "new"
    if not (log_dir / MARKER).exists() or not (log_dir / "checkpoints.jsonl").exists():
        return "stale" if any(log_dir.iterdir()) else "new"
    result = read_training_log(log_dir)
    if result.complete and (not heldout or result.heldout_accuracy is not None):
        return "done"
    return "partial"


def _check_same_run(log_dir: Path, expected: Mapping[str, Any]) -> None:
    """A run dir read back must be the run this grid point asks for (not one from an edited grid)."""
    from .runlog import load_marker

    saved = load_marker(log_dir)
    for key, value in expected.items():
        have = saved.get(key)
        if key.startswith("eval_") and isinstance(saved.get("heldout"), dict):
            have = saved["heldout"].get(key.removeprefix("eval_"))
        if have is not None and value is not None and have != value:
            raise ValueError(f"{log_dir} was trained with {key}={have!r}, not {value!r}: the sweep dir was edited, "
                             "or another sweep wrote there. Use another sweep_dir.")


# A row's columns read from its run's result (None for a run with none): column -> the attribute.
_FROM_RESULT = {"steps": "steps", "first_loss": "first_loss", "final_loss": "last_loss",
                "heldout_accuracy": "heldout_accuracy", "heldout_format_rate": "heldout_format_rate",
                "best_step": "best_step", "best_accuracy": "best_accuracy", "evals": "evals", "tokens": "tokens",
                "estimated_tokens": "estimated_tokens", "estimated_usd": "estimated_usd", "cost_usd": "cost_usd"}


def _row(name: str, point: Mapping[str, Any], seed: int, result: Any, status: str, wall: float | None,
         error: str | None, eval_settings: Mapping[str, Any], log_dir: Path) -> dict:
    r = result
    return {"run": name, **point, "seed": seed, "status": status,
            **{col: None if r is None else getattr(r, attr) for col, attr in _FROM_RESULT.items()},
            # a grid axis over the evals' sampling is this run's own value, not the fixed setting
            "eval_max_tokens": point.get("eval_max_tokens", eval_settings.get("eval_max_tokens")),
            "eval_temperature": point.get("eval_temperature", eval_settings.get("eval_temperature")),
            "wall_s": None if wall is None else round(wall, 3),
            "checkpoint": None if r is None else r.checkpoint, "log_dir": str(log_dir), "error": error}


def _frame(rows: list[dict], axes: Sequence[str]):
    import pandas as pd

    # an axis that is also a run column (eval_max_tokens, eval_temperature) is one column, with the axes
    return _keep_none(pd.DataFrame(rows, columns=["run", *axes, *[c for c in RUN_COLUMNS if c not in axes]]),
                      rows, axes)


def _keep_none(frame: "pd.DataFrame", rows: list[dict], axes: Sequence[str]) -> "pd.DataFrame":
    """`frame` with each axis that holds None (a setting left at sft's default) as the values given:
    pandas would make [None, 50] a float column [NaN, 50.0], and NaN names no setting."""
    import pandas as pd

    for axis in axes:
        values = [r[axis] for r in rows]
        if any(v is None for v in values):
            frame[axis] = pd.Series(values, index=frame.index, dtype=object)
    return frame


def setting_key(values: Sequence[Any]) -> tuple:
    """What makes two settings one: their values equal as numbers (1 == 1.0), None and NaN alike.

    Args:
        values: a setting's values, one per axis.

    Returns:
        A hashable key.
    """
    return tuple(("missing",) if v is None or (isinstance(v, float) and v != v) else _same_key(_plain(v))
                 for v in values)


def setting_groups(frame: "pd.DataFrame", axes: Sequence[str]) -> list[tuple[tuple, "pd.DataFrame"]]:
    """A frame's rows grouped by their values of `axes`, in the order the settings first appear.

    Unlike `DataFrame.groupby` (which drops a missing value, or makes it NaN), a setting left at
    its default (None) is a group of its own; `setting_key` of a group's values finds it again.

    Args:
        frame: a sweep frame or its summary.
        axes: the columns that make a setting ([] : the whole frame is one group).

    Returns:
        (the setting's values as the frame holds them, its rows) per setting.
    """
    if not axes:
        return [((), frame)]
    groups: dict[tuple, tuple[tuple, list[int]]] = {}
    for i, values in enumerate(frame[list(axes)].itertuples(index=False, name=None)):
        groups.setdefault(setting_key(values), (values, []))[1].append(i)
    return [(values, frame.iloc[rows]) for values, rows in groups.values()]


class _Stopped(Exception):
    """Raised in a run's metrics callback when the sweep is being stopped (a Ctrl-C in the caller)."""


def sweep(data: Any, grid: Mapping[str, Sequence[Any]], *, seeds: Sequence[int] = (0,), eval_data: Any = None,
          eval_every: int | None = None, model: str | None = None, engine: str | None = None,
          sweep_dir: str | os.PathLike | None = None, max_parallel: int = 1, max_usd: float | None = None,
          progress: bool | None = None, **settings: Any) -> "pd.DataFrame":
    """Train one run per grid point and seed with `sft`, and return one row per run.

    Args:
        data: the training rows, as sft takes them (a chat JSONL path, lines, or a DataFrame).
        grid: sft settings to vary, each a list of values, e.g. `{"learning_rate": [1e-3, 3e-3],
            "epochs": [5, 10]}` (axes: AXES). Every combination runs, the first axis slowest.
        seeds: training seeds per grid point (data order; default (0,)). Three seeds show how much
            a result is the seed's.
        eval_data: held-out rows scored during each run and on its final checkpoint (sft's
            eval_data). Default None: losses only. Sweep on a validation set (the corpus's
            valid.jsonl) and report the chosen setting once on another (eval.jsonl).
        eval_every: sft's (default None: once an epoch).
        model: as sft takes it (default None: the engine's model; local/arith-tiny locally).
        engine: as sft takes it (default None: the model's).
        sweep_dir: where the runs go, one log dir each named by `run_name`, plus sweep.json.
            Default None: a fresh `runs/sweep-<UTC time>-<hex>`. Pass the same dir again to
            resume: finished runs are read back, interrupted ones resumed exactly, the rest run.
            The same dir with other data, eval rows, model, engine or fixed settings is refused;
            more seeds or more grid values are welcome, and the axes keep the order the dir
            records (run names follow it), whatever order a later call lists them in.
        max_parallel: runs at once (default 1). Each run is its own cookbook loop in a child
            process. On the local engine the model is served from this process, one torch thread
            per run, so parallel runs share this machine's cores (more runs at once than free cores
            only makes each slower); on Tinker they run remotely.
        max_usd: the budget for the whole sweep. On Tinker, before the first run, every run still
            to run is priced (training plus its held-out evals) and the sum is refused with
            BudgetExceeded when over it, or when a price is unknown. Default None: no budget (a
            model without a training price is still refused). Local runs cost 0.
        progress: a progress bar over the runs (default None: in a notebook or terminal unless
            MACHINE_NB_PROGRESS=0; machine_nb.core.progress decides). The runs themselves show none.
        **settings: other sft keywords, the same for every run (e.g. batch_size=8, lora_rank=8).
            sweep.json records them, a base_url without its userinfo and query values
            (engines.shown_url): the runs connect with the URL given.

    Returns:
        A DataFrame, one row per run in grid order: run, the grid's axes, then RUN_COLUMNS (an
        axis among them, eval_max_tokens or eval_temperature, stays with the axes): seed,
        status ("ran", "resumed", "read back" or "failed"), steps, first_loss, final_loss,
        heldout_accuracy / heldout_format_rate (final checkpoint), best_step / best_accuracy,
        evals, tokens, estimated_tokens, estimated_usd (before the run), cost_usd (observed:
        tokens trained and sampled x price), eval_max_tokens / eval_temperature (the sampling the
        held-out scores were taken with), wall_s (None when read back), checkpoint, log_dir,
        error (why a run failed; the others still ran). `sweep_summary(frame)` gives one row
        per setting. A Ctrl-C stops the runs in progress and re-raises; call again to resume.

    Raises:
        ValueError, TypeError: a grid, seeds or settings a sweep cannot run (nothing is written).
        MachineFormatError: the sweep dir's sweep.json cannot be read, naming it and the field.
        BudgetExceeded: on Tinker, the runs still to run are over max_usd or cannot be priced.
    """
    from . import loop, train
    from .runlog import new_log_dir, read_training_log

    points = grid_points(grid)
    if isinstance(seeds, (str, bytes, numbers.Number)):
        raise TypeError(f"seeds must be a list of integers, e.g. seeds=[0, 1, 2] for three runs a setting "
                        f"(got {seeds!r})")
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool)
                                                             for s in seeds):
        raise ValueError(f"seeds must be distinct integers, at least one (got {seeds!r})")
    seeds = [int(s) for s in seeds]  # np.int64 as the int sweep.json and the run names hold
    bad = sorted(set(settings) & (set(_OWN) | set(grid)))
    if bad:
        raise TypeError(f"sweep sets {bad} itself (or they are in the grid); pass them as sweep's own arguments")
    import inspect

    known = set(inspect.signature(train.sft).parameters) - set(_OWN)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(f"{unknown} are not sft settings (known: {', '.join(sorted(known))})")
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise ValueError(f"max_parallel must be at least 1, got {max_parallel!r}")
    from .. import engines
    from ..checks.pricing import check_max_usd

    check_max_usd(max_usd)  # before anything is written

    model, engine = loop.resolve_target(model, engine)
    # rows given as a one-shot iterator are read once here: the fingerprint, the estimate and every
    # run read them again
    data, eval_data = _reusable(data), _reusable(eval_data)
    data_path, data_sha = _sha(data)
    eval_path, eval_sha = _sha(eval_data)
    path = Path(sweep_dir).absolute() if sweep_dir is not None else new_log_dir(prefix="sweep")
    manifest = {"generator": "machine_nb.sweeps.sweep", "grid": plain_grid(grid),
                "seeds": seeds, "model": model, "engine": engine, "eval_every": eval_every,
                # a base URL without its credentials: a rotated token is the same sweep
                "settings": {**settings, **({"base_url": engines.shown_url(settings["base_url"])}
                                            if settings.get("base_url") else {})},
                "data": data_path, "data_sha256": data_sha, "eval": eval_path, "eval_sha256": eval_sha,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    asked = json.loads(json.dumps(manifest, default=str))
    manifest = _claim_sweep_dir(path, asked)
    # the axes in the order the sweep dir records: run names follow it, so a resumed call that
    # lists them in another order finds its runs
    grid = {axis: grid[axis] for axis in manifest["grid"]}
    points = grid_points(grid)

    eval_settings = {"eval_max_tokens": settings.get("eval_max_tokens", 32),
                     "eval_temperature": settings.get("eval_temperature", 0.0)}
    runs = []
    for point in points:
        for seed in seeds:
            name = run_name(point, seed)
            runs.append((name, point, seed, path / name))
    states = {name: _state(log_dir, eval_data is not None) for name, _, _, log_dir in runs}
    for name, point, seed, log_dir in runs:
        if states[name] in ("done", "partial"):
            _check_same_run(log_dir, {**{k: v for k, v in point.items()}, "seed": seed, "model": model,
                                      "engine": engine})
    pending = [r for r in runs if states[r[0]] != "done"]
    if engine == "tinker" and pending:
        _guard_cost(data, eval_data, eval_every, model, pending, settings, max_usd)

    path.mkdir(parents=True, exist_ok=True)
    from ..core.jsonl import atomic_write_text, held_folder

    # read, merge and write under the dir's lock: another call adding seeds or values to this sweep
    # meanwhile (another kernel) keeps them in the record
    with held_folder(path):
        manifest = _claim_sweep_dir(path, asked)
        atomic_write_text(path / MANIFEST, json.dumps(manifest, indent=1, default=str) + "\n")

    stop = threading.Event()

    def on_metrics(_rows: Any) -> None:
        if stop.is_set():
            raise _Stopped("the sweep was stopped")

    def one(name: str, point: dict, seed: int, log_dir: Path) -> dict:
        state = _state(log_dir, eval_data is not None)
        if state == "done":
            return _row(name, point, seed, read_training_log(log_dir), "read back", None, None,
                        eval_settings, log_dir)
        if stop.is_set():
            raise _Stopped("the sweep was stopped")
        t0 = time.perf_counter()
        try:
            if state == "partial":
                result, status = train.sft(data, resume=log_dir, progress=False, on_metrics=on_metrics,
                                           max_usd=max_usd), "resumed"
            else:
                if state == "stale":
                    _set_aside(log_dir)
                kwargs = {**settings, **point}
                result = train.sft(data, model, engine, log_dir=log_dir, seed=seed, eval_data=eval_data,
                                   eval_every=eval_every, max_usd=max_usd, progress=False, on_metrics=on_metrics,
                                   **kwargs)
                status = "ran"
        except (KeyboardInterrupt, _Stopped, BudgetExceeded):
            raise
        except Exception as exc:  # one failed run: recorded, the others still run
            return _row(name, point, seed, None, "failed", time.perf_counter() - t0,
                        redacted(f"{type(exc).__name__}: {exc}"), eval_settings, log_dir)
        return _row(name, point, seed, result, status, time.perf_counter() - t0, None, eval_settings, log_dir)

    from ..core.progress import progress as progress_bar

    rows: dict[str, dict] = {}
    with progress_bar(total=len(runs), desc="sweep", unit="runs", enabled=progress) as bar, \
            loop.keep_runners(max_parallel):
        if max_parallel == 1:
            for run in runs:
                try:
                    rows[run[0]] = one(*run)
                except _Stopped:
                    raise KeyboardInterrupt("the sweep was stopped") from None
                _tick(bar, rows[run[0]])
        else:
            _parallel(runs, one, max_parallel, stop, rows, bar)
    return _frame([rows[name] for name, *_ in runs], list(grid))


def _tick(bar: Any, row: dict) -> None:
    post = {} if row["heldout_accuracy"] is None else {"heldout": row["heldout_accuracy"]}
    bar.update(1, **post)


def _parallel(runs: list, one: Any, max_parallel: int, stop: threading.Event, rows: dict, bar: Any) -> None:
    """Run `one` over the runs on `max_parallel` threads; a Ctrl-C here stops every run in progress
    (their metrics callbacks raise, and sft stops its loop) and cancels the rest."""
    import concurrent.futures as cf

    pool = cf.ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="machine-nb-sweep")
    futures: dict = {}
    try:  # handed out inside: a Ctrl-C landing meanwhile stops the runs already started
        for run in runs:
            futures[pool.submit(one, *run)] = run[0]
        for future in cf.as_completed(futures):
            rows[futures[future]] = future.result()
            _tick(bar, rows[futures[future]])
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        # a Ctrl-C landing while the pool starts a thread leaves the pool unaware of that thread:
        # each run handed out is waited for too (a second Ctrl-C stops waiting)
        cf.wait(futures)
        raise
    pool.shutdown(wait=True)


def estimate_sweep(data: Any, grid: Mapping[str, Sequence[Any]], *, seeds: Sequence[int] = (0,), eval_data: Any = None,
                   eval_every: int | None = None, model: str, **settings: Any) -> tuple[float, list[str]]:
    """What a sweep's runs are estimated to cost on Tinker: training plus held-out evals, summed.

    Args:
        data: as `sweep` takes it.
        grid: as `sweep` takes it.
        seeds: as `sweep` takes them (default (0,)).
        eval_data: as `sweep` takes it (default None: no held-out evals to price).
        eval_every: as `sweep` takes it (default None: once an epoch).
        model: the Tinker model the runs would train.
        **settings: other sft settings, as `sweep` takes them.

    Returns:
        (USD of the runs that can be priced, names of the runs that cannot).

    Raises:
        UnknownPrice: when the model has no training price.
    """
    pending = [(run_name(point, seed), point, seed, None) for point in grid_points(grid) for seed in seeds]
    return _estimate_runs(data, eval_data, eval_every, model, pending, settings)


def _estimate_runs(data: Any, eval_data: Any, eval_every: int | None, model: str, pending: list,
                   settings: Mapping[str, Any]) -> tuple[float, list[str]]:
    from ..core.chat import eval_rows, prepare_data
    from .loop import estimate_run, eval_count, refuse_unpriced

    refuse_unpriced(model, what="the sweep")
    rows, _ = prepare_data(data)
    held = None
    if eval_data is not None:
        held, _ = eval_rows(eval_data)
    total, unknown = 0.0, []
    for name, point, _seed, _log_dir in pending:
        s = {**settings, **point}
        epochs, batch = int(s.get("epochs", 10)), int(s.get("batch_size", 8))
        steps = (len(rows) // batch) * epochs
        if s.get("max_steps") is not None:
            steps = min(steps, int(s["max_steps"]))
        every = eval_every or max(1, len(rows) // batch)
        est = estimate_run("sft", rows, model, "tinker", epochs=epochs, batch_size=batch,
                           max_steps=s.get("max_steps"), eval_rows=held, evals=eval_count(steps, every) if held else 0,
                           eval_max_tokens=int(s.get("eval_max_tokens", 32)))
        if est["usd"] is None:
            unknown.append(name)
        else:
            total += est["usd"]
    return total, unknown


def _guard_cost(data: Any, eval_data: Any, eval_every: int | None, model: str, pending: list,
                settings: Mapping[str, Any], max_usd: float | None) -> None:
    """Price every run still to run on Tinker (training plus held-out evals); refuse the sweep when
    the sum is over `max_usd` or, with a budget, when a price is unknown. Nothing has run yet."""
    from ..checks.pricing import check_budget

    total, unknown = _estimate_runs(data, eval_data, eval_every, model, pending, settings)
    if unknown and max_usd is not None:
        check_budget(None, max_usd, f"the sweep ({len(unknown)} run(s) cannot be priced, e.g. {unknown[0]})")
    check_budget(total, max_usd, f"the sweep's {len(pending)} run(s) still to run")


def read_sweep(sweep_dir: str | os.PathLike) -> "pd.DataFrame":
    """A sweep dir read back as `sweep` returns it, without running anything.

    Args:
        sweep_dir: a dir `sweep` wrote (with its sweep.json).

    Returns:
        The same columns as `sweep`; status "read back" for finished runs, "incomplete" for runs
        that stopped part way (resumable by calling `sweep` again), "no checkpoint" for runs that
        started but hold no checkpoint (they stopped before their first one, or are starting now:
        nothing to resume, so `sweep` sets such a dir aside and runs it afresh), "missing" for runs
        never started. Only "read back" rows are summarised (sweep_summary).

    Raises:
        FileNotFoundError: when the dir holds no sweep.json.
        MachineFormatError: a sweep.json that cannot be read or holds no grid, seeds or settings a
            sweep writes (a hand-edited or damaged one), naming it and the field.
    """
    from .runlog import read_training_log

    path = Path(sweep_dir)
    if not (path / MANIFEST).exists():
        raise FileNotFoundError(f"No sweep at {path} (no {MANIFEST})")
    manifest = _read_manifest(path)
    settings = manifest.get("settings") or {}
    eval_settings = {"eval_max_tokens": settings.get("eval_max_tokens", 32),
                     "eval_temperature": settings.get("eval_temperature", 0.0)}
    heldout = bool(manifest.get("eval_sha256"))
    rows = []
    for point in grid_points(manifest["grid"]):
        for seed in manifest["seeds"]:
            name = run_name(point, seed)
            log_dir = path / name
            state = _state(log_dir, heldout)
            if state in ("done", "partial"):
                rows.append(_row(name, point, seed, read_training_log(log_dir),
                                 "read back" if state == "done" else "incomplete", None, None, eval_settings, log_dir))
            else:
                rows.append(_row(name, point, seed, None, "no checkpoint" if state == "stale" else "missing", None,
                                 None, eval_settings, log_dir))
    return _frame(rows, list(manifest["grid"]))


# --------------------------------------------------------------------------- summary and words

#: Columns of `sweep_summary`, after the grid's axes.
SUMMARY_COLUMNS = ["seeds", "metric", "mean", "sd", "min", "max", "ci_low", "ci_high", "effective_n",
                   "final_loss", "estimated_usd", "cost_usd"]


def axes_of(frame: "pd.DataFrame") -> list[str]:
    """The grid's axes in a sweep frame.

    Args:
        frame: what `sweep` or `read_sweep` returned.

    Returns:
        The columns between `run` and `seed` ([] for another frame).
    """
    cols = list(frame.columns)
    return cols[cols.index("run") + 1:cols.index("seed")] if "run" in cols and "seed" in cols else []


def _pooled_rows(log_dirs: Sequence[str]) -> Any:
    """The final checkpoints' held-out rows of several runs stacked, each row's `case` its row
    index (the same question in every run), so statistics count questions, not runs x questions."""
    import pandas as pd

    from .runlog import heldout_results

    frames = []
    for d in log_dirs:
        df = heldout_results(d, "final").rows
        frames.append(df.assign(case=df["row"]))
    out = pd.concat(frames, ignore_index=True)
    out["row"] = range(len(out))
    return out


def sweep_summary(frame: "pd.DataFrame", metric: str = "heldout_accuracy", *, level: float = 0.95) -> "pd.DataFrame":
    """One row per setting of a sweep frame: the metric over seeds, with its spread and an interval.

    Args:
        frame: what `sweep` or `read_sweep` returned (only runs that finished are summarised: status
            "ran", "resumed" or "read back").
        metric: a numeric run column to summarise. Default "heldout_accuracy" (the final
            checkpoints' held-out accuracy); e.g. "final_loss" or "best_accuracy".
        level: the interval's confidence level. Default 0.95.

    Returns:
        A DataFrame: the grid's axes, then SUMMARY_COLUMNS: seeds (runs summarised), metric (its
        name), mean, sd (across seeds; None for one), min, max, ci_low / ci_high and effective_n:
        for "heldout_accuracy", the Wilson interval of the accuracy pooled over seeds, at the
        effective number of questions (every seed answers the same questions, so they are
        clusters: stats.effective_size, and never more than the questions asked), i.e. what
        another draw of questions might show; for other metrics, None. final_loss: its mean. estimated_usd / cost_usd: summed over the
        seeds (observed next to the estimate). In the grid's order.
    """
    import pandas as pd

    from ..evaluation.stats import effective_size, proportion_interval

    axes = axes_of(frame)
    if metric not in frame.columns:
        raise KeyError(f"{metric!r} is not a column of the sweep frame ({', '.join(frame.columns)})")
    ok = frame[frame["status"].isin(["ran", "resumed", "read back"]) & frame[metric].notna()]
    out = []
    for key, g in setting_groups(ok, axes):
        values = g[metric].astype(float)
        low = high = n_eff = None
        if metric == "heldout_accuracy" and len(g):
            pooled = _pooled_rows(list(g["log_dir"]))
            correct = [float(bool(c)) for c in pooled["correct"]]
            # at most one question's worth per question: seeds cannot add questions that were not asked
            n_eff = min(effective_size(correct, list(pooled["case"]), level=level), float(pooled["case"].nunique()))
            low, high = (round(v, 12) for v in proportion_interval(sum(correct) / len(correct) * n_eff, n_eff,
                                                                    level=level))
        def total(col: str) -> float | None:
            return None if g[col].isna().any() else float(g[col].sum())
        out.append({**dict(zip(axes, key)), "seeds": len(g), "metric": metric, "mean": float(values.mean()),
                    "sd": float(values.std(ddof=1)) if len(g) > 1 else None, "min": float(values.min()),
                    "max": float(values.max()), "ci_low": low, "ci_high": high, "effective_n": n_eff,
                    "final_loss": float(g["final_loss"].mean()) if g["final_loss"].notna().any() else None,
                    "estimated_usd": total("estimated_usd"), "cost_usd": total("cost_usd")})
    return _keep_none(pd.DataFrame(out, columns=[*axes, *SUMMARY_COLUMNS]), out, axes)


def _setting_text(row: Mapping[str, Any], axes: Sequence[str]) -> str:
    return ", ".join(f"{a}={_value_text(row[a])}" for a in axes) or "the one setting"


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of a sweep metric is the better one: a loss, an NLL, a cost, tokens
    or seconds (`final_loss`, `cost_usd`, `wall_s`, …); otherwise (accuracies, rates) the larger.

    Args:
        metric: a run column's name.

    Returns:
        True for a metric to minimise.
    """
    return any(word in metric for word in ("loss", "nll", "usd", "cost", "tokens", "wall_s"))


def verdict(frame: "pd.DataFrame", metric: str = "heldout_accuracy", *, level: float = 0.95,
            summary: "pd.DataFrame | None" = None) -> str:
    """What a sweep shows, in plain words, with its uncertainty.

    Names the best setting by the metric's mean over seeds (highest accuracy, or lowest for a
    loss or a cost: lower_is_better), its spread across seeds and its interval, then compares it
    with the runner-up on the same questions (compare.py: paired, clustered by question across
    seeds; the delta's interval and p) and says whether the grid can tell them apart.

    Args:
        frame: a sweep frame.
        metric: as in sweep_summary (default "heldout_accuracy").
        level: the confidence level (default 0.95).
        summary: its sweep_summary, when already computed (default None: computed here).

    Returns:
        A paragraph of plain text.
    """
    from ..evaluation.compare import compare

    summary = sweep_summary(frame, metric, level=level) if summary is None else summary
    if summary.empty:
        return "No finished runs to summarise yet."
    axes = axes_of(frame)
    ranked = summary.sort_values("mean", ascending=lower_is_better(metric), kind="stable").reset_index(drop=True)
    best = ranked.iloc[0]
    pct = metric.endswith("accuracy") or metric.endswith("rate")
    val = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.4g}")
    spread = (f"range {val(best['min'])}–{val(best['max'])} over {best['seeds']} seeds"
              if best["seeds"] > 1 else "one seed, so no spread across seeds")
    text = [f"Best by mean {metric}: {_setting_text(best, axes)}, {val(best['mean'])} ({spread}"]
    if best["ci_low"] is not None and best["ci_low"] == best["ci_low"]:
        text[-1] += (f"; {level:.0%} interval over questions {val(best['ci_low'])}–{val(best['ci_high'])}, "
                     f"{best['effective_n']:.0f} effective questions")
    text[-1] += ")."
    if len(ranked) > 1:
        second = ranked.iloc[1]
        rest = "; ".join(f"{_setting_text(r, axes)}: {val(r['mean'])}" for _, r in ranked.iloc[1:].iterrows())
        text.append(f"The others, best first: {rest}.")
        if metric == "heldout_accuracy":
            done = frame[frame["status"].isin(["ran", "resumed", "read back"]) & frame[metric].notna()]
            by_setting = {setting_key(k): g for k, g in setting_groups(done, axes)}
            pick = lambda row: by_setting.get(setting_key(tuple(row[a] for a in axes)),  # noqa: E731
                                              done.iloc[:0]).sort_values("seed")
            a, b = pick(second), pick(best)
            common = sorted(set(a["seed"]) & set(b["seed"]))
            if common:
                ra = _pooled_rows(list(a[a["seed"].isin(common)]["log_dir"]))
                rb = _pooled_rows(list(b[b["seed"].isin(common)]["log_dir"]))
                cmp = compare(ra, rb, level=level)
                apart = cmp.delta_ci_low > 0
                text.append(f"Best minus the runner-up ({_setting_text(second, axes)}) on the same questions and "
                            f"seeds: {cmp.delta_text}, p = {cmp.p_value:.2g} ({cmp.p_method}); "
                            + ("the grid tells them apart." if apart else
                               "the grid cannot tell them apart: choose either, or add questions or seeds."))
    return " ".join(text)


__all__ = ["sweep", "read_sweep", "sweep_summary", "verdict", "lower_is_better", "estimate_sweep", "grid_points",
           "run_name", "setting_groups", "setting_key", "AXES", "RUN_COLUMNS", "SUMMARY_COLUMNS"]
