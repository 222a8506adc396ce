"""`machine-nb pairs` and `machine-nb dpo`: preference pairs from a tag store, and DPO on them, from a
terminal. The work is machine_nb.training.pairs's and machine_nb.training.preference's; this module parses flags, asks
for `--yes` before spending on Tinker, and prints what a reader needs.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import _flags as flags


def register(sub: argparse._SubParsersAction) -> None:
    """Add `pairs` and `dpo` to the CLI.

    Args:
        sub: the top-level parser's subparsers.
    """
    p = sub.add_parser(
        "pairs", help="preference pairs (prompt, chosen, rejected) from tag rows and scored runs",
        description="Build preference pairs from a tag store: /good --as rewrites (the rewrite over the reply it "
                    "replaced), /bad and /good rows of the same conversation, and runs of the same case whose "
                    "scores differ by at least --min-gap. Ties, identical replies and duplicates are dropped; "
                    "held-out cases are left out. Reads: the store, and with --workspace the machine's definition "
                    "(instructions, holdout.json) and runs. Writes: --out (atomic), nothing else. Cost: free.")
    p.add_argument("--store", type=flags.path, default=None, help="tag store directory (default: the current project's, as `tagged`)")
    p.add_argument("--workspace", type=flags.path, default=None, help="workspace holding the machine's definition and runs")
    p.add_argument("--machine", default=None, help="only this machine's rows and runs (its holdout is excluded)")
    p.add_argument("--min-gap", type=flags.number(0, above=True), default=0.25,
                   help="smallest score difference that makes a score pair (default 0.25)")
    p.add_argument("--source", action="append", choices=["rewrite", "tags", "scores"], default=None,
                   help="use only this source (repeatable; default all three)")
    p.add_argument("-o", "--out", type=flags.path, default=None, help="write the pairs here (JSONL)")
    p.add_argument("--format", choices=["comparison", "trl"], default="comparison",
                   help="comparison: tinker-cookbook's comparison JSONL (default); trl: TRL's prompt/chosen/rejected")
    p.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    p.set_defaults(func=_run_pairs)

    d = sub.add_parser(
        "dpo", help="direct preference optimisation with tinker-cookbook's train_dpo, on the local engine or Tinker",
        description="Train on preference pairs with tinker-cookbook's preference.train_dpo.main. Reads: PAIRS (a "
                    "pairs JSONL, either format `machine-nb pairs` writes) and --eval. Writes: a fresh log dir (runs/dpo-<time>-"
                    "<hex> unless --log-dir/--workspace; 0700) with pairs.jsonl, config.json, metrics.jsonl "
                    "(dpo_loss, accuracy, margin, chosen/rejected reward; with --eval, test/accuracy and "
                    "test/format_rate), checkpoints.jsonl, the checkpoints and, with --eval, heldout.jsonl. "
                    "Cost: free on the local engine; on Tinker each step passes both replies of every pair through "
                    "training, the policy's forward pass and the reference model's, and --eval samples its rows at "
                    "each eval step (needs --yes, TINKER_API_KEY and known train and prefill prices; refused over "
                    "--max-usd).")
    d.add_argument("pairs", type=flags.path, help="pairs JSONL (from `machine-nb pairs -o`)")
    flags.target_flags(d, engine_default="the model's or checkpoint's engine; local when neither is given",
                     model_default="the engine's; local/arith-tiny locally")
    d.add_argument("--from", dest="load_checkpoint", type=flags.path, default=None,
                   help="start from an SFT run: its log dir or a tinker://…/weights/<name> state path")
    d.add_argument("--beta", type=flags.number(0, above=True), default=0.1, help="DPO's KL coefficient (default 0.1)")
    flags.schedule_flags(d, unit="pairs",
                       learning_rate="3e-3 for a local LoRA from the base model, 1e-4 from a checkpoint, as "
                                     "benchmarks/bench_dpo.py measures them; 1e-5 on Tinker, the cookbook's",
                       lora_rank="8 local, 32 Tinker")
    flags.resume_flag(d, "dpo", flags.log_dir_flags(d))
    d.add_argument("--seed", type=flags.SEED, default=0, help="the order the pairs are written in (default 0)")
    flags.heldout_flags(d, every="once an epoch; also before the last step")
    flags.inspect_flags(d)
    flags.spending_flags(d)
    d.set_defaults(func=_run_dpo)


def _run_pairs(args: argparse.Namespace) -> int:
    from ..training.pairs import SOURCES, PairsSkipped, preference_pairs, write_pairs

    import warnings
    from pathlib import Path

    if args.store and not Path(args.store).is_dir():  # a path typed wrong: no pairs to be had, not zero pairs
        raise ValueError(f"no tag store at {args.store} (check --store)")
    with warnings.catch_warnings(record=True) as said:  # counted below, in the same words
        warnings.simplefilter("always")
        pairs = preference_pairs(args.store, machine=args.machine, workspace=args.workspace, min_gap=args.min_gap,
                                 sources=args.source or SOURCES)
    for w in said:
        if issubclass(w.category, PairsSkipped):
            print(f"machine-nb pairs: {w.message}", file=sys.stderr)
        else:  # said as any warning is (e.g. held-out cases that could not be checked)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    counts = {"pairs": len(pairs), "by_source": {k: int(v) for k, v in pairs["source"].value_counts().items()},
              "excluded_held_out": len(pairs.excluded),
              "skipped": {k: int(v) for k, v in pairs.skipped_counts().items()}}
    if args.out and len(pairs):
        counts["out"] = str(write_pairs(pairs, args.out, format=args.format))
    if args.json:
        print(json.dumps(counts))
    else:
        by = ", ".join(f"{n} {k}" for k, n in counts["by_source"].items()) or "none"
        print(f"{len(pairs)} pair(s) ({by}); {len(pairs.excluded)} left out as held-out")
        for reason, n in counts["skipped"].items():
            print(f"  skipped {n}: {reason}")
        if args.out and len(pairs):
            print(f"wrote {counts['out']} ({args.format})")
    if args.out and not len(pairs):  # a file of no pairs is one dpo refuses: the old file stays
        print(f"machine-nb pairs: no pairs to write: {args.out} left as it was", file=sys.stderr)
        return 1
    return 0


def _engine(args: argparse.Namespace) -> str:
    """--engine, else the model's, else the engine of the run or state path --from names, else local."""
    if not args.engine and not args.model and args.load_checkpoint:
        from pathlib import Path

        if Path(args.load_checkpoint).is_dir():  # an sft log dir: the engine it ran on
            from ..training.runlog import read_training_log

            return read_training_log(args.load_checkpoint).engine or "local"
    return flags.engine_of(args, args.load_checkpoint)


