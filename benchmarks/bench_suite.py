"""The whole suite's test time, as CI meets it: `make test` in a fresh clone of a commit
(the one-time conversion of the real model included), run several times, one after another.

Each run clones HEAD into a new temporary folder and runs the README's test command there, its
set-up step left out (`make -o setup test`: set-up is not test time): the clone uses this checkout's
`.venv`, with the clone first on the import path of every process the tests start. Printed per run:
pytest's own wall time ("in N s"), the summed time of every test phase, the CPU time of the
processes the run started and waited for (getrusage: a server or browser ended without a wait is
not in it), the pass/fail counts and the name and message of each test that failed; then the
slowest items of the last run. Run it alone: other
work on the machine slows every figure.

Before the runs and after them it measures what the machine's CPUs give together: the same
pure-Python loop in one process, then in one process per CPU at once; "N CPUs do X times the work
of one" is N times the first time over the slowest of the second. Where X is below N (CPUs that
share a physical core, a busy host), the suite's test time is its work divided by X, not by N.
That loop runs in the CPU's caches, so a host slowed in other ways (memory bandwidth, caches
shared with other guests) can pass it unchanged. Before each run it therefore also times the work
most of the suite's processes begin with: a fresh Python importing torch, the tinker SDK,
tinker-cookbook's renderers and pandas ("imports probe", CPU seconds, the median of three). The
same code taking more CPU in one run than in another, with the probe up by the same share, is the
host, not the code. It is one reading before a run of minutes, and the host can change within the
run: a probe that stayed level does not show the run's host stayed as fast.

    .venv/bin/python benchmarks/bench_suite.py [--runs 3] [--slowest 15] [--jobs N] [--rev REV] [--by-process]

`--rev` times another commit the same way (e.g. the suite before a change, for a ratio in one sitting).
`--by-process` also splits each run's CPU time by kind of process (pytest workers, notebook kernels,
training processes, servers, browsers, ...), read from /proc twice a second. It counts every
process, waited for or not, but misses each one's last half second before it ends: its sum and the
getrusage figure differ either way.
`--by-file N` also prints the N test files that cost the most CPU, every process they started
included: a process counts for the test its pytest worker was running when it started (a kernel of
the browser tests' JupyterLab counts for the test that opened it; a process kept across tests, such
as the shared Chromium or a training process, for the test that started it), and each worker's own
CPU for the test it ran. A process first seen (twice a second) after its test ended counts for the
worker's next test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (kind, a test on a process's command line), the first that matches names the process
KINDS = [("notebook kernels", lambda c: "ipykernel" in c),
         ("training processes (tinker-cookbook loops)", lambda c: "machine_nb.training.runner" in c),
         ("machine-nb serve", lambda c: "machine_nb.cli serve" in c or "machine-nb serve" in c),
         ("Chromium", lambda c: "chrom" in c.lower() or "headless_shell" in c),
         ("Playwright's driver", lambda c: "playwright" in c and "run-driver" in c),
         ("JupyterLab servers", lambda c: "jupyter" in c and ("lab" in c or "server" in c)),
         ("pytest workers", lambda c: "exec(eval(sys.stdin.readline()))" in c),
         ("pytest (main process)", lambda c: "-m pytest" in c),
         ("other Python processes the tests start", lambda c: "python" in c),
         ("other (make, git, ...)", lambda c: True)]


class ProcessSampler:
    """CPU seconds of every process started after `start()`, by kind (KINDS), read from /proc."""

    def __init__(self, every: float = 0.5):
        import threading

        self.every = every
        self.tick = os.sysconf("SC_CLK_TCK")
        #: (pid, start time) -> [command line, CPU seconds, parent pid, when first seen]
        self.seen: dict[tuple[str, str], list] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self) -> dict[tuple[str, str], tuple[float, int]]:
        found = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:  # ended meanwhile
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            found[(pid, fields[19])] = ((int(fields[11]) + int(fields[12])) / self.tick, int(fields[1]))
        return found

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            now = time.time()
            for key, (cpu, ppid) in self._scan().items():
                if key in self.before:
                    continue
                if key not in self.seen:
                    try:
                        cmd = Path(f"/proc/{key[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    except OSError:
                        continue
                    self.seen[key] = [cmd, cpu, ppid, now]
                self.seen[key][1] = cpu

    def start(self) -> None:
        self.before = set(self._scan())
        self._thread.start()

    def processes(self) -> list[dict]:
        """Every process seen: pid, parent pid, when first seen (epoch seconds), command line, CPU seconds."""
        return [{"pid": int(key[0]), "ppid": ppid, "seen": seen, "cmd": cmd, "cpu": cpu}
                for key, (cmd, cpu, ppid, seen) in self.seen.items()]

    def stop(self) -> list[tuple[str, int, float]]:
        """(kind, processes, CPU seconds) for each kind seen, most CPU first."""
        self._stop.set()
        self._thread.join()
        totals: dict[str, list] = {}
        for cmd, cpu, _, _ in self.seen.values():
            kind = next(name for name, test in KINDS if test(cmd))
            entry = totals.setdefault(kind, [0, 0.0])
            entry[0] += 1
            entry[1] += cpu
        return sorted(((k, n, cpu) for k, (n, cpu) in totals.items()), key=lambda x: -x[2])


#: The pytest plugin `--by-file` gives the workers: each test's worker pid, start, end and the worker's
#: own CPU seconds during it, a JSON line each, appended to $BENCH_SUITE_TESTS.
TIMELINE_PLUGIN = """
import json, os, resource, time
import pytest

