"""What `sft` and `dpo` share, written once: the steps of a training run, and the processes that
run tinker-cookbook's loops.

A run goes through the same steps whichever loop trains it; sft (train.py) and dpo
(preference.py) bring their own settings (a RunSettings subclass) and data (a RunData subclass):

1. resolved settings (`RunSettings.resolve`): every default filled in and every value checked,
   or for a resumed run (`resume_record`) the settings it was started with;
2. preflight (`preflight`): validate's checks of the data, the held-out overlap, the cost
   estimate, the budget guard and the engine's service. A refusal comes before anything is written;
3. the log dir (`prepare_log_dir`): a new one claimed and its inputs and run record written
   atomically, or a resumed one's record brought up to date;
4. the run (`run`): the cookbook's loop in a kept child process (`run_cookbook`, runner.py)
   with a progress bar and `on_metrics` fed from metrics.jsonl, and the engine watched;
5. read back: runlog.read_training_log.

`train` runs steps 2 to 5. The child process is kept for the next run (importing the cookbook and
the SDK takes seconds), also after an error or an interrupt where it forks a new worker for the next
run (runner.RESTARTS; replaced elsewhere), and ends with this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping, TypeVar

from ..errors import EngineError
from .runlog import (HELDOUT_ACCURACY, HELDOUT_DATA, MARKER, METRICS_FILE, TRAIN_LOG, MetricsTail, TrainResult,
                     claim_log_dir, hold_log_dir, load_marker, log_entries, new_log_dir, private_files,
                     read_training_log)

if TYPE_CHECKING:
    from ..checks.validate import ValidationResult

#: LoRA rank defaults: local models train rank-8 adapters (see LOCAL_LEARNING_RATE in train.py);
#: on Tinker the cookbook's rank.
LOCAL_LORA_RANK = 8
TINKER_LORA_RANK = 32

S = TypeVar("S", bound="RunSettings")

#: The learning-rate schedules the cookbook's loops know (tinker_cookbook.utils.lr_scheduling.LRSchedule).
LR_SCHEDULES = ("linear", "cosine", "constant")


def finite(value: Any) -> bool:
    """Whether a setting is a real number that is neither NaN nor infinite (a bool is not one).

    Args:
        value: the setting's value.

    Returns:
        True for a finite int or float.
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plain(value: Any) -> Any:
    """A numpy number (a DataFrame cell, a step of np.arange) as the Python int or float it stands
    for, since a run's record and its child's spec are JSON; any other value as it is."""
    import numbers

    if isinstance(value, bool) or type(value) in (int, float):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


# ---------------------------------------------------------------------------------------------
# 1. resolved settings


def inspect_spec(tasks: Any, settings: Any, call: str) -> dict | None:
    """The child's `inspect` settings for sft's or dpo's `inspect_tasks`, checked before anything
    runs (`call`: "sft" or "dpo", for the messages); None without tasks.

    Args:
        tasks: Inspect task names or files, one or a list.
        settings: the run's settings (its eval_every, eval_max_tokens, eval_temperature).
        call: the function's name.
    """
    if tasks is None:
        return None
    from ..evaluation.inspect_logs import require_inspect

    require_inspect(f"{call}(inspect_tasks=…)")
    tasks = [tasks] if isinstance(tasks, (str, os.PathLike)) else list(tasks)
    for task in tasks:
        if not isinstance(task, (str, os.PathLike)):
            raise TypeError(f"{call}(inspect_tasks=…): {type(task).__name__} is not a task name or file: the "
                            "training loop runs in a child process, so give Inspect tasks by registry name "
                            "(\"inspect_evals/gsm8k\") or task file (\"tasks.py@name\", an absolute path or one "
                            "relative to the working directory)")
    if not tasks:
        return None
    return {"tasks": [os.fspath(t) for t in tasks], "every": settings.eval_every,
            "max_tokens": int(settings.eval_max_tokens), "temperature": float(settings.eval_temperature),
            "seed": 0, "concurrency": 8}


def resolve_target(model: str | None, engine: str | None) -> tuple[str, str]:
    """The model and engine a run uses, checked against each other.

    Args:
        model: the base model, or None: the engine's default model.
        engine: "local" or "tinker", or None: the model's own ("local/…" is local; none given: local).

    Returns:
        (model, engine).

    Raises:
        EngineError: an unknown engine, or one asked for the other's model.
    """
    from .. import engines

    if engine is None:
        engine = engines.engine_for(model) if model else "local"
    if engine not in engines.ENGINES:
        raise EngineError(f"Unknown engine {engine!r}: use 'local' or 'tinker'.")
    if model is None:
        model = engines.default_model(engine)
    engines.check_model(engine, model)
    return model, engine


def refuse_unpriced(model: str, needs: tuple[str, ...] = ("train",), what: str = "training it") -> None:
    """Refuse a Tinker run whose cost cannot be bounded, before anything else is looked up.

    Args:
        model: the model to train.
        needs: the Price fields the run's cost needs (default ("train",); DPO also "prefill").
        what: the run, as the message names it (default "training it").

    Raises:
        UnknownPrice: no price for the model, or one of `needs` missing.
    """
    from ..checks.pricing import UnknownPrice, price_for

    row = price_for(model)  # an unknown model raises UnknownPrice itself
    if any(getattr(row, name) is None for name in needs):
        names = " or ".join("training" if n == "train" else n for n in needs)
        fields = ", ".join(f"{n}=…" for n in needs)
        raise UnknownPrice(f"No {names} price is known for {model!r}: cannot bound the cost of {what}. Call "
                           f"machine_nb.checks.pricing.set_price({model!r}, {fields}) with Tinker's "
                           f"price{'s' if len(needs) > 1 else ''}.")


@dataclass(frozen=True)
class Resumed:
    """An interrupted run to continue.

    Args:
        path: its log dir (claimed: this toolkit's, with checkpoints to resume from).
        record: its run record (machine_nb.json), as it was started.
    """

    path: Path
    record: dict


