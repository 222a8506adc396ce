"""Benchmark: two trainers on one local server at once against each alone.

A `machine-nb serve` process and trainer processes using the real tinker SDK, each running the
same small LoRA training loop (forward_backward + optim_step). Prints each trainer's time alone,
the time for both at once, the ratio (both at once) / (sum of the solo times) (target <= 0.7 on
2 cores: different runs' steps run in parallel, one thread each) and whether each trainer's
losses at once are bit-identical to its losses alone.

    .venv/bin/python benchmarks/bench_concurrent_runs.py [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
t0 = time.perf_counter()
losses = []
for _ in range(steps):
    fb = tc.forward_backward(data, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-3))
    losses.append(fb.result().metrics["loss:sum"])
    opt.result()
print(json.dumps({"seconds": time.perf_counter() - t0, "losses": losses}), flush=True)
sc.close("success").result(timeout=60)
""" % KEY


def trainers(url: str, steps: int, seeds: list[int]) -> list[dict]:
    """Start one trainer per seed, let them all go at once, and return their results."""
    procs = [subprocess.Popen([sys.executable, "-c", TRAINER, url, str(steps), str(s)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=str(ROOT)) for s in seeds]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait(120)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-concurrent-"))
    env = {**os.environ, "MACHINE_NB_SERVER_KEY": KEY, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                               str(work / "data")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env)
    url = server.stdout.readline().split(" on ", 1)[1].strip()
    try:
        trainers(url, 2, [0])  # warm-up: imports, first model load
        solo = [trainers(url, args.steps, [s])[0] for s in (1, 2)]
        both = trainers(url, args.steps, [1, 2])
        wall_both = max(r["seconds"] for r in both)
        total_solo = sum(r["seconds"] for r in solo)
        print(f"machine: {os.cpu_count()} cpu(s), load average {os.getloadavg()[0]:.1f}; {args.steps} steps each")
        print(f"alone: {solo[0]['seconds']:.2f} s and {solo[1]['seconds']:.2f} s (sum {total_solo:.2f} s)")
        print(f"both at once: {wall_both:.2f} s; ratio to the sum of solo times {wall_both / total_solo:.2f} "
              "(target <= 0.7 on 2 cores)")
        same = all(a["losses"] == b["losses"] for a, b in zip(solo, both))
        print(f"losses at once bit-identical to alone: {same}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
