"""The run index at scale: generated workspaces of 100,000 and 1,000,000 runs.

Measures, each in a fresh process (so imports and memory are not shared between steps):
  bare        walk the run folders and orjson-parse every file, nothing else (the floor), reading
              through os.open/os.read as load_runs does, and through open().read()
  first       load_runs with no index yet: parse everything and write the index
  second      load_runs again, nothing changed: five times with check="dirs" (the default), once
              with check="files"
  1% changed  rewrite 1% of the run files as Machine does (temp file + rename), load again:
              the index must parse exactly those
  picker      load_runs (from the index) + RunPicker: peak resident memory, and 20 text-filter
              changes (time from the widget value set to the new page in the view model)
Targets: first <= 2x bare; second <= 1 s at 1,000,000; 1% changed parses only those; peak RSS of
load_runs + RunPicker <= 2 GB; text filter median <= 100 ms, worst <= 300 ms at 1,000,000.
Times are wall seconds and process CPU seconds (on a shared machine other processes only add
wall time). Generated workspaces (about 4.2 kB a run on disk) are removed afterwards unless --keep.

Run: .venv/bin/python benchmarks/bench_run_index.py [--runs 100000 1000000] [--dir DIR] [--keep [--reuse]]
     [--reload-only]  (the first load and five reloads alone; with PYTHONPATH pointing at another
     checkout, the same workspace measures that code: `--dir D --keep` once, then `--reuse`)
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

CHUNK = 100_000  # runs generated per call of sample.generate (it holds a chunk's records in memory)


def generate(ws: Path, n: int) -> float:
    """n runs in ws, as sample.generate writes them, chunk by chunk with one seed per chunk."""
    from machine_nb.tools.sample_workspace import generate as sample

    t = time.perf_counter()
    runs = ws / ".machine" / "runs"
    done = k = 0
    while done < n:
        m = min(CHUNK, n - done)
        with tempfile.TemporaryDirectory(dir=ws.parent) as tmp:
            sample(tmp, seed=k, n_runs=m, tags=False)
            if k == 0:
                shutil.move(os.path.join(tmp, "machines"), ws / "machines")
            src = Path(tmp) / ".machine" / "runs"
            for dirpath, _, files in os.walk(src):
                dst = runs / os.path.relpath(dirpath, src)
                dst.mkdir(parents=True, exist_ok=True)
                for f in files:
                    os.rename(os.path.join(dirpath, f), dst / f)
        done += m
        k += 1
        print(f"  generated {done:,} runs ({time.perf_counter() - t:.0f} s)", flush=True)
    return time.perf_counter() - t


# ---------------------------------------------------------------------------------------------
# steps, each run in a child process: `python bench_run_index.py --step NAME WS`


def _read(path: str) -> bytes:
    """A file's bytes through os-level calls (the fastest plain read; load_runs reads so too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, os.fstat(fd).st_size + 1)
    finally:
        os.close(fd)


def step_bare(ws: str) -> dict:
    import orjson

    n = 0
    for dirpath, _, files in os.walk(os.path.join(ws, ".machine", "runs")):
        for name in files:
            if name.endswith(".json"):
                orjson.loads(_read(os.path.join(dirpath, name)))
                n += 1
    return {"files": n}


def step_bare_open(ws: str) -> dict:
    import orjson

    n = 0
    for dirpath, _, files in os.walk(os.path.join(ws, ".machine", "runs")):
        for name in files:
            if name.endswith(".json"):
                with open(os.path.join(dirpath, name), "rb") as fh:
                    orjson.loads(fh.read())
                n += 1
    return {"files": n}


def step_load(ws: str, check: str = "dirs") -> dict:
    import machine_nb as mnb

    df = mnb.load_runs(ws, index=True, check=check)
    s = df.attrs["index"]
    return {"rows": len(df), "parsed": s.parsed, "reused": s.reused, "removed": s.removed, "stats": s.stats,
            "written": s.written, "workers": s.workers}


