"""`machine-nb sft`, `smoke` and `sweep`: supervised fine-tuning from a terminal (train.py and
sweeps.py do the work; the flag groups they share with `eval`, `dpo` and the others are _flags.py's).

Mirrors Machine's `/train sft` and `/train smoke`: the local engine runs free on this machine;
Tinker needs `--yes` before spending (the estimate is printed first) and TINKER_API_KEY.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import _flags as flags

_COMMON_DESC = (
    "Reads: DATA (chat JSONL, one {{\"messages\": [...]}} per line). Writes: a fresh log dir "
    "(runs/{prefix}-<time>-<hex> unless --log-dir/--workspace; 0700) with train.jsonl, config.json, metrics.jsonl, "
    "checkpoints.jsonl, logs.log and the checkpoints (local engine: weights/ and sampler_weights/). "
    "Cost: free on the local engine; on Tinker, tokens x epochs at the model's train price (needs --yes, "
    "TINKER_API_KEY and a known price; refused over --max-usd).")


def _add_common(p: argparse.ArgumentParser) -> argparse._MutuallyExclusiveGroup:
    p.add_argument("data", type=flags.path, help="training data: chat JSONL (e.g. data/minimal_sft/train.jsonl)")
    flags.target_flags(p)
    where = flags.log_dir_flags(p)
    p.add_argument("--seed", type=flags.SEED, default=0, help="shuffling, LoRA init and sampling seed (default 0)")
    flags.spending_flags(p)
    return where


def register(sub: argparse._SubParsersAction) -> None:
    """Add `sft`, `smoke` and `sweep` to the CLI.

    Args:
        sub: the top-level parser's subparsers.
    """
    p = sub.add_parser(
        "sft", help="supervised fine-tuning with tinker-cookbook's loop, on the local engine or Tinker",
        description="Fine-tune a model on chat JSONL with tinker-cookbook's supervised.train.main. " + _COMMON_DESC.format(prefix="sft"))
    where = _add_common(p)
    flags.schedule_flags(p, unit="rows",
                       learning_rate="3e-3 for a local LoRA, 5e-4 at rank 0, as benchmarks/bench_sft.py measures "
                                     "them; the cookbook's on Tinker",
                       lora_rank="8 local, 32 Tinker; 0 = full fine-tuning, local only")
    flags.resume_flag(p, "sft", where)
    flags.heldout_flags(p)
    flags.inspect_flags(p)
    p.set_defaults(func=_run_sft)

    s = sub.add_parser(
        "smoke", help="a real 2-step training run: proves data, engine and loop work end to end",
        description="Run 2 real training steps (the same path as sft). " + _COMMON_DESC.format(prefix="sft"))
    _add_common(s)
    s.add_argument("--steps", type=flags.whole(1), default=2, help="steps to run (default 2)")
    s.set_defaults(func=_run_smoke)

    w = sub.add_parser(
        "sweep", help="one sft run per grid point and seed, resumable; prints a row per setting and the verdict",
        description=(
            "Run sft for every combination of --grid values and every --seeds value, each in its own log dir under "
            "--sweep-dir, scoring --eval while training. Reads: DATA (chat JSONL) and --eval. Writes: SWEEP_DIR/sweep.json "
            "and one log dir per run (as sft); the same --sweep-dir again reads finished runs back and runs only what "
            "is missing. Cost: free on the local engine; on Tinker every run still to run is priced (training plus "
            "held-out evals) first: without --yes the total is printed and nothing runs; over --max-usd it is refused."))
    w.add_argument("data", type=flags.path, help="training data: chat JSONL (e.g. data/minimal_sft/train.jsonl)")
    w.add_argument("--grid", action="append", required=True, metavar="SETTING=V1,V2",
                   help="a setting and its values, e.g. learning_rate=1e-3,3e-3 (repeat for more axes)")
    w.add_argument("--seeds", type=flags.whole_list, default=[0], help="comma-separated training seeds (default 0)")
    flags.heldout_flags(w, writes=False)
    w.add_argument("--set", action="append", default=[], metavar="SETTING=V",
                   help="an sft setting fixed for every run, e.g. batch_size=8 (repeatable)")
    w.add_argument("--sweep-dir", type=flags.path, default=None, help="where the runs go (default: a fresh runs/sweep-… dir)")
    flags.target_flags(w, model_default="the engine's; local/arith-tiny locally")
    w.add_argument("--max-parallel", type=flags.whole(1), default=1, help="runs at once (default 1)")
    flags.spending_flags(w, budget_of="the whole sweep", json_help="print one JSON object per run instead of the summary")
    w.set_defaults(func=_run_sweep)


def _refused_spend(args: argparse.Namespace, epochs: int, batch_size: int, steps: int | None) -> int | None:
    """On Tinker without --yes: print the estimate and refuse (Machine's habit).

    Returns:
        None to go on; else the exit status: REFUSED_SPEND, or USAGE when there is no --model to price.

    Raises:
        ValueError: fewer rows than one batch, the run sft refuses (exit 1, nothing offered for --yes).
    """
    if flags.engine_of(args) != "tinker" or args.yes:
        return None
    from ..checks.pricing import estimate_cost, no_full_batch

    if not flags.needs_model(args, "thinkingmachines/Inkling"):  # a model with a training price
        return flags.USAGE
    est = estimate_cost(args.data, args.model, epochs=epochs, batch_size=batch_size, max_steps=steps,
                        max_usd=args.max_usd)
    why = no_full_batch(est.rows, batch_size)
    if why:
        raise ValueError(why)
    evals = ""
    if getattr(args, "eval_data", None):
        from ..core.chat import load_eval_rows
        from ..training.loop import estimate_run, eval_count
        from ..core.chat import prepare_data

        rows, _ = prepare_data(args.data)
        every = args.eval_every if args.eval_every is not None else max(1, len(rows) // batch_size)  # 0: final only
        n = eval_count(est.steps, every)  # the eval steps and the final checkpoint
        held = load_eval_rows(args.eval_data)
        both = estimate_run("sft", rows, args.model, "tinker", epochs=epochs, batch_size=batch_size, max_steps=steps,
                            eval_rows=held, evals=n)
        evals = flags.heldout_cost_text(n, len(held), both["eval_usd"])
    flags.refuse_to_spend(
        f"trains {args.model}", f"about ${est.usd:.4f} ({est.rows} rows, {est.tokens:,} tokens x {epochs} epoch(s), "
                                f"{est.steps} steps; {flags.estimate_source(est)})", detail=evals)
    return flags.REFUSED_SPEND


def _run_sft(args: argparse.Namespace) -> int:
    from ..training.train import sft

    refused = _refused_spend(args, args.epochs, args.batch_size, args.steps)
    if refused is not None:
        return refused
    result = sft(args.data, args.model, args.engine, epochs=args.epochs, max_steps=args.steps,
                 learning_rate=args.learning_rate, batch_size=args.batch_size, lora_rank=args.lora_rank,
                 log_dir=args.log_dir, workspace=args.workspace, resume=args.resume, seed=args.seed,
                 max_usd=args.max_usd, eval_data=args.eval_data, eval_every=args.eval_every,
                 inspect_tasks=args.inspect_tasks)
    flags.print_result(result, args.json)
    return 0


def _run_smoke(args: argparse.Namespace) -> int:
    from ..core.chat import prepare_data
    from ..training.train import smoke

    rows, _ = prepare_data(args.data)
    batch = max(1, min(8, len(rows)))
    refused = _refused_spend(args, -(-args.steps // max(1, len(rows) // batch)), batch, args.steps)
    if refused is not None:
        return refused
    result = smoke(args.data, args.model, args.engine, steps=args.steps, log_dir=args.log_dir,
                   workspace=args.workspace, seed=args.seed, max_usd=args.max_usd)
    flags.print_result(result, args.json)
    return 0


def _value(text: str):
    """A command-line value as sft takes it: an int, a float, else the text (spaces around it dropped)."""
    text = text.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(items: list[str], flag: str, many: bool) -> dict:
    """`SETTING=VALUE` (or `=V1,V2` with `many`) items as a dict; a setting named twice is refused,
    since the later item would silently replace the earlier one's values."""
    out: dict = {}
    given: dict[str, str] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise ValueError(f"{flag} {item!r}: write SETTING=VALUE{'S (comma-separated)' if many else ''}")
        if name in given:
            way = f"list its values once: {flag} {name}=V1,V2" if many else "give it once"
            raise ValueError(f"{flag} {name} is given twice ({given[name]!r} and {item!r}); {way}")
        given[name] = item
        if many and any(not v.strip() for v in values.split(",")):
            raise ValueError(f"{flag} {item!r}: an empty value between commas; list each value once, e.g. "
                             f"{flag} {name}=V1,V2")
        out[name] = [_value(v) for v in values.split(",")] if many else _value(values)
    return out


#: sft keywords `sweep` takes from its own flags, and the flag that sets each.
_SWEEP_FLAGS = {"seed": "--seeds", "model": "--model", "engine": "--engine", "eval_data": "--eval",
                "eval_every": "--eval-every", "max_usd": "--max-usd", "data": "DATA"}
#: sft keywords the sweep sets for each run itself.
_SWEEP_SETS = ("log_dir", "workspace", "name", "resume", "progress", "on_metrics")


def _check_fixed(fixed: dict, grid: dict) -> None:
    """Refuse a `--set` the sweep cannot take, naming it: a setting with its own flag, one the sweep
    sets per run, one that is also a `--grid` axis, or a name sft does not know.

    Raises:
        ValueError: naming the `--set` item and the way out.
    """
    import inspect

    from ..training.train import sft

    known = set(inspect.signature(sft).parameters) - set(_SWEEP_FLAGS) - set(_SWEEP_SETS)
    for name in fixed:
        if name in _SWEEP_FLAGS:
            raise ValueError(f"--set {name}: give it as {_SWEEP_FLAGS[name]}")
        if name in _SWEEP_SETS:
            raise ValueError(f"--set {name}: the sweep sets {name} for each run itself")
        if name in grid:
            raise ValueError(f"--set {name}: {name} is a --grid axis too; give it in one of them")
        if name not in known:
            raise ValueError(f"--set {name}: not an sft setting (known: {', '.join(sorted(known))})")


def _run_sweep(args: argparse.Namespace) -> int:
    from ..training.sweeps import estimate_sweep, sweep, sweep_summary, verdict

    grid, fixed = _pairs(args.grid, "--grid", True), _pairs(args.set, "--set", False)
    _check_fixed(fixed, grid)
    seeds = args.seeds
    if flags.engine_of(args) == "tinker" and not args.yes:
        if not flags.needs_model(args, "thinkingmachines/Inkling"):  # a model with a training price
            return flags.USAGE
        total, unknown = estimate_sweep(args.data, grid, seeds=seeds, eval_data=args.eval_data,
                                        eval_every=args.eval_every, model=args.model, **fixed)
        from ..training.sweeps import grid_points

        runs = len(seeds) * len(grid_points(grid))
        extra = f"; {len(unknown)} cannot be priced" if unknown else ""
        flags.refuse_to_spend(f"sweep trains {args.model}",
                              f"about ${total:.4f} for {runs} runs with their held-out evals{extra}",
                              detail="Runs already finished in --sweep-dir are not charged again.")
        return flags.REFUSED_SPEND
    frame = sweep(args.data, grid, seeds=seeds, eval_data=args.eval_data, eval_every=args.eval_every,
                  model=args.model, engine=args.engine, sweep_dir=args.sweep_dir, max_parallel=args.max_parallel,
                  max_usd=args.max_usd, **fixed)
    if args.json:
        import json
        import math

        # a failed run's missing numbers are NaN in the frame (a diverged loss may be inf); JSON has
        # neither, so they print as null
        for row in frame.to_dict("records"):
            print(json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v
                              for k, v in row.items()}, default=str))
        return 0 if (frame["status"] != "failed").all() else 1
    metric = "heldout_accuracy" if frame["heldout_accuracy"].notna().any() else "final_loss"
    summary = sweep_summary(frame, metric)
    print(summary.to_string(index=False))
    print()
    print(verdict(frame, metric, summary=summary))
    failed = frame[frame["status"] == "failed"]
    for row in failed.itertuples():
        print(f"failed: {row.run}: {row.error}", file=sys.stderr)
    print(f"sweep dir: {os.path.dirname(frame['log_dir'].iloc[0])}")
    return 0 if failed.empty else 1
