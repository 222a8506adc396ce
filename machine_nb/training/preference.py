"""Preference training: tinker-cookbook's own DPO loop (`preference.train_dpo.main`) on pairs, on the
local engine or Tinker, and how a model ranks the two replies of each pair.

`dpo` goes through the same steps as `train.sft` (loop.py) with its own settings (DPOSettings)
and data (DPOData): preflight (validate's checks of both sides of every pair, the held-out
overlap, on Tinker the price, the budget and the service, before anything is spent:
pricing.estimate_dpo_cost), one fresh log dir, then the cookbook's loop unchanged in the runner
child process against the engine's URL, with a progress bar fed from `metrics.jsonl`. The pairs come from pairs.py (`preference_pairs`), written into the
log dir as the cookbook's comparison JSONL. With `eval_data`, the loop also calls the held-out
evaluator (heldout.py) as sft's does. `score_pairs` measures a model or checkpoint on pairs: the
summed log-probability of each reply, as the DPO loss sees them.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from . import loop
from ..checks import render
from ..errors import MachineFormatError
from .runlog import (CHECKPOINTS_FILE, DPO_LOSS, TrainResult, read_log_lines, read_training_log,  # noqa: F401
                     resume_note)

if TYPE_CHECKING:
    import pandas as pd

    from ..checks.validate import ValidationResult

#: Local LoRA learning rates for DPO: from the base model, and from an SFT checkpoint (a lower
#: rate, so DPO does not undo what SFT taught). benchmarks/bench_dpo.py measures the grid they
#: were chosen from (on a validation split of the tutor's training pairs) and reports what they reach.
LOCAL_DPO_LEARNING_RATE = 3e-3
LOCAL_DPO_FROM_CHECKPOINT_LEARNING_RATE = 1e-4
#: Tinker default: the cookbook's DPO learning rate.
TINKER_DPO_LEARNING_RATE = 1e-5
#: The metrics.jsonl key that marks a DPO step (the cookbook's loss).
STEP_KEY = DPO_LOSS

SCORE_COLUMNS = ["row", "pair", "source", "prompt", "expected", "rejected", "output", "chosen_logprob",
                 "rejected_logprob", "margin", "correct"]
"""Columns of `score_pairs`: row (0-based), pair, source, prompt (the last user message's text),
expected (the chosen reply), rejected (the rejected reply), output (the reply the model ranks
higher), chosen_logprob / rejected_logprob (summed log-probability of each reply's tokens after the
prompt, the tokens DPO weighs), margin (chosen minus rejected), correct (margin > 0). The frame is
an eval result as far as `compare` is concerned, so two of them compare pair by pair."""


# ---------------------------------------------------------------------------------------------
# pairs in, checked


def _given_pairs(pairs: Any, where: str) -> list[dict]:
    """The pairs as records, read once (a generator gives them all), each entry a mapping. A frame's
    rows as they were before pandas (core.chat.frame_rows): lists where a frame read back through
    pyarrow holds arrays, no missing cells, and no message key that is None only because another
    message has it (content aside)."""
    from ..core.chat import frame_rows
    from ..store.pairs import pair_records

    if isinstance(pairs, (str, os.PathLike)):
        return pair_records(pairs)
    if hasattr(pairs, "to_dict") and hasattr(pairs, "columns"):
        rows = list(frame_rows(pairs))
        for row in rows:
            for side in ("prompt", "chosen", "rejected"):
                if isinstance(row.get(side), list):
                    row[side] = [{k: v for k, v in m.items() if v is not None or k == "content"}
                                 if isinstance(m, dict) else m for m in row[side]]
        return rows
    if isinstance(pairs, Mapping):
        raise MachineFormatError(where, "one pair was given where a list of pairs is taken: pass [pair]")
    try:
        items = list(pairs)
    except TypeError:
        raise TypeError("pairs must be a pairs frame, pair records or a pairs JSONL path, not "
                        f"{type(pairs).__name__ if pairs is not None else None}") from None
    for i, p in enumerate(items, start=1):
        if not (isinstance(p, Mapping) or hasattr(p, "keys")):  # a dict, or a frame row (a Series)
            raise MachineFormatError(where, f"a pair must be a mapping with prompt, chosen, rejected, not a "
                                     f"{type(p).__name__}", line=i)
    return [dict(p) for p in items]


def _pair_records(pairs: Any) -> list[dict]:
    """Pair records (pair, source, prompt, chosen, rejected) checked like a file is: errors name the pair
    and field. A pair with no prompt text, or whose two replies are the same, is refused; a missing
    or NaN `pair` id (a row added to a pairs frame by hand) is computed."""
    from ..store.pairs import check_messages, pair_id, reply_key

    where = str(pairs) if isinstance(pairs, (str, os.PathLike)) else "<pairs>"
    out = []
    for i, p in enumerate(_given_pairs(pairs, where), start=1):
        prompt = check_messages(p.get("prompt"), Path(where), i, "prompt")
        chosen = check_messages(p.get("chosen"), Path(where), i, "chosen", reply=True)
        rejected = check_messages(p.get("rejected"), Path(where), i, "rejected", reply=True)
        if not any(m["content"].strip() for m in prompt):
            raise MachineFormatError(where, "the prompt has no text: a preference needs the conversation its two "
                                     "replies answer", line=i, field="prompt")
        if reply_key(chosen[0]["content"]) == reply_key(rejected[0]["content"]):  # as the pairs' reader compares
            raise MachineFormatError(where, "chosen and rejected are the same reply: no preference to learn",
                                     line=i, field="chosen")
        given = p.get("pair")
        source = p.get("source")
        out.append({"pair": given if isinstance(given, str) and given else pair_id(prompt, chosen, rejected),
                    "source": source if isinstance(source, str) else None, "prompt": prompt, "chosen": chosen,
                    "rejected": rejected})
    if not out:
        raise MachineFormatError(where, "no preference pairs")
    return out


def _preflight_pairs(records: list[dict], model: str, max_length: Any) -> "ValidationResult":
    """validate()'s checks (shape, secrets, the model's context, trained tokens) on both sides of
    every pair; ValidationFailed names the pair and side of the first failures. Returns the
    chosen side's ValidationResult."""
    from ..errors import ValidationFailed
    from ..checks.validate import preflight

    results = {}
    for side in ("chosen", "rejected"):
        rows = [{"messages": r["prompt"] + r[side]} for r in records]
        result = results[side] = preflight(rows, model, max_length, raise_errors=False)
        if result.ok:
            continue
        errors = result.errors()
        listed = "; ".join(f"pair {int(e.line)} ({side}): {e.code}: {e.message}" for e in errors.head(5).itertuples())
        raise ValidationFailed(f"{len(errors)} problem(s) in the pairs, refused before training: {listed}", result)
    return results["chosen"]


