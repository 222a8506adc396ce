"""`machine-nb`: the toolkit from a terminal, mirroring Machine's `/train` commands.

Each module in this package adds its subcommands with `register(subparsers)`; the handler is
stored as `func` and returns an exit code. Commands are imported lazily per module, so
`machine-nb --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# modules in this package, in the order their commands appear in --help
_MODULES = ["data", "corpus", "validate", "train", "eval", "cases", "report", "serve",
            "preference", "dashboard"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="machine-nb",
        description="Machine's loop from a terminal: explore runs, tag, export, validate, train, evaluate, report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _MODULES:
        importlib.import_module(f".{name}", __name__).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` names (default: the command line's) and return its exit code.

    Called as the program (no `argv`), a command that marks itself `end_process` (serve: its
    server has stopped and written everything when it returns) ends the process right there, with
    its output flushed, skipping the interpreter's teardown of torch and the other modules it
    loaded, which takes longer than the stop itself; every other command's process ends through
    its exit handlers with what it holds frozen out of the teardown's collections
    (core.process.freeze_at_exit). Called with `argv` (from Python), it always returns and
    changes nothing of the process.
    """
    if argv is None:
        from ..core.process import freeze_at_exit

        freeze_at_exit()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code = _run(args)
    if argv is None and getattr(args, "end_process", False):
        from ..core.process import end_process

        end_process(code)
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError) as exc:
        # errors of ours carry file/line/field; print them without a traceback
        from ..core.redact import redacted

        print(redacted(f"machine-nb {args.command}: {exc}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