def resume_record(resume: str | os.PathLike | None, kind: str) -> Resumed | None:
    """Claim the log dir of a run to resume and read its run record.

    Args:
        resume: the log dir, or None (a new run).
        kind: "sft" or "dpo": the run must be one.

    Returns:
        The Resumed run, or None when `resume` is None.

    Raises:
        FileNotFoundError / FileExistsError: not a resumable dir this toolkit made (runlog.claim_log_dir).
        MachineFormatError: a run record that cannot be read, naming it.
        ValueError: a run of the other kind.
    """
    if resume is None:
        return None
    path = Path(resume).absolute()
    claim_log_dir(path, resume=True)
    record = load_marker(path)
    started = record.get("kind", "sft")
    if started != kind:
        raise ValueError(f"resume={str(path)!r} is not a {kind} run but a {started} run: continue it with "
                         f"machine_nb.{started}(…, resume=…), not {kind}()")
    return Resumed(path, record)


def refuse_if_training(path: str | os.PathLike | None) -> None:
    """Refuse at once a log dir a run is training in now (another kernel, thread or process), before
    a training process is started for a call that would be refused; the run's own hold is taken
    with its claim (prepare_log_dir).

    Args:
        path: the log dir a call resumes or starts in (None, or not a folder yet: nothing to check).

    Raises:
        LogDirInUse: a run holds it.
    """
    if path is not None and Path(path).is_dir():
        with hold_log_dir(Path(path).absolute()):
            pass


