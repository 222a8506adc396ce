"""Statistics for comparing two models on the same eval rows, valid at the small n evals use.

Pure functions over counts and 0/1 lists: accuracy intervals, the paired-difference interval,
exact tests, clustering by case, power and Holm's correction. What they mean for a checkpoint is
put into words by compare.py. The distributions come from scipy.special's functions (the
binomial CDF, the inverse incomplete beta function, Student's t quantile) and the standard library's
NormalDist; the methods built on them (Wilson, Clopper-Pearson and Jeffreys intervals, exact
McNemar, Newcombe's paired interval, the cluster sign-flip test, effective sample size, exact
McNemar power, Holm's step-down) are written out here and checked against statsmodels' and
scipy.stats' in the tests. Neither of those is imported: together they take about half a second
to import, more than all of compare() takes at the sizes evals have, and a notebook pays that on
its first comparison. numpy and scipy.special load inside the functions, so importing this module
costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

PROPORTION_METHODS = {"wilson": "wilson", "clopper-pearson": "beta", "jeffreys": "jeffreys"}
"""proportion_interval() methods and the statsmodels `proportion_confint` method each equals:
Wilson score (the default: close to nominal coverage at small n, never zero width),
Clopper-Pearson (exact tails, conservative), Jeffreys (the equal-tailed Beta(k+½, n−k+½)
posterior interval)."""


def proportion_interval(k: float, n: float, *, level: float = 0.95, method: str = "wilson") -> tuple[float, float]:
    """A confidence interval for a proportion k/n that holds at small n.

    Args:
        k: successes (may be fractional: an effective count, see effective_size()).
        n: trials (> 0; may be fractional likewise).
        level: the confidence level. Default 0.95.
        method: "wilson" (default), "clopper-pearson" or "jeffreys" (see PROPORTION_METHODS).

    Returns:
        (low, high), inside [0, 1].

    Raises:
        ValueError: an unknown method, a level not strictly between 0 and 1, or counts that are
            not finite with 0 <= k <= n and n > 0.
    """
    if method not in PROPORTION_METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {sorted(PROPORTION_METHODS)}")
    check_level(level)
    if not (math.isfinite(k) and math.isfinite(n)):
        raise ValueError(f"need finite counts, got k={k}, n={n}")
    if not n > 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    tail = (1 - level) / 2
    if method == "wilson":
        z2 = _normal_quantile(1 - tail) ** 2
        p = k / n
        centre = (p + z2 / (2 * n)) / (1 + z2 / n)
        half = math.sqrt(z2 * p * (1 - p) / n + z2 ** 2 / (4 * n ** 2)) / (1 + z2 / n)
        low, high = centre - half, centre + half
    else:
        from scipy.special import betainccinv, betaincinv  # Beta quantiles from the lower / upper tail

        if method == "jeffreys":
            low, high = betaincinv(k + 0.5, n - k + 0.5, tail), betainccinv(k + 0.5, n - k + 0.5, tail)
        else:  # Clopper-Pearson
            low = 0.0 if k == 0 else betaincinv(k, n - k + 1, tail)
            high = 1.0 if k == n else betainccinv(k + 1, n - k, tail)
    return (max(0.0, float(low)), min(1.0, float(high)))


def check_level(level: float, name: str = "level") -> None:
    """Refuse a confidence level (or a test's alpha) that is not strictly between 0 and 1.

    Args:
        level: the value. name: what it is called in the message (default "level").

    Raises:
        ValueError: a bool, a non-number, NaN, or a value outside (0, 1), naming it.
    """
    import numbers

    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        example = "0.95 for 95%" if name == "level" else "0.05"
        raise ValueError(f"{name} must be between 0 and 1 (exclusive), e.g. {example}; got {level!r}")


def _normal_quantile(q: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def _binomial_cdf(x: int, n: int, p: float) -> float:
    """P(X ≤ x), X ~ Bin(n, p): 0 below 0, 1 from n on."""
    if x < 0:
        return 0.0
    if x >= n:
        return 1.0
    from scipy.special import bdtr

    return float(bdtr(x, n, p))


def newcombe_paired_interval(table: Sequence[Sequence[float]], *, level: float = 0.95) -> tuple[float, float]:
    """Newcombe's paired score interval (method 10 of Newcombe 1998) for p1 − p2 on paired data.

    Each marginal proportion gets its Wilson interval; the two are combined with the table's
    phi correlation, corrected as Newcombe gives it (AD − BC is reduced by N/2 when it exceeds
    N/2, and taken as 0 between 0 and N/2). Unlike Wald or bootstrap intervals it does not
    collapse to a point when every pair agrees: 24 wins of 24 gives +0.805 to +1.

    Args:
        table: [[a, b], [c, d]]: a = pairs where both succeed, b = only the first succeeds,
            c = only the second succeeds, d = neither; so p1 = (a+b)/N, p2 = (a+c)/N. Cells
            may be fractional (effective counts).
        level: the confidence level. Default 0.95.

    Returns:
        (low, high) of p1 − p2, inside [−1, 1].

    Raises:
        ValueError: a negative or non-finite cell, a zero total, or a level outside (0, 1).
    """
    check_level(level)
    (a, b), (c, d) = table
    n = a + b + c + d
    if not math.isfinite(n) or not n > 0 or not min(a, b, c, d) >= 0:
        raise ValueError(f"need non-negative cells and a positive total, got {[[a, b], [c, d]]}")
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = proportion_interval(a + b, n, level=level)
    l2, u2 = proportion_interval(a + c, n, level=level)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > n / 2 else cross) / math.sqrt(margins)
    theta = p1 - p2
    down = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    up = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    return (max(-1.0, theta - math.sqrt(max(0.0, down))), min(1.0, theta + math.sqrt(max(0.0, up))))


# --------------------------------------------------------------------------- exact tests

def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value on the discordant pairs: min(1, 2·P(X ≤ min(b, c))), X ~ Bin(b+c, ½).

    Args:
        b: rows only the baseline got right (losses).
        c: rows only the checkpoint got right (wins).

    Returns:
        The p-value; 1.0 when there are no discordant pairs (no evidence either way).
    """
    b, c = int(b), int(c)
    if b + c == 0:
        return 1.0
    return min(1.0, 2 * _binomial_cdf(min(b, c), b + c, 0.5))


def min_discordant_for(alpha: float = 0.05) -> int:
    """The fewest discordant pairs that can reach exact McNemar p < alpha.

    Args:
        alpha: the test's level (default 0.05).

    Returns:
        The smallest m with 2·½^m < alpha, all m pairs in one direction (6 at 0.05).

    Raises:
        ValueError: unless 0 < alpha < 1 (no count of pairs reaches p < 0).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    m = 1
    while 2 * 0.5 ** m >= alpha:
        m += 1
    return m


def critical_minority(d: int, alpha: float = 0.05) -> int | None:
    """How lopsided d discordant pairs must be for exact McNemar p < alpha.

    Args:
        d: the discordant pairs (wins + losses).
        alpha: the test's level (default 0.05).

    Returns:
        The largest minority count k for which a k-to-(d−k) split gives p < alpha, or None when
        no split of d pairs can (d < min_discordant_for(alpha)).
    """
    import numpy as np

    if d <= 0:
        return None
    k = int(_rejecting_minority(np.array([int(d)]), alpha)[0])
    return k if k >= 0 else None


def case_sums(values: Sequence[float], clusters: Sequence[Any] | None) -> tuple[Any, Any]:
    """Per-case sums of values and per-case sizes, as numpy arrays in order of first appearance.

    Args:
        values: per-row values. clusters: one case label per row; None: each row its own case.

    Returns:
        (sums, sizes).
    """
    import numpy as np
    import pandas as pd

    x = np.asarray(values, dtype=float)
    if clusters is None:
        return x, np.ones(len(x))
    if len(clusters) != len(x):
        raise ValueError(f"{len(clusters)} case labels for {len(x)} rows")
    codes, _ = pd.factorize(pd.Series(list(clusters), dtype=object), use_na_sentinel=False)
    return np.bincount(codes, weights=x), np.bincount(codes).astype(float)


def sign_flip_test(differences: Sequence[int], clusters: Sequence[Any] | None = None) -> float:
    """Exact two-sided p-value that per-row differences centre on zero, flipping signs per case.

    Under "neither model is better", swapping the two models' results within a case is as likely
    as not, so each case's summed difference keeps or flips its sign with probability ½. The
    p-value is the share of the 2^G sign patterns whose total is at least as far from 0 as the
    one observed, computed exactly (not sampled). With one row per case and differences in
    {−1, 0, +1} it equals the exact McNemar p-value.

    Args:
        differences: integer per-row differences (checkpoint − baseline correctness: −1, 0, 1).
        clusters: one case label per row; default None: every row is its own case.

    Returns:
        The p-value (1.0 when every case's difference sums to 0).
    """
    import numpy as np

    sums, _ = case_sums(differences, clusters)
    sums = np.rint(sums).astype(int)
    observed = abs(int(sums.sum()))
    sizes = np.abs(sums[sums != 0])
    if len(sizes) == 0:
        return 1.0
    # Cases with the same |sum| v contribute v·(2X − k), X ~ Bin(k, ½): convolve one binomial per v.
    total = int(sizes.sum())
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0  # index = S + total
    for v, k in zip(*np.unique(sizes, return_counts=True)):
        v, k = int(v), int(k)
        step = np.zeros_like(dist)
        for x in range(k + 1):
            px = math.exp(math.lgamma(k + 1) - math.lgamma(x + 1) - math.lgamma(k - x + 1) - k * math.log(2))
            shift = v * (2 * x - k)
            if shift >= 0:
                step[shift:] += px * dist[:len(dist) - shift]
            else:
                step[:shift] += px * dist[-shift:]
        dist = step
    s = np.arange(-total, total + 1)
    return float(min(1.0, dist[np.abs(s) >= observed].sum()))


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979): the family-wise error rate stays at or
    below alpha when a comparison counts as significant only if its adjusted p < alpha.

    Args:
        p_values: one p-value per comparison.
        alpha: the family-wise level; it does not change the adjusted values. Default 0.05.

    Returns:
        The adjusted p-values, in the input's order: the values of statsmodels'
        `multipletests(method="holm")`, which this does not call because it runs a full garbage
        collection on every call (a pause that grows with everything the process holds).
    """
    import numpy as np

    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p)
    # the i-th smallest p-value times the comparisons left (m - i), kept non-decreasing, capped at 1
    adjusted = np.minimum(np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)), 1.0)
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return out.tolist()