def _state_path(load_checkpoint: Any) -> tuple[str, str | None, str | None]:
    """(training state path, its model, its engine) of an SFT run to start DPO from."""
    if isinstance(load_checkpoint, TrainResult):
        result = load_checkpoint
    elif isinstance(load_checkpoint, (str, os.PathLike)) and Path(load_checkpoint).is_dir():
        result = read_training_log(load_checkpoint)
    elif isinstance(load_checkpoint, str) and "://" in load_checkpoint:
        if "/sampler_weights/" in load_checkpoint:
            raise ValueError(
                f"load_checkpoint={load_checkpoint!r} is sampler weights; DPO starts from training state "
                "(…/weights/<name>): pass the sft TrainResult, its log dir, or result.state_path")
        from ..engines import check_checkpoint, checkpoint_base_model, engine_for

        engine = engine_for(check_checkpoint(load_checkpoint))
        return load_checkpoint, checkpoint_base_model(load_checkpoint) if engine == "local" else None, engine
    elif isinstance(load_checkpoint, (str, os.PathLike)) and not Path(load_checkpoint).exists():
        raise ValueError(f"load_checkpoint={os.fspath(load_checkpoint)!r}: no such folder (nor a tinker:// state "
                         "path): pass the sft TrainResult, its log dir as it is on disk, or result.state_path")
    else:
        raise ValueError(f"load_checkpoint must be a TrainResult, a training log dir or a tinker:// state path, "
                         f"not {load_checkpoint!r}")
    if result.state_path is None:
        raise ValueError(f"{result.log_dir} saved no training state to start from (is the run complete?)")
    return result.state_path, result.model, result.engine


# ---------------------------------------------------------------------------------------------
# the run