@dataclass(frozen=True)
class RunSettings:
    """A training run's settings, every default resolved: what its run record keeps and its loop runs with.

    Args:
        model: the base model (its renderer formats the data).
        engine: "local" or "tinker".
        epochs: passes over the data (default 10).
        batch_size: rows (or pairs) a step; the partial last batch is dropped (default 8).
        max_steps: stop after this many steps (default None: epochs x full batches).
        learning_rate: the peak learning rate (default None: the kind's, see `default_learning_rate`).
        lora_rank: the LoRA rank, 0 = full fine-tuning (default None: 8 for local models, 32 on Tinker).
        seed: the data order (default 0).
        max_length: tokens a sequence may hold (default None: a local model's context, no limit on Tinker).
        lr_schedule: the cookbook's learning-rate schedule (default "linear": decays to 0).
        save_every: a checkpoint every N steps (default 20, the cookbook's), so a Ctrl-C loses little.
        base_url: the Tinker service URL (default None: $TINKER_BASE_URL, else Tinker's); the run
            record never keeps it (runner.py hands it to the SDK without writing it).
        max_usd: the budget on Tinker (default None: none; an unknown price is still refused).
        eval_every: score the held-out rows every N steps (default None: once an epoch).
        eval_max_tokens: output tokens a held-out reply may use (default 32).
        eval_temperature: the held-out evals' sampling temperature (default 0.0: greedy).
    """

    kind: ClassVar[str] = ""
    #: The loss a step logs (a metrics row with it is a step), and what the progress bar shows: label -> metric.
    loss: ClassVar[str] = ""
    shown: ClassVar[Mapping[str, str]] = {}
    #: The Price fields a Tinker run's cost needs; the run as a refusal names it, and as the budget guard does.
    priced: ClassVar[tuple[str, ...]] = ("train",)
    priced_what: ClassVar[str] = "training it"
    spend: ClassVar[str] = "training {model}"
    #: Whether the loop also scores before its last step (the cookbook's DPO loop does).
    evals_before_last: ClassVar[bool] = False
    #: Settings a resumed run takes from its run record (so the resumed run is the same run).
    resumed: ClassVar[tuple[str, ...]] = ("model", "engine", "epochs", "batch_size", "max_steps", "learning_rate",
                                          "lora_rank", "seed", "max_length", "lr_schedule", "save_every")

    model: str
    engine: str
    epochs: int = 10
    batch_size: int = 8
    max_steps: int | None = None
    learning_rate: float | None = None
    lora_rank: int | None = None
    seed: int = 0
    max_length: int | None = None
    lr_schedule: str = "linear"
    save_every: int = 20
    base_url: str | None = None
    max_usd: float | None = None
    eval_every: int | None = None
    eval_max_tokens: int = 32
    eval_temperature: float = 0.0

    @classmethod
    def resolve(cls: type[S], resumed: Resumed | None, /, **given: Any) -> S:
        """The settings of a run, from its call's arguments (or, resumed, the run's own).

        Args:
            resumed: the run to continue (its record's settings win), or None.
            **given: the call's settings by field name, each passed on explicitly by `sft` or
                `dpo` (model and engine may be None; a field not given keeps its default).

        Returns:
            The settings, every default filled in.

        Raises:
            EngineError: an unknown engine or a model it does not serve.
            UnknownPrice: on Tinker, a price the run's cost needs is unknown.
            ValueError: a value out of range. TypeError: a name that is not a field.
            MachineFormatError: a resumed run record whose held-out settings are incomplete.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}")
        values = {name: _plain(value) for name, value in given.items()}
        if resumed is not None:
            values.update({k: resumed.record[k] for k in cls.resumed if k in resumed.record})
            held = resumed.record.get("heldout")
            if isinstance(held, dict):
                missing = [k for k in ("every", "max_tokens", "temperature") if k not in held]
                if missing:
                    from ..errors import MachineFormatError

                    raise MachineFormatError(resumed.path / MARKER, f"the run's held-out settings lack "
                                             f"{', '.join(missing)}: the record was edited or damaged; put "
                                             "the run's values back to resume it", field=f"heldout.{missing[0]}")
                values.update(eval_every=held["every"], eval_max_tokens=held["max_tokens"],
                              eval_temperature=held["temperature"])
        values["model"], values["engine"] = resolve_target(values.get("model"), values.get("engine"))
        if values["engine"] == "tinker":  # an unbounded cost is refused before anything else is looked up
            refuse_unpriced(values["model"], cls.priced, cls.priced_what)
        settings = cls(**values)
        settings.check()
        return settings.with_defaults()

    @property
    def renderer(self) -> str:
        """The model's renderer name (what formats the rows for the cookbook)."""
        from ..checks.render import renderer_name

        return renderer_name(self.model)

    @property
    def local_model(self) -> bool:
        """Whether the model is one of the local engine's (`local/…`)."""
        from ..checks.render import is_local_model

        return is_local_model(self.model)

    def check(self) -> None:
        """Refuse values no run can use, naming the setting, before anything is written.

        Raises:
            ValueError: epochs, batch_size, max_steps, save_every, seed, lora_rank, eval_every or
                eval_max_tokens not a whole number; epochs, batch_size or eval_max_tokens below 1,
                seed or eval_every below 0, max_steps below 1, save_every below 0 (0: no
                periodic checkpoints, as the cookbook reads it), or a LoRA rank below 1 (0, full
                fine-tuning, is for local models only) or, on a local model, past its width; a
                learning_rate that is not a finite number above 0; an lr_schedule the cookbook does
                not know; an eval_temperature or max_usd that is not a finite number, 0 or more (a
                NaN budget would bound nothing).
        """
        for name in ("epochs", "batch_size", "max_steps", "save_every", "seed", "lora_rank", "eval_every",
                     "eval_max_tokens"):
            value = getattr(self, name)
            if (value is not None or name not in ("max_steps", "lora_rank", "eval_every")) and (
                    isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be 0 or more (it seeds the data order), got {self.seed}")
        if self.eval_every is not None and self.eval_every < 0:
            raise ValueError(f"eval_every must be at least 0 (0: no held-out evals while training) or None, got "
                             f"{self.eval_every}")
        if self.eval_max_tokens < 1:
            raise ValueError(f"eval_max_tokens must be at least 1 (a held-out reply's budget), got "
                             f"{self.eval_max_tokens}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be at least 1 (got epochs={self.epochs}, "
                             f"batch_size={self.batch_size})")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1 or None, got {self.max_steps}")
        rank = self.lora_rank
        if rank is not None and (rank < 0 or (rank == 0 and not self.local_model)):
            raise ValueError(f"lora_rank must be at least 1 (0 = full fine-tuning, local models only), got {rank}")
        if rank is not None:
            from ..engines import max_lora_rank

            if (most := max_lora_rank(self.model)) is not None and rank > most:
                raise ValueError(f"lora_rank {rank} is past {self.model}'s width: give at most {most} (a higher "
                                 "rank adds no capacity, only memory)")
        if self.save_every < 0:
            raise ValueError(f"save_every must be at least 0 (0: no checkpoint before the final one), got "
                             f"{self.save_every}")
        if self.learning_rate is not None and not (finite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a finite number above 0 (or None), got {self.learning_rate!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(map(repr, LR_SCHEDULES))}, got "
                             f"{self.lr_schedule!r}")
        if not (finite(self.eval_temperature) and self.eval_temperature >= 0):
            raise ValueError(f"eval_temperature must be a finite number, 0 or more, got {self.eval_temperature!r}")
        from ..checks.pricing import check_max_usd

        check_max_usd(self.max_usd)

    def default_learning_rate(self) -> float:
        """The learning rate when none is given (each kind has its own).

        Returns:
            The rate.
        """
        raise NotImplementedError

    def with_defaults(self: S) -> S:
        """These settings with lora_rank, learning_rate and max_length filled in.

        Returns:
            A copy (the settings are frozen).
        """
        from .. import engines
        from ..checks.render import base_model

        out = self
        if out.lora_rank is None:
            out = dataclasses.replace(out, lora_rank=LOCAL_LORA_RANK if self.local_model else TINKER_LORA_RANK)
        if out.learning_rate is None:
            out = dataclasses.replace(out, learning_rate=out.default_learning_rate())
        if out.max_length is None and self.local_model:
            out = dataclasses.replace(out, max_length=engines.model_context(base_model(self.model)))
        return out

    def record(self) -> dict[str, Any]:
        """The settings as the run record keeps them.

        Returns:
            engine, model, renderer and every `resumed` setting.
        """
        return {"engine": self.engine, "model": self.model, "renderer": self.renderer,
                **{k: getattr(self, k) for k in self.resumed if k not in ("model", "engine")}}

    def spec(self) -> dict[str, Any]:
        """The settings as the child process's loop takes them (`Config` fields, by the spec's names).

        Returns:
            A JSON-shaped dict.
        """
        from ..checks.render import base_model

        return {"model": base_model(self.model), "renderer": self.renderer, "max_length": self.max_length,
                "batch_size": self.batch_size, "seed": self.seed, "learning_rate": self.learning_rate,
                "lr_schedule": self.lr_schedule, "epochs": self.epochs, "lora_rank": self.lora_rank,
                "save_every": self.save_every, "max_steps": self.max_steps, "local_models": self.local_model}

    def resume_update(self, resumed: Resumed, per_epoch: int, steps: int) -> dict[str, Any] | None:
        """What a resume adds to the run record before the loop continues.

        Args:
            resumed: the run. per_epoch: steps an epoch. steps: the run's steps.

        Returns:
            Record keys to update, or None (the default: nothing).
        """
        return None


# ---------------------------------------------------------------------------------------------
# the data a run trains on, and its held-out rows


class RunData:
    """What a run trains on, checked: its items, and how they are validated, priced and written.

    Args:
        items: the checked rows (sft) or pair records (dpo), in order.
    """

    #: The file the loop reads in the log dir; the items' name; what adding more of them means;
    #: what names one item in a message ("line 3", "pair 3").
    file: ClassVar[str] = ""
    noun: ClassVar[str] = ""
    unit: ClassVar[str] = ""
    item: ClassVar[str] = ""

    def __init__(self, items: list[dict]):
        self.items = items

    def validate(self, settings: RunSettings) -> "ValidationResult":
        """validate()'s checks of every item, as `validate.preflight` makes them.

        Args:
            settings: the run's settings (model and max_length).

        Returns:
            The ValidationResult (ok).

        Raises:
            ValidationFailed: naming the first items that fail.
        """
        raise NotImplementedError

    def prompts(self) -> Iterator[tuple[int, list]]:
        """Each item's prompt, for the held-out overlap check.

        Returns:
            (the item's 1-based number, its messages) pairs; a trailing reply is ignored.
        """
        return ((i, item["messages"]) for i, item in enumerate(self.items, start=1))

    def lines(self, settings: RunSettings) -> list[dict]:
        """The lines of the log dir's data file, as the cookbook reads them.

        Args:
            settings: the run's settings.

        Returns:
            The JSONL lines.
        """
        return self.items

    def record(self) -> dict[str, Any]:
        """What the run record says of the data.

        Returns:
            Record keys (e.g. how many rows).
        """
        return {}


def data_source(resumed: Resumed | None, file: str, given: Any) -> Any:
    """Where a run's data comes from: a resumed run's own copy of what it started with, else `given`.

    Args:
        resumed: the run being resumed, or None.
        file: the data file in its log dir (train.jsonl, pairs.jsonl).
        given: the data the call was given.

    Returns:
        A path or the given data.

    Raises:
        FileNotFoundError: a resumed run whose copy is gone: the loop reads that copy, and the
            rows given now may differ from the ones the run started with.
    """
    if resumed is None:
        return given
    if not (resumed.path / file).is_file():
        raise FileNotFoundError(f"resume={str(resumed.path)!r}: its {file} (the rows the run started with, "
                                "which the resumed loop reads) is missing, so the run cannot continue as it "
                                f"started (nothing there was changed). Put {file} back in that folder, or start a "
                                "new run.")
    return resumed.path / file  # the very rows the run started with


def count_steps(settings: RunSettings, data: RunData) -> tuple[int, int]:
    """Steps an epoch and steps in all, as the cookbook counts them.

    Args:
        settings: epochs, batch_size, max_steps.
        data: the items.

    Returns:
        (steps an epoch, the run's steps).

    Raises:
        ValueError: fewer items than one batch (the cookbook would train 0 steps).
    """
    n = len(data.items)
    if n < settings.batch_size:
        raise ValueError(f"{n} {data.noun} make no full batch of {settings.batch_size}; the cookbook would train 0 "
                         f"steps. Lower batch_size or add {data.unit}.")
    per_epoch = n // settings.batch_size
    steps = per_epoch * settings.epochs
    return per_epoch, steps if settings.max_steps is None else min(steps, settings.max_steps)


def eval_schedule(start_step: int, total_steps: int, eval_every: int, *, last: bool = False) -> list[int]:
    """The steps at which a cookbook training loop calls its evaluators, in order.

    `supervised.train.main` evaluates before submitting step s when s % eval_every == 0, for s
    from the step it starts (or resumes) at up to the last; so the eval at step s sees the
    weights after s optimizer steps (step 0: the starting weights). `preference.train_dpo` also
    evaluates before its last step (`last=True`).

    Args:
        start_step: the first step the loop runs (0, or where a resumed run continues).
        total_steps: steps of the whole run.
        eval_every: N (0: never).
        last: also the last step, total_steps - 1 (default False: the supervised loop's rule).

    Returns:
        The steps, ascending.
    """
    if eval_every <= 0:
        return []
    return [s for s in range(start_step, total_steps) if s % eval_every == 0 or (last and s == total_steps - 1)]


def eval_count(steps: int, every: int, *, last: bool = False) -> int:
    """How many times a run scores its held-out rows: at its eval steps, then the final checkpoint.

    Args:
        steps: the run's steps.
        every: score every N steps.
        last: the loop also scores before its last step (DPO; default False).

    Returns:
        The number of evals.
    """
    return len(eval_schedule(0, steps, every, last=last)) + 1


#: The fields of an eval row that the held-out evals read (check_row fills in match and format).
HELD_OUT_FIELDS = ("messages", "expected", "match", "format")


@dataclass(frozen=True)
class HeldOut:
    """A run's held-out evals, checked before anything is written.

    Args:
        rows: the eval rows, each checked as evaluate() checks it (with its `line`).
        source: the eval file the user gave (None for in-memory rows).
        source_sha256: that file's SHA-256 (None for in-memory rows).
        every: score every N steps.
        evals: how many times the rows are scored (eval steps and the final checkpoint).
        max_tokens: output tokens a reply may use.
        temperature: the sampling temperature.
        renderer: the renderer that formats the prompts.
        seed: the sampling seed (default 0).
    """

    rows: tuple[dict, ...]
    source: str | None
    source_sha256: str | None
    every: int
    evals: int
    max_tokens: int
    temperature: float
    renderer: str
    seed: int = 0

    def lines(self) -> list[dict]:
        """The rows as the log dir's heldout_data.jsonl keeps them: the fields the evals read
        (HELD_OUT_FIELDS), as checked; a row's other fields (a frame's extra columns, which JSON
        may not hold: a date) stay in the source.

        Returns:
            The JSONL lines.
        """
        return [{k: r[k] for k in HELD_OUT_FIELDS if k in r} for r in self.rows]

    def record(self) -> dict[str, Any]:
        """The evals as the run record and the child's spec keep them.

        Returns:
            source, source_sha256, n, every, evals, max_tokens, temperature, seed, renderer.
        """
        return {"source": self.source, "source_sha256": self.source_sha256, "n": len(self.rows),
                "every": self.every, "evals": self.evals, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "seed": self.seed, "renderer": self.renderer}


def plan_heldout(settings: RunSettings, eval_data: Any, resumed: Resumed | None, *, per_epoch: int,
                 steps: int) -> HeldOut | None:
    """The held-out evals of a run, every row checked and rendered before anything is written.

    Args:
        settings: eval_every, eval_max_tokens, eval_temperature and the model.
        eval_data: a JSONL path, a list of row dicts or a DataFrame of them (evaluate()'s shape),
            or None: no evals. A resumed run scores the rows it started with.
        resumed: the run being resumed, or None.
        per_epoch: steps an epoch (eval_every's default).
        steps: the run's steps.

    Returns:
        The HeldOut, or None without evals.

    Raises:
        MachineFormatError: a bad row (file, line, field), a row the renderer cannot format, or no rows.
        ValueError: eval_every or eval_max_tokens below 1.
    """
    from ..core.chat import eval_rows
    from ..evaluation.results import file_sha256
    from ..evaluation.sampling import render_prompts, renderer_for

    saved = resumed.record.get("heldout") if resumed is not None else None
    if resumed is not None:
        eval_data = resumed.path / HELDOUT_DATA if saved else None
    if eval_data is None:
        return None
    rows, source = eval_rows(eval_data)  # a DataFrame's rows without their missing cells (frame_rows)
    every = per_epoch if settings.eval_every is None else settings.eval_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"eval_every must be a whole number of steps, at least 1 (got {settings.eval_every!r})")
    max_tokens = settings.eval_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"eval_max_tokens must be at least 1, got {max_tokens!r}")
    renderer, name = renderer_for(settings.model, None)
    render_prompts(renderer, rows, source)  # a row the renderer cannot format fails now, not mid-run
    sha = file_sha256(source)
    if isinstance(saved, dict):  # the file the run was started with, not the log dir's copy
        source, sha = saved.get("source"), saved.get("source_sha256")
    return HeldOut(rows=tuple(rows), source=source, source_sha256=sha, every=every,
                   evals=eval_count(steps, every, last=settings.evals_before_last), max_tokens=int(max_tokens),
                   temperature=float(settings.eval_temperature), renderer=name)


