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

    The exit statuses (docs/cli.md lists them): 0 done, 1 an error, 2 a usage error (_flags.USAGE),
    3 `candidate` or `commit`: the gate refused (cases.REFUSED), 4 a spend refused without `--yes`
    (_flags.REFUSED_SPEND), 130 Ctrl-C, 141 stdout's reader gone (PIPE_CLOSED).

    Called as the program (no `argv`), stdout and stderr write any character (one their encoding
    lacks as its escape), a warning prints as one line naming the command (`machine-nb runs:
    warning: …`, redacted), and a command that marks itself `end_process` (serve: its server has
    stopped and written everything when it returns) ends the process right there, with
    its output flushed, skipping the interpreter's teardown of torch and the other modules it
    loaded, which takes longer than the stop itself; every other command's process ends through
    its exit handlers with what it holds frozen out of the teardown's collections
    (core.process.freeze_at_exit). Called with `argv` (from Python), it always returns and
    changes nothing of the process.
    """
    if argv is None:
        from ..core.process import freeze_at_exit

        freeze_at_exit()
        _writable_anything()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        from ._flags import USAGE

        parser.print_help()
        return USAGE
    if argv is None:
        import warnings

        # a warning names the command, not a line of the package's entry point
        warnings.showwarning = lambda message, *_, **__: _warn(args, message)
    code = _run(args, program=argv is None)
    if argv is None and getattr(args, "end_process", False):
        from ..core.process import end_process

        end_process(code)
    return code


#: Exit status when the reader of stdout stops early (`machine-nb runs --json | head`): 128 + SIGPIPE,
#: what a shell reports for any other program cut off there.
PIPE_CLOSED = 141


def _run(args: argparse.Namespace, program: bool = False) -> int:
    """Run the parsed command and turn its errors into an exit status and one line on stderr.

    Args:
        args: the parsed flags, with the handler as `func`.
        program: the process is `machine-nb` itself (default False: called from Python), so stdout
            may be pointed at the null device when its reader has gone.

    Returns:
        The command's exit status; 1 for an error of ours (or an optional extra not installed), 130
        for Ctrl-C, PIPE_CLOSED when stdout's reader stopped reading.
    """
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone before the last buffered line is said here, not at exit
        return code
    except BrokenPipeError as exc:
        if not _stdout_closed():  # another pipe (a kernel's, a socket): an error like any other
            return _say(args, exc)
        if program:  # the interpreter flushes stdout again at exit: let that write go nowhere
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError, ImportError) as exc:  # ImportError: an extra not installed, said how
        return _say(args, exc)


def _writable_anything() -> None:
    """Let stdout and stderr write any character: one their encoding lacks (cp1252 on a Windows console
    or redirect) is written as its `\\u…` escape instead of failing the command after its work is done."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        try:
            if not codecs.lookup(stream.encoding).name.startswith("utf"):
                stream.reconfigure(errors="backslashreplace")
        except (AttributeError, LookupError, TypeError, ValueError):  # replaced, detached or unnamed
            pass


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports POLLERR on its write end)."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):  # no file descriptor (captured), or no poll (Windows)
        return False
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _warn(args: argparse.Namespace, message: Warning | str) -> None:
    """Print a warning as `machine-nb COMMAND: warning: …`, redacted, on stderr."""
    from ..core.redact import redacted

    try:
        print(redacted(f"machine-nb {args.command}: warning: {message}"), file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr gone or closed: a warning is not worth failing the command for
        pass


def _say(args: argparse.Namespace, exc: BaseException) -> int:
    """Print one of our errors (they carry file, line and field) as one redacted line, no traceback; exit status 1."""
    from ..core.redact import redacted

    print(redacted(f"machine-nb {args.command}: {exc}"), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
