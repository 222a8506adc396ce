"""Preference training: tinker-cookbook's own DPO loop (`preference.train_dpo.main`) on pairs, on the
local engine or Tinker, and how a model ranks the two replies of each pair.

`dpo` runs the same way `train.sft` does: one fresh log dir, the engine's checks (on Tinker the key,
the service and the price, before anything is spent: pricing.estimate_dpo_cost), then the
cookbook's loop unchanged in the runner child process against the engine's URL, with a progress
bar fed from `metrics.jsonl`. The pairs come from pairs.py (`preference_pairs`), written into the
log dir as the cookbook's comparison JSONL. With `eval_data`, the loop also calls the held-out
evaluator (heldout.py) as sft's does. `score_pairs` measures a model or checkpoint on pairs: the
summed log-probability of each reply, as the DPO loss sees them.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from . import render
from .errors import EngineError, MachineFormatError
from .runlog import DPO_LOSS, TrainResult, read_training_log, resume_note  # noqa: F401 (resume_note: public here too)

#: Local LoRA (rank 8, beta 0.1, 10 epochs) learning rates, chosen on a validation split of the
#: tutor's training pairs, never its held-out cases (benchmarks/bench_dpo.py re-measures the grid).
#: From the base model the chosen replies are ones it never says (their log-probabilities trail
#: the rejected ones by 40-100 nats), so DPO has far to go: 3e-3 ranks every validation pair
#: right, 2e-3 none. From an SFT checkpoint there is little left to move, and a high rate undoes
#: what SFT taught: 1e-4 keeps its exact match where 1e-3 already loses some.
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


def _pair_records(pairs: Any) -> list[dict]:
    """Pair records (prompt, chosen, rejected, pair?) checked like a file is: errors name the pair and field."""
    from .pairs import _messages, _records, pair_id

    where = str(pairs) if isinstance(pairs, (str, os.PathLike)) else "<pairs>"
    out = []
    for i, p in enumerate(_records(pairs), start=1):
        if not isinstance(p, dict):
            raise MachineFormatError(where, "a pair must be a mapping with prompt, chosen, rejected", line=i)
        prompt = _messages(p.get("prompt"), Path(where), i, "prompt")
        chosen = _messages(p.get("chosen"), Path(where), i, "chosen", reply=True)
        rejected = _messages(p.get("rejected"), Path(where), i, "rejected", reply=True)
        if chosen[0]["content"].strip() == rejected[0]["content"].strip():
            raise MachineFormatError(where, "chosen and rejected are the same reply: no preference to learn",
                                     line=i, field="chosen")
        out.append({"pair": p.get("pair") or pair_id(prompt, chosen, rejected), "prompt": prompt,
                    "chosen": chosen, "rejected": rejected})
    if not out:
        raise MachineFormatError(where, "no preference pairs")
    return out


def _preflight_pairs(records: list[dict], model: str, max_length: Any, eval_path: Any = None) -> None:
    """validate()'s checks (shape, secrets, the model's context, trained tokens) on both sides of
    every pair, and with `eval_path` that no pair's prompt is one of that eval file's;
    ValidationFailed names the pair and side of the first failures."""
    from .errors import ValidationFailed
    from .validate import preflight

    for side in ("chosen", "rejected"):
        rows = [{"messages": r["prompt"] + r[side]} for r in records]
        # both sides share their prompt: the overlap is checked once
        result = preflight(rows, model, max_length, raise_errors=False,
                           eval_path=eval_path if side == "chosen" else None)
        if result.ok:
            continue
        errors = result.errors()
        listed = "; ".join(f"pair {int(e.line)} ({side}): {e.code}: {e.message}" for e in errors.head(5).itertuples())
        raise ValidationFailed(f"{len(errors)} problem(s) in the pairs, refused before training: {listed}", result)


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
        from .engines import checkpoint_base_model, engine_for

        engine = engine_for(load_checkpoint)
        return load_checkpoint, checkpoint_base_model(load_checkpoint) if engine == "local" else None, engine
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


def __getattr__(name: str) -> Any:
    if name == "DPOResult":  # one result class for sft and dpo runs now
        from .compat import deprecated_alias

        deprecated_alias("machine_nb.preference.DPOResult", "machine_nb.TrainResult (kind='dpo')")
        return TrainResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _default_lr(model: str, from_checkpoint: bool) -> float:
    if not render.is_local_model(model):
        return TINKER_DPO_LEARNING_RATE
    return LOCAL_DPO_FROM_CHECKPOINT_LEARNING_RATE if from_checkpoint else LOCAL_DPO_LEARNING_RATE


#: Settings a resumed run takes from the run it continues.
_RESUMED = ("epochs", "batch_size", "max_steps", "learning_rate", "beta", "lora_rank", "seed", "max_length",
            "lr_schedule", "save_every", "model", "engine", "load_checkpoint")


def dpo(pairs: Any, model: str | None = None, engine: str | None = None, *, beta: float = 0.1,
        learning_rate: float | None = None, epochs: int = 10, batch_size: int = 8, max_steps: int | None = None,
        lora_rank: int | None = None, load_checkpoint: Any = None, log_dir: str | os.PathLike | None = None,
        workspace: str | os.PathLike | None = None, name: str | None = None,
        resume: str | os.PathLike | None = None, seed: int = 0, max_length: int | None = None,
        lr_schedule: str = "linear", save_every: int = 20, max_usd: float | None = None,
        base_url: str | None = None, progress: bool = True, on_metrics: Any = None,
        eval_data: Any = None, eval_every: int | None = None, eval_max_tokens: int = 32,
        eval_temperature: float = 0.0) -> TrainResult:
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
            or a pairs JSONL path (either format `write_pairs` writes). They are checked, shuffled
            with `seed` and written to `<log dir>/pairs.jsonl` (the cookbook's comparison JSONL,
            completion A chosen), which is what the cookbook reads.
        model: default None = the starting checkpoint's model, else the engine's default
            (`local/arith-tiny` locally; Tinker has none).
        engine: "local" or "tinker"; default None = the model's (or checkpoint's) own.
        beta: the DPO loss's KL coefficient (default 0.1, the cookbook's): higher keeps the policy
            closer to the reference model.
        learning_rate: default None = for a local LoRA 3e-3 from the base model and 1e-4 from a
            checkpoint (see LOCAL_DPO_LEARNING_RATE), the cookbook's 1e-5 on Tinker;
            `lr_schedule` "linear" (default) decays it to 0.
        epochs: passes over the pairs (default 10). max_steps: stop after this many (default None).
        batch_size: pairs per step (default 8; each is two sequences; the partial last batch is dropped).
        lora_rank: default None = 8 for local models, 32 on Tinker. With `load_checkpoint` the
            checkpoint's own rank applies.
        load_checkpoint: start from an SFT run's weights: its TrainResult, its log dir, or a
            `tinker://…/weights/<name>` state path (default None: the base model, fresh LoRA).
        log_dir / workspace / name: where the run writes (default a fresh `runs/dpo-<time>-<hex>`, or
            `<workspace>/.machine/training/<name>`); it must be new or empty.
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
        max_length: tokens per sequence (default None = the local model's context, 128; none on Tinker).
        save_every: checkpoint every N steps (default 20, the cookbook's).
        max_usd: Tinker budget, refused before spending when the estimate (pricing.estimate_dpo_cost:
            training, the policy's forward pass and the reference model's, plus the held-out evals
            at `eval_max_tokens` a reply) is over it; an unknown training or prefill price is always
            refused, an unknown sampling price whenever a budget is set. Local runs cost 0.
        base_url: Tinker service URL (default None: $TINKER_BASE_URL, else Tinker's).
        progress: show a progress bar (steps, dpo loss, pair accuracy, last held-out accuracy).
        on_metrics: default None; called in the caller's thread with each list of new metrics rows.
        eval_data: held-out eval rows to score while training (a JSONL path or a list of row dicts,
            evaluate()'s shape); every row is checked before anything is written, a pair whose
            prompt is in the eval file is refused, and a copy goes to `<log dir>/heldout_data.jsonl`.
            Default None: no held-out evals. Choose on a validation set, report on another.
        eval_every: score every N steps (the eval at step s sees the weights after s steps; step 0
            is the starting weights); the cookbook's DPO loop also scores before its last step.
            Default None = once an epoch (pairs // batch_size steps).
        eval_max_tokens / eval_temperature: the evals' sampling, as evaluate() takes it (default
            32 tokens, greedy); recorded with every score.

    Returns:
        A TrainResult (kind "dpo") read back from the log dir (`read_training_log`): steps, tokens,
        first / last `dpo_loss`, the final sampler checkpoint, the cost next to the estimate, and
        with `eval_data` the final checkpoint's held-out scores and the best step. The per-step
        `dpo_loss`, `accuracy`, `margin`, `chosen_reward` and `rejected_reward` are in
        `training_metrics(log_dir)`, the held-out scores in `heldout_curve(log_dir)`. A Ctrl-C
        stops the run and re-raises KeyboardInterrupt; `dpo(pairs, resume=log_dir)` finishes it.
    """
    from . import engines
    from .runlog import HELDOUT_ACCURACY, HELDOUT_DATA, MARKER, MetricsTail, claim_log_dir, new_log_dir, private_files
    from .train import LOCAL_LORA_RANK, TINKER_LORA_RANK, _heldout_settings, run_cookbook

    start_path = None
    saved: dict = {}
    if resume is not None:
        path = Path(resume).absolute()
        claim_log_dir(path, resume=True)
        saved = json.loads((path / MARKER).read_text(encoding="utf-8"))
        if saved.get("kind") != "dpo":
            raise ValueError(f"resume={str(resume)!r} is not a dpo run (resume an sft run with sft(resume=…))")
        (epochs, batch_size, max_steps, learning_rate, beta, lora_rank, seed, max_length, lr_schedule,
         save_every, model, engine, start_path) = (saved[k] for k in _RESUMED)
        held = saved.get("heldout")
        eval_data = path / HELDOUT_DATA if held else None
        if held:
            eval_every, eval_max_tokens, eval_temperature = held["every"], held["max_tokens"], held["temperature"]
    elif load_checkpoint is not None:
        start_path, start_model, start_engine = _state_path(load_checkpoint)
        if model is not None and start_model is not None and render.base_model(model) != render.base_model(start_model):
            raise ValueError(f"load_checkpoint was trained from {start_model!r}, not model={model!r}")
        model = model or start_model
        engine = engine or start_engine
    if engine is None:
        engine = engines.engine_for(model) if model else "local"
    if engine not in engines.ENGINES:
        raise EngineError(f"Unknown engine {engine!r}: use 'local' or 'tinker'.")
    if model is None:
        model = engines.default_model(engine)
    engines.check_model(engine, model)
    if start_path is not None:
        engines.check_model(engine, start_path)
    local_model = render.is_local_model(model)
    if engine == "tinker":  # an unbounded cost is refused before anything else is looked up
        from .pricing import UnknownPrice, price_for

        row = price_for(model)
        if row.train is None or row.prefill is None:
            raise UnknownPrice(f"No training or prefill price is known for {model!r}: cannot bound the cost of DPO. "
                               f"Call machine_nb.pricing.set_price({model!r}, train=…, prefill=…) with Tinker's prices.")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be at least 1 (got epochs={epochs}, batch_size={batch_size})")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be at least 1 or None, got {max_steps}")
    if beta <= 0:
        raise ValueError(f"beta must be above 0, got {beta}")
    if lora_rank is None:
        lora_rank = LOCAL_LORA_RANK if local_model else TINKER_LORA_RANK
    if lora_rank < 0 or (lora_rank == 0 and not local_model):
        raise ValueError(f"lora_rank must be at least 1 (0 = full fine-tuning, local models only), got {lora_rank}")

    source = pairs
    if resume is not None and (Path(resume) / "pairs.jsonl").exists():
        source = Path(resume).absolute() / "pairs.jsonl"  # the very pairs the run started with
    records = _pair_records(source)
    if len(records) < batch_size:
        raise ValueError(f"{len(records)} pairs make no full batch of {batch_size}; the cookbook would train 0 "
                         "steps. Lower batch_size or add pairs.")
    per_epoch = len(records) // batch_size
    steps_total = per_epoch * epochs
    if max_steps is not None:
        steps_total = min(steps_total, max_steps)
    heldout = held_rows = None
    if eval_data is not None:
        heldout = _heldout_settings(eval_data, model, eval_every, per_epoch, eval_max_tokens, eval_temperature,
                                    steps_total)
        held_rows = heldout.pop("rows")
        heldout["evals"] = dpo_evals(steps_total, heldout["every"])
        if saved.get("heldout"):  # the file the run was started with, not its copy
            heldout.update(source=saved["heldout"].get("source"), source_sha256=saved["heldout"].get("source_sha256"))
    renderer = render.renderer_name(model)
    if local_model and max_length is None:
        max_length = engines.model_context(render.base_model(model))
    overlap = heldout["source"] if heldout and heldout["source"] and Path(heldout["source"]).is_file() else None
    _preflight_pairs(records, model, max_length if max_length is not None else "auto", eval_path=overlap)

    # refuse before spending (and before writing anything): over budget, no key, not Tinker
    estimate = dpo_estimate(records, model, engine, epochs=epochs, batch_size=batch_size, max_steps=max_steps,
                            eval_rows=held_rows, evals=heldout["evals"] if heldout else 0,
                            eval_max_tokens=eval_max_tokens)
    if engine == "tinker":
        from .pricing import check_budget

        check_budget(estimate["usd"], max_usd, f"DPO on {model} for {epochs} epoch(s)"
                     + (f" with {estimate['evals']} held-out evals" if heldout else ""))
    url = engines.check_service(engine, base_url, (model,))

    from .jsonl import atomic_write_text

    if resume is None:
        from .jsonl import write_jsonl
        from .pairs import comparison_line

        path = (Path(log_dir).absolute() if log_dir is not None
                else new_log_dir("dpo", workspace=workspace, name=name))
        claim_log_dir(path, resume=False)
        random.Random(seed).shuffle(records)
        write_jsonl([comparison_line(r) for r in records], path / "pairs.jsonl")
        if held_rows is not None:
            write_jsonl(held_rows, path / HELDOUT_DATA)
        if learning_rate is None:
            learning_rate = _default_lr(model, start_path is not None)
        marker = {"kind": "dpo", "engine": engine, "model": model, "renderer": renderer, "pairs": len(records),
                  "epochs": epochs, "batch_size": batch_size, "max_steps": max_steps, "steps": steps_total,
                  "learning_rate": learning_rate, "beta": beta,
                  "lora_rank": None if start_path else lora_rank,  # a checkpoint keeps its own
                  "seed": seed, "max_length": max_length,
                  "lr_schedule": lr_schedule, "save_every": save_every, "load_checkpoint": start_path,
                  "source": str(pairs) if isinstance(pairs, (str, os.PathLike)) else "<in-memory pairs>",
                  "heldout": heldout, "estimate": estimate}
        atomic_write_text(path / MARKER, json.dumps(marker, indent=1))
    else:
        at = _resume_step(path, per_epoch)
        if at is not None and 0 < at < steps_total:  # the reference model will be taken here: say so
            saved["resumed_at"] = sorted({*saved.get("resumed_at", []), at})
            saved.setdefault("steps", steps_total)
            atomic_write_text(path / MARKER, json.dumps(saved, indent=1))

    spec = {"module": __name__, "data_path": str(path / "pairs.jsonl"), "log_dir": str(path),
            "model": render.base_model(model), "renderer": renderer, "max_length": max_length,
            "batch_size": batch_size, "learning_rate": learning_rate, "lr_schedule": lr_schedule, "epochs": epochs,
            "beta": beta, "lora_rank": lora_rank, "base_url": url, "save_every": save_every, "max_steps": max_steps,
            "load_checkpoint": None if start_path is None else engines.to_sdk_path(start_path),
            "local_models": local_model,
            "heldout": None if heldout is None else {**heldout, "path": str(path / HELDOUT_DATA)}}

    from .progress import progress as progress_bar

    tail = MetricsTail(path / "metrics.jsonl")
    seen_steps: set[int] = set()
    watchdog = engines.watchdog(engine, url)
    with progress_bar(total=steps_total, desc="dpo", unit="steps", enabled=None if progress else False) as bar, \
            watchdog as dog:

        def poll() -> None:
            new = tail.new_rows()
            steps = [m for m in new if STEP_KEY in m and m.get("step") not in seen_steps]
            seen_steps.update(m.get("step") for m in steps)
            scored = [m[HELDOUT_ACCURACY] for m in new if isinstance(m.get(HELDOUT_ACCURACY), (int, float))]
            if scored:
                bar.set_postfix(heldout=float(scored[-1]))
            if steps:
                bar.update(len(steps), loss=float(steps[-1][STEP_KEY]), acc=float(steps[-1].get("accuracy", 0.0)))
            if new and on_metrics is not None:
                on_metrics(new)

        try:
            run_cookbook(spec, path, engine=engine, on_poll=poll, watchdog=dog)
        finally:
            private_files(path)
    result = read_dpo_log(path)
    result.model, result.engine = model, engine
    return result


