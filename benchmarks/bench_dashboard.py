"""The Dashboard following a busy workspace: a writer adds runs and events at 20 runs/s for a
minute into a generated workspace of 100,000 runs (bench_run_index.generate).

Three processes: this one (the driver), a writer (runs as temp file + rename, one JSON line per
event: run.started before the rename, run.finished after; it logs each rename's time), and a
"kernel" process that holds `Dashboard(workspace)` and its `picker` on an asyncio loop, as a
Jupyter kernel does (following in its background thread, applying on the loop), without a
browser attached (no widget messages leave it). The kernel logs when each run became visible in
the dashboard's state and in the picker's frame, and answers a simulated interaction (a picker
text filter, or opening a run in the previewer) every half second, timing it from the moment it
was queued on the loop to its end.

Measured:
  latency     rename -> visible in the dashboard, and in the picker: median and worst
  counts      runs and events the dashboard counted, against the writer's log (no miss, no double)
  cpu idle    the kernel process's CPU (% of one core) over 10 s with nothing written
  cpu follow  the same while the writer writes
  interaction queued -> answered: each kind once before writing (first use), then every half
              second while following: median and worst
Targets: latency median <= 1 s, worst <= 2 s; counts exact; cpu idle <= 2 %, following <= 25 %;
interaction worst <= 200 ms.

Run: .venv/bin/python benchmarks/bench_dashboard.py [--runs 100000] [--seconds 60] [--rate 20] [--dir DIR --keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

KERNEL = r'''
import asyncio, json, os, sys, time
ws, log_path = sys.argv[1], sys.argv[2]
out = open(log_path, "a", buffering=1)
def log(**kw): out.write(json.dumps(kw) + "\n")

async def main():
    import machine_nb as mnb
    from machine_nb.widgets import run_picker
    t = time.perf_counter()
    d = mnb.Dashboard(ws)
    picker = d.picker
    log(kind="ready", load_s=time.perf_counter() - t, runs=len(picker.runs))
    seen_state, seen_picker = set(), set()
    known = set(picker.runs["id"].astype(str))
    orig_add = type(picker).add_runs
    def add_runs(self, frame):
        n = orig_add(self, frame)
        now = time.time()
        rows = frame.frame.iloc[:frame.n_top] if isinstance(frame, run_picker.AddedRuns) else frame
        for rid in rows["id"].astype(str):
            if rid not in seen_picker and rid not in known:
                seen_picker.add(rid); log(kind="picker", id=rid, t=now)
        return n
    type(picker).add_runs = add_runs
    orig_change = d._on_change
    def on_change(res, batches, force_picker=False):
        now = time.time()
        for b in batches:
            f = b["frame"]
            if f is not None:
                for rid in f["id"].astype(str):
                    if rid not in seen_state and rid not in known:
                        seen_state.add(rid); log(kind="state", id=rid, t=now)
        orig_change(res, batches, force_picker)
    d._follower.on_change = on_change
    loop = asyncio.get_running_loop()
    k = 0
    while True:
        cmd = await loop.run_in_executor(None, sys.stdin.readline)
        if not cmd or cmd.strip() == "quit":
            break
        if cmd.strip() == "counts":
            s = d.state.snapshot()
            log(kind="counts", runs=s["runs"], events=s["events"], event_counts=s["event_counts"],
                picker=len(picker.runs), cpu=os.times().user + os.times().system)
        elif cmd.strip() == "interact":
            queued = time.perf_counter()
            def act():
                global k
                start = time.perf_counter()
                if k % 2 == 0:
                    picker.set_filters(text="answer" if k % 4 == 0 else None)
                else:
                    latest = d.state.snapshot()["latest"]
                    if latest:
                        d.open_run(latest[0]["key"])
                k += 1
                log(kind="interact", wait=start - queued, total=time.perf_counter() - queued)
            loop.call_soon(act)
        elif cmd.strip() == "cpu":
            ti = os.times(); log(kind="cpu", cpu=ti.user + ti.system, t=time.monotonic())
    d.stop()

k = 0
asyncio.run(main())
'''


def writer(root: Path, events: Path, n: int, rate: float, log_path: Path) -> None:
    """Write n runs at `rate` a second (paced by the clock, not by sleeps that drift)."""
    from dashboard_writer import append, event_line, write_run

    with open(log_path, "w", buffering=1) as log:
        machines = ["support", "coder", "chatbot/triage"]
        t0 = time.monotonic()
        for i in range(n):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            m, rid = machines[i % 3], f"live{i:06d}-{os.getpid() % 1000:03d}"
            append(str(events), event_line("run.started", m, rid))
            write_run(str(root), m, rid)
            t = time.time()
            append(str(events), event_line("run.finished", m, rid))
            log.write(json.dumps({"id": rid, "t": t}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--dir", default=None, help="where to generate the workspace (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep (and reuse) the generated workspace")
    args = ap.parse_args()
    from bench_run_index import generate

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-dash-"))
    ws = base / f"ws{args.runs}"
    cache = base / "cache"
    env = {**os.environ, "MACHINE_NB_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "MACHINE_NB_PROGRESS": "0"}
    os.environ.update(env)
    if not (ws / ".machine" / "runs").is_dir():
        ws.mkdir(parents=True, exist_ok=True)
        print(f"generating {args.runs:,} runs…", flush=True)
        generate(ws, args.runs)
    events = ws / ".machine" / "events.jsonl"
    events.unlink(missing_ok=True)
    for p in (ws / ".machine" / "runs").rglob("live*.json"):  # a kept workspace: drop the last writer's runs
        p.unlink()
    klog = base / "kernel.jsonl"
    wlog = base / "writer.jsonl"
    klog.unlink(missing_ok=True)
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(ws), str(klog)], stdin=subprocess.PIPE,
                              text=True, env=env, cwd=base)

    def send(cmd: str) -> None:
        kernel.stdin.write(cmd + "\n")
        kernel.stdin.flush()

    def records(kind: str) -> list[dict]:
        if not klog.exists():
            return []
        return [r for r in map(json.loads, klog.read_text().splitlines()) if r["kind"] == kind]

    try:
        while not records("ready"):
            if kernel.poll() is not None:
                raise SystemExit("the kernel process died")
            time.sleep(0.2)
        ready = records("ready")[0]
        print(f"workspace: {args.runs:,} runs; Dashboard + picker ready in {ready['load_s']:.1f} s", flush=True)
        # first use of each interaction (first text search, first run opened), before any writing
        send("interact")
        send("interact")
        while len(records("interact")) < 2:
            time.sleep(0.05)
        first = [r["total"] for r in records("interact")[:2]]
        # idle CPU: 10 s with nothing written
        time.sleep(2)
        send("cpu")
        time.sleep(10)
        send("cpu")
        while len(records("cpu")) < 2:
            time.sleep(0.05)
        c0, c1 = records("cpu")[:2]
        idle = (c1["cpu"] - c0["cpu"]) / (c1["t"] - c0["t"]) * 100
        # following: the writer writes; interactions every 0.5 s
        n = int(args.seconds * args.rate)
        import multiprocessing as mp

        w = mp.get_context("spawn").Process(target=writer, args=(ws / ".machine" / "runs", events, n, args.rate, wlog))
        send("cpu")
        w.start()
        while w.is_alive():
            send("interact")
            time.sleep(0.5)
        w.join()
        send("cpu")
        time.sleep(3)  # the last files are picked up within a poll or two
        send("counts")
        while not records("counts") or len(records("cpu")) < 4:
            time.sleep(0.05)
        c2, c3 = records("cpu")[2:4]
        follow = (c3["cpu"] - c2["cpu"]) / (c3["t"] - c2["t"]) * 100
        counts = records("counts")[-1]
        written = {r["id"]: r["t"] for r in map(json.loads, wlog.read_text().splitlines())}
        state = {r["id"]: r["t"] for r in records("state")}
        picker = {r["id"]: r["t"] for r in records("picker")}
        lat_state = [state[i] - t for i, t in written.items() if i in state]
        lat_picker = [picker[i] - t for i, t in written.items() if i in picker]
        inter = [r["total"] for r in records("interact")[2:]]
        missed_state = [i for i in written if i not in state]
        missed_picker = [i for i in written if i not in picker]
        print(f"writer: {len(written):,} runs and {2 * len(written):,} events in {args.seconds:.0f} s "
              f"({args.rate:g} runs/s)")
        print(f"counted by the dashboard: runs {counts['runs']:,} (expected {args.runs + len(written):,}), "
              f"events {counts['events']:,} (expected {2 * len(written):,}), {counts['event_counts']}; "
              f"picker rows {counts['picker']:,}")
        print(f"missed: dashboard {len(missed_state)}, picker {len(missed_picker)}; "
              f"double-counted: {counts['runs'] - args.runs - len(written)} runs, "
              f"{counts['events'] - 2 * len(written)} events")

        def q(xs: list[float]) -> str:
            return f"median {statistics.median(xs):.3f} s, worst {max(xs):.3f} s" if xs else "none"

        print(f"latency rename -> dashboard: {q(lat_state)}")
        print(f"latency rename -> picker:    {q(lat_picker)}")
        print(f"kernel CPU idle:      {idle:.2f} % of one core")
        print(f"kernel CPU following: {follow:.1f} % of one core")
        print(f"interaction, first use before writing: picker text filter {first[0] * 1000:.0f} ms, "
              f"open a run {first[1] * 1000:.0f} ms")
        print(f"interaction while following (picker filter / open run), queued -> answered: {len(inter)} of them, "
              f"median {statistics.median(inter) * 1000:.0f} ms, worst {max(inter) * 1000:.0f} ms")
        ok = (not missed_state and not missed_picker and counts["runs"] == args.runs + len(written)
              and counts["events"] == 2 * len(written) and lat_state and statistics.median(lat_state) <= 1
              and max(lat_state) <= 2 and lat_picker and statistics.median(lat_picker) <= 1 and max(lat_picker) <= 2
              and idle <= 2 and follow <= 25 and max(inter) <= 0.2)
        print("targets met" if ok else "targets NOT all met")
    finally:
        try:
            send("quit")
            kernel.wait(20)
        except Exception:
            kernel.kill()
        for p in (ws / ".machine" / "runs").rglob("live*.json"):
            p.unlink()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