def read_dpo_log(log_dir: str | os.PathLike) -> TrainResult:
    """A DPO log dir read back: `read_training_log`, which reads sft and dpo runs alike.

    Args:
        log_dir: the run's log dir.

    Returns:
        The TrainResult (kind "dpo"): steps counted from the metrics rows that carry `dpo_loss`,
        first_loss / last_loss their `dpo_loss`, tokens their `num_tokens` (chosen + rejected
        sequences), the cost as pricing.dpo_cost bounds it (training + policy forward +
        reference forward; 0 locally) plus the held-out evals' sampling (`eval_cost_usd`), and
        with `dpo(eval_data=…)` the best eval step and the final checkpoint's scores. A resumed
        run says so in `resumed_at` and `note`.
    """
    return read_training_log(log_dir)


@dataclass(frozen=True)
class DPOSettings(loop.RunSettings):
    """A dpo run's settings, every default resolved (see loop.RunSettings for the shared ones).

    Args:
        beta: the DPO loss's KL coefficient (default 0.1, the cookbook's).
        load_checkpoint: the training state the run starts from (default None: the base model).
    """

    kind: ClassVar[str] = "dpo"
    loss: ClassVar[str] = DPO_LOSS
    shown: ClassVar[dict[str, str]] = {"loss": DPO_LOSS, "acc": "accuracy"}
    priced: ClassVar[tuple[str, ...]] = ("train", "prefill")
    priced_what: ClassVar[str] = "DPO"
    spend: ClassVar[str] = "DPO on {model}"
    evals_before_last: ClassVar[bool] = True
    resumed: ClassVar[tuple[str, ...]] = (*loop.RunSettings.resumed, "beta", "load_checkpoint")

    beta: float = 0.1
    load_checkpoint: str | None = None

    @classmethod
    def resolve(cls, resumed: loop.Resumed | None, /, **given: Any) -> "DPOSettings":
        """loop.RunSettings.resolve, after `load_checkpoint` (a TrainResult, log dir or state path)
        became the state path it names, and model and engine default to its own.

        Args:
            resumed: the run to continue, or None.
            **given: the call's settings by field name.

        Returns:
            The settings.

        Raises:
            ValueError: a checkpoint of another base model than `model`, or sampler weights.
        """
        from .. import engines

        if resumed is None and given.get("load_checkpoint") is not None:
            path, start_model, start_engine = _state_path(given["load_checkpoint"])
            model = given.get("model")
            if model is not None and start_model is not None and render.base_model(model) != render.base_model(start_model):
                raise ValueError(f"load_checkpoint was trained from {start_model!r}, not model={model!r}")
            given.update(load_checkpoint=path, model=model or start_model, engine=given.get("engine") or start_engine)
        settings = super().resolve(resumed, **given)
        if settings.load_checkpoint is not None:
            engines.check_model(settings.engine, settings.load_checkpoint)
        return settings

    def check(self) -> None:
        """loop.RunSettings.check, and beta a finite number above 0.

        Raises:
            ValueError: a value out of range.
        """
        super().check()
        if not (loop.finite(self.beta) and self.beta > 0):
            raise ValueError(f"beta must be a finite number above 0, got {self.beta!r}")

    def default_learning_rate(self) -> float:
        """LOCAL_DPO_LEARNING_RATE for a local LoRA from the base model,
        LOCAL_DPO_FROM_CHECKPOINT_LEARNING_RATE from a checkpoint, TINKER_DPO_LEARNING_RATE on Tinker.

        Returns:
            The rate.
        """
        if not self.local_model:
            return TINKER_DPO_LEARNING_RATE
        return LOCAL_DPO_FROM_CHECKPOINT_LEARNING_RATE if self.load_checkpoint else LOCAL_DPO_LEARNING_RATE

    def record(self) -> dict[str, Any]:
        """The shared record, with beta and the starting state (a checkpoint keeps its own LoRA rank).

        Returns:
            Record keys.
        """
        return {**super().record(), "lora_rank": None if self.load_checkpoint else self.lora_rank}

    def spec(self) -> dict[str, Any]:
        """The shared spec, with beta and the starting state as the SDK names it.

        Returns:
            A JSON-shaped dict.
        """
        return {**super().spec(), "beta": self.beta, "load_checkpoint": self.load_checkpoint}

    def resume_update(self, resumed: loop.Resumed, per_epoch: int, steps: int) -> dict[str, Any] | None:
        """Where the resumed run continues, when that is part way: the cookbook takes its reference
        model from the checkpoint there, which the run record keeps (`resumed_at`) so the result says so.

        Args:
            resumed: the run. per_epoch: steps an epoch. steps: the run's steps.

        Returns:
            resumed_at and steps, or None when the run continues from its start or end.

        Raises:
            MachineFormatError: a checkpoints.jsonl row with a field of the wrong type, naming the
                file, line and field.
        """
        states = [c for c in read_log_lines(resumed.path / CHECKPOINTS_FILE, strict=True)
                  if isinstance(c.get("state_path"), str)]
        if not states or not isinstance(states[-1].get("batch"), int):
            return None
        at = int(states[-1].get("epoch") or 0) * per_epoch + states[-1]["batch"]  # as train_dpo.main resumes
        if not 0 < at < steps:
            return None
        # a record written by another version, or edited, may hold something else: its whole numbers are kept
        earlier, total = resumed.record.get("resumed_at"), resumed.record.get("steps")
        earlier = [k for k in (earlier if isinstance(earlier, list) else []) if isinstance(k, int)
                   and not isinstance(k, bool)]
        return {"resumed_at": sorted({*earlier, at}),
                "steps": total if isinstance(total, int) and not isinstance(total, bool) else steps}