def step_picker(ws: str) -> dict:
    import statistics

    import machine_nb as mnb

    t = time.perf_counter()
    df = mnb.load_runs(ws)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    picker = mnb.RunPicker(df)
    t_picker = time.perf_counter() - t
    stamp: list[float] = []
    picker._table.observe(lambda _: stamp.append(time.perf_counter()), names="rows")
    queries = ["password", "refund", "order #1042", "tests/test_math", "priority: high", "anything else",
               "team: billing", "not sure", "zzz-no-such", "canada", "src/cart.py", "fixed", "the test passes",
               "charged twice", "help page", "1042", "warranty", "a", "parcel damaged", "sum(prices)"]
    times, matches = [], []
    for q in queries:
        stamp.clear()
        start = time.perf_counter()
        picker.controls["text"].value = q
        end = stamp[-1] if stamp else time.perf_counter()
        times.append((end - start) * 1000)
        matches.append(len(picker._view))  # the count, without building the frame of the matches
    other = {}
    for name, set_it in [("machine", lambda: picker.set_filters(text=None, machine=["coder"])),
                         ("score", lambda: picker.set_filters(machine=None, score=(0.5, 1.0))),
                         ("machine+score+text", lambda: picker.set_filters(machine=["support"], text="refund"))]:
        start = time.perf_counter()
        set_it()
        other[name] = (time.perf_counter() - start) * 1000
    return {"rows": len(df), "load_s": t_load, "picker_s": t_picker, "text_ms": times, "matches": matches,
            "text_median_ms": statistics.median(times), "text_worst_ms": max(times), "other_ms": other}


STEPS = {"bare": step_bare, "bare_open": step_bare_open, "load": step_load, "load_files": lambda ws: step_load(ws, "files"),
         "picker": step_picker}


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM, which starts afresh at exec (ru_maxrss keeps
    the parent's peak across fork + exec on Linux, so it would count the generator's memory)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024 * 1024)


def child(step: str, ws: str) -> None:
    import orjson  # noqa: F401  imports are not what is measured: a notebook pays them once
    import pandas  # noqa: F401
    import pyarrow.ipc  # noqa: F401

    import machine_nb.data.frames  # noqa: F401
    import machine_nb.store.index  # noqa: F401
    import machine_nb.widgets.run_picker  # noqa: F401

    w, c = time.perf_counter(), time.process_time()
    out = STEPS[step](ws)
    out.update(wall_s=time.perf_counter() - w, cpu_s=time.process_time() - c, peak_rss_mb=peak_rss_mb())
    print("RESULT " + json.dumps(out))


