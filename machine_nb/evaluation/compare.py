"""Baseline vs checkpoint (or several checkpoints) on the same eval rows, in numbers and words.

The statistics are stats.py's; this module pairs two results row by row, picks the methods that
hold at the n evals have (Wilson accuracy intervals, Newcombe's paired interval, exact tests,
clustering by case, Holm across checkpoints) and says in plain words what can be concluded.
Whether a checkpoint is good enough to use stays the reader's call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from . import stats
from .results import correct_values, format_rate
from ..core.theme import BORDER, FG, FG_MUTED, GREEN, RED, escape, no_math, text_colour

if TYPE_CHECKING:
    import os

    import pandas as pd

    from .results import EvalResult

    # one side of a comparison: an EvalResult, a DataFrame of per-row results, a results JSON
    # path, or a loaded results dict
    Results = Union[EvalResult, pd.DataFrame, str, os.PathLike, dict]

CASE_COLUMN = "case"  # results rows that share a value here are trials of one case

ACCURACY_INTERVAL = "Wilson score"
DELTA_INTERVAL = "Newcombe paired score (method 10)"

# JupyterLab's theme variables, with light-theme fallbacks for pages outside Lab.
_WIN, _LOSS = text_colour(GREEN), text_colour(RED)  # readable as text in light and dark themes
_MUTED, _BORDER, _TEXT = FG_MUTED, BORDER, FG
_FONT = "var(--jp-ui-font-family, system-ui, sans-serif)"


# --------------------------------------------------------------------------- inputs

def _as_results(value: Any, label: str) -> EvalResult:
    """An EvalResult from any form results travel in, checked to hold per-row scores."""
    from .results import as_eval_result

    res = as_eval_result(value, label)  # a results file keeps its case column where rows have one
    missing = [c for c in ("prompt", "expected", "output", "correct") if c not in res.rows.columns]
    if missing:
        raise ValueError(f"{label}: not an evaluate() result (missing columns {missing})")
    return res


def _label(res: EvalResult, fallback: str) -> str:
    return str(res.summary.get("name") or res.path or fallback)


def _level_label(level: float) -> str:
    """A confidence level as the percentage it is: "95%", "97.5%", "99.9%" (never rounded to a
    whole percent that is not the level)."""
    return f"{round(level * 100, 6):g}%"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _sample_keys(df: Any) -> list | None:
    """(sample id, epoch) per row for results read from Inspect logs; None for others."""
    if "sample_id" not in df.columns or any(_missing(x) for x in df["sample_id"]):
        return None
    epochs = df["epoch"] if "epoch" in df.columns else [1] * len(df)
    return [(str(s), int(e) if not _missing(e) else 1) for s, e in zip(df["sample_id"], epochs)]


def _align_samples(a: Any, b: Any, name_a: str, name_b: str) -> Any:
    """b's rows in a's order, paired by Inspect sample id and epoch (logs list samples in any
    order); b unchanged when either side has no sample ids."""
    ka, kb = _sample_keys(a), _sample_keys(b)
    if ka is None or kb is None:
        return b

    def shown(keys: list) -> str:
        listed = [k[0] if k[1] == 1 else f"{k[0]} (epoch {k[1]})" for k in keys[:10]]
        return ", ".join(listed) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")

    from collections import Counter

    for keys, name in ((ka, name_a), (kb, name_b)):
        dupes = sorted(k for k, count in Counter(keys).items() if count > 1)
        if dupes:
            raise ValueError(f"{name} has sample id(s) more than once: {shown(dupes)}")
    set_a, set_b = set(ka), set(kb)
    only_a, only_b = [k for k in ka if k not in set_b], [k for k in kb if k not in set_a]
    if only_a or only_b:
        parts = [f"only {name_a} has sample(s) {shown(only_a)}" if only_a else "",
                 f"only {name_b} has sample(s) {shown(only_b)}" if only_b else ""]
        raise ValueError("the two results are not over the same samples: " + "; ".join(p for p in parts if p)
                         + " (evaluate both on the same samples: same dataset, limit and epochs)")
    where = {k: i for i, k in enumerate(kb)}
    return b.iloc[[where[k] for k in ka]].reset_index(drop=True)


def _chat_text(messages: Any) -> Any:
    """A row's whole prompt as (role, text) pairs, the form both a results JSON's and an Inspect
    log's "messages" reduce to; None when the row carries none."""
    from ..core.chat import content_text

    if not isinstance(messages, (list, tuple)):
        return None
    return [(m.get("role"), content_text(m.get("content"))) for m in messages
            if isinstance(m, Mapping) and m.get("role") in ("system", "user", "assistant")]