def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, cpu = time.time(), _cpu()
    yield
    with open(os.environ["BENCH_SUITE_TESTS"], "a") as fh:
        fh.write(json.dumps({"file": item.nodeid.split("::")[0], "pid": os.getpid(), "start": start,
                             "end": time.time(), "cpu": _cpu() - cpu}) + "\\n")
"""


def by_file(tests: list[dict], processes: list[dict]) -> list[tuple[str, float, dict[str, float]]]:
    """(test file, CPU seconds, CPU seconds by kind of process) for each file, most CPU first: the
    workers' own CPU during its tests, and every process started from a worker (directly or further
    down) while it ran one of them (see the module's `--by-file`)."""
    workers = {t["pid"] for t in tests}
    runs: dict[int, list[dict]] = {}
    for t in tests:
        runs.setdefault(t["pid"], []).append(t)
    same_pid: dict[int, list[dict]] = {}
    for proc in processes:
        same_pid.setdefault(proc["pid"], []).append(proc)

    def parent(proc: dict) -> dict | None:  # the process of that pid alive when this one started
        earlier = [p for p in same_pid.get(proc["ppid"], []) if p["seen"] <= proc["seen"] + 1.0]
        return max(earlier, key=lambda p: p["seen"]) if earlier else None

    files: dict[str, dict[str, float]] = {}
    for t in tests:
        kinds = files.setdefault(t["file"], {})
        kinds["pytest workers"] = kinds.get("pytest workers", 0.0) + t["cpu"]
    for proc in processes:
        if proc["pid"] in workers:
            continue
        up, hops = proc, 0
        while up is not None and up["ppid"] not in workers and hops < 50:
            up, hops = parent(up), hops + 1
        if up is None or up["ppid"] not in workers:
            continue
        started = [t for t in runs[up["ppid"]] if t["start"] <= proc["seen"]]
        if not started:
            continue
        test = max(started, key=lambda t: t["start"])
        kind = next(name for name, match in KINDS if match(proc["cmd"]))
        kinds = files.setdefault(test["file"], {})
        kinds[kind] = kinds.get(kind, 0.0) + proc["cpu"]
    return sorted(((f, sum(k.values()), k) for f, k in files.items()), key=lambda x: -x[1])


#: the loop `throughput` times: about a second and a half of one CPU's pure-Python work
SPIN = "s = 0\nfor i in range(30_000_000):\n    s += i"


#: what the imports probe times: the imports most processes the suite starts make first
IMPORTS = "import torch, tinker, tinker_cookbook.renderers, pandas"


def imports_probe(repeats: int = 3) -> float:
    """CPU seconds (user + system) of a fresh Python running IMPORTS: the median of `repeats`."""
    spent = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", IMPORTS], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return statistics.median(spent)


def throughput(n: int, repeats: int = 3) -> tuple[float, float, float]:
    """(seconds for SPIN alone, seconds for the slowest of `n` SPINs at once, the work the `n` do
    together in units of one), each time the median of `repeats`."""
    def timed(k: int) -> float:
        start = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(k)]
        for proc in procs:
            proc.wait()
        return time.monotonic() - start

    alone = statistics.median(timed(1) for _ in range(repeats))
    together = statistics.median(timed(n) for _ in range(repeats))
    return alone, together, n * alone / together


