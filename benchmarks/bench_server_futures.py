"""What one new request costs the local server's table of results (engines/local/server.py
`_Futures.new`) while a session keeps N finished ones (each is kept FUTURE_TTL_S, 10 minutes, for
the SDK's polls: an evaluation of N rows leaves about N), here against another commit.

    .venv/bin/python benchmarks/bench_server_futures.py [--rev HEAD~1] [--sizes 1000,10000,100000]

For each tree (this checkout, and `--rev` in a temporary worktree) and each N, a fresh process
makes and finishes N results, then times 2,000 more new requests. Prints microseconds per request.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from common import tree_env, trees

SCRIPT = """
import json, sys, time
from machine_nb.engines.local import server
assert server.__file__.startswith(sys.argv[1]), server.__file__
futures = server._Futures()
for _ in range(int(sys.argv[2])):
    futures.resolve_json(futures.new("asample"), {})
start = time.perf_counter()
for _ in range(2000):
    futures.new("asample")
print(json.dumps((time.perf_counter() - start) / 2000 * 1e6))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD~1", help="the commit to compare with (default HEAD~1)")
    ap.add_argument("--sizes", default="1000,10000,100000")
    args = ap.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]

    with trees(args.rev) as both:
        found = {}
        for name, tree in both.items():
            for n in sizes:
                with tempfile.TemporaryDirectory() as tmp:
                    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tree), str(n)], check=True,
                                         capture_output=True, text=True, env=tree_env(tree, tmp), cwd=tmp).stdout
                found[name, n] = json.loads(out)
    print("microseconds per new request, with N finished results kept")
    print(f"{'N':>8}" + "".join(f"{name:>16}" for name in both))
    for n in sizes:
        print(f"{n:>8}" + "".join(f"{found[name, n]:>16.1f}" for name in both))


if __name__ == "__main__":
    main()