def _check_same_rows(a: Any, b: Any, name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise ValueError(f"the two results are not over the same rows: {name_a} has {len(a)} rows, {name_b} has {len(b)}")
    keys = [k for k in ("prompt", "expected", "match") if k in a.columns and k in b.columns]
    columns = {key: (a[key].tolist(), b[key].tolist()) for key in keys}
    for i in range(len(a)):
        for key in keys:
            va, vb = columns[key][0][i], columns[key][1][i]
            if key == "match" and (_missing(va) or _missing(vb)):
                continue  # an Inspect log's scorer may name no match mode
            if str(va) != str(vb):
                raise ValueError(f"the two results are not over the same rows: row {i} differs in {key!r}: "
                                 f"{name_a} has {str(va)[:80]!r}, {name_b} has {str(vb)[:80]!r}")


class NotMeasuredAlike(UserWarning):
    """The two results compared were sampled from other base models, with another renderer, reply
    budget or temperature, or over another eval file: the delta measures that as well."""


_SETTINGS = (("base model", ("model",)), ("renderer", ("renderer",)),
             ("max_tokens", ("parameters", "max_tokens")), ("temperature", ("parameters", "temperature")),
             ("eval file sha256", ("data", "sha256")))


def _other_prompts(a: Any, b: Any) -> int:
    """How many paired rows differ in their whole prompt (a system message, earlier turns) behind
    the same last user message, where both carry their rows' messages (results files and Inspect
    logs do; a frame built by hand may not)."""
    if "messages" not in a.columns or "messages" not in b.columns:
        return 0
    pairs = ((_chat_text(x), _chat_text(y)) for x, y in zip(a["messages"], b["messages"]))
    return sum(x is not None and y is not None and x != y for x, y in pairs)


def _warn_if_measured_differently(sa: Mapping, sb: Mapping, name_a: str, name_b: str, other_prompts: int = 0,
                                  rows: int = 0) -> None:
    """One NotMeasuredAlike warning listing every setting the two summaries both record and differ
    in (results without a summary, such as frames built by hand, record none), and the rows whose
    whole prompt differs (`other_prompts` of `rows`): comparing two sets of instructions is a
    comparison users make on purpose, so it is said, not refused."""
    import warnings

    from ..errors import user_stacklevel
    from .inspect_logs import PROVIDER

    def setting(summary: Mapping, path: tuple) -> Any:
        value: Any = summary
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, str) and path == ("model",):
            value = value.removeprefix(f"{PROVIDER}/")  # an Inspect log names the model with its provider
        return value

    differ = []
    for label, path in _SETTINGS:
        va, vb = setting(sa, path), setting(sb, path)
        if not _missing(va) and not _missing(vb) and va != vb:
            shown = (str(va)[:12] + "…", str(vb)[:12] + "…") if label.endswith("sha256") else (va, vb)
            differ.append(f"{label} {shown[0]} vs {shown[1]}")
    if other_prompts:
        differ.append(f"the whole prompt (a system message or earlier turns) in {other_prompts} of {rows} rows")
    if differ:
        warnings.warn(NotMeasuredAlike(
            f"{name_a} and {name_b} were not measured alike ({'; '.join(differ)}): the delta measures these "
            "differences as well as the model. Evaluate both with the same settings on the same eval file "
            "to compare the models alone."), stacklevel=user_stacklevel())


def _check_levels(alpha: float, level: float) -> None:
    stats.check_level(level)
    stats.check_level(alpha, "alpha")


def _clusters(cluster: Any, a: Any, b: Any, name_a: str, name_b: str) -> list | None:
    """One case label per row, or None when every row is its own case."""
    if cluster is False:
        return None
    if cluster is True or not (cluster is None or isinstance(cluster, str) or hasattr(cluster, "__iter__")):
        raise ValueError(f"cluster={cluster!r}: pass a column name (cluster='case'), one case label per row, "
                         "False (every row its own case) or None (the results' case column, if any)")
    if cluster is None or isinstance(cluster, str):
        column = CASE_COLUMN if cluster is None else cluster
        present = [(name, df) for name, df in ((name_a, a), (name_b, b)) if column in df.columns]
        if not present:
            if cluster is None:
                return None
            raise ValueError(f"cluster={column!r}: neither result has a {column!r} column")
        labels = list(present[0][1][column])
        if len(present) == 2:
            for i, (x, y) in enumerate(zip(labels, present[1][1][column])):
                if not (_missing(x) and _missing(y)) and str(x) != str(y):
                    raise ValueError(f"the two results disagree on the case of row {i}: {name_a} has {x!r}, "
                                     f"{name_b} has {y!r}")
        source = f"column {column!r}"
    else:
        labels = list(cluster)
        if len(labels) != len(a):
            raise ValueError(f"cluster: {len(labels)} case labels for {len(a)} rows")
        source = "cluster="
    for i, x in enumerate(labels):
        if _missing(x):
            raise ValueError(f"row {i} has no case ({source}); give every row a case, or cluster=False")
    if len(set(map(str, labels))) == len(labels):
        return None  # one row per case: nothing to cluster
    return [str(x) for x in labels]


# --------------------------------------------------------------------------- the numbers

