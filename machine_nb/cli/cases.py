"""`machine-nb cases | candidate | commit | revert`: a machine's cases, and the promotion gate, from a
terminal. The work is machine_nb.evaluation.cases's and machine_nb.evaluation.candidate's; this module parses flags,
asks for `--yes` before sampling on Tinker, and prints what a reader needs.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import _flags as flags

# exit status of `candidate` and `commit` when the gate refuses (0 passes; 1 is an error; 2 a usage error,
# _flags.USAGE; 4 a refused spend, _flags.REFUSED_SPEND)
REFUSED = 3


def _machine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("workspace", help="the workspace root (holding machines/ and .machine/)")
    p.add_argument("--machine", required=True, help="the machine's name, e.g. tutor or chatbot/triage")


def _measure_flags(p: argparse.ArgumentParser) -> None:
    _machine_flags(p)
    p.add_argument("--checkpoint", required=True, help="the trained sampler path: tinker://… (tinker://local-… on the local engine)")
    p.add_argument("--trials", type=flags.whole(1), default=1, help="samples per held-out case per version (default 1)")
    flags.engine_flag(p, help="local or tinker (default: the checkpoint's own; local for tinker://local-…)")
    p.add_argument("--data", default=None,
                   help="the training JSONL, to refuse a candidate trained on held-out inputs (default: not checked)")
    p.add_argument("--max-losses", type=flags.whole(0), default=0,
                   help="held-out cases the live version gets right that the candidate may lose (default 0)")
    p.add_argument("--min-delta", type=flags.finite, default=0.0,
                   help="accuracy margin over the live version, 0.1 = ten points (default 0: any gain)")
    p.add_argument("--alpha", type=flags.number(0, above=True), default=0.05,
                   help="significance the wins need, exact sign test (default 0.05; 1 disables the test)")
    flags.sampling_flags(p, per="case", concurrency=False)
    flags.spending_flags(p, budget_of="sampling both versions",
                         json_help="print the decision and numbers as one JSON object")


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `machine-nb` parser.

    Args:
        sub: the parser's subparsers.
    """
    cost = ("Cost: free on the local engine; on Tinker, every held-out case sampled by both versions "
            "(--trials times) at Tinker's sampling prices (asks for --yes first and prints the estimate).")
    p = sub.add_parser("cases", help="list a machine's cases or held-out cases",
                       description="List machines/<name>/cases.json (or holdout.json with --holdout): each "
                                   "case's input and its eval rule (expected + match). Reads: that file. Writes: "
                                   "nothing. Cost: free.")
    _machine_flags(p)
    p.add_argument("--holdout", action="store_true", help="the held-out cases (holdout.json) instead of cases.json")
    p.add_argument("--json", action="store_true", help="print the cases as a JSON list")
    p.set_defaults(func=_run_cases)

    p = sub.add_parser("candidate", help="measure a checkpoint against the live version on the held-out cases",
                       description="Measure --checkpoint against the machine's live version (versions.json) on its "
                                   "held-out cases and print the promotion gate's decision, with the cases that "
                                   "flipped. Every held-out case needs an expected answer (a command line has no grader). "
                                   "Reads: versions.json, holdout.json, instructions.md. Writes: nothing "
                                   "unless --out (live.json, candidate.json, report.json there, replacing earlier "
                                   "ones; any other file of those names is refused); never changes the "
                                   f"machine. Exit 0 when it passes, {REFUSED} when the gate refuses. " + cost)
    _measure_flags(p)
    p.add_argument("--out", default=None, help="a directory for the results and the report (default: none written)")
    p.set_defaults(func=_run_candidate)

    p = sub.add_parser("commit", help="measure a checkpoint, then make it live if it passes the gate",
                       description="Measure --checkpoint as `machine-nb candidate` does, then commit it. Reads: "
                                   "versions.json, holdout.json, instructions.md. Writes: machines/<name>/versions.json "
                                   "(a version with source kind train appended, the live flag moved to it) and "
                                   f"model.json's model (the checkpoint). Refused, nothing written, when the gate does "
                                   f"not pass (exit {REFUSED}) unless --force, or when another commit changed the live "
                                   "version meanwhile (exit 1). " + cost)
    _measure_flags(p)
    p.add_argument("--force", action="store_true", help="commit even if the gate refuses (recorded as forced)")
    p.add_argument("--note", default=None, help="a note kept in the version's source")
    p.set_defaults(func=_run_commit)

    p = sub.add_parser("revert", help="make the version before the live one live again",
                       description="Restore the previous version. Reads: versions.json. Writes: versions.json (the "
                                   "live flag moves back one entry; no entry is removed), model.json's model and, when "
                                   "that version's differ, instructions.md. Refused, nothing written (exit 1), "
                                   "when that version runs a local checkpoint that is gone, unless --force. "
                                   "Cost: free.")
    _machine_flags(p)
    p.add_argument("--force", action="store_true",
                   help="restore it even when its local checkpoint (tinker://local-…) cannot be found")
    p.set_defaults(func=_run_revert)