def run_step(step: str, ws: Path, cache: Path) -> dict:
    env = {**os.environ, "MACHINE_NB_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, __file__, "--step", step, str(ws)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"step {step} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def change_files(ws: Path, fraction: float) -> int:
    """Rewrite every 1/fraction-th run file as Machine would (temp file + rename), output changed."""
    import orjson

    n = 0
    every = round(1 / fraction)
    for dirpath, _, files in os.walk(ws / ".machine" / "runs"):
        for i, name in enumerate(sorted(files)):
            if i % every:
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                run = orjson.loads(fh.read())
            run["output"] = (run.get("output") or "") + " (edited)"
            tmp = os.path.join(dirpath, f".{name}.tmp")
            with open(tmp, "wb") as fh:
                fh.write(orjson.dumps(run, option=orjson.OPT_INDENT_2))
            os.replace(tmp, path)
            n += 1
    return n


def bench(n: int, base: Path, keep: bool, reuse: bool = False, reload_only: bool = False) -> None:
    ws, cache = base / f"ws-{n}", base / f"cache-{n}"
    print(f"\n== {n:,} runs ==", flush=True)
    done = ws / ".generated"  # written once a workspace is complete (for --reuse)
    if cache.exists():
        shutil.rmtree(cache)
    if reuse and done.exists():
        gen_s = float(done.read_text())
        print(f"reusing {ws} (generated earlier in {gen_s:.0f} s)")
    else:
        if ws.exists():
            shutil.rmtree(ws)
        ws.mkdir(parents=True)
        gen_s = generate(ws, n)
        done.write_text(f"{gen_s:.1f}")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ws / ".machine" / "runs") for f in fs)
    print(f"generated {n:,} run files, {size / 1e9:.2f} GB, in {gen_s:.0f} s")
    if reload_only:
        try:
            first = run_step("load", ws, cache)
            seconds = [run_step("load", ws, cache) for _ in range(5)]
            second = sorted(seconds, key=lambda r: r["wall_s"])[2]
            index_mb = sum(f.stat().st_size for f in cache.rglob("*.arrow")) / 1e6
            import machine_nb

            print(f"reload only, {n:,} runs, machine_nb from {Path(machine_nb.__file__).parent} "
                  f"(index file {index_mb:.0f} MB):")
            print(f"  first load_runs (builds index)     wall {first['wall_s']:7.2f} s  cpu {first['cpu_s']:7.2f} s")
            print(f"  second load_runs, median of 5      wall {second['wall_s']:7.2f} s  cpu {second['cpu_s']:7.2f} s  "
                  "each: " + ", ".join(f"{r['wall_s']:.2f}" for r in seconds) + " s")
        finally:
            if not keep:
                shutil.rmtree(ws, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
        return
    try:
        run_step("bare", ws, cache)  # warm the page cache
        bare = min((run_step("bare", ws, cache) for _ in range(2)), key=lambda r: r["wall_s"])
        bare_open = min((run_step("bare_open", ws, cache) for _ in range(2)), key=lambda r: r["wall_s"])
        first = run_step("load", ws, cache)
        assert first["parsed"] == n and first["rows"] == n, first
        seconds = [run_step("load", ws, cache) for _ in range(5)]
        second = sorted(seconds, key=lambda r: r["wall_s"])[2]  # the median of five
        worst = max(seconds, key=lambda r: r["wall_s"])
        files = run_step("load_files", ws, cache)
        assert all(r["parsed"] == 0 for r in seconds) and files["parsed"] == 0, (seconds, files)
        changed = change_files(ws, 0.01)
        time.sleep(2.5)  # a reload a moment later: files changed within RACY_NS of a scan are read again
        after = run_step("load", ws, cache)
        again = run_step("load", ws, cache)
        picker = run_step("picker", ws, cache)
        index_mb = sum(f.stat().st_size for f in cache.rglob("*.arrow")) / 1e6

        def row(label, r, extra=""):
            print(f"  {label:34s} wall {r['wall_s']:7.2f} s  cpu {r['cpu_s']:7.2f} s  peak RSS {r['peak_rss_mb']:6.0f} MB  {extra}")

        print(f"results, {n:,} runs (index file {index_mb:.0f} MB, {index_mb * 1e6 / n:.0f} bytes a run; "
              f"run files {size / 1e9:.2f} GB; {os.cpu_count()} CPUs):")
        row("bare parse, os.read (floor)", bare)
        row("bare parse, open().read()", bare_open)
        row("first load_runs (builds index)", first, f"parsed {first['parsed']:,} in {first['workers']} processes")
        row("second load_runs, median of 5", second, f"parsed {second['parsed']}, stat-ed {second['stats']:,}")
        row("second load_runs, worst of 5", worst, "each: " + ", ".join(f"{r['wall_s']:.2f}" for r in seconds) + " s")
        row("second load_runs, check=files", files, f"parsed {files['parsed']}, stat-ed {files['stats']:,}")
        row(f"after {changed:,} files changed (1%)", after,
            f"parsed {after['parsed']:,} (want {changed:,}), stat-ed {after['stats']:,}")
        row("and again, nothing changed", again, f"parsed {again['parsed']}, stat-ed {again['stats']:,}")
        row("load_runs + RunPicker", picker, f"load {picker['load_s']:.2f} s, RunPicker() {picker['picker_s']:.2f} s")
        for label, floor in (("os.read", bare), ("open().read()", bare_open)):
            print(f"  first / bare ({label}): wall {first['wall_s'] / floor['wall_s']:.2f}x, "
                  f"cpu {first['cpu_s'] / floor['cpu_s']:.2f}x  (target <= 2x; times exclude imports, peak RSS includes them)")
        print(f"  1% changed: parsed {after['parsed']:,} of {changed:,} changed files"
              f" ({'only those' if after['parsed'] == changed else 'MISMATCH'})")
        print(f"  text filter over 20 changes: median {picker['text_median_ms']:.1f} ms, worst {picker['text_worst_ms']:.1f} ms"
              f"  (each: {', '.join(f'{t:.0f}' for t in picker['text_ms'])} ms)")
        print(f"  other filters: {', '.join(f'{k} {v:.1f} ms' for k, v in picker['other_ms'].items())}")
    finally:
        if not keep:
            shutil.rmtree(ws, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--dir", default=None, help="where to generate (default: a temp dir); removed after unless --keep")
    p.add_argument("--keep", action="store_true", help="keep the generated workspaces and indexes")
    p.add_argument("--reuse", action="store_true", help="use a workspace a run with --keep left in --dir")
    p.add_argument("--reload-only", action="store_true",
                   help="only the first load and five reloads (to compare two versions of the code on one workspace)")
    p.add_argument("--step", nargs=2, metavar=("STEP", "WS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.step:
        child(*a.step)
        return 0
    base = Path(a.dir or tempfile.mkdtemp(prefix="mnb-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free / 1e9
    print(f"disk free at {base}: {free:.0f} GB (need about {max(a.runs) * 4.2e3 * 1.3 / 1e9:.1f} GB)")
    for n in a.runs:
        bench(n, base, a.keep, a.reuse, a.reload_only)
    if not a.keep and a.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