@dataclass
class CompareResult:
    """Baseline vs checkpoint on the same rows, with paired statistics (what compare() returns).

    Args:
        n: rows compared.
        baseline_accuracy, checkpoint_accuracy: the share of rows each got right.
        delta: checkpoint_accuracy − baseline_accuracy.
        wins, ties, losses: rows only the checkpoint got right, rows both or neither got right,
            rows only the baseline got right.
        p_value: exact McNemar on wins vs losses (with several rows per case: the exact
            sign-flip test over cases, see p_method).
        ci_low, ci_high: the paired bootstrap interval of delta, a second view that has zero
            width when every pair agrees (delta_ci_low/delta_ci_high is the interval to read).
        flips: the rows that changed, a DataFrame (row, prompt, expected, baseline_output,
            checkpoint_output, baseline_correct, checkpoint_correct, change "win" | "loss").
        summary: what can be concluded, in sentences (one a line).
        baseline_name, checkpoint_name: the two results' names (defaults "baseline",
            "checkpoint").
        baseline_format_rate, checkpoint_format_rate: the share of replies in the row's format
            (None when no row has one).
        min_discordant: the fewest one-sided discordant pairs that can reach p < alpha (default 6,
            for alpha 0.05).
        level, alpha: the intervals' confidence level and the test's level (defaults 0.95, 0.05).
        baseline_ci_low, baseline_ci_high, checkpoint_ci_low, checkpoint_ci_high: Wilson score
            intervals of each accuracy (accuracy_interval names the method).
        delta_ci_low, delta_ci_high: Newcombe's paired score interval of delta (delta_interval
            names it).
        p_method: how p_value was computed (default "exact McNemar").
        cases: distinct cases (= n when each row is its own).
        design_effect, effective_n: how much clustering by case shrinks the evidence
            (defaults 1.0 and 0.0).
        rows_for_power: the rows an exact McNemar test needs to detect the observed effect with
            `power` (with several rows per case: the cases that test needs, counting each case
            as a win, a loss or neither, times this eval's rows per case); None: no effect
            observed, or over 100,000.
        power: the power rows_for_power is sized for (default 0.8).
        p_adjusted, adjustment: the Holm-adjusted p-value and how it was adjusted, set by
            compare_many (default None).
    """

    n: int
    baseline_accuracy: float
    checkpoint_accuracy: float
    delta: float
    wins: int
    ties: int
    losses: int
    p_value: float
    ci_low: float
    ci_high: float
    flips: pd.DataFrame
    summary: str
    baseline_name: str = "baseline"
    checkpoint_name: str = "checkpoint"
    baseline_format_rate: float | None = None
    checkpoint_format_rate: float | None = None
    min_discordant: int = field(default=6)
    level: float = 0.95
    alpha: float = 0.05
    baseline_ci_low: float = 0.0
    baseline_ci_high: float = 1.0
    checkpoint_ci_low: float = 0.0
    checkpoint_ci_high: float = 1.0
    accuracy_interval: str = ACCURACY_INTERVAL
    delta_ci_low: float = -1.0
    delta_ci_high: float = 1.0
    delta_interval: str = DELTA_INTERVAL
    p_method: str = "exact McNemar"
    cases: int = 0
    design_effect: float = 1.0
    effective_n: float = 0.0
    rows_for_power: int | None = None
    power: float = 0.8
    p_adjusted: float | None = None
    adjustment: str | None = None

    @property
    def bootstrap_has_spread(self) -> bool:
        """False when every bootstrap resample gave the same delta (ci_low == ci_high)."""
        return not math.isclose(self.ci_low, self.ci_high, abs_tol=1e-12)

    @property
    def delta_text(self) -> str:
        """The delta with the interval to read, e.g. "+100.0% (95% CI +80.5% to +100.0%, Newcombe)"."""
        return (f"{self.delta:+.1%} ({_level_label(self.level)} CI {self.delta_ci_low:+.1%} to {self.delta_ci_high:+.1%}, "
                "Newcombe)")

    @property
    def bootstrap_text(self) -> str:
        """The bootstrap view in words; never a zero-width interval printed as if it were one."""
        if self.bootstrap_has_spread:
            return f"[{self.ci_low:+.1%}, {self.ci_high:+.1%}]"
        return f"no spread (every resample gives {self.ci_low:+.1%})"

    def to_dict(self) -> dict:
        """The numbers as plain data, e.g. for a report's JSON.

        Returns:
            Every field by name, flips as a list of row dicts.
        """
        return {k: (v.to_dict("records") if k == "flips" else v) for k, v in self.__dict__.items()}

    def __repr__(self) -> str:
        return (f"CompareResult(n={self.n}, baseline={self.baseline_accuracy:.3f}, checkpoint={self.checkpoint_accuracy:.3f}, "
                f"delta={self.delta:+.3f}, W/T/L={self.wins}/{self.ties}/{self.losses}, p={self.p_value:.3g}, "
                f"delta_ci=[{self.delta_ci_low:+.3f}, {self.delta_ci_high:+.3f}], "
                f"bootstrap={'[%+.3f, %+.3f]' % (self.ci_low, self.ci_high) if self.bootstrap_has_spread else 'no spread'})")

    def _repr_html_(self) -> str:
        e = escape
        fmt = lambda r: "—" if r is None else f"{r:.1%}"  # noqa: E731
        cell = f"padding:2px 10px 2px 0;border-bottom:1px solid {_BORDER};text-align:left;vertical-align:top"
        muted = f"color:{_MUTED}"
        lv = _level_label(self.level)

        def row(*cells: str) -> str:
            return "<tr>" + "".join(f"<td style='{cell}'>{c}</td>" for c in cells) + "</tr>"

        p_text = f"{self.p_method} p = {self.p_value:.3g}"
        if self.p_adjusted is not None:
            p_text += f"; {e(str(self.adjustment))}: p = {self.p_adjusted:.3g}"
        head = (
            f"<table style='border-collapse:collapse;color:{_TEXT}'><thead><tr>"
            + "".join(f"<th style='{cell}'>{h}</th>" for h in ("", "accuracy", f"{lv} CI ({self.accuracy_interval})", "format"))
            + "</tr></thead><tbody>"
            + row(e(self.baseline_name), f"{self.baseline_accuracy:.1%}",
                  f"{self.baseline_ci_low:.1%} to {self.baseline_ci_high:.1%}", fmt(self.baseline_format_rate))
            + row(e(self.checkpoint_name), f"{self.checkpoint_accuracy:.1%}",
                  f"{self.checkpoint_ci_low:.1%} to {self.checkpoint_ci_high:.1%}", fmt(self.checkpoint_format_rate))
            + row("delta", f"{self.delta:+.1%}",
                  f"{self.delta_ci_low:+.1%} to {self.delta_ci_high:+.1%} ({e(self.delta_interval)})",
                  f"<span style='{muted}'>bootstrap: {e(self.bootstrap_text)}</span>")
            + row("wins / ties / losses",
                  f"<span style='color:{_WIN}'>{self.wins}</span> / {self.ties} / <span style='color:{_LOSS}'>{self.losses}</span>",
                  e(p_text), "")
            + "</tbody></table>"
        )
        paras = "".join(f"<p style='margin:4px 0'>{e(p)}</p>" for p in self.summary.split("\n") if p.strip())
        if len(self.flips):
            rows = "".join(
                f"<tr><td style='{cell}'>{r.row}</td><td style='{cell}'>{e(str(r.prompt))}</td>"
                f"<td style='{cell}'>{e(str(r.expected))}</td><td style='{cell}'>{e(str(r.baseline_output))}</td>"
                f"<td style='{cell}'>{e(str(r.checkpoint_output))}</td>"
                f"<td style='{cell};color:{_WIN if r.change == 'win' else _LOSS}'>{r.change}</td></tr>"
                for r in self.flips.itertuples())
            flips = ("<details open><summary>rows that changed</summary>"
                     f"<table style='border-collapse:collapse;color:{_TEXT}'><thead><tr>"
                     + "".join(f"<th style='{cell}'>{h}</th>" for h in
                               ("row", "prompt", "expected", e(self.baseline_name), e(self.checkpoint_name), "change"))
                     + f"</tr></thead><tbody>{rows}</tbody></table></details>")
        else:
            flips = "<p>No row changed.</p>"
        return no_math(f"<div class='machine-nb-compare' style='font-family:{_FONT};font-size:13px;color:{_TEXT}'>"
                       f"{head}{paras}{flips}</div>")


