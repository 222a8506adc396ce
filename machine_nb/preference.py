"""Preference training: tinker-cookbook's own DPO loop (`preference.train_dpo.main`) on pairs, on the
local engine or Tinker, and how a model ranks the two replies of each pair.

`dpo` runs the same way `train.sft` does: one fresh log dir, the engine's checks (on Tinker the key,
the service and the price, before anything is spent: pricing.estimate_dpo_cost), then the
cookbook's loop unchanged in the runner child process against the engine's URL, with a progress
bar fed from `metrics.jsonl`. The pairs come from pairs.py (`preference_pairs`), written into the
log dir as the cookbook's comparison JSONL. `score_pairs` measures a model or checkpoint on pairs:
the summed log-probability of each reply, as the DPO loss sees them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path
from typing import Any

from . import render
from .errors import EngineError, MachineFormatError

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
STEP_KEY = "dpo_loss"

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


def _preflight_pairs(records: list[dict], model: str, max_length: Any) -> None:
    """validate()'s checks (shape, secrets, the model's context, trained tokens) on both sides of
    every pair; ValidationFailed names the pair and side of the first failures."""
    from .errors import ValidationFailed
    from .validate import preflight

    for side in ("chosen", "rejected"):
        rows = [{"messages": r["prompt"] + r[side]} for r in records]
        result = preflight(rows, model, max_length, raise_errors=False)
        if result.ok:
            continue
        errors = result.errors()
        listed = "; ".join(f"pair {int(e.line)} ({side}): {e.code}: {e.message}" for e in errors.head(5).itertuples())
        raise ValidationFailed(f"{len(errors)} problem(s) in the pairs, refused before training: {listed}", result)


def _state_path(load_checkpoint: Any) -> tuple[str, str | None, str | None]:
    """(training state path, its model, its engine) of an SFT run to start DPO from."""
    from .train import TrainResult, read_training_log

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


def _dpo_steps(log_dir: Path) -> list[dict]:
    from .train import _read_log_lines, _unique_steps

    return _unique_steps([m for m in _read_log_lines(log_dir / "metrics.jsonl")
                          if isinstance(m.get(STEP_KEY), (int, float))])


def read_dpo_log(log_dir: str | os.PathLike):
    """The checkpoint, steps, tokens and losses of a DPO log dir (finished or not).

    Args:
        log_dir: the run's log dir.

    Returns:
        `read_training_log`'s TrainResult, with steps counted from the metrics rows that carry
        `dpo_loss`, first_loss / last_loss their `dpo_loss`, tokens their `num_tokens` (chosen +
        rejected sequences) and the cost as DPOCostEstimate bounds it (training + policy forward +
        reference forward; 0 locally).
    """
    from .pricing import dpo_cost
    from .train import read_training_log

    result = read_training_log(log_dir)
    steps = _dpo_steps(Path(log_dir))
    result.steps = len(steps)
    result.tokens = int(sum(m.get("num_tokens", 0) or 0 for m in steps))
    result.first_loss = float(steps[0][STEP_KEY]) if steps else None
    result.last_loss = float(steps[-1][STEP_KEY]) if steps else None
    result.cost_usd = dpo_cost(result.model, result.engine, result.tokens)
    return result


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
        base_url: str | None = None, progress: bool = True, on_metrics: Any = None):
    """Direct preference optimisation with tinker-cookbook's `preference.train_dpo.main`, on `engine`.

    The cookbook's loop runs unchanged in a child process (its `main` calls `asyncio.run` itself, so
    it never touches a notebook's event loop) and reaches the engine through the real tinker SDK.
    Its reference model is a frozen snapshot of the weights it starts from: the base model, or the
    SFT checkpoint given as `load_checkpoint` (SFT then DPO).

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
            settings it was started with. Steps already done are not repeated; the cookbook takes
            its reference model from the weights it resumes from, so the resumed steps are measured
            against the checkpoint rather than the starting weights.
        seed: the order the pairs are written in (default 0), which the cookbook shuffles per epoch.
        max_length: tokens per sequence (default None = the local model's context, 128; none on Tinker).
        save_every: checkpoint every N steps (default 20, the cookbook's).
        max_usd: Tinker budget, refused before spending when the estimate (pricing.estimate_dpo_cost:
            training, the policy's forward pass and the reference model's) is over it; an unknown
            price is always refused. Local runs cost 0.
        base_url: Tinker service URL (default None: $TINKER_BASE_URL, else Tinker's).
        progress: show a progress bar (steps, dpo loss, pair accuracy).
        on_metrics: default None; called in the caller's thread with each list of new metrics rows.

    Returns:
        A TrainResult read back from the log dir (`read_dpo_log`): steps, tokens, first / last
        `dpo_loss`, the final sampler checkpoint, the cost. The per-step `dpo_loss`, `accuracy`,
        `margin`, `chosen_reward` and `rejected_reward` are in `training_metrics(log_dir)`.
    """
    from . import engines
    from .train import (LOCAL_LORA_RANK, MARKER, TINKER_LORA_RANK, _claim_log_dir, _MetricsTail, _private_files,
                        new_log_dir, run_cookbook)

    start_path = None
    if resume is not None:
        path = Path(resume).absolute()
        _claim_log_dir(path, resume=True)
        saved = json.loads((path / MARKER).read_text(encoding="utf-8"))
        if saved.get("kind") != "dpo":
            raise ValueError(f"resume={str(resume)!r} is not a dpo run (resume an sft run with sft(resume=…))")
        (epochs, batch_size, max_steps, learning_rate, beta, lora_rank, seed, max_length, lr_schedule,
         save_every, model, engine, start_path) = (saved[k] for k in _RESUMED)
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
    steps_total = (len(records) // batch_size) * epochs
    if max_steps is not None:
        steps_total = min(steps_total, max_steps)
    renderer = render.renderer_name(model)
    if local_model and max_length is None:
        from .engines.local import load_config

        max_length = load_config(render.base_model(model)).block_size
    _preflight_pairs(records, model, max_length if max_length is not None else "auto")

    if engine == "tinker":
        from .engines.tinker import check_tinker
        from .pricing import estimate_dpo_cost

        # refuse before spending (and before writing anything): over budget, no key, not Tinker
        estimate_dpo_cost(records, model, epochs=epochs, batch_size=batch_size, max_usd=max_usd, max_steps=max_steps)
        url = check_tinker(base_url, models=(model,))
    else:
        url = engines.local_base_url()

    if resume is None:
        from .jsonl import atomic_write_text, write_jsonl
        from .pairs import comparison_line

        path = (Path(log_dir).absolute() if log_dir is not None
                else new_log_dir("dpo", workspace=workspace, name=name))
        _claim_log_dir(path, resume=False)
        random.Random(seed).shuffle(records)
        write_jsonl([comparison_line(r) for r in records], path / "pairs.jsonl")
        if learning_rate is None:
            learning_rate = _default_lr(model, start_path is not None)
        marker = {"kind": "dpo", "engine": engine, "model": model, "renderer": renderer, "pairs": len(records),
                  "epochs": epochs, "batch_size": batch_size, "max_steps": max_steps, "learning_rate": learning_rate,
                  "beta": beta, "lora_rank": None if start_path else lora_rank,  # a checkpoint keeps its own
                  "seed": seed, "max_length": max_length,
                  "lr_schedule": lr_schedule, "save_every": save_every, "load_checkpoint": start_path,
                  "source": str(pairs) if isinstance(pairs, (str, os.PathLike)) else "<in-memory pairs>"}
        atomic_write_text(path / MARKER, json.dumps(marker, indent=1))

    spec = {"module": __name__, "data_path": str(path / "pairs.jsonl"), "log_dir": str(path),
            "model": render.base_model(model), "renderer": renderer, "max_length": max_length,
            "batch_size": batch_size, "learning_rate": learning_rate, "lr_schedule": lr_schedule, "epochs": epochs,
            "beta": beta, "lora_rank": lora_rank, "base_url": url, "save_every": save_every, "max_steps": max_steps,
            "load_checkpoint": None if start_path is None else engines.to_sdk_path(start_path),
            "local_models": local_model}

    from .engines.tinker import Watchdog
    from .progress import progress as progress_bar

    tail = _MetricsTail(path / "metrics.jsonl")
    seen_steps: set[int] = set()
    watchdog = Watchdog(url) if engine == "tinker" else contextlib.nullcontext()
    with progress_bar(total=steps_total, desc="dpo", unit="steps", enabled=None if progress else False) as bar, \
            watchdog as dog:

        def poll() -> None:
            new = tail.new_rows()
            steps = [m for m in new if STEP_KEY in m and m.get("step") not in seen_steps]
            seen_steps.update(m.get("step") for m in steps)
            if steps:
                bar.update(len(steps), loss=float(steps[-1][STEP_KEY]), acc=float(steps[-1].get("accuracy", 0.0)))
            if new and on_metrics is not None:
                on_metrics(new)

        try:
            run_cookbook(spec, path, engine=engine, on_poll=poll, watchdog=dog)
        finally:
            _private_files(path)
    result = read_dpo_log(path)
    result.model, result.engine = model, engine
    from .pricing import dpo_cost

    result.cost_usd = dpo_cost(model, engine, result.tokens)
    return result


def child_run(spec: dict) -> None:
    """The dpo half that runs in the child (runner.py): the cookbook's DPO loop, unchanged."""
    from tinker_cookbook.preference import train_dpo
    from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
    from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    builder = DPODatasetBuilderFromComparisons(
        comparison_builder=ComparisonBuilderFromJsonl(train_path=spec["data_path"]),
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=spec["model"], renderer_name=spec["renderer"],
            max_length=spec["max_length"], batch_size=spec["batch_size"]))
    config = train_dpo.Config(
        log_path=spec["log_dir"], model_name=spec["model"], recipe_name="machine_nb_dpo", dataset_builder=builder,
        load_checkpoint_path=spec["load_checkpoint"], renderer_name=spec["renderer"],
        learning_rate=spec["learning_rate"], lr_schedule=spec["lr_schedule"], num_epochs=spec["epochs"],
        dpo_beta=spec["beta"], lora_rank=spec["lora_rank"], base_url=spec["base_url"], save_every=spec["save_every"],
        eval_every=0, infrequent_eval_every=0, ttl_seconds=None, max_steps=spec["max_steps"])
    train_dpo.main(config)  # synchronous; it runs its own event loops


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


#: The local engine's SDK client, by server URL, reused by every score_pairs call of this process.


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

    from .engines import checkpoint_base_model, default_model, engine_for, service_client, to_sdk_path
    from .evaluate import prompt_text

    records = _pair_records(pairs)
    if engine is None:
        engine = engine_for(checkpoint or model) if (checkpoint or model) else "local"
    if model is None and checkpoint is not None:
        model = checkpoint_base_model(checkpoint)
    if model is None:
        if checkpoint is not None:
            raise ValueError("model= is needed with a Tinker checkpoint (its renderer formats the pairs)")
        model = default_model(engine)
    client_of = service_client(engine, models=(model,))  # engines keeps one client per engine and URL
    import tinker

    client = (client_of.create_sampling_client(model_path=to_sdk_path(checkpoint)) if checkpoint
              else client_of.create_sampling_client(base_model=render.base_model(model)))
    if isinstance(client, tinker.APIFuture):  # the SDK hands back a future of the client
        client = client.result()
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


__all__ = ["dpo", "score_pairs", "read_dpo_log", "child_run", "SCORE_COLUMNS", "STEP_KEY"]