def _run_dpo(args: argparse.Namespace) -> int:
    from ..training.preference import dpo

    if _engine(args) == "tinker" and not args.yes:
        from ..checks.pricing import estimate_dpo_cost, no_full_batch

        if not flags.needs_model(args, "thinkingmachines/Inkling"):
            return flags.USAGE
        est = estimate_dpo_cost(args.pairs, args.model, epochs=args.epochs, batch_size=args.batch_size,
                                max_steps=args.steps, max_usd=args.max_usd)
        why = no_full_batch(est.pairs, args.batch_size, "pairs", "dpo")
        if why:  # the run dpo refuses: exit 1 with its reason, nothing offered for --yes
            raise ValueError(why)
        evals = ""
        if args.eval_data:
            from ..core.chat import load_eval_rows
            from ..checks.pricing import UnknownPrice, check_budget, estimate_eval_cost
            from ..training.preference import dpo_evals

            every = args.eval_every if args.eval_every is not None else max(1, est.pairs // args.batch_size)
            n = dpo_evals(est.steps, every)  # every 0: the final checkpoint alone
            held = load_eval_rows(args.eval_data)
            try:
                eval_usd = estimate_eval_cost(held, args.model, samples_per_row=n).usd
            except UnknownPrice:
                eval_usd = None
            check_budget(None if eval_usd is None else est.usd + eval_usd, args.max_usd,
                         f"DPO on {args.model} for {args.epochs} epoch(s) with {n} held-out evals")
            evals = flags.heldout_cost_text(n, len(held), eval_usd)
        flags.refuse_to_spend(
            f"trains {args.model} with DPO",
            f"about ${est.usd:.4f} = training ${est.train_usd:.4f} + the policy's forward pass "
            f"${est.forward_usd:.4f} + the reference model's forward pass ${est.reference_usd:.4f} ({est.pairs} "
            f"pairs, {est.tokens:,} tokens (chosen + rejected) x {args.epochs} epoch(s), {est.steps} steps; "
            f"{flags.estimate_source(est)})", detail=evals)
        return flags.REFUSED_SPEND
    result = dpo(args.pairs, args.model, args.engine, beta=args.beta, learning_rate=args.learning_rate,
                 epochs=args.epochs, max_steps=args.steps, batch_size=args.batch_size, lora_rank=args.lora_rank,
                 load_checkpoint=args.load_checkpoint, log_dir=args.log_dir, workspace=args.workspace,
                 resume=args.resume, seed=args.seed, max_usd=args.max_usd, eval_data=args.eval_data,
                 eval_every=args.eval_every, inspect_tasks=args.inspect_tasks)
    flags.print_result(result, args.json, steps="DPO steps", loss="dpo_loss")
    return 0
