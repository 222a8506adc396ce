"""What `compare` says for three small evals, and what its statistics cost in time.

The three 24-row comparisons: 24/0/0 (every row a win), 7 wins / 1 loss / 16 ties, and 12/24
vs 18/24 where the baseline's 12 correct rows are among the checkpoint's 18 (paired, though the
two accuracies alone look unpaired; the independent-samples Newcombe interval is printed beside
it to show what pairing buys). Then the same 24/0/0 rows as 3 cases of 8 trials, and the three
checkpoints through compare_many (Holm). Last, the first compare() call in a fresh process
(it loads scipy and statsmodels) against later calls.
Run: .venv/bin/python benchmarks/bench_compare_intervals.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pandas as pd

import machine_nb as mnb


def frame(correct: list[bool], name: str, case: list | None = None) -> mnb.EvalResult:
    n = len(correct)
    df = pd.DataFrame({"row": range(n), "prompt": [f"What is {i} plus {i}?" for i in range(n)],
                       "expected": [f"answer: {2 * i}" for i in range(n)], "match": ["exact"] * n,
                       "output": [f"answer: {2 * i}" if c else "?" for i, c in enumerate(correct)],
                       "correct": correct})
    if case is not None:
        df["case"] = case
    return mnb.EvalResult(df, {"name": name})


def show(title: str, r) -> None:
    print(f"== {title}")
    print(f"   W/T/L {r.wins}/{r.ties}/{r.losses}; {r.p_method} p = {r.p_value:.3g}")
    print(f"   {r.baseline_name} {r.baseline_accuracy:.1%} (95% CI {r.baseline_ci_low:.1%} to {r.baseline_ci_high:.1%}, "
          f"{r.accuracy_interval}); {r.checkpoint_name} {r.checkpoint_accuracy:.1%} "
          f"(95% CI {r.checkpoint_ci_low:.1%} to {r.checkpoint_ci_high:.1%})")
    print(f"   delta {r.delta_text}; bootstrap {r.bootstrap_text}")
    print(f"   rows for 80% power: {r.rows_for_power}")
    for line in r.summary.split("\n"):
        print(f"   | {line}")


def main() -> int:
    none = [False] * 24
    base_7_1 = [False] * 23 + [True]
    half = [True] * 12 + [False] * 12
    cases = {
        "24/0/0: baseline 0/24, checkpoint 24/24": (none, [True] * 24),
        "7 wins / 1 loss of 24": (base_7_1, [True] * 7 + [False] * 17),
        "12/24 vs 18/24, paired (baseline's 12 within checkpoint's 18)": (half, [True] * 18 + [False] * 6),
    }
    for title, (a, b) in cases.items():
        show(title, mnb.compare(frame(a, "baseline"), frame(b, "final")))
    from statsmodels.stats.proportion import confint_proportions_2indep

    lo, hi = confint_proportions_2indep(18, 24, 12, 24, method="newcomb")
    print(f"   (read as two independent samples, Newcombe's unpaired interval would be {lo:+.1%} to {hi:+.1%})")

    labels = [f"case-{i // 8}" for i in range(24)]
    show("24/0/0 again, as 3 cases of 8 trials", mnb.compare(frame(none, "baseline", case=labels),
                                                             frame([True] * 24, "final", case=labels)))

    many = mnb.compare_many(frame(none, "baseline"), {
        "all-24": frame([True] * 24, "all-24"), "six-wins": frame([True] * 6 + [False] * 18, "six-wins"),
        "seven-one": frame([True] * 7 + [False] * 17, "seven-one")})
    print("== compare_many (the baseline 0/24 against three checkpoints)")
    print(many.table[["checkpoint", "accuracy", "delta", "delta_low", "delta_high", "wins", "losses", "p_value",
                      "p_holm", "significant"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for line in many.summary.split("\n"):
        print(f"   | {line}")

    probe = ("import json, time, pandas as pd, machine_nb as mnb\n"
             "df = lambda c: pd.DataFrame({'prompt': [str(i) for i in range(24)], 'expected': ['a'] * 24, "
             "'output': ['a'] * 24, 'correct': c})\n"
             "a, b = df([False] * 23 + [True]), df([True] * 7 + [False] * 17)\n"
             "t = time.perf_counter(); mnb.compare(a, b); first = time.perf_counter() - t\n"
             "later = []\n"
             "for _ in range(5):\n"
             "    t = time.perf_counter(); mnb.compare(a, b); later.append(time.perf_counter() - t)\n"
             "print(json.dumps([first, sorted(later)[2]]))")
    firsts, laters = [], []
    for _ in range(3):
        first, later = json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                                 text=True).stdout)
        firsts.append(first)
        laters.append(later)
    print("== time (24 rows, 10,000 bootstrap resamples; median of 3 fresh processes)")
    print(f"   first compare() in a process (loads scipy + statsmodels): {statistics.median(firsts):.3f} s")
    print(f"   a later compare():                                        {statistics.median(laters):.3f} s")
    code = "import sys, machine_nb; print([m for m in ('scipy', 'statsmodels') if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    print(f"   `import machine_nb` loads: {loaded} (the libraries load on the first compare())")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
