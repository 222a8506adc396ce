"""Benchmark: the local engine as a Tinker-compatible server.

On the minimal-SFT corpus (48 rows, batch 8, 10 epochs = 60 steps), in one run:
- `sft` wall time through the server (the cookbook unchanged in a child process, the real
  tinker SDK over HTTP), and the same seed twice giving identical losses and outputs;
- a 24-row eval through the server;
- server start-up: `machine-nb serve` launched to its ready line, and in this process
  `ensure_server()` to a first answered request (target <= 3 s);
- notebook 01 end to end through the server (target <= 30 s), from a fresh kernel;
- time per request (`--requests`): a keep-alive GET answered by the server, and the real SDK's
  forward, forward_backward + optim_step, sample and compute_logprobs (a DPO step's reference
  pass) round trips on one small datum; with
  `--baseline DIR` (a checkout of another commit) both codes are measured in alternating child
  processes of one run and the ratios printed (target <= 1.3x).

    .venv/bin/python benchmarks/bench_engine_server.py [--repeats 3] [--no-notebook]
    .venv/bin/python benchmarks/bench_engine_server.py --requests [--baseline /tmp/main-checkout]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
ROOT = Path(__file__).resolve().parents[1]
CODE = Path(os.environ.get("BENCH_CODE_ROOT") or ROOT)  # the checkout whose machine_nb is measured
sys.path.insert(0, str(CODE))


def per_request(n_raw: int = 300, n_sdk: int = 30) -> dict[str, float]:
    """Milliseconds per request against this process's local server (see the module docstring)."""
    import http.client

    import tinker
    from tinker import types

    from machine_nb.engines import service_client
    from machine_nb.engines.local.server import ensure_server

    server = ensure_server()
    key = getattr(server, "key", None) or "tml-local-engine"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"X-API-Key": key}
    for _ in range(20):
        conn.request("GET", "/api/v1/get_server_capabilities", headers=headers)
        conn.getresponse().read()
    t0 = time.perf_counter()
    for _ in range(n_raw):
        conn.request("GET", "/api/v1/get_server_capabilities", headers=headers)
        conn.getresponse().read()
    raw = (time.perf_counter() - t0) / n_raw
    conn.close()
    sc = service_client("local")
    tc = sc.create_lora_training_client("local/arith-tiny", rank=2).result()
    ids = [5, 17, 23, 9, 11, 40, 3, 8]
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids),
                        loss_fn_inputs={"target_tokens": ids[1:] + [2], "weights": [1.0] * len(ids)})
    sampler = tc.save_weights_and_get_sampling_client("bench")
    params = tinker.SamplingParams(max_tokens=2, temperature=0.0)
    out: dict[str, float] = {"raw GET": raw * 1000}
    for name, fn in (("forward", lambda: tc.forward([datum], "cross_entropy").result()),
                     ("forward_backward + optim_step", lambda: (
                         tc.forward_backward([datum], "cross_entropy"),
                         tc.optim_step(types.AdamParams(learning_rate=1e-4)).result())),
                     ("sample", lambda: sampler.sample(types.ModelInput.from_ints(ids), 1, params).result()),
                     ("compute_logprobs, 48 tokens", lambda: sampler.compute_logprobs(
                         types.ModelInput.from_ints(ids * 6)).result())):
        for _ in range(3):
            fn()
        t0 = time.perf_counter()
        for _ in range(n_sdk):
            fn()
        out[name] = (time.perf_counter() - t0) / n_sdk * 1000
    return out


def compare_requests(baseline: Path, rounds: int) -> None:
    """Per-request times of `baseline`'s code and this checkout's, in alternating child processes."""
    figures: dict[str, dict[str, list[float]]] = {"baseline": {}, "this": {}}
    for _ in range(rounds):
        for label, code in (("baseline", baseline), ("this", ROOT)):
            env = {**os.environ, "BENCH_CODE_ROOT": str(code), "PYTHONPATH": str(code)}
            done = subprocess.run([sys.executable, __file__, "--requests", "--json"], capture_output=True,
                                  text=True, env=env, cwd=str(code))
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items():
                figures[label].setdefault(k, []).append(v)
    print(f"time per request, median of {rounds} alternating runs (baseline {baseline} vs this checkout):")
    for k in figures["this"]:
        b, t = med(figures["baseline"][k]), med(figures["this"][k])
        print(f"  {k:32s} baseline {b:8.2f} ms   this {t:8.2f} ms   ratio {t / b:.2f}x (target <= 1.3x)")


