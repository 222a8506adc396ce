"""`machine-nb report`: execute a notebook with parameters into a shareable HTML report."""

from __future__ import annotations

import argparse
import sys

from ._flags import number, path


_PYTHON_LITERALS = {"None": None, "True": True, "False": False}


def _value(text: str):
    """A parameter value: JSON when it parses (numbers, true/false, null, lists), Python's None, True
    and False (as papermill's own `-p` reads them: `-p expect_live_at_most None`), else the string."""
    from ..core.jsonl import parse_json

    if text in _PYTHON_LITERALS:
        return _PYTHON_LITERALS[text]
    try:
        return parse_json(text)
    except ValueError:  # MachineFormatError too: not JSON, or nested too deep to be meant as JSON
        return text


def _check_notebook(notebook: str) -> None:
    """Refuse a file that is not a notebook Jupyter reads, naming it, before a kernel starts.

    Args:
        notebook: the notebook given (a missing file is left to run_report, which names it).

    Raises:
        ValueError: not UTF-8, not JSON, or JSON that is not a notebook (no list of cells).
    """
    import warnings
    from pathlib import Path

    if not Path(notebook).is_file():
        return
    raw = Path(notebook).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{notebook}: not a notebook: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                         f"{exc.start})") from None
    import nbformat

    try:
        with warnings.catch_warnings():  # an old notebook's upgrade notes: papermill says them when it runs
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4)
        cells = nb.get("cells")
        if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
            raise ValueError("its cells are not a list of cells")
    except Exception as exc:  # nbformat raises ValueError, jsonschema's ValidationError or AttributeError here
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{notebook}: not a notebook Jupyter can read ({why})") from None


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `machine-nb` parser.

    Args:
        sub: the parser's subparsers.
    """
    p = sub.add_parser(
        "report",
        help="execute a notebook with parameters and write a self-contained HTML report",
        description=(
            "Execute NOTEBOOK top to bottom in a fresh kernel (papermill), with parameters injected "
            "after its cell tagged 'parameters', and write OUT.html plus the executed OUT.ipynb beside it. "
            "The page opens with the notebook's title, the headline, cost and accuracy chart of the last "
            "mnb.report_summary(...) it displays, its loss curve, the settings and links to each section; code is "
            "hidden behind a 'Show code' button, and the page fetches nothing (it reads offline). "
            "Reads: the notebook and whatever it reads. Writes: the two report files only, redacted (values of "
            "secret-named environment variables and parameters such as TINKER_API_KEY or DB_PASS, URL passwords, "
            "key-shaped strings), with this machine's folders written relative to the notebook (or as ~/… under "
            "home); the notebook runs in memory, so no unredacted file exists even mid-run or "
            "after Ctrl-C. A failing cell's error is printed redacted too. Cost: whatever the "
            "notebook spends; the shipped notebooks default to the free local engine."),
    )
    p.add_argument("notebook", type=path, help="the .ipynb to execute")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a parameter (VALUE parsed as JSON when it can be: 10, 3e-3, true, \"text\"; "
                        "a secret-named one, such as db_pass, stays text)")
    p.add_argument("-o", "--output", type=path,
                   help="the HTML path, not .ipynb (default reports/<notebook name>.html; the executed notebook "
                        "goes beside it as .ipynb)")
    p.add_argument("--cwd", type=path, help="kernel working directory (default: the notebook's folder)")
    p.add_argument("--timeout", type=number(0, above=True), help="per-cell timeout in seconds (default: none)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..core.redact import is_secret_name
    from ..reports.notebook import run_report, scrub, secret_values

    # a secret-named parameter (a password, a key) is the text given: "1e5" or "0012" read as a number
    # would reach the notebook as another value
    params = {name: value if is_secret_name(name) else _value(value) for name, value in args.parameter}
    _check_notebook(args.notebook)
    if args.output and args.output.lower().endswith(".ipynb"):  # the page would take the executed notebook's path
        raise ValueError(f"-o {args.output}: -o names the HTML page (the executed notebook is written beside it as "
                         ".ipynb); give a path ending in .html")
    try:
        report = run_report(args.notebook, params, args.output, cwd=args.cwd, timeout=args.timeout,
                            progress=sys.stderr.isatty())
    except (ValueError, RuntimeError, OSError) as exc:  # e.g. a kernel that died: its message may quote a cell
        secrets = sorted(set(secret_values()) | set(secret_values(params)), key=len, reverse=True)
        print(f"machine-nb report: {scrub(str(exc), secrets)[0]}", file=sys.stderr)
        return 1
    except Exception as exc:
        # papermill is imported once the input checks pass (a missing notebook is said before its
        # seconds of imports), so a failed cell's error class is looked up only where it can be
        ran = sys.modules.get("papermill.exceptions")
        if ran is None or not isinstance(exc, ran.PapermillExecutionError):
            raise
        print(f"machine-nb report: cell {exc.exec_count} failed: {exc.ename}: {exc.evalue}\n"  # redacted already
              "the partial report (with the error in place) was written anyway (redacted)", file=sys.stderr)
        return 1
    print(f"report: {report.html}")
    print(f"executed notebook: {report.executed}")
    print(f"wall: {report.wall_s:.1f} s")
    if report.stopped:
        print(f"the notebook stopped early: {report.stopped}")
    return 0
