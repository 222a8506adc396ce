"""machine_nb.evaluation.stats against published tables and cases worked by hand.

Published: Newcombe (1998a, Stat Med 17:857, Table II) single-proportion intervals; Fagerland,
Lydersen & Laake (2014, Stat Med 33:2850) Newcombe paired interval for Cavo et al.'s data. The
rest is checked by hand (closed forms, enumerable distributions) or by brute-force enumeration.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest

from machine_nb.evaluation import stats

Z = 1.959963984540054  # the 97.5% normal quantile


# --------------------------------------------------------------------------- single proportions

@pytest.mark.parametrize("k, n, wilson, clopper_pearson", [
    # Newcombe 1998a, Table II: method 3 (score, no continuity correction) and method 5 (exact)
    (81, 263, (0.2553, 0.3662), (0.2527, 0.3676)),
    (15, 148, (0.0624, 0.1605), (0.0578, 0.1617)),
    (0, 20, (0.0000, 0.1611), (0.0000, 0.1684)),
    (1, 29, (0.0061, 0.1718), (0.0009, 0.1776)),
])
def test_proportion_intervals_match_newcombe_1998a(k, n, wilson, clopper_pearson):
    assert stats.proportion_interval(k, n) == pytest.approx(wilson, abs=5e-5)
    assert stats.proportion_interval(k, n, method="clopper-pearson") == pytest.approx(clopper_pearson, abs=5e-5)


def test_wilson_closed_form_at_the_edges():
    # k = n: the lower end is n / (n + z²); k = 0 mirrors it
    assert stats.proportion_interval(24, 24) == pytest.approx((24 / (24 + Z ** 2), 1.0))
    assert stats.proportion_interval(0, 24) == pytest.approx((0.0, Z ** 2 / (24 + Z ** 2)))
    # fractional (effective) counts are allowed, and a higher level is wider
    lo90, hi90 = stats.proportion_interval(2.5, 5.5, level=0.90)
    lo95, hi95 = stats.proportion_interval(2.5, 5.5)
    assert lo95 < lo90 < hi90 < hi95


def test_jeffreys_is_the_beta_posterior():
    from scipy.stats import beta

    lo, hi = stats.proportion_interval(7, 24, method="jeffreys")
    assert (lo, hi) == pytest.approx((beta.ppf(0.025, 7.5, 17.5), beta.ppf(0.975, 7.5, 17.5)))


def test_proportion_intervals_give_statsmodels_values():
    from statsmodels.stats.proportion import proportion_confint

    for n in (1, 2, 7, 24, 263, 5000):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n, n / 2 + 0.25}):  # fractional: effective counts
            for method, theirs in stats.PROPORTION_METHODS.items():
                for level in (0.8, 0.95, 0.99):
                    low, high = proportion_confint(k, n, alpha=1 - level, method=theirs)
                    want = (max(0.0, float(low)), min(1.0, float(high)))
                    assert stats.proportion_interval(k, n, method=method, level=level) == pytest.approx(
                        want, abs=1e-12), (k, n, method, level)


def test_proportion_interval_refuses_nonsense():
    with pytest.raises(ValueError, match="unknown method"):
        stats.proportion_interval(1, 2, method="wald")
    with pytest.raises(ValueError, match="0 <= k <= n"):
        stats.proportion_interval(3, 2)
    with pytest.raises(ValueError, match="n > 0"):
        stats.proportion_interval(0, 0)


# --------------------------------------------------------------------------- Newcombe's paired interval

def test_newcombe_paired_matches_fagerland_2014():
    # Cavo et al. (2012): complete response before/after consolidation, [[59, 6], [16, 80]]:
    # estimate -0.0621, 95% CI -0.1186 to -0.0046 (Newcombe square-and-add, Fagerland et al. 2014)
    lo, hi = stats.newcombe_paired_interval([[59, 6], [16, 80]])
    assert (round(lo, 4), round(hi, 4)) == (-0.1186, -0.0046)


def test_newcombe_paired_all_wins_by_hand():
    # 24 rows, every one only right for the first: p1 = 1, p2 = 0, phi = 0 (zero margins);
    # L = 1 - sqrt((1 - l1)² + (u2 - 0)²) with 1 - l1 = u2 = z²/(24 + z²); U = 1
    gap = Z ** 2 / (24 + Z ** 2)
    lo, hi = stats.newcombe_paired_interval([[0, 24], [0, 0]])
    assert lo == pytest.approx(1 - math.sqrt(2) * gap) == pytest.approx(0.8049, abs=1e-4)
    assert hi == 1.0


def test_newcombe_paired_never_collapses_and_brackets_the_estimate():
    # every 2x2 table with n <= 9: positive width, contains the estimate, inside [-1, 1]
    for n in range(1, 10):
        for a, b, c in itertools.product(range(n + 1), repeat=3):
            d = n - a - b - c
            if d < 0:
                continue
            lo, hi = stats.newcombe_paired_interval([[a, b], [c, d]])
            theta = (b - c) / n
            assert -1 <= lo < hi <= 1 and lo - 1e-12 <= theta <= hi + 1e-12, (a, b, c, d)
    # swapping the two conditions mirrors the interval
    lo, hi = stats.newcombe_paired_interval([[3, 7], [1, 13]])
    assert stats.newcombe_paired_interval([[3, 1], [7, 13]]) == pytest.approx((-hi, -lo))
    # no discordant pair at all: an interval around 0, not a point (phi = (144 - 12)/144 narrows it)
    lo, hi = stats.newcombe_paired_interval([[12, 0], [0, 12]])
    assert lo == pytest.approx(-hi) and 0.05 < hi < 0.14


# --------------------------------------------------------------------------- exact tests

def test_mcnemar_hand_worked():
    # b=1, c=6: 7 discordant pairs; P(X <= 1) = (C(7,0) + C(7,1)) / 2^7 = 8/128; two-sided doubles it
    assert stats.mcnemar_exact(1, 6) == pytest.approx(2 * (1 + 7) / 128) == pytest.approx(0.125)
    assert stats.mcnemar_exact(6, 1) == stats.mcnemar_exact(1, 6)
    assert stats.mcnemar_exact(1, 7) == pytest.approx(2 * 9 / 256)  # 7 wins, 1 loss: 0.0703
    assert stats.mcnemar_exact(0, 24) == pytest.approx(2 * 0.5 ** 24)
    assert stats.mcnemar_exact(0, 0) == 1.0 and stats.mcnemar_exact(3, 3) == 1.0


def test_mcnemar_gives_statsmodels_values():
    from statsmodels.stats.contingency_tables import mcnemar

    for b, c in [*itertools.product(range(40), repeat=2), (120, 180), (4000, 4210), (0, 1500)]:
        want = 1.0 if b + c == 0 else min(1.0, float(mcnemar([[0, b], [c, 0]], exact=True).pvalue))
        assert stats.mcnemar_exact(b, c) == pytest.approx(want, rel=1e-12, abs=1e-300), (b, c)


def test_critical_minority_against_brute_force():
    for d in range(0, 60):
        ok = [k for k in range(d // 2 + 1) if stats.mcnemar_exact(k, d - k) < 0.05]
        assert stats.critical_minority(d) == (max(ok) if ok else None), d
    assert stats.critical_minority(5) is None and stats.critical_minority(6) == 0
    assert stats.critical_minority(10) == 1  # 9-1: p = 22/1024 = 0.021; 8-2: 0.109


def test_sign_flip_test_is_exact_mcnemar_with_one_row_per_case():
    for b in range(0, 12):
        for c in range(0, 12):
            diffs = [1] * c + [-1] * b + [0] * 5
            assert stats.sign_flip_test(diffs) == pytest.approx(stats.mcnemar_exact(b, c)), (b, c)


def test_sign_flip_test_over_cases_by_hand():
    # 24 wins in 3 cases of 8: only all-plus or all-minus reach |S| = 24: 2 of 8 patterns
    assert stats.sign_flip_test([1] * 24, [i // 8 for i in range(24)]) == pytest.approx(0.25)
    # case sums +2, +1, -1 (observed S = 2): |±2 ±1 ±1| over the 8 patterns is 4,2,2,0 twice,
    # so 6 of 8 are at least 2
    diffs = [1, 1, 0] + [1, 0] + [-1, 0]
    cases = ["a", "a", "a", "b", "b", "c", "c"]
    assert stats.sign_flip_test(diffs, cases) == pytest.approx(6 / 8)
    assert stats.sign_flip_test([0, 0, 1, -1], ["a", "a", "b", "b"]) == 1.0  # every case nets 0


def test_holm_hand_worked():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.2]) == [0.2] and stats.holm([]) == []
    assert stats.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_holm_gives_statsmodels_values_without_a_garbage_collection_per_call(monkeypatch):
    import gc

    import numpy as np
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(0)
    families = [rng.uniform(size=n).round(rng.integers(1, 4)).tolist() for n in (1, 2, 3, 7, 20, 50)]
    families += [[0.01, 0.01, 0.04, 0.04], [1.0, 0.0, 0.5], [0.3] * 5]  # ties, the ends
    with monkeypatch.context() as m:
        m.setattr(gc, "collect", lambda *args: 0)  # the reference's own full collection per call
        expected = [multipletests(ps, method="holm")[1].tolist() for ps in families]
    for ps, want in zip(families, expected):
        assert stats.holm(ps) == want, ps
    # compare_many calls it once per comparison table: a full collection each time is a pause that
    # grows with everything the notebook holds
    seen = []
    gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(info["generation"]))
    try:
        stats.holm([0.01, 0.04, 0.03])
    finally:
        gc.callbacks.pop()
    assert 2 not in seen


# --------------------------------------------------------------------------- bootstrap

def test_bootstrap_matches_an_enumerable_case():
    # two rows, deltas (1, 0): a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4
    assert stats.paired_bootstrap_ci([0, 0], [1, 0]) == (0.0, 1.0)


def test_bootstrap_is_reproducible_and_brackets_the_delta():
    base = [True] + [False] * 23
    ckpt = [True] * 20 + [False] * 4
    lo, hi = stats.paired_bootstrap_ci(base, ckpt, seed=0)
    assert (lo, hi) == stats.paired_bootstrap_ci(base, ckpt, seed=0)
    assert lo < 19 / 24 < hi
    assert 0.55 <= lo <= 0.7 and 0.9 <= hi <= 1.0  # normal approximation: about 0.79 ± 0.16
    assert math.isclose(lo * 24, round(lo * 24)) and math.isclose(hi * 24, round(hi * 24))


def test_bootstrap_all_ties_is_zero_width():
    assert stats.paired_bootstrap_ci([True, False, True], [True, False, True]) == (0.0, 0.0)


def test_cluster_bootstrap_resamples_whole_cases():
    # case A: two wins, case B: two ties. Resampling cases: AA -> 1, AB/BA -> 0.5, BB -> 0,
    # each of AA and BB with probability 1/4, so the 2.5/97.5 percentiles are 0 and 1
    assert stats.paired_bootstrap_ci([0, 0, 1, 1], [1, 1, 1, 1], clusters=["A", "A", "B", "B"]) == (0.0, 1.0)
    # 16 rows: case A 4 wins, cases B-D 4 ties each. Drawing 4 cases, k ~ Bin(4, 1/4) are A and the
    # delta is k/4: P(k = 0) = 0.32, P(k <= 2) = 0.949, P(k <= 3) = 0.996, so the interval is [0, 0.75]
    base, ckpt = [0] * 4 + [1] * 12, [1] * 16
    cases = [i // 4 for i in range(16)]
    assert stats.paired_bootstrap_ci(base, ckpt, clusters=cases) == (0.0, 0.75)
    # resampling the 16 rows as if independent: Bin(16, 1/4)/16, a narrower [0.0625, 0.5]
    assert stats.paired_bootstrap_ci(base, ckpt) == (0.0625, 0.5)


# --------------------------------------------------------------------------- clustering

def test_design_effect_by_hand():
    assert stats.design_effect([1, 0, 1, 0], None) == 1.0
    assert stats.design_effect([1, 0, 1, 0], ["a", "b", "c", "d"]) == pytest.approx(1.0)  # one row per case
    # 3 cases of 8, the first all 1, the others all 0: mean 1/3; per-case sums of deviations
    # 16/3, -8/3, -8/3 -> robust = 3/2 * (256 + 64 + 64)/9 / 24² = 1/9; iid = (8·4/9 + 16/9)/23/24
    # = 16/3/552; ratio 11.5
    cases = [i // 8 for i in range(24)]
    assert stats.design_effect([1] * 8 + [0] * 16, cases) == pytest.approx(11.5)
    # errors spread evenly across cases: no inflation (floored at 1)
    assert stats.design_effect([1, 0] * 12, cases) == 1.0
    assert stats.design_effect([1] * 24, cases) == 1.0  # nothing varies: nothing to estimate


def test_effective_size_korn_graubard():
    cases = [i // 8 for i in range(24)]
    assert stats.effective_size([1, 0] * 12, None) == 24
    assert stats.effective_size([1, 0] * 12, list(range(24))) == 24  # one row per case: n exactly
    # design effect 1, but 3 cases: 24 · (t_23 / t_2)² with t_23 = 2.0687, t_2 = 4.3027 (t tables)
    assert stats.effective_size([1] * 24, cases) == pytest.approx(24 * (2.0687 / 4.3027) ** 2, rel=1e-3)
    assert stats.effective_size([1] * 24, [0] * 24) == 1.0  # one case: one observation's worth


# --------------------------------------------------------------------------- power

def _power_by_enumeration(n, p_win, p_loss, alpha=0.05):
    p_tie = 1 - p_win - p_loss
    total = 0.0
    for w in range(n + 1):
        for l in range(n + 1 - w):
            prob = math.comb(n, w) * math.comb(n - w, l) * p_win ** w * p_loss ** l * p_tie ** (n - w - l)
            if stats.mcnemar_exact(l, w) < alpha:
                total += prob
    return total


def test_mcnemar_power_against_enumeration_and_by_hand():
    for n, pw, pl in [(6, 0.5, 0.0), (10, 0.4, 0.1), (12, 0.3, 0.05), (8, 0.2, 0.2), (15, 0.6, 0.3)]:
        assert stats.mcnemar_power(n, pw, pl) == pytest.approx(_power_by_enumeration(n, pw, pl), abs=1e-12)
    # n = 6 at p_win = 0.5, no losses: only 6 wins of 6 rejects (fewer discordant pairs cannot): 1/64
    assert stats.mcnemar_power(6, 0.5, 0.0) == pytest.approx(1 / 64)
    assert stats.mcnemar_power(5, 1.0, 0.0) == 0.0 and stats.mcnemar_power(6, 1.0, 0.0) == 1.0


def test_mcnemar_power_gives_the_scipy_stats_sum():
    import numpy as np
    from scipy.stats import binom

    def by_scipy_stats(n, p_win, p_loss, alpha):
        psi, d = p_win + p_loss, np.arange(n + 1)
        k = binom.ppf(alpha / 2, d, 0.5) - 1
        q = min(1.0, p_win / psi)
        reject = np.where(k >= 0, binom.cdf(k, d, q) + binom.sf(d - k - 1, d, q), 0.0)
        return float(min(1.0, (binom.pmf(d, n, min(1.0, psi)) * reject).sum()))

    for n in (1, 6, 24, 300, 1000):
        for p_win, p_loss in [(0.5, 0.0), (1.0, 0.0), (0.3, 0.1), (0.05, 0.02), (0.6, 0.4), (0.2, 0.2)]:
            for alpha in (0.05, 0.01):
                assert stats.mcnemar_power(n, p_win, p_loss, alpha=alpha) == pytest.approx(
                    by_scipy_stats(n, p_win, p_loss, alpha), abs=1e-12), (n, p_win, p_loss, alpha)


def test_rows_for_power():
    assert stats.rows_for_power(1.0, 0.0) == 6  # every row a win: 6 are the fewest that can reach p < 0.05
    assert stats.rows_for_power(0.1, 0.1) is None  # no effect to detect
    for pw, pl in [(7 / 24, 1 / 24), (0.25, 0.0), (0.3, 0.1)]:
        rows = stats.rows_for_power(pw, pl)
        assert stats.mcnemar_power(rows, pw, pl) >= 0.8
        assert all(stats.mcnemar_power(k, pw, pl) < 0.8 for k in range(1, rows))  # the fewest
    # large n: close to Connor's (1987) normal approximation, (z_a·√ψ + z_b·√(ψ − δ²))² / δ²
    connor = (Z * math.sqrt(0.07) + 0.8416212 * math.sqrt(0.07 - 0.03 ** 2)) ** 2 / 0.03 ** 2
    assert stats.rows_for_power(0.05, 0.02) == pytest.approx(connor, rel=0.1)
    assert stats.rows_for_power(0.001, 0.0005, max_rows=1000) is None


def test_importing_the_statistics_loads_no_library():
    code = ("import sys, machine_nb.evaluation.stats, machine_nb.evaluation.compare; "
            "print([m for m in ('numpy', 'pandas', 'scipy', 'statsmodels') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_comparison_loads_neither_scipy_stats_nor_statsmodels():
    # they take about half a second to import: a notebook's first comparison would pay it
    code = """
import sys
import machine_nb as mnb
from machine_nb.evaluation import stats
import pandas as pd
frame = lambda correct, case: pd.DataFrame({"prompt": [f"p{i}" for i in range(24)], "expected": "a",
                                            "output": "a", "correct": correct, "case": case})
rows = [True] * 7 + [False] * 17
for case in (None, [i // 8 for i in range(24)]):
    mnb.compare(frame([False] * 24, case), frame(rows, case), cluster="case" if case else False)
stats.proportion_interval(3, 10, method="clopper-pearson"), stats.proportion_interval(3, 10, method="jeffreys")
stats.critical_minority(30), stats.rows_for_power(0.3, 0.1)
print([m for m in ("scipy.stats", "statsmodels") if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
