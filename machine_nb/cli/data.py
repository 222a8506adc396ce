"""`machine-nb runs | tagged | export`: Machine's stored runs and tag rows from a terminal, and the
export of selected runs as training JSONL. The work is done by frames.py, store/tags.py,
select.py and export.py; this module only parses arguments and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._flags import finite, path, whole

_RUN_TABLE = ["id", "machine", "model", "harness", "score", "n_messages", "n_tool_calls", "started_at"]


def _unicode_stdout() -> bool:
    """Whether stdout writes every character (a UTF encoding); JSON elsewhere is written as ASCII escapes."""
    import codecs

    try:
        return codecs.lookup(sys.stdout.encoding).name.startswith("utf")
    except (AttributeError, LookupError, TypeError):
        return False


def _print_frame(df, columns: list[str], as_json: bool) -> None:
    if as_json:
        import json
        import math

        def plain(v):
            if v is None or (isinstance(v, float) and math.isnan(v)) or v != v:
                return None
            return v.isoformat() if hasattr(v, "isoformat") else v

        rows = [{c: plain(v) for c, v in zip(columns, vals)} for vals in df[columns].itertuples(index=False)]
        print(json.dumps(rows, ensure_ascii=not _unicode_stdout(), default=str))
        return
    import pandas as pd

    with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200,
                           "display.max_colwidth", 48):
        print(df[columns].to_string(index=False) if len(df) else "(none)")


def cmd_runs(args: argparse.Namespace) -> int:
    """`machine-nb runs WORKSPACE`: print the stored runs, newest first.

    Args:
        args: the parsed arguments.

    Returns:
        The exit status (0).
    """
    from ..data.frames import load_runs

    df = load_runs(args.workspace, args.machine, on_error="raise" if args.strict else "warn",
                   index=False if args.no_index else None, check=args.check)
    if args.limit:
        df = df.head(args.limit)
    cols = _RUN_TABLE + (["input", "output", "case", "rubric", "cost_usd", "final"] if args.json else [])
    _print_frame(df, cols, args.json)
    return 0


def cmd_tagged(args: argparse.Namespace) -> int:
    """`machine-nb tagged`: print the tag store's rows, like /tagged.

    Args:
        args: the parsed arguments.

    Returns:
        The exit status: 0, or 1 when --store names no store or --project no folder.
    """
    from ..store.tags import store_dir, tagged

    if args.project and not Path(args.project).is_dir():  # a typo, not a project with no tags
        print(f"machine-nb tagged: no project folder at {args.project} (check --project)", file=sys.stderr)
        return 1
    store = Path(args.store) if args.store else store_dir(args.project)
    if not store.exists():
        if args.store:  # a path the user typed that is not there: a mistake to say, not an empty list
            print(f"machine-nb tagged: no tag store at {store} (check --store)", file=sys.stderr)
            return 1
        print(f"store: {store} (no tag store yet: nothing tagged in this project)", file=sys.stderr)
        print("[]" if args.json else "(none)")
        return 0
    df = tagged(store)  # a file, not a folder: MachineFormatError, printed as one line
    if args.limit:
        df = df.tail(args.limit)
    cols = ["id", "file", "tag", "kind", "note", "source", "n_messages", "last_user", "last_assistant"]
    if not args.json:
        print(f"store: {store}", file=sys.stderr)
    _print_frame(df, cols, args.json)
    return 0


def _read_exclude(path: str) -> list[str]:
    """Cases from a holdout.json-style JSON array, or plain text with one case per line."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        from ..store.workspace import read_cases

        return [c["input"] for c in read_cases(path)]
    return [line.rstrip("\n") for line in text.splitlines() if line.strip()]


