"""How often a tinker SDK script against a local server ends with SIGABRT instead of exit 0, with
the transport the server's client config asks for (httpx's own) against the SDK's default
(pyqwest, which hands each response to asyncio from a Rust thread of its own).

Each process makes a training client of the tiny model, sends 30 one-row forward/backward requests
and ends without waiting for them, after a pause drawn from 0-0.1 s: the interpreter ends while
responses arrive, as a script that returns with a request or a heartbeat in flight does. The two
arms alternate, one process at a time, against one in-process LocalServer each. Then what the
transport costs: one process per arm and round makes 100 training steps (forward/backward and
optimizer step, each waited for) and 100 two-token samples, and times each hundred.

    .venv/bin/python benchmarks/bench_sdk_exit.py [--runs 80] [--rounds 3]

Prints, for each arm, the exit statuses counted and the median wall time of a process, then the
median seconds of the hundred steps and of the hundred samples.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import subprocess
import sys
import time

CLIENT = """
import sys, time
import tinker
from tinker import types

sc = tinker.ServiceClient(base_url=sys.argv[1])
tc = sc.create_lora_training_client(base_model="local/arith-tiny", rank=4).result()
datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4, 5] * 10),
                    loss_fn_inputs={"target_tokens": [2, 3, 4, 5, 1] * 10, "weights": [1.0] * 50})
pending = [tc.forward_backward([datum], "cross_entropy") for _ in range(30)]
time.sleep(float(sys.argv[2]))  # then end, the requests still in flight
"""

STEPS = """
import sys, time
import tinker
from tinker import types

sc = tinker.ServiceClient(base_url=sys.argv[1])
tc = sc.create_lora_training_client(base_model="local/arith-tiny", rank=4).result()
sampler = sc.create_sampling_client(base_model="local/arith-tiny").result()
datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4, 5] * 10),
                    loss_fn_inputs={"target_tokens": [2, 3, 4, 5, 1] * 10, "weights": [1.0] * 50})
start = time.perf_counter()
for _ in range(100):
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
trained = time.perf_counter()
for _ in range(100):
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)).result()
print(trained - start, time.perf_counter() - trained)
sc.close("success").result()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=80, help="processes per arm (default 80)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the cost's measure (default 3)")
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from machine_nb.engines.local.server import LocalServer

    class SdkDefaultTransport(LocalServer):
        def client_config(self, q, body):
            return {**super().client_config(q, body), "use_pyqwest_transport": True}

    servers = {"httpx (served)": LocalServer().start(), "pyqwest (SDK default)": SdkDefaultTransport().start()}
    statuses = {arm: collections.Counter() for arm in servers}
    walls = {arm: [] for arm in servers}
    rng = random.Random(0)
    try:
        for _ in range(args.runs):
            pause = rng.choice([0, 0.02, 0.05, 0.1])
            for arm, server in servers.items():
                start = time.monotonic()
                done = subprocess.run([sys.executable, "-c", CLIENT, server.url, str(pause)],
                                      env={**os.environ, "TINKER_API_KEY": server.key}, capture_output=True,
                                      timeout=120)
                walls[arm].append(time.monotonic() - start)
                statuses[arm][done.returncode] += 1
        costs = {arm: [] for arm in servers}
        for _ in range(args.rounds):
            for arm, server in servers.items():
                done = subprocess.run([sys.executable, "-c", STEPS, server.url], capture_output=True, text=True,
                                      env={**os.environ, "TINKER_API_KEY": server.key}, timeout=600, check=True)
                costs[arm].append([float(x) for x in done.stdout.split()])
    finally:
        for server in servers.values():
            server.stop()
    print(f"{args.runs} processes per arm, each ending with 30 forward/backward requests in flight")
    for arm in servers:
        counts = ", ".join(f"exit {code}: {n}" for code, n in sorted(statuses[arm].items()))
        print(f"{arm:>22}: {counts}; aborted (SIGABRT) {statuses[arm][-6]} of {args.runs}; "
              f"median wall {statistics.median(walls[arm]):.2f} s")
    print(f"{args.rounds} rounds; one process per arm and round, median seconds")
    for arm in servers:
        steps, samples = (statistics.median(c[k] for c in costs[arm]) for k in range(2))
        print(f"{arm:>22}: 100 training steps {steps:.2f} s, 100 samples {samples:.2f} s")


if __name__ == "__main__":
    main()