def dpo_evals(steps: int, every: int) -> int:
    """How many times a DPO run of `steps` steps scores its held-out rows every `every` steps: the
    cookbook's DPO loop evaluates before step s when s % every == 0 and before its last step
    (heldout.eval_schedule with last=True), then the final checkpoint is scored."""
    from .heldout import eval_schedule

    return len(eval_schedule(0, steps, every, last=True)) + 1


def dpo_estimate(records: Any, model: str, engine: str, *, epochs: int, batch_size: int, max_steps: int | None,
                 eval_rows: Any = None, evals: int = 0, eval_max_tokens: int = 32) -> dict:
    """What a DPO run is estimated to cost before it starts: training (pricing.estimate_dpo_cost)
    plus its held-out evals.

    Args:
        records: the pairs. model / engine: what and where. epochs / batch_size / max_steps: as dpo takes them.
        eval_rows: the held-out rows (default None: no evals). evals: how many times they are
            scored (`dpo_evals`). eval_max_tokens: output tokens a reply.

    Returns:
        {"usd" (None when a price is unknown), "train_usd" (training, policy forward and reference
        forward), "eval_usd", "tokens" (tokens the training is priced on, both sequences of every
        pair), "evals", "exact", "price_source", "price_date"}: 0 on the local engine.
    """
    from .pricing import UnknownPrice, estimate_dpo_cost, estimate_eval_cost

    try:
        train = estimate_dpo_cost(records, model, epochs=epochs, batch_size=batch_size, max_steps=max_steps)
    except UnknownPrice:
        return {"usd": None, "train_usd": None, "eval_usd": None, "tokens": None, "evals": evals, "exact": None,
                "price_source": None, "price_date": None}
    full = (train.pairs // batch_size) * epochs
    tokens = round(train.tokens * epochs * (train.steps / full if full else 1.0))
    eval_usd: float | None = 0.0
    if eval_rows is not None and evals:
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


def _resume_step(log_dir: Path, per_epoch: int) -> int | None:
    """The step a resumed run continues from: the last checkpoint with training state, as the cookbook picks it."""
    from .runlog import read_log_lines

    states = [c for c in read_log_lines(log_dir / "checkpoints.jsonl") if isinstance(c.get("state_path"), str)]
    if not states or not isinstance(states[-1].get("batch"), int):
        return None
    return int(states[-1].get("epoch") or 0) * per_epoch + states[-1]["batch"]


def _dpo_config(spec: dict) -> Any:
    """The cookbook's train_dpo Config for a spec `dpo` wrote (runs in the child process)."""
    from tinker_cookbook.preference import train_dpo
    from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
    from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    builder = DPODatasetBuilderFromComparisons(
        comparison_builder=ComparisonBuilderFromJsonl(train_path=spec["data_path"]),
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=spec["model"], renderer_name=spec["renderer"],
            max_length=spec["max_length"], batch_size=spec["batch_size"]))
    return train_dpo.Config(
        log_path=spec["log_dir"], model_name=spec["model"], recipe_name="machine_nb_dpo", dataset_builder=builder,
        load_checkpoint_path=spec["load_checkpoint"], renderer_name=spec["renderer"],
        learning_rate=spec["learning_rate"], lr_schedule=spec["lr_schedule"], num_epochs=spec["epochs"],
        dpo_beta=spec["beta"], lora_rank=spec["lora_rank"], base_url=spec["base_url"], save_every=spec["save_every"],
        eval_every=0, infrequent_eval_every=0, ttl_seconds=None, max_steps=spec["max_steps"])