# ---------------------------------------------------------------------------------------------
# 2. preflight


def refuse_overlap(data: RunData, heldout: HeldOut | None, result: "ValidationResult") -> None:
    """Refuse items whose prompt is one of the held-out rows' (validate's eval_overlap rule, by
    validate.prompt_keys): the held-out score would be measured on trained data.

    Args:
        data: the run's items.
        heldout: its held-out evals (None: nothing to check).
        result: validate's result for the items, which the refusal carries with its findings added.

    Raises:
        ValidationFailed: naming the first items whose prompt is a held-out row's.
    """
    if heldout is None:
        return
    import pandas as pd

    from ..errors import ValidationFailed
    from ..checks.validate import FINDING_COLUMNS, prompt_keys

    held: dict[bytes, str] = {}
    for i, row in enumerate(heldout.rows, start=1):
        line = row.get("line") or i
        held.setdefault(prompt_keys(row["messages"])[0],
                        f"line {line} of {heldout.source}" if heldout.source else f"eval_data row {line}")
    found = [(number, f"this prompt is also {held[key]}: the held-out score would be measured on trained data")
             for number, messages in data.prompts() if (key := prompt_keys(messages)[0]) in held]
    if not found:
        return
    findings = pd.DataFrame([(number, "error", "eval_overlap", message) for number, message in found],
                            columns=FINDING_COLUMNS)
    frame = pd.concat([result.findings, findings], ignore_index=True)
    frame["line"] = pd.array(frame["line"].tolist(), dtype="Int64")
    failed = dataclasses.replace(result, findings=frame, ok=False,
                                 summary={**result.summary, "errors": result.summary.get("errors", 0) + len(found)})
    listed = "; ".join(f"{data.item} {number}: eval_overlap: {message}" for number, message in found[:5])
    more = f"; … {len(found) - 5} more" if len(found) > 5 else ""
    raise ValidationFailed(f"{len(found)} of the {data.noun} share a prompt with the held-out rows, refused before "
                           f"training: {listed}{more}", failed, line=found[0][0])