class DPOData(loop.RunData):
    """Preference pairs as `_pair_records` checked them.

    Args:
        items: the pair records (pair, prompt, chosen, rejected).
    """

    file: ClassVar[str] = "pairs.jsonl"
    noun: ClassVar[str] = "pairs"
    unit: ClassVar[str] = "pairs"
    item: ClassVar[str] = "pair"

    def validate(self, settings: loop.RunSettings) -> "ValidationResult":
        """validate()'s checks on both sides of every pair.

        Args:
            settings: model and max_length.

        Returns:
            The chosen side's ValidationResult.

        Raises:
            ValidationFailed: naming the pair and side of the first failures.
        """
        return _preflight_pairs(self.items, settings.model,
                                settings.max_length if settings.max_length is not None else "auto")

    def prompts(self) -> Any:
        """Each pair's prompt (both sides share it).

        Returns:
            (pair number, prompt messages) pairs.
        """
        return ((i, r["prompt"]) for i, r in enumerate(self.items, start=1))

    def lines(self, settings: loop.RunSettings) -> list[dict]:
        """The pairs shuffled with the run's seed, as the cookbook's comparison JSONL (completion A chosen).

        Args:
            settings: the seed.

        Returns:
            The JSONL lines.
        """
        from ..store.pairs import comparison_line

        records = list(self.items)
        random.Random(settings.seed).shuffle(records)
        return [comparison_line(r) for r in records]

    def record(self) -> dict[str, Any]:
        """The number of pairs.

        Returns:
            Record keys.
        """
        return {"pairs": len(self.items)}


