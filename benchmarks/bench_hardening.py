"""What the input guards cost and how fast they refuse: JSONL reading with the nesting limit, eval
regexes under a time bound, corpus counts, report redaction.

- read: `iter_jsonl` over a 100,000-row chat file, against the bare parse (decode + `json.loads`) of
  the same lines; plus rows with many brackets (900, 4 deep: only the C-speed text bound runs) and
  rows with 600 `[` inside a string (the bound is exceeded, so the parsed value is walked).
- deep line: how long a 100,000-`[` line takes to be refused (once, as a MachineFormatError).
- regex: one `score_output(..., "regex")` on an answer-sized reply through the bounded engine vs
  Python's `re`, and the wall time of one pathological row (`(a|aa)+$`), which `re` would not finish.
- corpus: refusing 4,000 + 200 rows, and drawing the largest corpus (4,095 rows).
- scrub: redacting a 2 MB notebook-sized text with 10 secrets (and a DSN, a JDBC URL and a URL
  password every 100 lines).
- run index checksums: a generated workspace's index reloaded (read_index, median of 5), and the
  column checksums alone; their throughput projects the cost at 1,000,000 runs (target: the whole
  reload <= 1 s there).
- hostile workspace: load_runs over the sample with a FIFO, a symlink to /dev/zero and a symlink
  to / planted in it (in a child process with a deadline).
- half-dead Tinker: `evaluate(engine="tinker")` against a loopback server whose health check and
  capabilities answer and whose work calls answer 500: seconds to EngineError (the SDK alone
  retries for ~5 minutes; target <= 30 s, imports included).

Run: .venv/bin/python benchmarks/bench_hardening.py [--rows 100000] [--index-runs 20000]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--index-runs", type=int, default=20_000)
    args = ap.parse_args()

    from machine_nb.data.corpus import MAX_ROWS, corpus_rows
    from machine_nb.errors import MachineFormatError
    from machine_nb.evaluation.scoring import score_output
    from machine_nb.core.jsonl import MAX_DEPTH, iter_jsonl
    from machine_nb.core.patterns import REGEX_TIMEOUT_S, RegexTimeout
    from machine_nb.reports.notebook import scrub

    tmp = Path(tempfile.mkdtemp())
    row = {"messages": [{"role": "user", "content": "What is 47 plus 15? " + "pad " * 20},
                        {"role": "assistant", "content": "answer: 62"}]}
    plain = tmp / "plain.jsonl"
    plain.write_text((json.dumps(row) + "\n") * args.rows)
    bracketed = tmp / "bracketed.jsonl"
    wide = {**row, "tools": [[[]] for _ in range(300)]}  # 900 brackets, 4 levels deep: bounded cheaply, accepted
    texty = {**row, "note": "[" * 600}  # 600 brackets inside a string: bound exceeded, so the value is walked
    bracketed.write_text((json.dumps(wide) + "\n") * (args.rows // 10))
    in_strings = tmp / "in_strings.jsonl"
    in_strings.write_text((json.dumps(texty) + "\n") * (args.rows // 10))

    def bare(path):  # the parse alone, without iter_jsonl's nesting limit
        with open(path, "rb") as fh:
            for raw in fh:
                json.loads(raw.decode("utf-8"))

    t_bare = timed(lambda: bare(plain), 3)
    t_iter = timed(lambda: sum(1 for _ in iter_jsonl(plain)), 3)
    t_bare_b = timed(lambda: bare(bracketed), 3)
    t_iter_b = timed(lambda: sum(1 for _ in iter_jsonl(bracketed)), 3)
    t_bare_s = timed(lambda: bare(in_strings), 3)
    t_iter_s = timed(lambda: sum(1 for _ in iter_jsonl(in_strings)), 3)
    print(f"read {args.rows:,} rows: iter_jsonl {t_iter:.3f} s vs bare parse {t_bare:.3f} s (x{t_iter / t_bare:.2f}); "
          f"MAX_DEPTH {MAX_DEPTH}")
    print(f"  {args.rows // 10:,} rows with 900 brackets, 4 deep (text bound only): {t_iter_b:.3f} s vs "
          f"{t_bare_b:.3f} s (x{t_iter_b / t_bare_b:.2f})")
    print(f"  {args.rows // 10:,} rows with 600 '[' inside a string (value walked): {t_iter_s:.3f} s vs "
          f"{t_bare_s:.3f} s (x{t_iter_s / t_bare_s:.2f})")

    deep = tmp / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n")

    def refuse():
        try:
            list(iter_jsonl(deep))
        except MachineFormatError as exc:
            assert "nested deeper" in str(exc)
    print(f"deep line (100,000 '['): refused in {timed(refuse, 3) * 1000:.1f} ms")

    n = 20_000
    t_bounded = timed(lambda: [score_output("answer: 62", r"answer: -?\d+", "regex") for _ in range(n)], 3) / n
    pat = re.compile(r"answer: -?\d+", re.DOTALL)
    t_re = timed(lambda: [pat.fullmatch("answer: 62".strip()) for _ in range(n)], 3) / n
    print(f"regex score, one answer-sized reply: bounded {t_bounded * 1e6:.1f} us vs re {t_re * 1e6:.1f} us per row")
    t0 = time.perf_counter()
    try:
        score_output("a" * 200 + "!", "(a|aa)+$", "regex")
        outcome = "matched?"
    except RegexTimeout:
        outcome = "RegexTimeout"
    print(f"pathological row (a|aa)+$ on 201 chars: {outcome} after {time.perf_counter() - t0:.2f} s "
          f"(bound {REGEX_TIMEOUT_S:g} s)")

    def too_many():
        try:
            corpus_rows(0, 4000, 200)
        except ValueError:
            pass
    print(f"corpus 4,000 + 200 rows: refused in {timed(too_many, 3) * 1000:.2f} ms; "
          f"largest corpus ({MAX_ROWS:,} rows) drawn in {timed(lambda: corpus_rows(0, MAX_ROWS - 95, 95)):.2f} s")

    text = ("cell output line with some words and a path /home/user/project/data.jsonl\n" * 99 +
            "host=db user=u password=pw-123 jdbc:postgresql://h/db?user=u&password=pw-456 "
            "postgres://u:p@ss-789@db/app\n") * 280
    secrets = [f"secret-value-{i:04d}-abcdef" for i in range(8)] + ["hunter2", "s3cr"]
    t_scrub = timed(lambda: scrub(text, secrets), 3)
    left = [pw for pw in ("pw-123", "pw-456", "ss-789") if pw in scrub(text, secrets)[0]]
    print(f"scrub {len(text) / 1e6:.1f} MB with {len(secrets)} secrets and 840 connection-string passwords: "
          f"{t_scrub:.3f} s (left unredacted: {left or 'none'})")

    bench_index(tmp, args.index_runs)
    bench_hostile(tmp)
    bench_half_dead()


def bench_index(tmp: Path, n: int) -> None:
    import os
    import statistics
    import warnings

    import machine_nb as mnb
    from machine_nb.tools.sample_workspace import generate
    from machine_nb.store import index as run_index

    os.environ["MACHINE_NB_CACHE_DIR"] = str(tmp / "cache")
    ws = tmp / "ws-index"
    generate(ws, seed=0, n_runs=n, tags=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mnb.load_runs(ws, index=True)
    path = run_index.run_index_path(ws)
    real = os.path.realpath(run_index.runs_root(ws))
    size = path.stat().st_size
    reads, sums = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        table, _, why = run_index.read_index(path, real)
        reads.append(time.perf_counter() - t0)
        assert table is not None, why
        t0 = time.perf_counter()
        for col in table.columns:
            run_index.column_checksum(col)
        sums.append(time.perf_counter() - t0)
        del table
    t_read, t_sum = statistics.median(reads), statistics.median(sums)
    mb_s = size / 1e6 / max(t_sum, 1e-9)
    at_1m = size / n * 1_000_000 / 1e6 / mb_s
    print(f"run index, {n:,} runs ({size / 1e6:.1f} MB): read_index {t_read * 1000:.1f} ms (median of 5), of which "
          f"column checksums {t_sum * 1000:.1f} ms ({mb_s:,.0f} MB/s, {t_sum / t_read:.0%} of the read); "
          f"projected checksum cost at 1,000,000 runs: {at_1m:.2f} s")


def bench_hostile(tmp: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    sample = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
    ws = tmp / "ws-hostile"
    shutil.copytree(sample / ".machine", ws / ".machine")
    support = ws / ".machine" / "runs" / "support"
    os.mkfifo(support / "fifo.json")
    (support / "zero.json").symlink_to("/dev/zero")
    (ws / ".machine" / "runs" / "root").symlink_to("/", target_is_directory=True)
    code = ("import time, warnings; warnings.simplefilter('ignore'); import machine_nb as mnb; t = time.perf_counter(); "
            f"n = len(mnb.load_runs({str(ws)!r}, index=False)); print(n, time.perf_counter() - t)")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
        print(f"hostile workspace (FIFO, /dev/zero, link to /): load_runs read {int(out[0]):,} runs in {float(out[1]):.2f} s")
    except subprocess.TimeoutExpired:
        print("hostile workspace (FIFO, /dev/zero, link to /): load_runs did NOT finish within 120 s")


def bench_half_dead() -> None:
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from half_dead import serve_half_dead

    server, url, handler = serve_half_dead()
    os.environ["TINKER_BASE_URL"] = url
    os.environ["TINKER_API_KEY"] = "tml-bench-placeholder-key-0123456789"
    from machine_nb.errors import EngineError
    from machine_nb.evaluation.evaluate import evaluate

    t0 = time.perf_counter()
    try:
        evaluate([{"messages": [{"role": "user", "content": "hi"}], "expected": "x"}], model="thinkingmachines/Inkling",
                 engine="tinker", save=False, progress=False)
        said = "no error?"
    except EngineError as exc:
        said = str(exc)
    took = time.perf_counter() - t0
    print(f"half-dead Tinker: evaluate raised EngineError after {took:.1f} s (imports included; target <= 30 s), "
          f"{handler.work} work calls answered 500: {said[:160]}")
    server.shutdown()


if __name__ == "__main__":
    main()