# --------------------------------------------------------------------------- intervals by resampling

def paired_bootstrap_ci(baseline_correct: Any, checkpoint_correct: Any, *, resamples: int = 10_000,
                        seed: int = 0, level: float = 0.95, clusters: Sequence[Any] | None = None) -> tuple[float, float]:
    """Percentile CI of the accuracy delta (checkpoint − baseline), resampling rows in pairs.

    It is a second view, not the interval to act on at small n: when every pair agrees (all wins,
    or no row changed) every resample gives the same delta and the interval has zero width.

    Args:
        baseline_correct, checkpoint_correct: per-row 0/1 (or bool), the same rows in order.
        resamples: default 10,000 (the percentile ends move by < 1 row's worth at n = 24).
        seed: default 0, so the same two results always give the same interval.
        level: default 0.95.
        clusters: one case label per row; when given, whole cases are resampled (a cluster
            bootstrap), since rows of one case are not independent. Default None: rows.

    Returns:
        (low, high).

    Raises:
        ValueError: the two lists differ in length, a value is not 0 or 1, resamples < 1, or level
            is outside (0, 1).
    """
    import numbers

    import numpy as np

    check_level(level)
    if isinstance(resamples, bool) or not isinstance(resamples, numbers.Integral) or resamples < 1:
        raise ValueError(f"resamples must be a whole number of at least 1, got {resamples!r}")
    a = np.asarray(baseline_correct, dtype=float).reshape(-1)
    b = np.asarray(checkpoint_correct, dtype=float).reshape(-1)
    if len(a) != len(b):
        raise ValueError(f"the baseline has {len(a)} rows and the checkpoint {len(b)}: the bootstrap resamples "
                         "pairs of one row each, so both need the same rows in the same order")
    for name, x in (("baseline", a), ("checkpoint", b)):
        bad = np.flatnonzero((x != 0) & (x != 1))  # NaN is neither
        if len(bad):
            raise ValueError(f"{name}: row {int(bad[0])} is {float(x[bad[0]])!r}; every row's correctness must be 0 or 1 "
                             "(or a bool)")
    diff = b - a
    if clusters is None:
        units, sizes = diff, None
    else:
        units, sizes = case_sums(diff, clusters)
    n = len(units)
    if n == 0:
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    resamples = int(resamples)
    deltas = np.empty(resamples)
    chunk = max(1, 2_000_000 // n)  # bound memory for large evals
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        if sizes is None:
            deltas[start:stop] = units[idx].mean(axis=1)
        else:
            deltas[start:stop] = units[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(deltas, [tail, 100 - tail])
    return (float(low), float(high))


# --------------------------------------------------------------------------- clustering by case

def design_effect(values: Sequence[float], clusters: Sequence[Any] | None) -> float:
    """Kish's design effect of a mean over rows grouped in cases: the cluster-robust variance of
    the mean over the variance it would have if rows were independent, floored at 1.

    Args:
        values: per-row values (0/1 correctness, or a per-row difference).
        clusters: one case label per row; None (every row its own case) gives 1.

    Returns:
        The design effect, ≥ 1; 1 when the values do not vary (nothing to estimate it from).
    """
    import numpy as np

    x = np.asarray(values, dtype=float)
    n = len(x)
    if clusters is None or n < 2:
        return 1.0
    sums, sizes = case_sums(x - x.mean(), clusters)
    g = len(sums)
    iid = float(((x - x.mean()) ** 2).sum()) / (n - 1) / n
    if g < 2 or iid <= 0:
        return 1.0
    robust = g / (g - 1) * float((sums ** 2).sum()) / n ** 2
    return max(1.0, robust / iid)


def effective_size(values: Sequence[float], clusters: Sequence[Any] | None, *, level: float = 0.95) -> float:
    """The number of independent rows that carry the same information as these clustered rows.

    n / design effect (Kish), times (t_{n−1} / t_{G−1})² for G cases, the degrees-of-freedom
    adjustment of Korn & Graubard (1998): with few cases the variance itself is uncertain, so
    24 rows in 3 cases count as about 5.5 rows even when their results do not vary. With one row
    per case it is n exactly.

    Args:
        values: per-row values. clusters: one case label per row (None: n is returned).
        level: the confidence level the intervals use. Default 0.95.

    Returns:
        The effective size, in (0, n].

    Raises:
        ValueError: level is outside (0, 1).
    """
    from scipy.special import stdtrit  # Student's t quantile

    check_level(level)
    n = len(values)
    if clusters is None or n == 0:
        return float(n)
    g = len(case_sums(values, clusters)[1])
    if g == n:
        return float(n)
    if g < 2:
        return 1.0  # one case: one observation's worth, whatever its size
    q = 1 - (1 - level) / 2
    df_factor = (stdtrit(n - 1, q) / stdtrit(g - 1, q)) ** 2
    return float(min(n, n / design_effect(values, clusters) * df_factor))


# --------------------------------------------------------------------------- power

def mcnemar_power(n: int, p_win: float, p_loss: float, *, alpha: float = 0.05) -> float:
    """Exact power of the two-sided exact McNemar test (significant when p < alpha) on n rows.

    Args:
        n: rows (independent pairs).
        p_win, p_loss: the true shares of rows only the checkpoint / only the baseline gets right.
        alpha: the test's level. Default 0.05.

    Returns:
        P(p < alpha), summed exactly over the number of discordant pairs and their split.
    """
    import numpy as np
    from scipy.special import bdtr, bdtrc  # the binomial CDF and its upper tail

    psi = p_win + p_loss
    if n <= 0 or psi <= 0:
        return 0.0
    d = np.arange(n + 1)
    k = _rejecting_minority(d, alpha)
    q = min(1.0, p_win / psi)
    kk = np.maximum(k, 0)
    reject = np.where(k >= 0, bdtr(kk, d, q) + bdtrc(d - kk - 1, d, q), 0.0)
    discordant = np.diff(bdtr(d, n, min(1.0, psi)), prepend=0.0)  # P(d discordant pairs of n)
    return float(min(1.0, (discordant * reject).sum()))


def _rejecting_minority(d: Any, alpha: float) -> Any:
    """Per number of discordant pairs d (an array): the largest minority count k that exact McNemar
    rejects at alpha, i.e. the largest k with P(X ≤ k) < alpha/2, X ~ Bin(d, ½); −1 where none does.
    A bisection over all d at once: P(X ≤ −1) = 0 < alpha/2, and P(X ≤ d//2) ≥ ½ ≥ alpha/2."""
    import numpy as np
    from scipy.special import bdtr

    low, high = np.full(len(d), -1), d // 2
    while (open_ := high - low > 1).any():
        mid = (low + high) // 2
        below = bdtr(np.maximum(mid, 0), d, 0.5) < alpha / 2
        low = np.where(open_ & below, mid, low)
        high = np.where(open_ & ~below, mid, high)
    return low


def rows_for_power(p_win: float, p_loss: float, *, power: float = 0.8, alpha: float = 0.05,
                   max_rows: int = 100_000) -> int | None:
    """The fewest rows at which the exact McNemar test reaches the given power.

    Exact power is searched upwards from 0.8 times Connor's (1987) normal-approximation size (the
    exact test is the more conservative, so it needs at least about that many); above 1,000 rows
    the approximation itself is returned: it is within a few rows there, and scanning costs time.

    Args:
        p_win, p_loss: the true shares of rows only the checkpoint / only the baseline gets right.
        power: default 0.8. alpha: the test's two-sided level, default 0.05.
        max_rows: search no further. Default 100,000.

    Returns:
        The number of rows, or None when p_win == p_loss (nothing to detect) or more than max_rows.
    """
    from statistics import NormalDist

    psi, delta = p_win + p_loss, abs(p_win - p_loss)
    if delta <= 0:
        return None
    z = NormalDist()
    za, zb = z.inv_cdf(1 - alpha / 2), z.inv_cdf(power)
    approx = (za * math.sqrt(psi) + zb * math.sqrt(max(0.0, psi - delta ** 2))) ** 2 / delta ** 2
    if approx > 1_000:
        rows = math.ceil(approx)
        return rows if rows <= max_rows else None
    for rows in range(max(1, int(0.8 * approx)), max_rows + 1):
        if mcnemar_power(rows, p_win, p_loss, alpha=alpha) >= power:
            return rows
    return None