def dpo(pairs: Any, model: str | None = None, engine: str | None = None, *, beta: float = 0.1,
        learning_rate: float | None = None, epochs: int = 10, batch_size: int = 8, max_steps: int | None = None,
        lora_rank: int | None = None, load_checkpoint: Any = None, log_dir: str | os.PathLike | None = None,
        workspace: str | os.PathLike | None = None, name: str | None = None,
        resume: str | os.PathLike | None = None, seed: int = 0, max_length: int | None = None,
        lr_schedule: str = "linear", save_every: int = 20, max_usd: float | None = None,
        base_url: str | None = None, progress: bool | None = None,
        on_metrics: Callable[[list[dict]], Any] | None = None, eval_data: Any = None,
        eval_every: int | None = None, eval_max_tokens: int = 32, eval_temperature: float = 0.0,
        inspect_tasks: Any = None) -> TrainResult:
    """Direct preference optimisation with tinker-cookbook's `preference.train_dpo.main`, on `engine`.

    The cookbook's loop runs unchanged in a child process (its `main` calls `asyncio.run` itself, so
    it never touches a notebook's event loop) and reaches the engine through the real tinker SDK.
    Its reference model is a frozen snapshot of the weights it starts from: the base model, or the
    SFT checkpoint given as `load_checkpoint` (SFT then DPO). With `eval_data`, the loop itself
    calls the held-out evaluator (heldout.py, in its Config's `evaluator_builders`) every
    `eval_every` steps and before its last step, and the final checkpoint is scored the same way,
    as `sft(eval_data=…)` does: `metrics.jsonl` gains `test/accuracy` and `test/format_rate`,
    `heldout.jsonl` keeps the per-row results, and the result says which step was best.

    Args:
        pairs: a `preference_pairs` frame, pair records (prompt, chosen, rejected message lists),
            or a pairs JSONL path (either format `write_pairs` writes). They are checked (a pair
            whose prompt has no text, or whose two replies are the same, is refused), shuffled
            with `seed` and written to `<log dir>/pairs.jsonl` (the cookbook's comparison JSONL,
            completion A chosen), which is what the cookbook reads.
        model: default None = the starting checkpoint's model, else the engine's default
            (`local/arith-tiny` locally; Tinker has none).
        engine: "local" or "tinker"; default None = the model's (or checkpoint's) own.
        beta: the DPO loss's KL coefficient (default 0.1, the cookbook's): higher keeps the policy
            closer to the reference model.
        learning_rate: default None = LOCAL_DPO_LEARNING_RATE for a local LoRA from the base model,
            LOCAL_DPO_FROM_CHECKPOINT_LEARNING_RATE from a checkpoint, the cookbook's
            TINKER_DPO_LEARNING_RATE on Tinker; `lr_schedule` applies.
        epochs: passes over the pairs (default 10).
        max_steps: stop after this many steps (default None: epochs x full batches).
        batch_size: pairs per step (default 8; each is two sequences; the partial last batch is dropped).
        lora_rank: default None = 8 for local models, 32 on Tinker. With `load_checkpoint` the
            checkpoint's own rank applies.
        load_checkpoint: start from an SFT run's weights: its TrainResult, its log dir, or a
            `tinker://…/weights/<name>` state path (default None: the base model, fresh LoRA).
        log_dir: where the run writes; it must be new or empty (default None: a fresh
            `runs/dpo-<time>-<hex>` under the cwd, or under `workspace`).
        workspace: default None; a workspace puts the log dir in `<workspace>/.machine/training/`.
        name: the log dir's name there (default None: `dpo-<time>-<hex>`).
        resume: a log dir of an interrupted dpo run to continue from its last checkpoint, with the
            settings (held-out evals included) it was started with. Steps already done are not
            repeated, and the optimizer state and learning-rate schedule carry on, but the resumed
            run is not the uninterrupted one: the cookbook takes the reference model from the
            weights it resumes from (the checkpoint at step k), not from the starting weights. So
            from step k on, the DPO loss restarts at log 2 (margin and rewards at 0), the steps
            train differently, and their weights, held-out scores and the final checkpoint differ
            from an uninterrupted run's; steps 0 to k-1 are the same. The result says so
            (`resumed_at`, `note`).
        seed: the order the pairs are written in (default 0), which the cookbook shuffles per epoch.
        max_length: tokens per sequence (default None = a local model's context, 128 for
            `local/arith-tiny`; no limit on Tinker).
        lr_schedule: the cookbook's schedule (default "linear": decays to 0).
        save_every: checkpoint every N steps (default 20, the cookbook's).
        max_usd: Tinker budget, refused before spending when the estimate (pricing.estimate_dpo_cost:
            training, the policy's forward pass and the reference model's, plus the held-out evals
            at `eval_max_tokens` a reply) is over it; an unknown training or prefill price is always
            refused, an unknown sampling price whenever a budget is set. Local runs cost 0.
        base_url: Tinker service URL (default None: $TINKER_BASE_URL, else Tinker's). Credentials in
            it (`https://user:token@host`) are connected with, never written to the log dir (its
            config.json records None); a query (`?api_key=…`) is refused (engines.check_base_url).
        progress: show a progress bar (steps, dpo loss, pair accuracy, last held-out accuracy);
            default None: in a notebook or terminal unless MACHINE_NB_PROGRESS=0.
        on_metrics: default None; called in the caller's thread with each list of new metrics rows
            (e.g. a LossPlot's `update`).
        eval_data: held-out eval rows to score while training (a JSONL path or a list of row dicts,
            evaluate()'s shape); every row is checked before anything is written, a pair whose
            prompt is one of them is refused, and a copy goes to `<log dir>/heldout_data.jsonl`.
            Default None: no held-out evals. Choose on a validation set, report on another.
        eval_every: score every N steps (the eval at step s sees the weights after s steps; step 0
            is the starting weights); the cookbook's DPO loop also scores before its last step.
            Default None = once an epoch (pairs // batch_size steps).
        eval_max_tokens: the evals' reply budget, as evaluate() takes it (default 32); recorded
            with every score.
        eval_temperature: the evals' sampling temperature (default 0.0: greedy); recorded too.
        inspect_tasks: Inspect AI tasks to run at the same steps (`eval_every`; default once an
            epoch) and on the final checkpoint, as sft(inspect_tasks=…) runs them: registry names
            or task files ("tasks.py@name"); their scores go into `metrics.jsonl` as
            `test/inspect/<dataset>/<metric>` (`machine_nb.evaluation.inspect_bridge.inspect_curve`
            reads them), Inspect's logs into `<log dir>/inspect/`. Needs
            `pip install "machine_nb[inspect]"`. Default None: none.

    Returns:
        A TrainResult (kind "dpo") read back from the log dir (`read_training_log`): steps, tokens,
        first / last `dpo_loss`, the final sampler checkpoint, the cost next to the estimate, and
        with `eval_data` the final checkpoint's held-out scores and the best step. The per-step
        `dpo_loss`, `accuracy`, `margin`, `chosen_reward` and `rejected_reward` are in
        `training_metrics(log_dir)`, the held-out scores in `heldout_curve(log_dir)`. A Ctrl-C
        stops the run and re-raises KeyboardInterrupt; `dpo(pairs, resume=log_dir)` finishes it.
    """
    resumed = loop.resume_record(resume, "dpo")
    settings = DPOSettings.resolve(
        resumed, model=model, engine=engine, beta=beta, learning_rate=learning_rate, epochs=epochs,
        batch_size=batch_size, max_steps=max_steps, lora_rank=lora_rank, load_checkpoint=load_checkpoint, seed=seed,
        max_length=max_length, lr_schedule=lr_schedule, save_every=save_every, max_usd=max_usd, base_url=base_url,
        eval_every=eval_every, eval_max_tokens=eval_max_tokens, eval_temperature=eval_temperature)
    inspect = loop.inspect_spec(inspect_tasks, settings, "dpo")
    # before the runner starts: a resume whose rows are gone is refused first
    source = loop.data_source(resumed, DPOData.file, pairs)
    loop.refuse_if_training(resume if resume is not None else log_dir)
    loop.start_runner()
    records = DPOData(_pair_records(source))
    return loop.train(settings, records, module=__name__, eval_data=eval_data, resumed=resumed, log_dir=log_dir,
                      workspace=workspace, name=name, source=pairs, progress=progress, on_metrics=on_metrics,
                      **({"inspect": inspect} if inspect else {}))