def _paired_numbers(ca: list[bool], cb: list[bool], clusters: list | None, *, alpha: float, level: float,
                    resamples: int, seed: int, power_alpha: float) -> dict:
    """Every number compare() reports, from the two per-row correctness lists."""
    n = len(ca)
    wins = sum(1 for x, y in zip(ca, cb) if y and not x)
    losses = sum(1 for x, y in zip(ca, cb) if x and not y)
    both = sum(1 for x, y in zip(ca, cb) if x and y)
    diff = [int(y) - int(x) for x, y in zip(ca, cb)]
    if clusters is None:
        p, p_method, cases = stats.mcnemar_exact(losses, wins), "exact McNemar", n
    else:
        p, cases = stats.sign_flip_test(diff, clusters), len(set(clusters))
        p_method = f"exact sign-flip test over {cases} cases"
    eff_a = stats.effective_size(ca, clusters, level=level)
    eff_b = stats.effective_size(cb, clusters, level=level)
    eff_d = stats.effective_size(diff, clusters, level=level)
    acc_a, acc_b = sum(ca) / n, sum(cb) / n
    scale = eff_d / n
    table = [[both * scale, wins * scale], [losses * scale, (n - both - wins - losses) * scale]]
    deff = stats.design_effect(diff, clusters)
    case_wins = case_losses = None
    if clusters is None:
        rows = stats.rows_for_power(wins / n, losses / n, alpha=power_alpha)
    else:  # the test counts cases: size the eval in cases that net a win or a loss, then in rows
        sums, _ = stats.case_sums(diff, clusters)
        case_wins, case_losses = float((sums > 0).mean()), float((sums < 0).mean())
        units = stats.rows_for_power(case_wins, case_losses, alpha=power_alpha)
        rows = None if units is None else math.ceil(units * n / cases)
    return {
        "n": n, "wins": wins, "losses": losses, "ties": n - wins - losses, "p_value": p, "p_method": p_method,
        "baseline_accuracy": acc_a, "checkpoint_accuracy": acc_b, "delta": acc_b - acc_a,
        "baseline_ci": stats.proportion_interval(acc_a * eff_a, eff_a, level=level),
        "checkpoint_ci": stats.proportion_interval(acc_b * eff_b, eff_b, level=level),
        "delta_ci": stats.newcombe_paired_interval(table, level=level),
        "ci": stats.paired_bootstrap_ci(ca, cb, resamples=resamples, seed=seed, level=level, clusters=clusters),
        "cases": cases, "design_effect": deff, "effective_n": eff_d, "rows_for_power": rows,
        "case_wins": case_wins, "case_losses": case_losses,
    }


