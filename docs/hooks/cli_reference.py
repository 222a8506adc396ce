"""MkDocs hook: the CLI reference page is written from `machine-nb … --help` at build time.

`<!-- cli-help -->` in a page is replaced by every command's help. One child process of this
Python runs this file as a script: it calls the `machine-nb` entry point's `main([... "--help"])`
for every command and subcommand and prints them as JSON, so the page is always what `--help`
prints, at the cost of one start of the package.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys

MARKER = "<!-- cli-help -->"
# a subcommand line in argparse's help: four spaces, the name, then its one-line help (or a newline)
_COMMAND = re.compile(r"^    ([a-z][a-z0-9-]*)(?:\s{2,}|$)")


def _help(*args: str) -> str:
    """What `machine-nb ARGS --help` prints (run in this process: the child's side)."""
    from machine_nb.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*args, "--help"])
    return out.getvalue()


def _all_helps(path: list[str]) -> list[tuple[list[str], str]]:
    """Every command's help under `path`, depth first, in --help's order (the child's side)."""
    text = _help(*path)
    found = [(path, text)]
    for name in _commands(text):
        found += _all_helps([*path, name])
    return found


def _commands(text: str) -> list[str]:
    found, inside = [], False
    for line in text.splitlines():
        if line.strip() in ("COMMAND", "SUBCOMMAND") or re.match(r"^  \{", line):
            inside = True
            continue
        if inside and not line.startswith("  "):
            break
        m = _COMMAND.match(line) if inside else None
        if m:
            found.append(m.group(1))
    return found


def _section(helps: list[tuple[list[str], str]]) -> list[str]:
    parts = []
    for path, text in helps:
        level = min(len(path) + 2, 4)
        parts += [f"{'#' * level} `machine-nb {' '.join(path)}`" if path else "", "", "```text", text.rstrip(), "```", ""]
    return parts


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' signature)
    if MARKER not in markdown:
        return markdown
    env = dict(os.environ, COLUMNS="100", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, check=True, timeout=120)
    helps = [(path, text) for path, text in json.loads(out.stdout)]
    return markdown.replace(MARKER, "\n".join(_section(helps)).lstrip())


if __name__ == "__main__":
    print(json.dumps(_all_helps([])))