def dpo_evals(steps: int, every: int) -> int:
    """How many times a DPO run scores its held-out rows.

    The cookbook's DPO loop evaluates before step s when s % every == 0 and before its last step
    (loop.eval_schedule with last=True), then the final checkpoint is scored.

    Args:
        steps: the run's steps.
        every: score every N steps.

    Returns:
        The number of evals.
    """
    return loop.eval_count(steps, every, last=True)


# ---------------------------------------------------------------------------------------------
# the half that runs in the child process (runner.py)


def _dpo_config(spec: dict) -> Any:
    """The cookbook's train_dpo Config for a spec `dpo` wrote (runs in the child process)."""
    from tinker_cookbook.preference import train_dpo
    from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    from .dpo_data import ComparisonFileBuilder  # each pair as written (the cookbook's loader fills keys with None)

    builder = DPODatasetBuilderFromComparisons(
        comparison_builder=ComparisonFileBuilder(train_path=spec["data_path"]),
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=spec["model"], renderer_name=spec["renderer"],
            max_length=spec["max_length"], batch_size=spec["batch_size"]))
    return train_dpo.Config(
        log_path=spec["log_dir"], model_name=spec["model"], recipe_name="machine_nb_dpo", dataset_builder=builder,
        load_checkpoint_path=spec["load_checkpoint"], renderer_name=spec["renderer"],
        learning_rate=spec["learning_rate"], lr_schedule=spec["lr_schedule"], num_epochs=spec["epochs"],
        dpo_beta=spec["beta"], lora_rank=spec["lora_rank"], base_url=spec["base_url"], save_every=spec["save_every"],
        eval_every=0, infrequent_eval_every=0, ttl_seconds=None, max_steps=spec["max_steps"])


