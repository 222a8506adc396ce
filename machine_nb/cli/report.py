"""`machine-nb report`: execute a notebook with parameters into a shareable HTML report."""

from __future__ import annotations

import argparse
import json
import sys


def _value(text: str):
    """A parameter value: JSON when it parses (numbers, true/false, null, lists), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="execute a notebook with parameters and write a self-contained HTML report",
        description=(
            "Execute NOTEBOOK top to bottom in a fresh kernel (papermill), with parameters injected "
            "after its cell tagged 'parameters', and write OUT.html plus the executed OUT.ipynb beside it. "
            "Reads: the notebook and whatever it reads. Writes: the two report files (secret-looking "
            "environment values such as TINKER_API_KEY are redacted from both). Cost: whatever the "
            "notebook spends; the shipped notebooks default to the free local engine."),
    )
    p.add_argument("notebook", help="the .ipynb to execute")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a parameter (VALUE parsed as JSON when it can be: 10, 3e-3, true, \"text\")")
    p.add_argument("-o", "--output", help="the HTML path (default reports/<notebook name>.html)")
    p.add_argument("--cwd", help="kernel working directory (default: the notebook's folder)")
    p.add_argument("--timeout", type=float, help="per-cell timeout in seconds (default: none)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..report import run_report

    from papermill.exceptions import PapermillExecutionError

    params = {name: _value(value) for name, value in args.parameter}
    try:
        report = run_report(args.notebook, params, args.output, cwd=args.cwd, timeout=args.timeout,
                            progress_bar=sys.stderr.isatty())
    except PapermillExecutionError as exc:
        print(f"machine-nb report: cell {exc.exec_count} failed: {exc.ename}: {exc.evalue}\n"
              "the partial report (with the error in place) was written anyway", file=sys.stderr)
        return 1
    print(f"report: {report.html}")
    print(f"executed notebook: {report.executed}")
    print(f"wall: {report.wall_s:.1f} s")
    return 0
