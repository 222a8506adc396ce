"""MkDocs hook: the CLI reference page is written from `machine-nb … --help` at build time.

`<!-- cli-help -->` in a page is replaced by every command's help, run through the installed
`machine-nb` entry point's module in this Python (so the page is always what `--help` prints).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

MARKER = "<!-- cli-help -->"
# a subcommand line in argparse's help: four spaces, the name, then its one-line help (or a newline)
_COMMAND = re.compile(r"^    ([a-z][a-z0-9-]*)(?:\s{2,}|$)")


def _help(*args: str) -> str:
    env = dict(os.environ, COLUMNS="100", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "machine_nb.cli", *args, "--help"], capture_output=True,
                         text=True, env=env, check=True, timeout=120)
    return out.stdout


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


def _section(path: list[str], level: int) -> list[str]:
    text = _help(*path)
    parts = [f"{'#' * level} `machine-nb {' '.join(path)}`" if path else "", "", "```text", text.rstrip(), "```", ""]
    for name in _commands(text):
        parts += _section([*path, name], min(level + 1, 4))
    return parts


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' signature)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, "\n".join(_section([], 2)).lstrip())
