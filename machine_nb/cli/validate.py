"""`machine-nb validate`: check a chat JSONL training or eval file before training; non-zero exit on errors."""

from __future__ import annotations

import argparse
import json

from ._flags import whole


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `machine-nb` parser.

    Args:
        sub: the parser's subparsers.
    """
    p = sub.add_parser(
        "validate",
        help="check a chat JSONL file: shape, renderer readiness, token counts, eval overlap, secrets",
        description=(
            "Validate FILE (training rows, or eval rows with 'expected') row by row with the model's "
            "tinker-cookbook renderer. Reads: FILE (streamed) and --eval. Writes: nothing. Prints each finding "
            "as FILE:LINE: severity code: message, then a summary with tokens and the token-length histogram. "
            "Exit status 1 when there is any error finding, 0 otherwise. Cost: free (local rendering only); "
            "with --epochs it also prints the training cost estimate from the price table, and a note when "
            "the rows fill no batch of --batch-size (a run sft refuses: 0 steps, $0); a file with an error "
            "finding, or of eval rows, is not priced (the cost line says why)."),
    )
    p.add_argument("file", help="the chat JSONL file to check")
    p.add_argument("-m", "--model", default=None,
                   help="model whose renderer to use (default: the local engine's model, local/arith-tiny)")
    p.add_argument("--max-length", type=whole(0), default=None,
                   help="longest row in tokens (default: the model's context where known, 128 for local/arith-tiny, "
                        "else 32768); capped at the model's context; 0 drops this limit but keeps the context's")
    p.add_argument("--eval", dest="eval_path", default=None, help="held-out eval file: prompts shared with it are errors")
    p.add_argument("--kind", choices=["auto", "train", "eval"], default="auto",
                   help="row kind (default auto: eval when rows carry 'expected')")
    p.add_argument("--epochs", type=whole(1), default=None, help="also print the cost of training this many epochs")
    p.add_argument("--batch-size", type=whole(1), default=8, help="rows per step for the cost estimate (default 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object (summary + findings) instead of text")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..engines import DEFAULT_LOCAL_MODEL
    from ..checks.validate import validate

    model = args.model or DEFAULT_LOCAL_MODEL
    max_length = "auto" if args.max_length is None else (args.max_length or None)
    result = validate(args.file, model, max_length=max_length, eval_data=args.eval_path, kind=args.kind)
    cost = None
    if args.epochs is not None and not result.ok:
        cost = {"error": "not estimated: sft refuses a file with an error finding; fix them first"}
    elif args.epochs is not None and result.summary["kind"] == "eval":
        cost = {"error": f"not estimated: {args.file} holds eval rows, and eval rows are not trained on "
                         "(--epochs prices a training file)"}
    elif args.epochs is not None:
        from ..checks.pricing import estimate_cost

        try:
            est = estimate_cost(args.file, model, epochs=args.epochs, batch_size=args.batch_size)
            cost = {"usd": est.usd, "steps": est.steps, "tokens": est.tokens, "exact": est.exact,
                    "price_source": est.price.source, "price_date": est.price.date, "note": est.note}
        except RuntimeError as exc:  # UnknownPrice: say so, the data is still valid
            cost = {"error": str(exc)}
    if args.json:
        findings = [{"line": None if str(r.line) == "<NA>" else int(r.line), "severity": r.severity, "code": r.code,
                     "message": r.message} for r in result.findings.itertuples()]
        print(json.dumps({"ok": result.ok, "summary": result.summary, "findings": findings, "cost": cost}))
        return 0 if result.ok else 1
    for r in result.findings.itertuples():
        where = args.file if str(r.line) == "<NA>" else f"{args.file}:{int(r.line)}"
        print(f"{where}: {r.severity} {r.code}: {r.message}")
    s = result.summary
    hist = ", ".join(f"{k}: {v}" for k, v in s["histogram"].items() if v) or "none"
    counted = "exact" if s["exact"] else "estimated"
    print(f"{'OK' if result.ok else 'FAILED'}: {s['rows']} {s['kind']} rows, {s['errors']} error(s), "
          f"{s['warnings']} warning(s); {s['tokens']} tokens ({counted}, {model})"
          + (f", {s['trained_tokens']} trained" if s["kind"] == "train" else "") + f"; per row: {hist}")
    if cost is not None:
        if "error" in cost:
            print(f"cost: {cost['error']}")
        else:
            print(f"cost: ${cost['usd']:.4f} for {args.epochs} epoch(s), {cost['steps']} steps "
                  f"(price: {cost['price_source']} {cost['price_date']})")
            if cost["note"]:  # e.g. fewer rows than one batch: a run sft refuses
                print(f"note: {cost['note']}")
    return 0 if result.ok else 1