def _summary_text(num: dict, base: str, ckpt: str, *, alpha: float, level: float, power_alpha: float,
                  p_adjusted: float | None = None, adjustment: str | None = None) -> str:
    n, wins, ties, losses, p = num["n"], num["wins"], num["ties"], num["losses"], num["p_value"]
    acc_a, acc_b, d = num["baseline_accuracy"], num["checkpoint_accuracy"], wins + losses
    clustered = num["cases"] < n
    lv = _level_label(level)
    (la, ha), (lb, hb), (ld, hd), (bl, bh) = num["baseline_ci"], num["checkpoint_ci"], num["delta_ci"], num["ci"]
    lines = [
        f"{base}: {acc_a:.1%} correct; {ckpt}: {acc_b:.1%} correct, a delta of {acc_b - acc_a:+.1%} "
        f"on the same {n} rows.",
        f"{lv} intervals: {base} {la:.1%} to {ha:.1%}, {ckpt} {lb:.1%} to {hb:.1%} (Wilson score); "
        f"the delta {ld:+.1%} to {hd:+.1%} (Newcombe's paired score interval).",
    ]
    if math.isclose(bl, bh, abs_tol=1e-12):
        boot = (f"the paired bootstrap shows no spread (every resample gives {bl:+.1%}, because "
                + ("no row changed" if d == 0 else "every changed row went the same way")
                + "): that is a limit of resampling, not certainty; read the Newcombe interval")
    else:
        boot = f"paired bootstrap {lv} interval for the delta [{bl:+.1%}, {bh:+.1%}]"
    if clustered:
        lines.append(f"{wins} win(s), {ties} tie(s), {losses} loss(es); {num['p_method']} p = {p:.3g}; {boot}.")
        lines.append(f"The {n} rows come from {num['cases']} cases, and rows of one case are not independent: "
                     f"the intervals count them as {num['effective_n']:.1f} independent rows (design effect "
                     f"{num['design_effect']:.2f}, with Korn & Graubard's adjustment for few cases), the "
                     "bootstrap resamples whole cases, and the test flips whole cases.")
    else:
        lines.append(f"{wins} win(s), {ties} tie(s), {losses} loss(es); exact McNemar p = {p:.3g} on the {d} "
                     f"discordant pair(s); {boot}.")

    need = stats.min_discordant_for(alpha)
    decisive = p if p_adjusted is None else p_adjusted
    p_words = f"p < {alpha:g}" if p_adjusted is None else f"{adjustment}: adjusted p = {p_adjusted:.3g} < {alpha:g}"
    units, unit_word = (num["cases"], "cases") if clustered else (n, "rows")
    if units < need:
        lines.append(f"With {units} {unit_word} no result can reach p < {alpha:g}: that takes at least {need} "
                     + ("cases that changed, all in one direction." if clustered else
                        "discordant pairs, all in one direction.")
                     + (" Use more cases" if clustered else " Use more eval rows") + " before drawing any conclusion.")
    elif decisive < alpha:
        better = "better" if wins > losses else "worse"
        lines.append(f"The checkpoint is {better} than the base model on these rows, and a difference this lopsided "
                     f"is unlikely to be noise ({p_words}). It says nothing about rows unlike these; "
                     "see the probe for where a learned style bleeds.")
    elif p_adjusted is not None and p < alpha:
        lines.append(f"On its own p = {p:.3g} would pass {alpha:g}, but not once corrected for the other "
                     f"comparisons ({adjustment}: adjusted p = {p_adjusted:.3g}): it cannot be told from noise.")
    elif clustered:
        lines.append(f"At this n the difference cannot be told from noise (p ≥ {alpha:g}).")
    else:
        text = (f"At this n the difference cannot be told from noise (p ≥ {alpha:g}): with {n} rows at least "
                f"{need} discordant pairs, all in one direction, are needed for p < {alpha:g}, and here there "
                f"are {d} ({wins} one way, {losses} the other).")
        split = stats.critical_minority(d, alpha)
        if split is not None:
            text += f" With {d} discordant pairs, p < {alpha:g} needs a split of at least {d - split} to {split}."
        lines.append(text)
    excludes_zero = ld > 0 or hd < 0
    if units >= need and excludes_zero != (decisive < alpha):
        lines.append(f"The Newcombe interval {'excludes' if excludes_zero else 'includes'} 0 while the test "
                     f"{'does not reach' if excludes_zero else 'reaches'} significance: the two methods differ at "
                     "the edge (the exact test is the more cautious), so treat this result as borderline.")

    rows = num["rows_for_power"]
    level_words = f"two-sided α = {power_alpha:.3g}" + ("" if power_alpha == alpha else f" ({alpha:g} over the comparisons)")
    if wins == losses or (clustered and num["case_wins"] == num["case_losses"]):
        lines.append("No difference was observed, so there is no observed effect to size a larger eval by.")
    else:
        if clustered:
            per_case = n / num["cases"]
            size = ("more than 100,000 cases" if rows is None else
                    f"about {rows:,} rows ({math.ceil(rows / per_case - 1e-9):,} cases of {per_case:.3g} rows)")
            lines.append(f"To detect a difference this size with 80% power ({level_words}) takes {size}, counting "
                         "each case as one unit that nets a win, a loss or neither (an exact McNemar test over "
                         f"cases), assuming the true shares of such cases are the observed {num['case_wins']:.1%} "
                         f"and {num['case_losses']:.1%}; a smaller true difference needs more.")
        else:
            size = "more than 100,000 rows" if rows is None else f"about {rows:,} rows"
            lines.append(f"To detect a difference this size with 80% power (exact McNemar, {level_words}) takes "
                         f"{size}, assuming the true shares of rows only {ckpt} gets right and only {base} gets "
                         f"right are the observed {wins / n:.1%} and {losses / n:.1%}, with independent rows; "
                         "a smaller true difference needs more.")
    return "\n".join(lines)