def cmd_export(args: argparse.Namespace) -> int:
    """`machine-nb export WORKSPACE --machine M --out FILE`: select runs and write training JSONL.

    Args:
        args: the parsed arguments.

    Returns:
        The exit status (0).
    """
    from ..data.export import estimate_tokens, training_lines
    from ..data.frames import load_runs
    from ..core.jsonl import write_jsonl
    from ..data.select import select_runs

    runs = load_runs(args.workspace, args.machine, on_error="raise" if args.strict else "warn")
    if not len(runs) or not (runs["machine"] == args.machine).any():
        from ..store.workspace import resolve_machine

        resolve_machine(args.machine, args.workspace)  # neither runs nor a definition: names the machines there are
    kw = {}
    if args.rubric is not None:
        kw["rubric"] = None if args.rubric == "any" else args.rubric
    exclude = _read_exclude(args.exclude_file) if args.exclude_file else None
    selected = select_runs(runs, args.machine, min_score=args.min_score, best_of=args.best_of,
                           exclude=exclude, models=args.model or None, workspace=args.workspace, **kw)
    lines = training_lines(selected, whole_runs=True if args.whole_runs else None, base_model=args.base_model,
                           reasoning=not args.no_reasoning)
    write_jsonl(lines, args.out)
    print(f"{len(selected)} of {len(runs)} runs selected → {len(lines)} lines in {args.out} "
          f"(about {estimate_tokens(lines):,} tokens, a 2.5 chars/token estimate)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `runs`, `tagged` and `export` to the `machine-nb` parser.

    Args:
        sub: the parser's subparsers.
    """
    p = sub.add_parser("runs", help="List a workspace's stored runs, newest first (reads .machine/runs; free).",
                       description="List the runs stored under WORKSPACE/.machine/runs, newest first, as a table or "
                                   "JSON. Reads files only; writes nothing in the workspace (large workspaces keep a run "
                                   "index in the user's cache folder, see `machine_nb.run_index_path`); costs nothing.")
    p.add_argument("workspace", type=path, help="workspace directory (the one holding .machine/)")
    p.add_argument("--machine", help="only this machine and its nested machines")
    p.add_argument("--limit", type=whole(0), default=0, help="show at most N runs (default 0: all)")
    p.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    p.add_argument("--strict", action="store_true", help="fail on the first bad run file instead of skipping it")
    p.add_argument("--no-index", action="store_true",
                   help="parse every run file; neither use nor write the run index (default: use it for large workspaces)")
    p.add_argument("--check", choices=["dirs", "files"], default="dirs",
                   help="how the index finds changed files: folder times (dirs, default) or a stat of every file "
                        "(files: also sees files rewritten in place)")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("tagged", help="List the tag store's rows like /tagged (reads the store; free).",
                       description="List the rows of the project's tag store (train, traces, observed, rejected "
                                   "JSONL), like Machine's /tagged. Reads files only; writes nothing; costs nothing.")
    which = p.add_mutually_exclusive_group()  # a store given is read whatever the project
    which.add_argument("--store", type=path, help="store directory (default: the current project's, see store_dir)")
    which.add_argument("--project", type=path, help="project directory whose store to read (default: current directory)")
    p.add_argument("--limit", type=whole(0), default=0, help="show only the last N rows (default 0: all)")
    p.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    p.set_defaults(func=cmd_tagged)

    p = sub.add_parser("export", help="Select graded runs and write training JSONL (writes --out; free).",
                       description="Select a machine's graded runs with Machine's rules (current rubric, min score, "
                                   "best of N per case, holdout excluded, echo harness and non-final turns left "
                                   "out) and write them as chat JSONL for tinker-cookbook. Reads the workspace; "
                                   "writes only --out (atomically); costs nothing.")
    p.add_argument("workspace", type=path, help="workspace directory (the one holding .machine/ and machines/)")
    p.add_argument("--machine", required=True, help="machine to export (e.g. chatbot/triage)")
    p.add_argument("--rubric", help="rubric fingerprint to require (default: the machine's; 'any' for none)")
    p.add_argument("--min-score", type=finite, default=1.0, help="lowest scorecard total (default 1: every criterion met)")
    p.add_argument("--best-of", type=whole(1), default=2, help="keep at most N runs per case (default 2; at least 1)")
    p.add_argument("--exclude-file", type=path,
                   help="cases never to train on: a JSON array like holdout.json, or one per line "
                        "(default: the machine's holdout.json)")
    p.add_argument("--model", action="append", help="only runs by this model (repeatable)")
    p.add_argument("--whole-runs", action="store_true", help="one line per whole run (Inkling base models only)")
    p.add_argument("--base-model", help="the model to be trained; whole runs are refused unless it is Inkling")
    p.add_argument("--no-reasoning", action="store_true", help="drop reasoning from the lines")
    p.add_argument("--strict", action="store_true", help="fail on the first bad run file instead of skipping it")
    p.add_argument("--out", type=path, required=True, help="JSONL file to write")
    p.set_defaults(func=cmd_export)