def estimate_run(kind: str, items: Any, model: str, engine: str, *, epochs: int, batch_size: int,
                 max_steps: int | None, eval_rows: Any = None, evals: int = 0,
                 eval_max_tokens: int = 32) -> dict[str, Any]:
    """What a run is estimated to cost before it starts: training plus its held-out evals.

    Args:
        kind: "sft" (pricing.estimate_cost) or "dpo" (pricing.estimate_dpo_cost: training, the
            policy's forward pass and the reference model's).
        items: the training rows or the pairs.
        model: the model.
        engine: "local" (free) or "tinker".
        epochs: passes over the data.
        batch_size: items a step.
        max_steps: the step cap (None: none).
        eval_rows: the held-out rows (default None: no evals).
        evals: how many times they are scored (`eval_count`; default 0).
        eval_max_tokens: output tokens a reply (default 32).

    Returns:
        {"usd" (None when a price is unknown), "train_usd", "eval_usd", "tokens" (tokens the
        training is priced on), "evals", "exact", "price_source", "price_date"}: 0 on the local engine,
        and for fewer items than one batch (a run the trainer refuses).
    """
    from ..checks.pricing import UnknownPrice, estimate_cost, estimate_dpo_cost, estimate_eval_cost

    price_training = estimate_dpo_cost if kind == "dpo" else estimate_cost
    try:
        train = price_training(items, model, epochs=epochs, batch_size=batch_size, max_steps=max_steps)
    except UnknownPrice:
        return {"usd": None, "train_usd": None, "eval_usd": None, "tokens": None, "evals": evals, "exact": None,
                "price_source": None, "price_date": None}
    full = ((train.pairs if kind == "dpo" else train.rows) // batch_size) * epochs
    # no full batch: the trainer refuses the run (pricing.no_full_batch), so nothing is trained or scored
    tokens = round(train.tokens * epochs * train.steps / full) if full else 0
    eval_usd: float | None = 0.0
    if eval_rows is not None and evals and full:
        try:
            eval_usd = estimate_eval_cost(eval_rows, model, max_tokens=eval_max_tokens).usd * evals
        except UnknownPrice:
            eval_usd = None
    train_usd = train.usd
    if engine == "local":
        train_usd, eval_usd = 0.0, 0.0
    usd = None if eval_usd is None else train_usd + eval_usd
    return {"usd": usd, "train_usd": train_usd, "eval_usd": eval_usd, "tokens": tokens, "evals": evals,
            "exact": train.exact, "price_source": train.price.source, "price_date": train.price.date}


@dataclass(frozen=True)
class Preflight:
    """What a run's preflight established.

    Args:
        estimate: the cost estimate (`estimate_run`), which the run record keeps.
        base_url: the URL of the engine's service, which answered.
    """

    estimate: dict
    base_url: str


def preflight(settings: RunSettings, data: RunData, heldout: HeldOut | None, steps: int) -> Preflight:
    """Every check before a run writes or spends anything.

    validate()'s checks of the data (the same a file gets), no item whose prompt is a held-out
    row's, the cost estimate (training plus the held-out evals), on Tinker the budget, and the
    engine's service (on Tinker a base URL without a query, the key, and the service answer,
    within seconds).

    Args:
        settings: the run's settings.
        data: its data.
        heldout: its held-out evals, or None.
        steps: the run's steps.

    Returns:
        The Preflight.

    Raises:
        ValidationFailed: data validate rejects, or an item trained on a held-out prompt.
        BudgetExceeded: on Tinker, over `max_usd`, or a price unknown.
        EngineError: a base URL with a query (engines.check_base_url), no key, or the service does not answer.
    """
    from .. import engines

    refuse_overlap(data, heldout, data.validate(settings))
    estimate = estimate_run(settings.kind, data.items, settings.model, settings.engine, epochs=settings.epochs,
                            batch_size=settings.batch_size, max_steps=settings.max_steps,
                            eval_rows=None if heldout is None else heldout.lines(),
                            evals=0 if heldout is None else heldout.evals, eval_max_tokens=settings.eval_max_tokens)
    if settings.engine == "tinker":
        from ..checks.pricing import check_budget

        engines.check_base_url(engines.base_url(settings.engine, settings.base_url))
        what = settings.spend.format(model=settings.model)
        check_budget(estimate["usd"], settings.max_usd, f"{what} for {settings.epochs} epoch(s)"
                     + (f" with {estimate['evals']} held-out evals" if heldout else ""))
    return Preflight(estimate, engines.check_service(settings.engine, settings.base_url, (settings.model,)))


# ---------------------------------------------------------------------------------------------
# 3. the log dir


@contextlib.contextmanager
def prepare_log_dir(settings: RunSettings, data: RunData, heldout: HeldOut | None, checked: Preflight, *,
                    resumed: Resumed | None, log_dir: str | os.PathLike | None, workspace: str | os.PathLike | None,
                    name: str | None, source: Any, per_epoch: int, steps: int) -> Iterator[tuple[Path, set[str]]]:
    """The run's log dir, ready for the loop and held for it (runlog.hold_log_dir): a new one
    claimed, with its data, held-out rows and run record written atomically; or a resumed one, its
    record brought up to date.

    Args:
        settings: the run's settings.
        data: its data.
        heldout: its held-out evals, or None.
        checked: its preflight (the estimate goes into the record).
        resumed: the run being resumed, or None.
        log_dir: a new run's dir (None: runlog.new_log_dir under `workspace`, or under runs/).
        workspace: see log_dir (None: none).
        name: the new dir's name (None: `<kind>-<time>-<hex>`).
        source: the data as the call gave it (its path is recorded).
        per_epoch: steps an epoch.
        steps: the run's steps.

    Returns:
        A context manager yielding (the log dir, what was in it before the run: runlog.log_entries,
        empty for a new one) while the dir is held.

    Raises:
        LogDirInUse: a run is training in the dir now.
        FileExistsError: a log dir that is not new or empty (runlog.claim_log_dir).
    """
    from ..core.jsonl import atomic_write_text, write_jsonl

    path = (resumed.path if resumed is not None else Path(log_dir).absolute() if log_dir is not None
            else new_log_dir(settings.kind, workspace=workspace, name=name))
    if not path.is_dir():
        claim_log_dir(path, resume=resumed is not None)  # refuses a file; makes a new run's dir
    with hold_log_dir(path):
        claim_log_dir(path, resume=resumed is not None)  # again, held: no run came in meanwhile
        if resumed is not None:
            resumed = Resumed(path, load_marker(path))  # as the last run there left it
            update = settings.resume_update(resumed, per_epoch, steps)
            if update:
                atomic_write_text(path / MARKER, json.dumps({**resumed.record, **update}, indent=1))
            yield path, log_entries(path)
            return
        write_jsonl(data.lines(settings), path / data.file)
        if heldout is not None:
            write_jsonl(heldout.lines(), path / HELDOUT_DATA)
        record = {"kind": settings.kind, **settings.record(), **data.record(), "steps": steps,
                  "source": str(source) if isinstance(source, (str, os.PathLike)) else f"<in-memory {data.unit}>",
                  "heldout": None if heldout is None else heldout.record(), "estimate": checked.estimate}
        atomic_write_text(path / MARKER, json.dumps(record, indent=1))
        yield path, set()


# ---------------------------------------------------------------------------------------------
# 4. the run


def child_spec(module: str, settings: RunSettings, data: RunData, path: Path, checked: Preflight,
               heldout: HeldOut | None, **extra: Any) -> dict[str, Any]:
    """What the child process needs to run the loop: plain JSON.

    Args:
        module: the module whose `child_run(spec)` builds the cookbook's Config and runs it.
        settings: the run's settings.
        data: its data (the file the loop reads).
        path: its log dir.
        checked: its preflight (the service's URL).
        heldout: its held-out evals, or None.
        **extra: the kind's own keys.

    Returns:
        The spec.
    """
    return {"module": module, "data_path": str(path / data.file), "log_dir": str(path), **settings.spec(),
            "base_url": checked.base_url,
            "heldout": None if heldout is None else {**heldout.record(), "path": str(path / HELDOUT_DATA)}, **extra}


def ended_message(code: int | None, log_dir: Path) -> str:
    """Why a run failed when its training process ended without a word: its exit code, or the
    signal that killed it (SIGKILL is most often the system out of memory), and the way on.

    Args:
        code: the process's return code (negative: killed by that signal).
        log_dir: the run's log dir.

    Returns:
        The message.
    """
    import signal

    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = f"killed by {name}" + (": most often the system ran out of memory" if name == "SIGKILL" else "")
    else:
        why = f"exit code {code}"
    return (f"the training process ended unexpectedly ({why}); see {log_dir / TRAIN_LOG}. The log dir resumes "
            f"from its last checkpoint: call again with resume={str(log_dir)!r}")


def run(settings: RunSettings, spec: dict, path: Path, *, steps: int, before: set[str], progress: bool | None,
        on_metrics: Callable[[list[dict]], Any] | None) -> None:
    """Run the loop in the child process, with a progress bar and `on_metrics` fed from metrics.jsonl.

    Args:
        settings: the run's settings (its kind names the bar; `shown` says what it shows).
        spec: `child_spec`'s.
        path: the log dir.
        steps: the run's steps (the bar's total).
        before: what was in the log dir before the run (left as it is by the tightening after it).
        progress: show the bar (None: machine_nb.core.progress decides; False: never).
        on_metrics: called in this thread with each list of new metrics rows (default None).

    Raises:
        KeyboardInterrupt: a Ctrl-C (the run stops; its files stay whole and it can be resumed).
        EngineError: the run failed, or the service stopped answering.
    """
    from .. import engines
    from ..core.progress import progress as progress_bar

    loss = settings.loss
    tail = MetricsTail(path / METRICS_FILE)
    seen_steps: set[Any] = set()
    watchdog = engines.watchdog(settings.engine, spec["base_url"])
    with progress_bar(total=steps, desc=settings.kind, unit="steps", enabled=progress) as bar, watchdog as dog:

        def poll() -> None:
            new = tail.new_rows()
            done = [m for m in new if loss in m and m.get("step") not in seen_steps]
            seen_steps.update(m.get("step") for m in done)
            scored = [m[HELDOUT_ACCURACY] for m in new if isinstance(m.get(HELDOUT_ACCURACY), (int, float))]
            if scored:
                bar.set_postfix(heldout=float(scored[-1]))
            if done:
                bar.update(len(done), **{label: float(done[-1].get(metric, 0.0))
                                         for label, metric in settings.shown.items()})
            if new and on_metrics is not None:
                on_metrics(new)

        try:
            run_cookbook(spec, path, engine=settings.engine, on_poll=poll, watchdog=dog)
        finally:
            private_files(path, before)


def train(settings: RunSettings, data: RunData, *, module: str, eval_data: Any, resumed: Resumed | None,
          log_dir: str | os.PathLike | None, workspace: str | os.PathLike | None, name: str | None, source: Any,
          progress: bool | None, on_metrics: Callable[[list[dict]], Any] | None, **spec_extra: Any) -> TrainResult:
    """A run with resolved settings and checked data: preflight, the log dir, the loop, read back.

    Args:
        settings: the run's settings (`RunSettings.resolve`).
        data: its data.
        module: the module whose `child_run` runs the loop in the child.
        eval_data: the held-out rows (see `plan_heldout`), or None.
        resumed: the run being resumed, or None.
        log_dir: where a new run goes (see `prepare_log_dir`).
        workspace: see `prepare_log_dir`.
        name: see `prepare_log_dir`.
        source: the data as the call gave it.
        progress: see `run`.
        on_metrics: see `run`.
        **spec_extra: the kind's own keys for the child.

    Returns:
        The TrainResult read back from the log dir (runlog.read_training_log), with the
        settings' model and engine.
    """
    per_epoch, steps = count_steps(settings, data)
    heldout = plan_heldout(settings, eval_data, resumed, per_epoch=per_epoch, steps=steps)
    checked = preflight(settings, data, heldout, steps)
    with prepare_log_dir(settings, data, heldout, checked, resumed=resumed, log_dir=log_dir, workspace=workspace,
                         name=name, source=source, per_epoch=per_epoch, steps=steps) as (path, before):
        run(settings, child_spec(module, settings, data, path, checked, heldout, **spec_extra), path, steps=steps,
            before=before, progress=progress, on_metrics=on_metrics)
    result = read_training_log(path)
    result.model, result.engine = settings.model, settings.engine
    return result


# ---------------------------------------------------------------------------------------------
# the child processes that run the cookbook (runner.py says why a child)


def start_runner() -> None:
    """Start the process for the coming run now, unless one is idle, so that its imports go on
    while the caller reads and checks the data (`sft` and `dpo` call it once their settings
    resolve). A run refused by those checks leaves it idle, as after a run, for the next one."""
    with _Runner._lock:
        if _Runner._idle:
            return
    runner = _Runner()
    with _Runner._lock:
        _Runner._idle.append(runner)


def _child_env(engine: str) -> dict[str, str]:
    """The run's environment: the caller's, unchanged, except that on the local engine the
    training loop sends the local server's own key (the user's TINKER_API_KEY never goes to the local server)."""
    from ..engines import LOCAL_API_KEY

    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if engine == "local":
        env["TINKER_API_KEY"] = LOCAL_API_KEY
    return env


class _Runner:
    """A child process (runner.py) that runs training loops one after another.

    Kept for the next run, since importing tinker-cookbook and the SDK takes seconds, and ended with
    this process (it exits when its stdin closes). After an error or an interrupt it is kept too
    where it forks a new worker for the next run (`restarts`), and replaced elsewhere.
    """

    _idle: "list[_Runner]" = []
    _keep = 1  # idle processes kept for the next run (keep_runners raises it while runs go in parallel)
    _lock = threading.Lock()

    def __init__(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-m", "machine_nb.training.runner"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_child_env("local"))
        self.events: "list[dict]" = []
        self._sent: int | None = None  # the index of the first event of the last run sent
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
            start = self._sent = len(self.events)
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

    @property
    def restarts(self) -> bool:
        """Whether the process serves the next run after one that failed or was interrupted, as it
        said when it started (runner.RESTARTS: a new worker follows); False until it has said."""
        with self._cond:
            return bool(self.events and self.events[0].get("restarts"))

    def last_outcome(self) -> dict | None:
        """How the last run sent here ended (`outcome`); None while it goes, or when none was sent."""
        return None if self._sent is None else self.outcome(self._sent)

    def stop(self) -> None:
        """Ctrl-C for the run in progress, until it has ended. The first SIGINT cancels the run's
        event loop, which cannot land while it waits in a blocking SDK call; a second one, after
        a short grace, raises KeyboardInterrupt there; the process is killed if both fail. Then the
        process is kept for the next run where a new worker follows (`restarts`) and the run
        reported its end, and closed otherwise."""
        import signal

        def ended() -> bool:  # the process's output ends before it can be waited for
            exited = self.proc.poll() is not None or self.events[-1:] == [{"event": "exit"}]
            # `restarts` read each time: a process started a moment ago may not have said it yet
            return exited or (self.restarts and self.last_outcome() is not None)

        for grace in (3, 15):
            if ended():
                break
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGINT)
            with self._cond:
                self._cond.wait_for(ended, grace)
        if not ended():
            self.proc.kill()
            self.proc.wait()
        outcome = self.last_outcome()
        if self.restarts and outcome is not None and outcome["event"] != "exit":
            self.give_back()
        else:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(Exception):
            self.proc.wait(5)


@contextlib.contextmanager
def keep_runners(n: int) -> Iterator[None]:
    """While the block runs, keep up to `n` training processes for the next runs (one each for
    runs going in parallel: a fresh one takes seconds to import the cookbook); one afterwards.

    Args:
        n: processes to keep.

    Returns:
        A context manager.
    """
    with _Runner._lock:
        before, _Runner._keep = _Runner._keep, max(_Runner._keep, int(n))
    try:
        yield
    finally:
        with _Runner._lock:
            _Runner._keep = before
        _Runner.trim()


def run_cookbook(spec: dict, log_dir: Path, *, engine: str, on_poll: Callable[[], Any] | None = None,
                 poll_s: float = 0.2, watchdog: Any = None) -> None:
    """Run `runner.run(spec)` in a kept runner process, calling `on_poll()` in this thread meanwhile.

    Its console output goes to `<log dir>/train.log`. A KeyboardInterrupt here (or an error from
    `on_poll`, or a watchdog that saw the service die) stops the run (SIGINT, then harder) before
    re-raising; files it wrote stay whole.

    Args:
        spec: `child_spec`'s.
        log_dir: the run's log dir.
        engine: "local" (the child sends the local server's key) or "tinker".
        on_poll: called about every `poll_s` seconds while the run goes, and once after it (default None).
        poll_s: seconds between polls (default 0.2).
        watchdog: engines.watchdog's, checked at every poll (default None).

    Raises:
        KeyboardInterrupt: the run was interrupted.
        EngineError: the run failed (MachineFormatError when the server named a corrupt file).
    """
    spec = {**spec, "env": _child_env(engine), "cwd": os.getcwd(), "log": str(log_dir / TRAIN_LOG)}
    runner = _Runner.take()
    try:
        try:
            start = runner.send(spec)  # inside: an interrupt as the spec goes out stops the run too
        except BrokenPipeError:  # the process ended after it was handed out: the run never began there
            runner.close()
            runner = _Runner()
            try:
                start = runner.send(spec)
            except BrokenPipeError:  # a new process that ends at once: its exit code says why
                runner.proc.wait(30)
                raise EngineError(ended_message(runner.proc.returncode, log_dir)) from None
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
    if outcome["event"] == "done" or (runner.restarts and outcome["event"] != "exit"):
        runner.give_back()
    else:
        runner.close()
    if outcome["event"] == "done":
        return
    if outcome["event"] == "interrupted":
        raise KeyboardInterrupt("training was interrupted")
    if outcome["event"] == "exit":
        raise EngineError(ended_message(runner.proc.returncode, log_dir))
    from ..engines import explain

    if isinstance(outcome.get("body"), dict):
        class _Sdk(Exception):
            body = outcome["body"]
        raise explain(_Sdk(outcome["message"])) from None
    from ..core.redact import redacted

    raise EngineError(redacted(f"training failed: {outcome['type']}: {outcome['message']} "
                               f"(log: {log_dir / TRAIN_LOG})"))


__all__ = ["RunSettings", "RunData", "Resumed", "HeldOut", "Preflight", "resolve_target", "refuse_unpriced",
           "inspect_spec", "resume_record", "data_source", "count_steps", "eval_schedule", "eval_count",
           "plan_heldout", "refuse_overlap", "estimate_run", "preflight", "refuse_if_training", "prepare_log_dir",
           "child_spec", "run", "train", "keep_runners", "run_cookbook",
           "LOCAL_LORA_RANK", "TINKER_LORA_RANK"]
