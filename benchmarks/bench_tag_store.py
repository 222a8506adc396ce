"""tagged() + untag() on a tag store of about 1 GB: peak resident memory and time.

Writes a store of trace rows (each a user turn, a long tool result, an answer: the bulk of a
real trace store is tool output), then in a fresh process runs `tagged(store)` and
`untag(<a row in the middle>)` and reports the process's peak resident memory. Both stream:
memory follows the rows' summaries (last user and assistant texts), not the file. The store is
removed afterwards.
Run: .venv/bin/python benchmarks/bench_tag_store.py [--mb 1000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import peak_rss_mb


def write_store(store: Path, mb: int) -> int:
    store.mkdir(parents=True, exist_ok=True)
    tool = "x" * 9000
    n = 0
    with open(store / "traces.jsonl", "w") as fh:
        while fh.tell() < mb * 1_000_000:
            fh.write(json.dumps({"id": f"{n:012x}", "tag": "good", "kind": "trace", "source": f"run{n}.json",
                                 "machine": "coder", "run": f"run{n}",
                                 "messages": [{"role": "user", "content": f"fix test {n}"},
                                              {"role": "tool", "content": tool},
                                              {"role": "assistant", "content": f"fixed {n}"}]}) + "\n")
            n += 1
    return n


def child(store: str, n: int) -> None:
    import machine_nb as mnb

    t = time.perf_counter()
    df = mnb.tagged(store)
    t_tagged = time.perf_counter() - t
    t = time.perf_counter()
    removed = mnb.untag(f"{n // 2:012x}", store=store)
    t_untag = time.perf_counter() - t
    assert len(df) == n and removed["run"] == f"run{n // 2}"
    print(json.dumps({"rows": len(df), "tagged_s": t_tagged, "untag_s": t_untag, "peak_rss_mb": peak_rss_mb()}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=1000, help="store size in MB (default 1000)")
    p.add_argument("--dir", default=None)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]))
        return 0
    base = Path(a.dir or tempfile.mkdtemp(prefix="mnb-tags-"))
    store = base / "store"
    try:
        t = time.perf_counter()
        n = write_store(store, a.mb)
        size = os.path.getsize(store / "traces.jsonl")
        print(f"store: {n:,} rows, {size / 1e9:.2f} GB, written in {time.perf_counter() - t:.0f} s")
        out = subprocess.run([sys.executable, __file__, "--child", str(store), str(n)], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-2000:])
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"tagged(): {r['tagged_s']:.1f} s; untag(): {r['untag_s']:.1f} s; peak RSS of the process "
              f"{r['peak_rss_mb']:.0f} MB for a {size / 1e9:.2f} GB store")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
