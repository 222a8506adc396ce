"""Benchmark: two trainers on one local server at once against each alone.

A `machine-nb serve` process and trainer processes using the real tinker SDK, each running the
same small LoRA training loop (forward_backward + optim_step). Each round times trainer 1 alone,
trainer 2 alone, then both at once, and prints the ratio (both at once) / (sum of the solo times)
(target <= 0.7 on 2 cores: different runs' steps run in parallel, a run started beside another in
one of the server's training processes, `--train-workers`; 0 runs every one on a thread of the
server's own process); the summary
gives the median over the rounds and whether each trainer's losses at once were bit-identical to
its losses alone in every round.

Each round also prints the machine's load average and the CPU the server used per step alone and
at once (the same work either way), and the share of a core the solo runs got (CPU seconds of
server and trainer over wall seconds): well under 1 means other processes held the cores, and the
ratio then says more about them than about the server.

    .venv/bin/python benchmarks/bench_concurrent_runs.py [--steps 40] [--rounds 3]
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
KEY = "tml-bench-concurrent-runs-key"

TRAINER = r"""
import json, sys, time
import tinker
from tinker import types
url, steps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sc = tinker.ServiceClient(base_url=url, api_key=%r)
tc = sc.create_lora_training_client("local/arith-tiny", rank=8, seed=seed).result()
data = []
for i in range(8):
    ids = [(7 * i + 3 * j + seed) %% 90 + 5 for j in range(48)]
    data.append(types.Datum(model_input=types.ModelInput.from_ints(ids),
                            loss_fn_inputs={"target_tokens": ids[1:] + [2], "weights": [1.0] * len(ids)}))
print("ready", flush=True)
sys.stdin.readline()
t0, c0 = time.perf_counter(), time.process_time()
losses = []
for _ in range(steps):
    fb = tc.forward_backward(data, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-3))
    losses.append(fb.result().metrics["loss:sum"])
    opt.result()
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "losses": losses}),
      flush=True)
sc.close("success").result(timeout=60)
""" % KEY


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` and the processes it started (the server's
    training processes) have used so far (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                    for c in (t / "children").read_text().split()]
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(cpu_seconds(c) for c in children)


def trainers(url: str, steps: int, seeds: list[int], server_pid: int) -> tuple[list[dict], float]:
    """Start one trainer per seed, let them all go at once; their results and the server's CPU seconds."""
    procs = [subprocess.Popen([sys.executable, "-c", TRAINER, url, str(steps), str(s)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=str(ROOT)) for s in seeds]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    before = cpu_seconds(server_pid)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = [json.loads(p.stdout.readline()) for p in procs]
    used = cpu_seconds(server_pid) - before
    for p in procs:
        p.wait(120)
    return out, used


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-workers", type=int, default=None,
                    help="the server's training processes (default: serve's; 0: none)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-concurrent-"))
    env = {**os.environ, "MACHINE_NB_SERVER_KEY": KEY, "PYTHONPATH": str(ROOT)}
    workers = [] if args.train_workers is None else ["--train-workers", str(args.train_workers)]
    server = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                               str(work / "data"), *workers], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env)
    url = server.stdout.readline().split(" on ", 1)[1].strip()
    print(f"machine: {os.cpu_count()} cpu(s); {args.steps} steps each; {args.rounds} rounds; server's training "
          f"processes: {'the default' if args.train_workers is None else args.train_workers}")
    ratios, identical = [], True
    try:
        trainers(url, 2, [0, 3], server.pid)  # warm-up, two at once: imports, first model loads, training processes
        for r in range(1, args.rounds + 1):
            load = os.getloadavg()[0]
            solo = [trainers(url, args.steps, [s], server.pid) for s in (1, 2)]
            both, both_cpu = trainers(url, args.steps, [1, 2], server.pid)
            wall_both = max(b["seconds"] for b in both)
            total_solo = sum(out[0]["seconds"] for out, _ in solo)
            ratios.append(wall_both / total_solo)
            identical &= all(out[0]["losses"] == b["losses"] for (out, _), b in zip(solo, both))
            solo_cpu = sum(cpu for _, cpu in solo)
            share = (solo_cpu + sum(out[0]["cpu"] for out, _ in solo)) / total_solo
            print(f"round {r}: load average {load:.1f}; alone {solo[0][0][0]['seconds']:.2f} s and "
                  f"{solo[1][0][0]['seconds']:.2f} s, both at once {wall_both:.2f} s: ratio {ratios[-1]:.2f}; "
                  f"server CPU per step {1000 * solo_cpu / (2 * args.steps):.0f} ms alone, "
                  f"{1000 * both_cpu / (2 * args.steps):.0f} ms at once; share of a core alone {share:.2f}",
                  flush=True)
        print(f"median ratio to the sum of solo times {statistics.median(ratios):.2f} "
              f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}; target <= 0.7 on 2 cores)")
        print(f"losses at once bit-identical to alone in every round: {identical}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
