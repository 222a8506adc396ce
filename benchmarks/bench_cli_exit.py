"""CPU and wall time of a whole `machine-nb` command, start to exit, here against another commit:
`validate` on the minimal-SFT corpus's training file (it loads torch for the tiny model's context)
and `corpus` (no torch). What a command's process spends ending is in it (core.process.freeze_at_exit).

    .venv/bin/python benchmarks/bench_cli_exit.py [--rev HEAD~1] [--rounds 5]

Each round runs both commands for this checkout and for `--rev` (a temporary worktree on the
import path of the process), in alternating order, each in a fresh process; CPU is the child's
user + system time (wait4). Prints the medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import alternating, tree_env, trees

COMMANDS = {"validate": ["validate", "{tmp}/corpus/train.jsonl", "--model", "local/arith-tiny"],
            "corpus": ["corpus", "-o", "{tmp}/other"]}


def run(tree, argv: list[str], tmp: str) -> tuple[float, float]:
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", *[a.format(tmp=tmp) for a in argv]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=tree_env(tree, tmp), cwd=tmp)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"machine-nb {argv[0]} failed ({tree}): exit {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD~1", help="the commit to compare with (default HEAD~1)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    with trees(args.rev) as both, tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "machine_nb.cli", "corpus", "-o", f"{tmp}/corpus"], check=True,
                       capture_output=True, env=tree_env(next(iter(both.values())), tmp), cwd=tmp)
        found = {name: {cmd: [] for cmd in COMMANDS} for name in both}
        for name, tree in alternating(both, args.rounds):
            for cmd, argv in COMMANDS.items():
                found[name][cmd].append(run(tree, argv, tmp))

    print(f"{args.rounds} rounds; a whole command in a fresh process: CPU-s (user + system) and wall s")
    med = {name: {cmd: [statistics.median(r[k] for r in runs) for k in range(2)] for cmd, runs in cmds.items()}
           for name, cmds in found.items()}
    for name, cmds in med.items():
        print(f"{name:>14}: " + ", ".join(f"{cmd} {c:.2f} CPU-s {w:.2f} s" for cmd, (c, w) in cmds.items())
              + f"   (all CPU-s: {json.dumps({cmd: [round(r[0], 2) for r in runs] for cmd, runs in found[name].items()})})")
    this, that = med["this checkout"], med[args.rev]
    print(f"ratio this/{args.rev}: " + ", ".join(
        f"{cmd} CPU {this[cmd][0] / that[cmd][0]:.2f} wall {this[cmd][1] / that[cmd][1]:.2f}" for cmd in COMMANDS))


if __name__ == "__main__":
    main()