def _with_heldout(spec: dict, config: Any) -> tuple[Any, Any, int]:
    """The Config with the held-out evaluator in its `evaluator_builders`, the builder, and the run's
    total steps. train_dpo evaluates before step s when s % eval_every == 0 and before its last
    step, from the step it starts (or resumes) at; each score is filed under its step."""
    import chz
    from tinker_cookbook import checkpoint_utils

    from .heldout import HeldOutEvalBuilder, eval_schedule

    dataset, _ = config.dataset_builder()
    n_batches = len(dataset)
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    last = checkpoint_utils.get_last_checkpoint(spec["log_dir"])
    start = 0 if last is None else (last.epoch or 0) * n_batches + (last.batch or 0)  # as train_dpo.main resumes
    every = int(spec["heldout"]["every"])
    builder = HeldOutEvalBuilder.from_spec(spec, eval_schedule(start, total, every, last=True))
    return chz.replace(config, evaluator_builders=[builder], eval_every=every), builder, total


def child_run(spec: dict) -> None:
    """The dpo half that runs in the child (runner.py): the cookbook's DPO loop, unchanged; with
    held-out evals, its evaluator in the loop's `evaluator_builders`, then the final checkpoint
    scored the same way (the loop evaluates before a step, so never the weights after the last)."""
    from tinker_cookbook.preference import train_dpo

    config = _dpo_config(spec)
    builder = None
    if spec.get("heldout"):
        config, builder, total = _with_heldout(spec, config)
    train_dpo.main(config)  # synchronous; it runs its own event loops
    if builder is not None:
        from .heldout import evaluate_final

        evaluate_final(builder, spec["base_url"], total)