def losses(log_dir) -> list[float]:
    from machine_nb.training.train import training_metrics

    return [float(x) for x in training_metrics(log_dir)["train_mean_nll"]]


def med(xs) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each side (default 3)")
    ap.add_argument("--no-notebook", action="store_true", help="skip notebook 01 end to end")
    ap.add_argument("--requests", action="store_true", help="only the time per request")
    ap.add_argument("--baseline", type=Path, default=None, help="with --requests: a checkout to compare with")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.requests:
        if args.baseline is not None:
            compare_requests(args.baseline.resolve(), args.repeats)
        else:
            os.environ.setdefault("MACHINE_NB_DATA_DIR", tempfile.mkdtemp(prefix="bench-requests-"))
            figures = per_request()
            print(json.dumps(figures) if args.json else
                  "\n".join(f"{k}: {v:.2f} ms per request" for k, v in figures.items()), flush=True)
            os._exit(0)  # the SDK's threads need not be waited for
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-server-"))
    os.environ.setdefault("MACHINE_NB_DATA_DIR", str(work / "server-data"))
    import torch

    from machine_nb.data.corpus import make_corpus
    from machine_nb.evaluation.evaluate import evaluate
    from machine_nb.training.train import sft

    print(f"machine: {os.cpu_count()} cpu(s), torch {torch.__version__}, load average "
          f"{os.getloadavg()[0]:.1f}")
    corpus = make_corpus(work / "corpus", seed=0)

    # -- server start-up
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                             str(work / "serve-data")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    serve_ready = time.perf_counter() - t0
    proc.terminate()
    proc.wait()
    import urllib.request

    from machine_nb.engines.local.server import ensure_server

    t0 = time.perf_counter()
    url = ensure_server().url
    urllib.request.urlopen(url + "/api/v1/healthz", timeout=10).read()
    inproc_ready = time.perf_counter() - t0
    print(f"server start-up: `machine-nb serve` to its ready line {serve_ready:.2f} s ({line.strip()!r}); "
          f"in this process, ensure_server() to a first answer {inproc_ready * 1000:.0f} ms (target <= 3 s)")

    # -- sft
    warm = sft(corpus.train, log_dir=work / "warm-server", progress=False)  # first call: server + child start
    server_t, server_runs = [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        server_runs.append(sft(corpus.train, log_dir=work / f"server-{i}", progress=False))
        server_t.append(time.perf_counter() - t0)
    print(f"sft, 60 steps: server median {med(server_t):.2f} s (runs {', '.join(f'{x:.2f}' for x in server_t)})")
    print(f"same seed twice through the server: identical losses "
          f"{losses(server_runs[0].log_dir) == losses(warm.log_dir)}")

    # -- eval
    def server_eval(ckpt):
        return evaluate(corpus.eval, checkpoint=ckpt, save=False, progress=False)

    outs_a = server_eval(server_runs[0].checkpoint).rows["output"].tolist()
    outs_b = server_eval(warm.checkpoint).rows["output"].tolist()
    print(f"same seed twice through the server: identical outputs {outs_a == outs_b} "
          f"(exact match {sum(o == r for o, r in zip(outs_a, [json.loads(x)['expected'] for x in open(corpus.eval)])) / 24:.3f})")
    ev_server = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        server_eval(server_runs[0].checkpoint)
        ev_server.append(time.perf_counter() - t0)
    print(f"24-row eval: server median {med(ev_server):.3f} s")

    # -- notebook 01
    if not args.no_notebook:
        out = work / "nb01.html"
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "machine_nb.cli", "report",
                               str(ROOT / "notebooks" / "01_minimal_sft.ipynb"), "-o", str(out)],
                              capture_output=True, text=True, cwd=str(ROOT))
        wall = time.perf_counter() - t0
        print(f"notebook 01 through the server, `machine-nb report` end to end: {wall:.1f} s, exit {done.returncode} "
              "(target <= 30 s)")
        if done.returncode:
            print(done.stderr[-2000:])
    with contextlib.suppress(Exception):
        import shutil

        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
