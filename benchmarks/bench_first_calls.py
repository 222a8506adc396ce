"""CPU of a notebook's first call to two of the toolkit's functions, each in a fresh process, here
against another commit: `compare()` (rows paired by position, then by case: the statistics'
libraries load on the first call) and the real model's tokenizer (`hf.get_tokenizer()`, what
token counts, previews and the renderer of local/smollm2-135m load).

    .venv/bin/python benchmarks/bench_first_calls.py [--rev HEAD~1] [--rounds 5]

Each round runs, for this checkout and for `--rev` (a temporary worktree on the import path of
the processes), in alternating order, one process per call. Each imports machine_nb, pandas and
tinker first (what a notebook has loaded by then: the SDK brings torch), then reads its CPU
seconds (user + system) before and after the call and prints the difference. Prints the median of
each and the ratio of this checkout's to `--rev`'s. Needs the real model's package (make setup).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from common import alternating, tree_env, trees

BEFORE = """
import os, sys
import machine_nb as mnb, pandas as pd, tinker
assert mnb.__file__.startswith(sys.argv[1]), mnb.__file__
def cpu():
    t = os.times()
    return t.user + t.system
"""

CALLS = {
    "compare": """
frame = lambda correct, case: pd.DataFrame({"prompt": [f"p{i}" for i in range(24)], "expected": "a",
                                            "output": "a", "correct": correct, "case": case})
rows, cases = [True] * 7 + [False] * 17, [i // 8 for i in range(24)]
start = cpu()
mnb.compare(frame([False] * 24, cases), frame(rows, cases), cluster=False)
mnb.compare(frame([False] * 24, cases), frame(rows, cases), cluster="case")
print(cpu() - start)
""",
    "real-model tokenizer": """
from machine_nb.engines.local import hf
hf.tokenizer_dir()  # the model's package found and its folder converted before the clock starts
start = cpu()
hf.get_tokenizer().encode("Hello world")
print(cpu() - start)
""",
}


def call_cpu(tree, code: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = tree_env(tree, tmp)
        env.pop("MACHINE_NB_CACHE_DIR")  # the checkout's converted real model, not a fresh conversion
        out = subprocess.run([sys.executable, "-c", BEFORE + code, str(tree)], check=True, capture_output=True,
                             text=True, env=env, cwd=tmp).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD~1", help="the commit to compare with (default HEAD~1)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    with trees(args.rev) as both:
        found = {name: {call: [] for call in CALLS} for name in both}
        for name, tree in alternating(both, args.rounds):
            for call, code in CALLS.items():
                found[name][call].append(call_cpu(tree, code))

    print(f"{args.rounds} rounds; CPU-s of the first call in a fresh process that has imported machine_nb, pandas, tinker")
    medians = {name: {k: statistics.median(v) for k, v in calls.items()} for name, calls in found.items()}
    for name, m in medians.items():
        print(f"{name:>14}: " + ", ".join(f"{call} {m[call]:.2f}" for call in CALLS)
              + f"   (all: {json.dumps({k: [round(x, 2) for x in v] for k, v in found[name].items()})})")
    this, that = medians["this checkout"], medians[args.rev]
    print(f"ratio this/{args.rev}: " + ", ".join(f"{call} {this[call] / that[call]:.2f}" for call in CALLS))


if __name__ == "__main__":
    main()
