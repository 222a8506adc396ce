"""`machine-nb sft` and `machine-nb smoke`: supervised fine-tuning from a terminal (train.py does the work).

Mirrors Machine's `/train sft` and `/train smoke`: the local engine runs free on this machine;
Tinker needs `--yes` before spending (the estimate is printed first) and TINKER_API_KEY.
"""

from __future__ import annotations

import argparse
import os
import sys

_COMMON_DESC = (
    "Reads: DATA (chat JSONL, one {{\"messages\": [...]}} per line). Writes: a fresh log dir "
    "(runs/{prefix}-<time>-<hex> unless --log-dir/--workspace; 0700) with train.jsonl, config.json, metrics.jsonl, "
    "checkpoints.jsonl, logs.log and the checkpoints (local engine: weights/ and sampler_weights/). "
    "Cost: free on the local engine; on Tinker, tokens x epochs at the model's train price (needs --yes, "
    "TINKER_API_KEY and a known price; refused over --max-usd).")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="training data: chat JSONL (e.g. data/minimal_sft/train.jsonl)")
    p.add_argument("--model", default=None,
                   help="base model (default: the engine's; local/arith-tiny on the local engine)")
    p.add_argument("--engine", choices=["local", "tinker"], default=None,
                   help="where to train (default: the model's engine; local when no model is given)")
    p.add_argument("--log-dir", default=None, help="log dir for this run (default: a fresh runs/… dir)")
    p.add_argument("--workspace", default=None, help="write the log dir under WORKSPACE/.machine/training/")
    p.add_argument("--seed", type=int, default=0, help="shuffling, LoRA init and sampling seed (default 0)")
    p.add_argument("--max-usd", type=float, default=None, help="Tinker budget: refuse when the estimate is over it")
    p.add_argument("--yes", action="store_true", help="allow spending on Tinker (without it: print the estimate, exit 2)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sft", help="supervised fine-tuning with tinker-cookbook's loop, on the local engine or Tinker",
        description="Fine-tune a model on chat JSONL with tinker-cookbook's supervised.train.main. " + _COMMON_DESC.format(prefix="sft"))
    _add_common(p)
    p.add_argument("--epochs", type=int, default=10, help="passes over the data (default 10: small style sets need several)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: epochs x full batches)")
    p.add_argument("--learning-rate", "--lr", type=float, default=None,
                   help="peak learning rate, linear decay (default: 3e-3 local LoRA, calibrated; the cookbook's on Tinker)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per step (default 8; the partial last batch is dropped)")
    p.add_argument("--lora-rank", type=int, default=None, help="LoRA rank (default 8 local, 32 Tinker; 0 = full fine-tuning, local only)")
    p.add_argument("--resume", default=None, help="continue the run in this log dir from its last checkpoint")
    p.add_argument("--eval", dest="eval_data", default=None,
                   help="held-out eval JSONL to score while training (e.g. data/minimal_sft/valid.jsonl; "
                        "default: none). Writes heldout.jsonl; on Tinker its sampling is in the estimate")
    p.add_argument("--eval-every", type=int, default=None,
                   help="score --eval every N steps (default: once an epoch) and the final checkpoint")
    p.set_defaults(func=_run_sft)

    s = sub.add_parser(
        "smoke", help="a real 2-step training run: proves data, engine and loop work end to end",
        description="Run 2 real training steps (the same path as sft). " + _COMMON_DESC.format(prefix="sft"))
    _add_common(s)
    s.add_argument("--steps", type=int, default=2, help="steps to run (default 2)")
    s.set_defaults(func=_run_smoke)

    w = sub.add_parser(
        "sweep", help="one sft run per grid point and seed, resumable; prints a row per setting and the verdict",
        description=(
            "Run sft for every combination of --grid values and every --seeds value, each in its own log dir under "
            "--sweep-dir, scoring --eval while training. Reads: DATA (chat JSONL) and --eval. Writes: SWEEP_DIR/sweep.json "
            "and one log dir per run (as sft); the same --sweep-dir again reads finished runs back and runs only what "
            "is missing. Cost: free on the local engine; on Tinker every run still to run is priced (training plus "
            "held-out evals) first: without --yes the total is printed and nothing runs; over --max-usd it is refused."))
    w.add_argument("data", help="training data: chat JSONL (e.g. data/minimal_sft/train.jsonl)")
    w.add_argument("--grid", action="append", required=True, metavar="SETTING=V1,V2",
                   help="a setting and its values, e.g. learning_rate=1e-3,3e-3 (repeat for more axes)")
    w.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0)")
    w.add_argument("--eval", dest="eval_data", default=None,
                   help="held-out JSONL to choose on, scored while training (e.g. data/minimal_sft/valid.jsonl)")
    w.add_argument("--eval-every", type=int, default=None, help="score --eval every N steps (default: once an epoch)")
    w.add_argument("--set", action="append", default=[], metavar="SETTING=V",
                   help="an sft setting fixed for every run, e.g. batch_size=8 (repeatable)")
    w.add_argument("--sweep-dir", default=None, help="where the runs go (default: a fresh runs/sweep-… dir)")
    w.add_argument("--model", default=None, help="base model (default: the engine's; local/arith-tiny locally)")
    w.add_argument("--engine", choices=["local", "tinker"], default=None, help="where to train (default: the model's)")
    w.add_argument("--max-parallel", type=int, default=1, help="runs at once (default 1)")
    w.add_argument("--max-usd", type=float, default=None, help="budget for the whole sweep on Tinker")
    w.add_argument("--yes", action="store_true", help="allow spending on Tinker (without it: print the estimate, exit 2)")
    w.add_argument("--json", action="store_true", help="print one JSON object per run instead of the summary")
    w.set_defaults(func=_run_sweep)


