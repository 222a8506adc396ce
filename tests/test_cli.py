"""The CLI mirrors Machine's `/train` commands: every subcommand is listed and its help says what
it does, what it reads and writes, and what it may cost (the headless user's only documentation).
"""

import argparse
import re
import subprocess
import sys

import pytest

from machine_nb.cli import build_parser

# Machine's /train, /tagged and data commands, plus the report runner
COMMANDS = ["corpus", "validate", "sft", "smoke", "eval", "tagged", "runs", "export", "report"]
EVAL_COMMANDS = ["baseline", "checkpoint", "compare"]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(name: str) -> str:
    parser = build_parser()
    subs = _subparsers(parser)
    assert name in subs, f"`machine-nb {name}` is missing; have {sorted(subs)}"
    return subs[name].format_help()


def test_top_level_help_lists_every_command():
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    listed = set(re.findall(r"^\s{4}(\w[\w-]*)\s", proc.stdout, flags=re.M))
    missing = [c for c in COMMANDS if c not in listed]
    assert not missing, f"machine-nb --help does not list {missing}:\n{proc.stdout}"


def _says_reads_writes_costs(name: str, text: str) -> None:
    flat = " ".join(text.split()).lower()
    assert re.search(r"\bread", flat), f"`{name} --help` does not say what it reads:\n{text}"
    assert re.search(r"\bwrit", flat), f"`{name} --help` does not say what it writes:\n{text}"
    assert re.search(r"\bcost|\bfree\b|\busd\b|\$", flat), f"`{name} --help` does not say what it costs:\n{text}"


@pytest.mark.parametrize("name", [c for c in COMMANDS if c != "eval"])
def test_each_command_help_says_reads_writes_costs(name):
    _says_reads_writes_costs(name, _help(name))


@pytest.mark.parametrize("name", EVAL_COMMANDS)
def test_eval_subcommands_help_says_reads_writes_costs(name):
    parser = build_parser()
    subs = _subparsers(parser)
    assert "eval" in subs, f"`machine-nb eval` is missing; have {sorted(subs)}"
    inner = _subparsers(subs["eval"])
    assert name in inner, f"`machine-nb eval {name}` is missing; have {sorted(inner)}"
    _says_reads_writes_costs(f"eval {name}", inner[name].format_help())


def test_console_script_help_runs_without_heavy_imports():
    # `machine-nb --help` must stay light: no torch or tinker_cookbook just to print help
    code = ("import sys; from machine_nb.cli import build_parser; build_parser().format_help(); "
            "print(','.join(m for m in ('torch', 'tinker_cookbook', 'pandas') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"--help imported heavy modules: {proc.stdout.strip()}"


def test_unknown_command_fails_cleanly():
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "no-such-command"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