def child_run(spec: dict) -> None:
    """The dpo half that runs in the child (runner.py): the cookbook's DPO loop, unchanged (its
    `main` runs its own event loops); with held-out evals or Inspect tasks, runner.run_loop puts
    them in the loop's evaluators (the held-out one also scores before the last step) and scores
    the final checkpoint.

    Args:
        spec: what `dpo` wrote (loop.child_spec).
    """
    from tinker_cookbook.preference import train_dpo

    from .runner import run_loop

    run_loop(spec, _dpo_config(spec), train_dpo.main, last=True)


# ---------------------------------------------------------------------------------------------
# how a model ranks the two replies


def _reply_logprob(client: Any, renderer: Any, messages: list[dict]) -> Any:
    """A future of (summed log-probability of the last reply's trained tokens, token count)."""
    import tinker

    from ..checks.render import renderer_messages

    tokens, weights = renderer.build_supervised_example(renderer_messages(messages))
    ints = tokens.to_ints() if hasattr(tokens, "to_ints") else list(tokens)
    weights = [float(w) for w in weights]
    future = client.compute_logprobs(tinker.ModelInput.from_ints(ints))

    class _Sum:
        def result(self) -> float:
            logprobs = future.result()
            # token i's log-probability given the ones before it; the first token has none
            return sum(lp * w for lp, w in zip(logprobs[1:], weights[1:]) if w)

    return _Sum()


def score_pairs(pairs: Any, model: str | None = None, checkpoint: str | None = None,
                engine: str | None = None) -> "pd.DataFrame":
    """How a model (or checkpoint) ranks each pair's replies: the summed log-probability of each.

    Pair accuracy, the share of pairs whose chosen reply is the more likely one, is
    `score_pairs(...)["correct"].mean()`; DPO's own `accuracy` metric is the same comparison
    relative to the reference model. Two frames of the same pairs compare pair by pair with
    `compare` (exact McNemar on the pairs that changed).

    Args:
        pairs: a pairs frame, pair records (a list or any iterable, read once) or a pairs JSONL
            path, checked as `dpo` checks them.
        model: the base model (its renderer turns messages into tokens). Default None: the
            checkpoint's base model, else the local engine's default model.
        checkpoint: a sampler checkpoint to score instead of the base model (default None).
        engine: default None = the checkpoint's (or model's) own.

    Returns:
        A DataFrame with SCORE_COLUMNS, one row per pair.

    Raises:
        MachineFormatError: a pair in the wrong shape, with no prompt text or with the same reply
            twice, or no pairs at all, naming the pair and field.
        TypeError: `pairs` none of those forms.
    """
    import pandas as pd

    from ..core.chat import prompt_text
    from ..engines import checkpoint_base_model, default_model, engine_for
    from ..evaluation.sampling import SamplerTarget, open_sampler

    records = _pair_records(pairs)
    if engine is None:
        engine = engine_for(checkpoint or model) if (checkpoint or model) else "local"
    if model is None and checkpoint is not None:
        model = checkpoint_base_model(checkpoint)
    if model is None:
        if checkpoint is not None:
            raise ValueError("model= is needed with a Tinker checkpoint (its renderer formats the pairs)")
        model = default_model(engine)
    # engines keeps one service client
    client = open_sampler(SamplerTarget(render.base_model(model), checkpoint, engine))
    renderer = render.get_renderer(model)
    futures = [(_reply_logprob(client, renderer, r["prompt"] + r["chosen"]),
                _reply_logprob(client, renderer, r["prompt"] + r["rejected"])) for r in records]
    rows = []
    for i, (r, (fc, fr)) in enumerate(zip(records, futures)):
        c, j = fc.result(), fr.result()
        chosen, rejected = r["chosen"][0]["content"], r["rejected"][0]["content"]
        rows.append({"row": i, "pair": r["pair"], "source": r["source"], "prompt": prompt_text(r["prompt"]),
                     "expected": chosen, "rejected": rejected, "output": chosen if c > j else rejected,
                     "chosen_logprob": c, "rejected_logprob": j, "margin": c - j, "correct": bool(c > j)})
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


__all__ = ["dpo", "score_pairs", "read_dpo_log", "resume_note", "dpo_evals", "child_run",
           "SCORE_COLUMNS", "STEP_KEY"]