def paired_rows(baseline: Results, checkpoint: Results) -> tuple:
    """The two results' rows paired as compare() pairs them: by position, or by Inspect sample id
    and epoch where both carry them.

    Args:
        baseline, checkpoint: the two results, in any form compare() takes.

    Returns:
        (baseline rows, checkpoint rows): two DataFrames of the same length, row i of one paired
        with row i of the other (the checkpoint's in the baseline's order).

    Raises:
        ValueError: they are not per-row results, or not over the same rows or samples (naming
            the first row that differs, or the sample ids only one has).
    """
    _, _, a, b, _, _ = _named_pair(baseline, checkpoint, None)
    return a, b


def _named_pair(baseline: Any, checkpoint: Any, name_b: str | None) -> tuple:
    """(both EvalResults, both rows paired and checked, both names) for paired_rows and _pair."""
    ra, rb = _as_results(baseline, "baseline"), _as_results(checkpoint, "checkpoint")
    name_a, name_b = _label(ra, "baseline"), name_b or _label(rb, "checkpoint")
    if name_a == name_b:
        name_a, name_b = f"{name_a} (A)", f"{name_b} (B)"
    a = ra.rows.reset_index(drop=True)
    b = _align_samples(a, rb.rows.reset_index(drop=True), name_a, name_b)
    _check_same_rows(a, b, name_a, name_b)
    return ra, rb, a, b, name_a, name_b


def _pair(baseline: Any, checkpoint: Any, name_b: str | None, cluster: Any) -> tuple:
    ra, rb, a, b, name_a, name_b = _named_pair(baseline, checkpoint, name_b)
    _warn_if_measured_differently(ra.summary, rb.summary, name_a, name_b, _other_prompts(a, b), len(a))
    if len(a) == 0:
        raise ValueError("no rows to compare")
    return a, b, name_a, name_b, _clusters(cluster, a, b, name_a, name_b)


def row_numbers(rows: Any) -> list[int]:
    """Each row's number: its "row" value, or its 0-based position where it has none.

    Args:
        rows: per-row results (a DataFrame).

    Returns:
        One int per row. A results file whose rows carry no "row", or only some of them do
        (the others read back as NaN), keeps its numbers where given.
    """
    given = rows["row"].tolist() if "row" in rows.columns else [None] * len(rows)
    out = []
    for i, value in enumerate(given):
        try:
            out.append(i if _missing(value) else int(value))
        except (TypeError, ValueError):
            out.append(i)
    return out


def _flips(a: Any, b: Any, ca: list[bool], cb: list[bool]) -> Any:
    import pandas as pd

    numbers = row_numbers(a)
    return pd.DataFrame.from_records(
        [{"row": numbers[i],
          "prompt": a["prompt"].iloc[i], "expected": a["expected"].iloc[i],
          "baseline_output": a["output"].iloc[i], "checkpoint_output": b["output"].iloc[i],
          "baseline_correct": ca[i], "checkpoint_correct": cb[i], "change": "win" if cb[i] else "loss"}
         for i in range(len(ca)) if ca[i] != cb[i]],
        columns=["row", "prompt", "expected", "baseline_output", "checkpoint_output", "baseline_correct",
                 "checkpoint_correct", "change"])


def _result(a: Any, b: Any, name_a: str, name_b: str, clusters: list | None, *, alpha: float, level: float,
            resamples: int, seed: int, power_alpha: float, p_adjusted: float | None = None,
            adjustment: str | None = None, num: dict | None = None) -> CompareResult:
    ca, cb = correct_values(a, name_a), correct_values(b, name_b)
    if num is None:
        num = _paired_numbers(ca, cb, clusters, alpha=alpha, level=level, resamples=resamples, seed=seed,
                              power_alpha=power_alpha)
    return CompareResult(
        n=num["n"], baseline_accuracy=num["baseline_accuracy"], checkpoint_accuracy=num["checkpoint_accuracy"],
        delta=num["delta"], wins=num["wins"], ties=num["ties"], losses=num["losses"], p_value=num["p_value"],
        ci_low=num["ci"][0], ci_high=num["ci"][1], flips=_flips(a, b, ca, cb),
        summary=_summary_text(num, name_a, name_b, alpha=alpha, level=level, power_alpha=power_alpha,
                              p_adjusted=p_adjusted, adjustment=adjustment),
        baseline_name=name_a, checkpoint_name=name_b, baseline_format_rate=format_rate(a, name_a),
        checkpoint_format_rate=format_rate(b, name_b), min_discordant=stats.min_discordant_for(alpha),
        level=level, alpha=alpha, baseline_ci_low=num["baseline_ci"][0], baseline_ci_high=num["baseline_ci"][1],
        checkpoint_ci_low=num["checkpoint_ci"][0], checkpoint_ci_high=num["checkpoint_ci"][1],
        delta_ci_low=num["delta_ci"][0], delta_ci_high=num["delta_ci"][1], p_method=num["p_method"],
        cases=num["cases"], design_effect=num["design_effect"], effective_n=num["effective_n"],
        rows_for_power=num["rows_for_power"], p_adjusted=p_adjusted, adjustment=adjustment)