# ---------------------------------------------------------------------------------------------
# how a model ranks the two replies


def _reply_logprob(client: Any, renderer: Any, messages: list[dict]) -> Any:
    """A future of (summed log-probability of the last reply's trained tokens, token count)."""
    import tinker

    tokens, weights = renderer.build_supervised_example(messages)
    ints = tokens.to_ints() if hasattr(tokens, "to_ints") else list(tokens)
    weights = [float(w) for w in weights]
    future = client.compute_logprobs(tinker.ModelInput.from_ints(ints))

    class _Sum:
        def result(self) -> float:
            logprobs = future.result()
            # token i's log-probability given the ones before it; the first token has none
            return sum(lp * w for lp, w in zip(logprobs[1:], weights[1:]) if w)

    return _Sum()


def score_pairs(pairs: Any, model: str | None = None, checkpoint: str | None = None, engine: str | None = None):
    """How a model (or checkpoint) ranks each pair's replies: the summed log-probability of each.

    Pair accuracy, the share of pairs whose chosen reply is the more likely one, is
    `score_pairs(...)["correct"].mean()`; DPO's own `accuracy` metric is the same comparison
    relative to the reference model. Two frames of the same pairs compare pair by pair with
    `compare` (exact McNemar on the pairs that changed).

    Args:
        pairs: a pairs frame, pair records or a pairs JSONL path.
        model: the base model (its renderer turns messages into tokens). Default None: the
            checkpoint's base model, else the local engine's default model.
        checkpoint: a sampler checkpoint to score instead of the base model (default None).
        engine: default None = the checkpoint's (or model's) own.

    Returns:
        A DataFrame with SCORE_COLUMNS, one row per pair.
    """
    import pandas as pd

    from .chat import prompt_text
    from .engines import checkpoint_base_model, default_model, engine_for
    from .sampling import open_sampler

    records = _pair_records(pairs)
    if engine is None:
        engine = engine_for(checkpoint or model) if (checkpoint or model) else "local"
    if model is None and checkpoint is not None:
        model = checkpoint_base_model(checkpoint)
    if model is None:
        if checkpoint is not None:
            raise ValueError("model= is needed with a Tinker checkpoint (its renderer formats the pairs)")
        model = default_model(engine)
    client = open_sampler(render.base_model(model), checkpoint, engine)  # engines keeps one service client
    renderer = render.get_renderer(model)
    futures = [(_reply_logprob(client, renderer, r["prompt"] + r["chosen"]),
                _reply_logprob(client, renderer, r["prompt"] + r["rejected"])) for r in records]
    from .pairs import _records

    raw = _records(pairs)
    rows = []
    for i, (r, (fc, fr)) in enumerate(zip(records, futures)):
        c, j = fc.result(), fr.result()
        chosen, rejected = r["chosen"][0]["content"], r["rejected"][0]["content"]
        rows.append({"row": i, "pair": r["pair"], "source": raw[i].get("source"), "prompt": prompt_text(r["prompt"]),
                     "expected": chosen, "rejected": rejected, "output": chosen if c > j else rejected,
                     "chosen_logprob": c, "rejected_logprob": j, "margin": c - j, "correct": bool(c > j)})
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


__all__ = ["dpo", "score_pairs", "read_dpo_log", "resume_note", "dpo_estimate", "dpo_evals", "child_run",
           "SCORE_COLUMNS", "STEP_KEY"]