def one_run(slowest: int, jobs: int | None, rev: str, by_process: bool = False, by_files: bool = False) -> dict:
    """Clone the repository at `rev`, run `make test` there; returns the run's figures, its slowest
    items, (`by_process`) its CPU time by kind of process and (`by_files`) by test file."""
    work = Path(tempfile.mkdtemp(prefix="bench-suite-"))
    clone = work / "clone"
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        os.symlink(ROOT / ".venv", clone / ".venv")
        junit = work / "junit.xml"
        env = {**os.environ, "PYTHONPATH": str(clone),
               "PYTEST_ADDOPTS": f"--durations={slowest} --junitxml={junit} -p no:cacheprovider"}
        timeline = work / "tests.jsonl"
        if by_files:  # the plugin alone in a folder of its own on the path: it shadows no module
            (work / "plugin").mkdir()
            (work / "plugin" / "bench_suite_timeline.py").write_text(TIMELINE_PLUGIN)
            env["PYTHONPATH"] += os.pathsep + str(work / "plugin")
            env["PYTEST_ADDOPTS"] += " -p bench_suite_timeline"
            env["BENCH_SUITE_TESTS"] = str(timeline)
        cmd = ["make", "-o", "setup", "test"] + ([f"JOBS={jobs}"] if jobs else [])
        sampler = ProcessSampler() if by_process or by_files else None
        if sampler:
            sampler.start()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        kinds = sampler.stop() if sampler else []
        files = []
        if by_files and timeline.exists():
            tests = [json.loads(line) for line in timeline.read_text().splitlines()]
            files = by_file(tests, sampler.processes())
        out = done.stdout + done.stderr
        summary = re.findall(r"=+ (.*) in ([\d.]+)s", out)
        if not summary:
            raise SystemExit(f"make test printed no summary (exit {done.returncode}):\n{out[-3000:]}")
        counts, pytest_s = summary[-1][0], float(summary[-1][1])
        cases = list(ET.parse(junit).iter("testcase"))
        phases = [(float(tc.get("time", 0)), tc.get("classname", ""), tc.get("name", "")) for tc in cases]
        failed = [(f"{tc.get('classname', '')}::{tc.get('name', '')}", (bad.get("message") or "").strip())
                  for tc in cases for bad in tc if bad.tag in ("failure", "error")]
        slow = re.search(r"slowest \d+ durations =+\n(.*?)\n(?:=|\n)", out, re.S)
        return {"pytest_s": pytest_s, "make_s": wall, "summed_s": sum(p[0] for p in phases),
                "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                "counts": counts, "rc": done.returncode, "slowest": slow.group(1).strip() if slow else "",
                "kinds": kinds if by_process else [], "files": files, "failed": failed}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs, one after another (default 3)")
    parser.add_argument("--slowest", type=int, default=15, help="slowest items to print (default 15)")
    parser.add_argument("--jobs", type=int, default=None, help="pytest workers (default: the Makefile's)")
    parser.add_argument("--rev", default="HEAD", help="the commit to time (default HEAD)")
    parser.add_argument("--by-process", action="store_true", help="also each run's CPU time by kind of process")
    parser.add_argument("--by-file", type=int, default=0, metavar="N",
                        help="also the N test files that cost each run the most CPU, their processes included")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"commit {subprocess.run(['git', '-C', str(ROOT), 'rev-parse', '--short', args.rev], capture_output=True, text=True).stdout.strip()}")
    n = os.cpu_count() or 1

    def say_throughput(when: str) -> None:
        alone, together, x = throughput(n)
        print(f"throughput {when}: one loop alone {alone:.2f} s, {n} at once {together:.2f} s: "
              f"{n} CPUs do {x:.2f} times the work of one", flush=True)

    say_throughput("before the runs")
    runs = []
    for i in range(args.runs):
        probe = imports_probe()
        r = one_run(args.slowest, args.jobs, args.rev, args.by_process, args.by_file > 0)
        runs.append(r)
        print(f"run {i + 1}: pytest {r['pytest_s']:.1f} s (make test {r['make_s']:.1f} s), summed test time "
              f"{r['summed_s']:.0f} s, CPU {r['cpu_s']:.0f} s, {r['counts']}, exit {r['rc']}; imports probe before it "
              f"{probe:.2f} CPU-s", flush=True)
        for kind, count, cpu in r["kinds"]:
            print(f"    {cpu:6.0f} s CPU  {count:4d} × {kind}", flush=True)
        if r["files"]:
            total = sum(cpu for _, cpu, _ in r["files"])
            print(f"    CPU by test file, its processes included ({total:.0f} s in all):", flush=True)
            for name, cpu, kinds in r["files"][:args.by_file]:
                split = ", ".join(f"{k} {v:.0f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.5)
                print(f"    {cpu:6.1f} s {100 * cpu / total:4.1f}%  {name}  ({split})", flush=True)
        for name, message in r["failed"]:
            print(f"    failed: {name}: {message[:600]}", flush=True)
    say_throughput("after the runs")
    times = [r["pytest_s"] for r in runs]
    print(f"pytest wall: median {statistics.median(times):.1f} s, min {min(times):.1f}, max {max(times):.1f} "
          f"(target <= 240)")
    print(f"slowest {args.slowest} items of the last run:\n{runs[-1]['slowest']}")
    sys.exit(max(r["rc"] for r in runs))


if __name__ == "__main__":
    main()
