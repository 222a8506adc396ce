"""Exact token counting with the Inkling renderer over generated conversations: speed, and how far
Machine's 2.5-characters-per-token estimate is from the exact count.

Run: .venv/bin/python benchmarks/bench_tokens.py [--rows 10000] [--model thinkingmachines/Inkling-Small]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")

WORDS = ("the file build test error value function return list string model train step loss token "
         "python import class data path run check eval result number answer question because when").split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def conversation(rng: random.Random) -> dict:
    """A mix like real export lines: arithmetic Q/A, prose, multi-turn, some code and a system prompt."""
    kind = rng.random()
    if kind < 0.3:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                             {"role": "assistant", "content": f"answer: {a + b}"}]}
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": sentence(rng, rng.randint(5, 40))})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": sentence(rng, rng.randint(5, 80))})
        reply = " ".join(sentence(rng, rng.randint(5, 30)) for _ in range(rng.randint(1, 6)))
        if rng.random() < 0.2:
            reply += "\n```python\ndef f(x):\n    return x * %d  # %s\n```" % (rng.randint(2, 9), sentence(rng, 4))
        messages.append({"role": "assistant", "content": reply})
    return {"messages": messages}


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from machine_nb.checks.tokens import machine_estimate, count_tokens

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--model", default="thinkingmachines/Inkling-Small")
    args = parser.parse_args()

    rng = random.Random(0)
    rows = [conversation(rng) for _ in range(args.rows)]
    count_tokens(rows[:5], args.model)  # load tokenizer and renderer outside the timing
    t0 = time.perf_counter()
    df = count_tokens(rows, args.model, progress=False)
    wall = time.perf_counter() - t0
    assert df["exact"].all(), df[~df["exact"]].head()
    estimates = [machine_estimate(r) for r in rows]
    tokens = int(df["tokens"].sum())
    ratios = sorted(t / e for t, e in zip(df["tokens"], estimates))
    chars = sum(len(m["content"]) for r in rows for m in r["messages"])

    print(f"model: {args.model} (renderer-exact counts, build_supervised_example)")
    print(f"conversations: {len(rows):,}; messages: {sum(len(r['messages']) for r in rows):,}")
    print(f"tokens: {tokens:,} (trained {int(df['trained_tokens'].sum()):,}); wall {wall:.2f} s")
    print(f"speed: {tokens / wall:,.0f} tokens/s, {len(rows) / wall:,.0f} conversations/s "
          f"({1000 * wall / len(rows):.2f} ms per conversation), torch threads 1, 1 process")
    print(f"2.5-chars estimate total: {sum(estimates):,} tokens")
    print(f"exact / estimate, whole set: {tokens / sum(estimates):.3f}")
    q = lambda p: ratios[min(len(ratios) - 1, math.floor(p * len(ratios)))]  # noqa: E731
    print(f"exact / estimate per row: median {statistics.median(ratios):.3f}, p5 {q(0.05):.3f}, "
          f"p95 {q(0.95):.3f}, min {ratios[0]:.3f}, max {ratios[-1]:.3f}")
    print(f"content characters per exact token: {chars / tokens:.2f}")


if __name__ == "__main__":
    main()
