"""Benchmark: does evaluate() run its requests concurrently? 24 rows against a stand-in sampler
with a fixed 200 ms latency (Tinker-like: the time is the service's, not this machine's).

Target: the whole eval takes at most 2x one request (ideally ~1x), against 24x when sequential.
Run: .venv/bin/python benchmarks/bench_eval_concurrency.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import tinker  # noqa: E402

from machine_nb.evaluation.evaluate import evaluate  # noqa: E402
from machine_nb.checks.render import get_renderer, get_tokenizer  # noqa: E402

MODEL = "thinkingmachines/Inkling-Small"  # renders offline; the sampler is a stand-in either way
LATENCY = 0.200
ROWS = 24


class FixedLatencySampler:
    """tinker's sample_async: waits LATENCY, then replies 'answer: 0' in the model's own tokens."""

    def __init__(self):
        self.reply = get_tokenizer(MODEL).encode("answer: 0", add_special_tokens=False) + \
            list(get_renderer(MODEL).get_stop_sequences())
        self.in_flight = self.peak = 0

    async def sample_async(self, prompt, num_samples, sampling_params):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(LATENCY)
        self.in_flight -= 1
        seq = tinker.SampledSequence(stop_reason="stop", sequence_id="0", tokens_np=np.array(self.reply, dtype=np.int32))
        return tinker.SampleResponse(sequences=[seq])


def rows(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"}], "expected": f"answer: {2 * i}"}
            for i in range(n)]


def run(concurrency: int, repeats: int = 3) -> tuple[float, int]:
    walls, peak = [], 0
    for _ in range(repeats):
        sampler = FixedLatencySampler()
        t0 = time.perf_counter()
        evaluate(rows(ROWS), model=MODEL, engine="tinker", sampling_client=sampler, concurrency=concurrency, save=False)
        walls.append(time.perf_counter() - t0)
        peak = sampler.peak
    return statistics.median(walls), peak


def main() -> None:
    get_renderer(MODEL)  # load the tokenizer once, outside the timings
    sequential_sum = ROWS * LATENCY
    print(f"stand-in sampler: fixed {LATENCY * 1000:.0f} ms per request; {ROWS} rows; median of 3 runs")
    print(f"{'concurrency':>11}  {'wall s':>7}  {'peak in flight':>14}  {'x one request':>13}  {'x sequential sum':>16}")
    for concurrency in (32, 8, 1):
        wall, peak = run(concurrency, repeats=3 if concurrency > 1 else 1)
        print(f"{concurrency:>11}  {wall:7.3f}  {peak:>14}  {wall / LATENCY:13.2f}  {wall / sequential_sum:16.3f}")
    wall, _ = run(32)
    verdict = "PASS" if wall / LATENCY <= 2 else "FAIL"
    print(f"default Tinker concurrency (32): {wall / LATENCY:.2f}x one request (target <= 2x): {verdict}")


if __name__ == "__main__":
    main()