def _run_cases(args: argparse.Namespace) -> int:
    from ..evaluation.cases import load_cases

    df = load_cases(args.workspace, args.machine, "holdout" if args.holdout else "cases")
    if args.json:
        from ._flags import json_text  # strict JSON, its escapes ASCII: whole on a stdout of any encoding

        print(json_text(df.drop(columns=["path"]).to_dict("records")))
        return 0
    print(f"{len(df)} {'held-out ' if args.holdout else ''}cases of {args.machine} ({df['path'].iloc[0]})",
          file=sys.stderr)
    for r in df.itertuples():
        rule = "no rule (needs a grader)" if r.expected is None else f"{r.match} {r.expected!r}"
        files = f" [{len(r.files)} file(s)]" if isinstance(r.files, dict) and r.files else ""
        print(f"{r.case:>3}  {r.input!r}{files}  → {rule}")
    return 0


def _check_expected(args: argparse.Namespace) -> None:
    """Refuse, before any estimate or sampling, held-out cases without an expected answer: only a
    grader (a Python function) scores those, and a command line has none to give."""
    import warnings

    from ..evaluation.cases import HoldoutInCases, check_grader, load_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HoldoutInCases)  # said once, when candidate() loads the cases
        holdout = load_cases(args.workspace, args.machine, "holdout")
    check_grader(holdout, None, way_out='the command line has no grader: give each held-out case an "expected" '
                                        'answer (and a "match" mode), or measure from Python with '
                                        "candidate(…, grader=(case, reply) -> bool)")


def _spend_ok(args: argparse.Namespace) -> bool:
    """On Tinker without --yes: print what measuring could cost and refuse (Machine's habit)."""
    from ..evaluation.cases import is_checkpoint, live_version, load_cases

    if flags.engine_of(args, args.checkpoint) != "tinker" or args.yes:
        return True
    live = live_version(args.workspace, args.machine)
    model = live.get("baseModel") or (None if is_checkpoint(live["model"]) else live["model"])
    system = [{"role": "system", "content": live["instructions"]}] if live.get("instructions") else []
    rows = [{"messages": system + [{"role": "user", "content": c}]}
            for c in load_cases(args.workspace, args.machine, "holdout")["input"]]
    return flags.refuse_to_spend("samples", flags.eval_cost_text(rows, model or args.checkpoint,
                                                                 max_tokens=args.max_tokens,
                                                                 samples_per_row=2 * args.trials))


def _measure(args: argparse.Namespace, out: str | None = None):
    from ..evaluation.candidate import Gate, candidate

    gate = Gate(max_losses=args.max_losses, min_delta=args.min_delta, alpha=None if args.alpha >= 1 else args.alpha)
    return candidate(args.workspace, args.machine, args.checkpoint, trials=args.trials, gate=gate, engine=args.engine,
                     data=args.data, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                     max_usd=args.max_usd, out_dir=out)


def _print(cand, as_json: bool, extra: dict | None = None) -> None:
    r = cand.report
    if as_json:
        print(json.dumps({"candidate": cand.id, "machine": cand.machine, "checkpoint": cand.checkpoint,
                          "live_version": cand.live_version["id"], "passed": cand.passed, "reason": cand.reason,
                          "rule": cand.gate.describe(), "n_cases": r.n_cases, "live_accuracy": r.live_accuracy,
                          "candidate_accuracy": r.candidate_accuracy, "wins": r.wins, "ties": r.ties,
                          "losses": r.losses, "p_value": r.p_value, **(extra or {})}, default=str))
        return
    print(f"{cand.machine}: live {cand.live_version['id']} {r.live_accuracy:.1%} → candidate {r.candidate_accuracy:.1%} "
          f"on {r.n_cases} held-out cases; W/T/L {r.wins}/{r.ties}/{r.losses}")
    print(cand.gate.describe())
    print(cand.reason)
    for f in r.flipped.itertuples():
        print(f"  [{f.change}] case {f.case}: {f.input!r} expected {f.expected!r}\n"
              f"      live:      {f.live_output!r}\n      candidate: {f.candidate_output!r}")


def _run_candidate(args: argparse.Namespace) -> int:
    _check_expected(args)
    if not _spend_ok(args):
        return flags.REFUSED_SPEND
    cand = _measure(args, args.out)
    _print(cand, args.json, {"out": args.out} if args.out else None)
    return 0 if cand.passed else REFUSED


def _run_commit(args: argparse.Namespace) -> int:
    _check_expected(args)
    if not _spend_ok(args):
        return flags.REFUSED_SPEND
    from ..core.redact import redacted
    from ..evaluation.candidate import CommitRefused

    cand = _measure(args)
    try:
        entry = cand.commit(force=args.force, note=args.note)  # CommitConflict: exit 1 with the reason
    except CommitRefused as refused:  # the gate's refusal: candidate's status
        print(redacted(f"machine-nb commit: {refused}"), file=sys.stderr)
        if args.json:  # a script reading stdout gets the decision it was refused on
            _print(cand, True, {"committed": None, "forced": False, "refused": redacted(str(refused))})
        return REFUSED
    if args.json:
        _print(cand, True, {"committed": entry["id"], "forced": bool(entry.get("forced"))})
        return 0
    _print(cand, False)
    print(f"committed {entry['id']}{' (forced)' if entry.get('forced') else ''}: {args.machine} now runs {entry['model']}")
    return 0


def _run_revert(args: argparse.Namespace) -> int:
    from ..evaluation.candidate import revert

    entry = revert(args.workspace, args.machine, force=args.force)
    print(f"{args.machine}: {entry['id']} is live again ({entry['model']})")
    return 0