def _engine(args: argparse.Namespace) -> str:
    from ..engines import engine_for

    if args.engine:
        return args.engine
    return engine_for(args.model) if args.model else "local"


def _confirm_spend(args: argparse.Namespace, epochs: int, batch_size: int, steps: int | None) -> bool:
    """On Tinker without --yes: print the estimate and refuse (Machine's habit). True = go on."""
    if _engine(args) != "tinker" or args.yes:
        return True
    from ..pricing import estimate_cost

    if not args.model:
        print("machine-nb: --engine tinker needs --model (e.g. thinkingmachines/Inkling-Small)", file=sys.stderr)
        return False
    est = estimate_cost(args.data, args.model, epochs=epochs, batch_size=batch_size, max_steps=steps,
                        max_usd=args.max_usd)
    evals = ""
    if getattr(args, "eval_data", None):
        from ..chat import load_eval_rows
        from ..loop import eval_count
        from ..train import prepare_data, run_estimate

        rows, _ = prepare_data(args.data)
        every = args.eval_every or max(1, len(rows) // batch_size)
        n = eval_count(est.steps, every)  # the eval steps and the final checkpoint
        held = load_eval_rows(args.eval_data)
        both = run_estimate(rows, args.model, "tinker", epochs=epochs, batch_size=batch_size, max_steps=steps,
                            eval_rows=held, evals=n)
        eval_usd = "an unknown amount" if both["eval_usd"] is None else f"at most ${both['eval_usd']:.4f}"
        evals = f" Held-out evals: {n} x {len(held)} rows, {eval_usd}."
    print(f"This trains {args.model} on Tinker: {est.rows} rows, {est.tokens:,} tokens x {epochs} epoch(s), "
          f"{est.steps} steps, about ${est.usd:.4f} ({'exact' if est.exact else 'estimated'} tokens, "
          f"{est.price.source} {est.price.date}).{evals} Re-run with --yes to spend.", file=sys.stderr)
    return False


def _print(result, as_json: bool) -> None:
    if as_json:
        import json

        print(json.dumps(result.to_dict()))
        return
    loss = ("–" if result.first_loss is None else f"{result.first_loss:.4f} → {result.last_loss:.4f}")
    usd = lambda v: "unknown" if v is None else f"${v:.4f}"  # noqa: E731
    cost = usd(result.cost_usd) + ("" if result.estimated_usd is None else f" (estimated {usd(result.estimated_usd)})")
    print(f"{result.model} on {result.engine}: {result.steps} steps, {result.tokens:,} tokens, loss {loss}, cost {cost}")
    if result.evals:
        final = "–" if result.heldout_accuracy is None else f"{result.heldout_accuracy:.1%}"
        print(f"held-out:   {final} at the final checkpoint; best {result.best_accuracy:.1%} at step "
              f"{result.best_step} ({result.evals} evals, heldout.jsonl)")
    print(f"checkpoint: {result.checkpoint}")
    print(f"log dir:    {result.log_dir}")


def _run_sft(args: argparse.Namespace) -> int:
    from ..train import sft

    if not _confirm_spend(args, args.epochs, args.batch_size, args.steps):
        return 2
    result = sft(args.data, args.model, args.engine, epochs=args.epochs, max_steps=args.steps,
                 learning_rate=args.learning_rate, batch_size=args.batch_size, lora_rank=args.lora_rank,
                 log_dir=args.log_dir, workspace=args.workspace, resume=args.resume, seed=args.seed,
                 max_usd=args.max_usd, eval_data=args.eval_data, eval_every=args.eval_every)
    _print(result, args.json)
    return 0


def _run_smoke(args: argparse.Namespace) -> int:
    from ..train import prepare_data, smoke

    rows, _ = prepare_data(args.data)
    batch = max(1, min(8, len(rows)))
    if not _confirm_spend(args, -(-args.steps // max(1, len(rows) // batch)), batch, args.steps):
        return 2
    result = smoke(args.data, args.model, args.engine, steps=args.steps, log_dir=args.log_dir,
                   workspace=args.workspace, seed=args.seed, max_usd=args.max_usd)
    _print(result, args.json)
    return 0


def _value(text: str):
    """A command-line value as sft takes it: an int, a float, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(items: list[str], flag: str, many: bool) -> dict:
    out = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name or not values:
            raise ValueError(f"{flag} {item!r}: write SETTING=VALUE{'S (comma-separated)' if many else ''}")
        out[name] = [_value(v) for v in values.split(",")] if many else _value(values)
    return out


def _run_sweep(args: argparse.Namespace) -> int:
    from ..sweeps import estimate_sweep, sweep, sweep_summary, verdict

    grid, fixed = _pairs(args.grid, "--grid", True), _pairs(args.set, "--set", False)
    seeds = [int(x) for x in args.seeds.split(",")]
    if _engine(args) == "tinker" and not args.yes:
        if not args.model:
            print("machine-nb: --engine tinker needs --model (e.g. thinkingmachines/Inkling-Small)", file=sys.stderr)
            return 2
        total, unknown = estimate_sweep(args.data, grid, seeds=seeds, eval_data=args.eval_data,
                                        eval_every=args.eval_every, model=args.model, **fixed)
        from ..sweeps import grid_points

        runs = len(seeds) * len(grid_points(grid))
        extra = f"; {len(unknown)} cannot be priced" if unknown else ""
        print(f"This sweep trains {args.model} on Tinker: {runs} runs, about ${total:.4f} with their held-out evals"
              f"{extra}. Runs already finished in --sweep-dir are not charged again. Re-run with --yes to spend.",
              file=sys.stderr)
        return 2
    frame = sweep(args.data, grid, seeds=seeds, eval_data=args.eval_data, eval_every=args.eval_every,
                  model=args.model, engine=args.engine, sweep_dir=args.sweep_dir, max_parallel=args.max_parallel,
                  max_usd=args.max_usd, **fixed)
    if args.json:
        import json

        for row in frame.to_dict("records"):
            print(json.dumps(row, default=str))
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