def compare(baseline: Results, checkpoint: Results, *, alpha: float = 0.05, level: float = 0.95,
            resamples: int = 10_000, seed: int = 0, cluster: Any = None) -> CompareResult:
    """Compare two eval results over the same rows, with statistics that hold at small n.

    Reports each accuracy with its Wilson score interval, the delta with Newcombe's paired score
    interval (it does not collapse to a point when every pair agrees) and the paired bootstrap as
    a second view, wins/ties/losses with the exact McNemar p-value, and, in the summary, how many
    rows an exact McNemar test needs to detect the observed effect with 80% power.

    Args:
        baseline: the baseline's results: an EvalResult (from evaluate, evaluate_cases or
            load_results), a results JSON path, a DataFrame of per-row results, or a loaded
            results dict.
        checkpoint: the checkpoint's results, in any of the same forms. The rows must be the
            same as the baseline's (same count, and the same prompt, expected and match in
            order). Results read from Inspect logs (load_results, inspect_eval) are paired by
            sample id and epoch instead of by position; different sample sets are an error
            naming the ids. Results whose summaries record another base model, renderer,
            max_tokens, temperature or eval file, or whose rows carry other whole prompts (a
            system message) behind the same last message, are compared with a NotMeasuredAlike
            warning.
        alpha: the level of the summary's "what can be concluded" sentence and the power
            calculation, between 0 and 1. Default 0.05.
        level: the confidence level of every interval, between 0 and 1. Default 0.95.
        resamples, seed: the bootstrap's (default 10,000 and 0: reproducible).
        cluster: which rows are trials of one case. Default None: the results' "case" column
            when they have one, else every row is its own case. A column name, a sequence of one
            label per row, or False (ignore any case column). With several rows per case the
            intervals use the effective sample size, the bootstrap resamples cases, and p comes
            from an exact sign-flip test over cases.

    Returns:
        A CompareResult.

    Raises:
        ValueError: the two results are not over the same rows (naming the first row that
            differs), they are not per-row results, a row's correct is not True or False (or its
            format_ok not True, False or None), or alpha, level or cluster is out of range.
        TypeError: a value that is none of the accepted forms.
    """
    _check_levels(alpha, level)
    a, b, name_a, name_b, clusters = _pair(baseline, checkpoint, None, cluster)
    return _result(a, b, name_a, name_b, clusters, alpha=alpha, level=level, resamples=resamples, seed=seed,
                   power_alpha=alpha)


# --------------------------------------------------------------------------- several checkpoints

@dataclass
class CompareManyResult:
    """Several checkpoints, each against one baseline on the same rows, with Holm's correction
    (what compare_many() returns).

    Args:
        baseline_name: the baseline's name.
        baseline_accuracy, baseline_ci_low, baseline_ci_high: its accuracy and Wilson interval.
        results: {checkpoint name: CompareResult} (each one's p_adjusted and summary use the
            correction).
        table: a DataFrame, one row per checkpoint: checkpoint, n, accuracy, accuracy_low,
            accuracy_high, delta, delta_low, delta_high (Newcombe), wins, ties, losses,
            p_value, p_holm, significant (p_holm < alpha).
        summary: the same in words, stating the correction.
        alpha, level: the test's level and the intervals' confidence level (defaults 0.05, 0.95).
    """

    baseline_name: str
    baseline_accuracy: float
    baseline_ci_low: float
    baseline_ci_high: float
    results: dict
    table: pd.DataFrame
    summary: str
    alpha: float = 0.05
    level: float = 0.95

    def __repr__(self) -> str:
        return f"CompareManyResult(baseline={self.baseline_name!r}, checkpoints={list(self.results)}, alpha={self.alpha:g})"

    def _repr_html_(self) -> str:
        e = escape
        cell = f"padding:2px 10px 2px 0;border-bottom:1px solid {_BORDER};text-align:left"
        lv = _level_label(self.level)
        heads = ("checkpoint", "accuracy", f"{lv} CI", "delta", f"{lv} CI (Newcombe)", "W / T / L", "p", "p (Holm)")
        trs = []
        for r in self.table.itertuples():
            colour = (_WIN if r.delta > 0 else _LOSS) if r.significant else _TEXT
            vals = (e(str(r.checkpoint)), f"{r.accuracy:.1%}", f"{r.accuracy_low:.1%} to {r.accuracy_high:.1%}",
                    f"<span style='color:{colour}'>{r.delta:+.1%}</span>", f"{r.delta_low:+.1%} to {r.delta_high:+.1%}",
                    f"{r.wins} / {r.ties} / {r.losses}", f"{r.p_value:.3g}", f"{r.p_holm:.3g}")
            trs.append("<tr>" + "".join(f"<td style='{cell}'>{v}</td>" for v in vals) + "</tr>")
        paras = "".join(f"<p style='margin:4px 0'>{e(p)}</p>" for p in self.summary.split("\n") if p.strip())
        return no_math(f"<div class='machine-nb-compare-many' style='font-family:{_FONT};font-size:13px;color:{_TEXT}'>"
                       f"<table style='border-collapse:collapse;color:{_TEXT}'><thead><tr>"
                       + "".join(f"<th style='{cell}'>{h}</th>" for h in heads)
                       + f"</tr></thead><tbody>{''.join(trs)}</tbody></table>{paras}</div>")


