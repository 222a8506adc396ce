"""CPU the toolkit's own processes take to start: the training runner (`sft`'s child process, to the
end of a short run) and `machine-nb serve` (to its ready line), here against another commit.

    .venv/bin/python benchmarks/bench_startup.py [--rev HEAD~1] [--rounds 5] [--steps 8]

Each round starts, for this checkout and for `--rev` (checked out into a temporary worktree, on
the import path of every process it starts), in alternating order: a script that trains `--steps`
steps of `sft` on the arithmetic corpus with the local engine, reading its runner's CPU seconds
(user + system, from /proc through psutil) once the run is done; and `machine-nb serve --port 0`,
reading its CPU seconds when it prints its ready line, then stopping it with Ctrl-C. Both trees'
bytecode is compiled first. Prints the median of each, and the ratio of this checkout's to
`--rev`'s. One compute thread, as the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, alternating, tree_env, trees

RUNNER = """
import json, sys, psutil
import machine_nb as mnb
assert mnb.__file__.startswith(sys.argv[3]), mnb.__file__
corpus = mnb.make_corpus(sys.argv[1] + "/corpus", seed=0)
mnb.sft(corpus.train, max_steps=int(sys.argv[2]), log_dir=sys.argv[1] + "/run", progress=False)
(runner,) = [c for c in psutil.Process().children() if "machine_nb.training.runner" in " ".join(c.cmdline())]
t = runner.cpu_times()
print(json.dumps(t.user + t.system))
"""


def runner_cpu(tree: Path, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", RUNNER, tmp, str(steps), str(tree)], check=True, capture_output=True,
                             text=True, env=tree_env(tree, tmp), cwd=tmp).stdout
    return float(out.strip().splitlines()[-1])


def serve_cpu(tree: Path) -> float:
    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                                 f"{tmp}/data"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=tree_env(tree, tmp), cwd=tmp)
        try:
            line = proc.stdout.readline()
            if not line.startswith("serving the Tinker API on"):
                raise SystemExit(f"machine-nb serve did not start ({tree}): {line!r}")
            t = psutil.Process(proc.pid).cpu_times()
            return t.user + t.system
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD~1", help="the commit to compare with (default HEAD~1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="training steps of the runner's run")
    args = ap.parse_args()

    with trees(args.rev) as both:
        found: dict[str, dict[str, list[float]]] = {name: {"runner": [], "serve": []} for name in both}
        runner_cpu(ROOT, 1)  # the file cache warm
        for name, tree in alternating(both, args.rounds):
            found[name]["runner"].append(runner_cpu(tree, args.steps))
            found[name]["serve"].append(serve_cpu(tree))

    print(f"machine: {os.cpu_count()} CPUs; {args.rounds} rounds; runner: a {args.steps}-step sft run")
    medians = {name: {k: statistics.median(v) for k, v in kinds.items()} for name, kinds in found.items()}
    for name, m in medians.items():
        print(f"{name:>14}: runner {m['runner']:.2f} CPU-s, serve to ready {m['serve']:.2f} CPU-s   "
              f"(all: {json.dumps({k: [round(x, 2) for x in v] for k, v in found[name].items()})})")
    this, that = medians["this checkout"], medians[args.rev]
    print(f"ratio this/{args.rev}: runner {this['runner'] / that['runner']:.2f}, serve {this['serve'] / that['serve']:.2f}")


if __name__ == "__main__":
    main()
