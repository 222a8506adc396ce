"""`machine-nb eval baseline|checkpoint|compare|probe`: Machine's `/train eval` from a terminal.

The work is machine_nb.evaluation.evaluate's (evaluate, compare, probe); this module parses flags, asks for
`--yes` before spending on Tinker (as Machine's commands do), and prints what a reader needs.
"""

from __future__ import annotations

import argparse
import sys

from ._flags import (REFUSED_SPEND, SEED, USAGE, engine_flag, eval_cost_text, json_text, model_flag, path,
                     refuse_to_spend, sampling_flags, spending_flags)

DEFAULT_DATA = "data/minimal_sft/eval.jsonl"  # where `machine-nb corpus` writes the held-out rows


def _sampling_flags(p: argparse.ArgumentParser, data: str = DEFAULT_DATA, *, per: str = "row",
                    json_help: str = "print the results summary as one JSON object") -> None:
    """The flags every sampling subcommand takes: the rows, the model and engine, sampling, spending."""
    p.add_argument("--data", type=path, default=data, help=f"JSONL of rows to sample (default {data}, `machine-nb corpus`'s)")
    model_flag(p, short=True, help="base model whose renderer formats prompts (default: the local engine's model; "
                                   "required for tinker:// checkpoints)")
    engine_flag(p, help="default: local for local/… models and tinker://local-… paths, else tinker")
    sampling_flags(p, per=per)
    spending_flags(p, budget_of="the sampling", json_help=json_help)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `machine-nb eval` and its subcommands (baseline, checkpoint, compare, probe).

    Args:
        sub: the top-level parser's subparsers.

    Returns:
        None; each subcommand's handler is stored as `func` and returns an exit code.
    """
    ev = sub.add_parser("eval", help="evaluate a base model or checkpoint on held-out rows; compare two results",
                        description="Evaluate on held-out eval rows and compare baseline vs checkpoint. Reads eval JSONL and results JSON; writes eval_results/*.json; costs nothing locally, sampling prices on Tinker (asks for --yes).")
    evsub = ev.add_subparsers(dest="eval_command", metavar="SUBCOMMAND")
    cost = ("Cost: free on the local engine; on Tinker, each row's prompt at the prefill price plus its reply at "
            "the sample price (asks for --yes first and prints the estimate).")

    p = evsub.add_parser("baseline", help="evaluate the base model (before training)",
                         description="Sample every row of --data from the base model --model and score it. Reads: "
                                     "--data. Writes: --out (default eval_results/baseline.json). " + cost)
    _sampling_flags(p)
    p.add_argument("--out", type=path, default=None, help="results JSON (default eval_results/baseline.json)")
    p.set_defaults(func=_run_eval, checkpoint=None)

    p = evsub.add_parser("checkpoint", help="evaluate a trained checkpoint (sampler path)",
                         description="Sample every row of --data from CHECKPOINT (tinker://…; tinker://local-… on the local engine) and score "
                                     "it. Reads: --data, the checkpoint. Writes: --out (default "
                                     "eval_results/<last path segment>.json). " + cost)
    p.add_argument("checkpoint", help="sampler path: tinker://…/sampler_weights/…")
    _sampling_flags(p)
    p.add_argument("--out", type=path, default=None, help="results JSON (default eval_results/<checkpoint name>.json)")
    p.set_defaults(func=_run_eval)

    p = evsub.add_parser("compare", help="compare two results: accuracy delta, W/T/L, McNemar p, bootstrap CI",
                         description="Compare two eval results over the same rows (A = baseline, B = checkpoint): "
                                     "accuracies, delta, wins/ties/losses, the rows that changed, the exact McNemar "
                                     "p-value and a paired bootstrap 95% interval. Reads: A, B. Writes: nothing. "
                                     "Cost: free. Exit 1 when the two files are not over the same rows.")
    p.add_argument("a", type=path, help="baseline results JSON")
    p.add_argument("b", type=path, help="checkpoint results JSON")
    p.add_argument("--seed", type=SEED, default=0, help="bootstrap seed (default 0: reproducible)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=_run_compare)

    p = evsub.add_parser("probe", help="off-distribution prompts through base and checkpoint: where does the style bleed?",
                         description="Run off-distribution prompts (--data, default the corpus's probe.jsonl) "
                                     "through the base model and CHECKPOINT side by side. Reads: --data. Writes: "
                                     "nothing. " + cost.replace("each row", "each prompt, twice,"))
    p.add_argument("checkpoint", help="sampler path: tinker://…")
    _sampling_flags(p, data="data/minimal_sft/probe.jsonl", per="prompt",
                    json_help="print the side-by-side replies as one JSON list")
    p.add_argument("--format", default=None, help="the learned style as a regex, e.g. 'answer: .*' (default: each row's)")
    p.set_defaults(func=_run_probe)
    ev.set_defaults(func=lambda args: (ev.print_help(), USAGE)[1])


def _spend_ok(args: argparse.Namespace, n_prompts_factor: int = 1) -> bool:
    """On Tinker without --yes: print what the eval could cost and refuse (Machine's habit)."""
    from ..core.chat import load_eval_rows, probe_rows
    from ..evaluation.sampling import sampler_target

    target = sampler_target(args.model, args.checkpoint, args.engine)
    if target.engine != "tinker" or args.yes:
        return True
    rows = load_eval_rows(args.data) if n_prompts_factor == 1 else probe_rows(args.data)
    return refuse_to_spend("samples", eval_cost_text(rows, target.model, max_tokens=args.max_tokens,
                                                     samples_per_row=n_prompts_factor))


def _run_eval(args: argparse.Namespace) -> int:
    from ..evaluation.evaluate import evaluate

    if not _spend_ok(args):
        return REFUSED_SPEND
    res = evaluate(args.data, model=args.model, checkpoint=args.checkpoint, engine=args.engine,
                   max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                   concurrency=args.concurrency, out=args.out, max_usd=args.max_usd)
    s = res.summary
    if args.json:
        print(json_text({**s, "path": res.path}))
        return 0
    fmt = "" if s["format_rate"] is None else f", format {s['format_rate']:.1%}"
    usd = "unknown" if s["cost"]["usd"] is None else f"${s['cost']['usd']:.4f}"
    print(f"{s['name']}: {s['correct']}/{s['n']} correct ({s['accuracy']:.1%}){fmt}; {s['wall_s']:.1f} s; "
          f"cost {usd} ({s['cost']['source']}); wrote {res.path}")
    if s["errors"]:
        print(f"warning: {s['errors']} request(s) failed and count as wrong (see 'error' in the results)", file=sys.stderr)
    return 0


def _expected(value: object) -> str:
    """A row's expected answer as the table shows it: "(none)" for a row without one (pandas holds
    that as NaN)."""
    if value is None or (isinstance(value, float) and value != value):
        return "(none)"
    return repr(value)


def _run_compare(args: argparse.Namespace) -> int:
    from ..evaluation.compare import compare

    result = compare(args.a, args.b, seed=args.seed)
    if args.json:
        print(json_text(result.to_dict()))
        return 0
    print(result.summary)
    if len(result.flips):
        print("\nrows that changed:")
        for r in result.flips.itertuples():
            print(f"  [{r.change}] row {r.row}: {r.prompt!r} expected {_expected(r.expected)}\n"
                  f"      {result.baseline_name}: {r.baseline_output!r}\n      {result.checkpoint_name}: {r.checkpoint_output!r}")
    return 0


def _run_probe(args: argparse.Namespace) -> int:
    from ..evaluation.evaluate import probe

    if not _spend_ok(args, n_prompts_factor=2):
        return REFUSED_SPEND
    df = probe(args.data, model=args.model, checkpoint=args.checkpoint, engine=args.engine, format=args.format,
               max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
               concurrency=args.concurrency).rows
    if args.json:
        print(json_text(df.to_dict("records")))
        return 0
    for r in df.itertuples():
        mark = " [bled]" if r.bled else ""
        print(f"{r.prompt!r}{mark}\n  base:       {r.baseline_output!r}\n  checkpoint: {r.checkpoint_output!r}")
    return 0