def compare_many(baseline: Results, checkpoints: Mapping[str, Results] | Sequence[Results], *, alpha: float = 0.05,
                 level: float = 0.95, resamples: int = 10_000, seed: int = 0,
                 cluster: Any = None) -> CompareManyResult:
    """Compare several checkpoints with one baseline on the same rows, correcting for multiplicity.

    Each pair is compared as compare() does; the p-values are then Holm-adjusted over the
    checkpoints, so the chance of calling any no-better checkpoint significant stays at most
    alpha. The intervals are each comparison's own (not adjusted), and the power sentence uses
    alpha divided by the number of checkpoints (the level Holm's first step tests at).

    Args:
        baseline: the baseline's results, in any form compare() takes (an EvalResult, a
            results JSON path, a DataFrame, a results dict).
        checkpoints: {name: results, …}, or a list of results (named by their own results name).
        alpha, level, resamples, seed, cluster: as in compare() (defaults 0.05, 0.95, 10,000, 0,
            None).

    Returns:
        A CompareManyResult.

    Raises:
        ValueError: no checkpoint, two checkpoints with one name, or results not over the same
            rows.
        TypeError: `checkpoints` is one result (a path, a DataFrame, an EvalResult, a results
            dict) rather than a mapping or list of them.
    """
    import os

    import pandas as pd

    from .results import EvalResult

    _check_levels(alpha, level)
    if (isinstance(checkpoints, (str, bytes, os.PathLike, pd.DataFrame, EvalResult))
            or (isinstance(checkpoints, Mapping) and isinstance(checkpoints.get("rows"), list))):
        raise TypeError(f"checkpoints: got one {type(checkpoints).__name__}, expected several results: pass a list "
                        "([results, …]) or a dict ({name: results, …}), or use compare() for a single checkpoint")
    items = list(checkpoints.items()) if isinstance(checkpoints, Mapping) else [(None, c) for c in checkpoints]
    if not items:
        raise ValueError("compare_many needs at least one checkpoint")
    m = len(items)
    adjustment = f"Holm over {m} comparisons"
    power_alpha = alpha / m
    base = _as_results(baseline, "baseline")  # read once, paired with each checkpoint
    pairs = [_pair(base, ckpt, name, cluster) for name, ckpt in items]
    names = [p[3] for p in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"two checkpoints share a name ({names}); pass {{name: results, …}}")
    nums = [_paired_numbers(correct_values(p[0], p[2]), correct_values(p[1], p[3]), p[4],
                            alpha=alpha, level=level, resamples=resamples, seed=seed, power_alpha=power_alpha)
            for p in pairs]
    adjusted = stats.holm([num["p_value"] for num in nums], alpha=alpha)
    results = {p[3]: _result(*p, alpha=alpha, level=level, resamples=resamples, seed=seed, power_alpha=power_alpha,
                             p_adjusted=q, adjustment=adjustment, num=num)
               for p, num, q in zip(pairs, nums, adjusted)}
    table = pd.DataFrame([{
        "checkpoint": name, "n": r.n, "accuracy": r.checkpoint_accuracy, "accuracy_low": r.checkpoint_ci_low,
        "accuracy_high": r.checkpoint_ci_high, "delta": r.delta, "delta_low": r.delta_ci_low,
        "delta_high": r.delta_ci_high, "wins": r.wins, "ties": r.ties, "losses": r.losses, "p_value": r.p_value,
        "p_holm": r.p_adjusted, "significant": bool(r.p_adjusted < alpha),
    } for name, r in results.items()])
    any_r = next(iter(results.values()))
    base_name = pairs[0][2].removesuffix(" (A)")
    lines = [f"{m} checkpoint(s) against {base_name} ({any_r.baseline_accuracy:.1%} correct, {_level_label(level)} CI "
             f"{any_r.baseline_ci_low:.1%} to {any_r.baseline_ci_high:.1%}) on the same {any_r.n} rows. "
             f"The p-values are Holm-adjusted over the {m} comparisons, so the chance of calling any "
             f"no-better checkpoint different stays at most {alpha:g}; the intervals are per comparison, not adjusted."]
    for name, r in results.items():
        verdict = ("better" if r.delta > 0 else "worse") if r.p_adjusted < alpha else "not distinguishable from the baseline"
        lines.append(f"{name}: {r.checkpoint_accuracy:.1%} correct, delta {r.delta_text}; {r.wins}/{r.ties}/{r.losses} "
                     f"W/T/L; {r.p_method} p = {r.p_value:.3g}, Holm-adjusted {r.p_adjusted:.3g}: {verdict}.")
    return CompareManyResult(baseline_name=base_name, baseline_accuracy=any_r.baseline_accuracy,
                             baseline_ci_low=any_r.baseline_ci_low, baseline_ci_high=any_r.baseline_ci_high,
                             results=results, table=table, summary="\n".join(lines), alpha=alpha, level=level)
