"""The promotion gate: a trained checkpoint is a *candidate*, measured against the machine's live
version on its held-out cases; `Candidate.commit()` makes it live only if it passed the gate
(unless forced), and `revert()` restores the previous version. Measuring is
`cases.evaluate_cases`, the paired numbers `compare.compare`'s; this module decides, and writes
the machine's `versions.json` (and the `model` of its `model.json`).

Writes are whole-file replacements (temp + rename) under one lock per machine, after re-reading
the file: two commits racing each other cannot both win, and the loser learns why.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cases import (PREVIOUS_LIVE, VERSION_ID, check_grader, check_trials, is_checkpoint, live_index, load_cases,
                    machine_path, previous_live_index, read_versions)
from ..core.chat import content_text

if TYPE_CHECKING:
    import pandas as pd


class CommitRefused(RuntimeError):
    """`commit()` refused a candidate that did not pass the gate (pass force=True to commit anyway).

    reason: the gate's sentence. report: the CandidateReport it was decided on.
    """

    def __init__(self, message: str, *, reason: str | None = None, report: Any = None):
        super().__init__(message)
        self.reason = reason or message
        self.report = report


class CommitConflict(RuntimeError):
    """`commit()` or `revert()` found versions.json changed since the candidate was measured (another
    commit or revert won), or the candidate already committed. Nothing was written; force does not help."""


# ---------------------------------------------------------------------------------------------
# the gate


@dataclass(frozen=True)
class Gate:
    """The promotion rule, decided on the held-out cases (case by case, live vs candidate).

    max_losses: held-out cases the live version gets right that the candidate may get wrong.
        Default 0: a candidate never trades an old skill for a new one unseen.
    min_delta: how far the candidate's accuracy must exceed the live version's (0.1 = ten points),
        below 1. Default 0.0: any gain. A gain of exactly min_delta does not pass, whatever the
        accuracies (3 → 4 of 10 as 6 → 7 of 10: float rounding does not decide).
    alpha: the wins must beat the losses beyond chance: exact two-sided sign test (McNemar on the
        cases that changed) p < alpha. Default 0.05; None skips the test (then a margin decides).

    Raises:
        ValueError: a rule no candidate could pass or that is not a number (max_losses below 0 or
            not whole, min_delta not finite or 1 or more, alpha not in (0, 1]).
    """

    max_losses: int = 0
    min_delta: float = 0.0
    alpha: float | None = 0.05

    def __post_init__(self) -> None:
        import math
        import numbers

        if (isinstance(self.max_losses, bool) or not isinstance(self.max_losses, numbers.Integral)
                or self.max_losses < 0):
            raise ValueError(f"Gate: max_losses must be a whole number, 0 or more, not {self.max_losses!r}")
        if (isinstance(self.min_delta, bool) or not isinstance(self.min_delta, numbers.Real)
                or not math.isfinite(self.min_delta)):
            raise ValueError(f"Gate: min_delta must be a finite number (0.1 = ten points), not {self.min_delta!r}")
        if self.min_delta >= 1:
            raise ValueError(f"Gate: min_delta must be below 1 (0.1 = ten points), not {self.min_delta!r}: no "
                             "accuracy beats another by 100 points or more, so no candidate could pass")
        if self.alpha is not None and (isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real)
                                       or not 0 < self.alpha <= 1):
            raise ValueError(f"Gate: alpha must be above 0 and at most 1 (None skips the sign test), not "
                             f"{self.alpha!r}: no p-value is below {self.alpha!r}, so no candidate could pass")

    def describe(self) -> str:
        """The rule in plain words.

        Returns:
            One sentence: "A candidate passes when …".
        """
        parts = ["it loses no held-out case the live version gets right" if self.max_losses == 0 else
                 f"it loses at most {self.max_losses} held-out case(s) the live version gets right",
                 "its held-out accuracy is above the live version's" if self.min_delta == 0 else
                 f"its held-out accuracy beats the live version's by more than {self.min_delta:.0%}"]
        if self.alpha is not None:
            parts.append("its wins outnumber its losses beyond chance (exact two-sided sign test on the "
                         f"cases that changed, p < {self.alpha:g})")
        return "A candidate passes when " + ", ".join(parts[:-1]) + " and " + parts[-1] + "."

    def decide(self, report: "CandidateReport") -> tuple[bool, str]:
        """Decide a candidate by this rule.

        Args:
            report: the CandidateReport to decide on.

        Returns:
            (passed, reason): the reason names every part of the rule that failed, or the numbers that passed.
        """
        from .stats import min_discordant_for

        r = report
        failed = []
        if r.trained_on_holdout:
            failed.append(f"it was trained on {r.trained_on_holdout} held-out input(s), so its held-out score "
                          "measures memory, not what it learned")
        for who, result, errors in (("the live version", r.live, r.live_errors),
                                    ("the candidate", r.candidate, r.candidate_errors)):
            if errors:  # a failed reply counts as wrong: the other side would win cases it never played
                failed.append(f"{errors} of {who}'s {len(_rows(result))} replies failed (see their error), so the "
                              "numbers measure the failures, not the versions: measure again")
        if r.losses > self.max_losses:
            failed.append(f"it loses {r.losses} case(s) the live version gets right (allowed: {self.max_losses})")
        if not _beats(r.delta, self.min_delta):
            failed.append(f"its accuracy {r.candidate_accuracy:.0%} is not above the live version's "
                          f"{r.live_accuracy:.0%}" + (f" by more than {self.min_delta:.0%}" if self.min_delta else ""))
        if self.alpha is not None and not r.p_value < self.alpha:
            text = f"its gain is not beyond chance (sign test p = {r.p_value:.3g}, needs < {self.alpha:g})"
            need = min_discordant_for(self.alpha) if self.alpha < 1 else 2  # at 1: p = 1 with one changed case
            if r.n_cases < need:
                text += f"; with {r.n_cases} held-out cases no result can get there (it takes {need}): add cases"
            failed.append(text)
        numbers = (f"{r.wins} won, {r.ties} tied, {r.losses} lost of {r.n_cases} held-out cases; accuracy "
                   f"{r.live_accuracy:.0%} → {r.candidate_accuracy:.0%}"
                   + (f"; sign test p = {r.p_value:.3g}" if self.alpha is not None else ""))
        if failed:
            return False, "Refused: " + "; ".join(failed) + f". The numbers: {numbers}."
        return True, f"Passed: {numbers}."


def _beats(delta: float, margin: float) -> bool:
    """Whether an accuracy gain is more than the margin, a gain equal to it but for float rounding
    not counting (0.4 - 0.3 is 0.10000000000000003, 0.7 - 0.6 is 0.09999999999999998)."""
    import math

    return delta > margin and not math.isclose(delta, margin, rel_tol=1e-9, abs_tol=1e-12)


# ---------------------------------------------------------------------------------------------
# the report


CASE_TABLE_COLUMNS = ["case", "input", "expected", "live_output", "candidate_output", "live_correct",
                      "candidate_correct", "change"]
"""Columns of `CandidateReport.cases`: case, input, expected, live_output / candidate_output (the
first trial's reply), live_correct / candidate_correct (share of trials right: 0 or 1 with one
trial), change ("win": the candidate did better on this case, "loss": worse, "tie")."""


@dataclass
class CandidateReport:
    """Live version vs candidate on the held-out cases.

    live, candidate: the `evaluate_cases` results (EvalResults: `rows` one per case and trial).
    cases: one row per case (CASE_TABLE_COLUMNS). comparison: `compare` over the paired
    rows (case and trial). wins / ties / losses, p_value: per case (a case's share of trials right,
    live vs candidate), the exact sign test on the cases that changed (McNemar's, and equal to
    comparison's with one trial). trained_on_holdout: training rows whose input is a held-out case
    (when the training data was given). live_errors / candidate_errors: replies that failed (the
    gate refuses a report with any: a failed reply counts as wrong, so it decides nothing).
    """

    machine: str
    live_name: str
    candidate_name: str
    trials: int
    live: Any
    candidate: Any
    cases: Any
    comparison: Any
    wins: int
    ties: int
    losses: int
    p_value: float
    live_accuracy: float
    candidate_accuracy: float
    trained_on_holdout: int = 0

    @property
    def live_errors(self) -> int:
        """How many of the live version's replies failed (a request, or its grading).

        Returns:
            The rows of `live` whose `error` is set.
        """
        return _errors(self.live)

    @property
    def candidate_errors(self) -> int:
        """How many of the candidate's replies failed (a request, or its grading).

        Returns:
            The rows of `candidate` whose `error` is set.
        """
        return _errors(self.candidate)

    @property
    def n_cases(self) -> int:
        """How many held-out cases were measured.

        Returns:
            The number of rows of `cases`.
        """
        return len(self.cases)

    @property
    def delta(self) -> float:
        """The candidate's accuracy minus the live version's.

        Returns:
            The difference (0.1 = ten points better).
        """
        return self.candidate_accuracy - self.live_accuracy

    @property
    def flipped(self) -> pd.DataFrame:
        """The cases that changed (wins and losses).

        Returns:
            The rows of `cases` whose change is not "tie".
        """
        return self.cases[self.cases["change"] != "tie"].reset_index(drop=True)

    def to_dict(self) -> dict:
        """The numbers and the per-case table as plain data (e.g. for a report's JSON).

        Returns:
            machine, live, candidate, trials, n_cases, live_accuracy, candidate_accuracy, delta, wins,
            ties, losses, p_value, trained_on_holdout, live_errors, candidate_errors, cases (records).
        """
        return {"machine": self.machine, "live": self.live_name, "candidate": self.candidate_name,
                "trials": self.trials, "n_cases": self.n_cases, "live_accuracy": self.live_accuracy,
                "candidate_accuracy": self.candidate_accuracy, "delta": self.delta, "wins": self.wins,
                "ties": self.ties, "losses": self.losses, "p_value": self.p_value,
                "trained_on_holdout": self.trained_on_holdout, "live_errors": self.live_errors,
                "candidate_errors": self.candidate_errors, "cases": self.cases.to_dict("records")}


def _rows(result: Any) -> Any:
    """The rows of an EvalResult (or a bare frame of them)."""
    return getattr(result, "rows", result)


def _errors(result: Any) -> int:
    rows = _rows(result)
    if rows is None or "error" not in getattr(rows, "columns", ()):
        return 0
    return int(sum(isinstance(e, str) and e != "" for e in rows["error"]))


def case_table(live: Any, candidate: Any) -> pd.DataFrame:
    """One row per case from two evaluate_cases results over the same cases and trials.

    Args:
        live: the live version's results (an EvalResult, a frame or a results JSON path).
        candidate: the candidate's, over the same cases and trials.

    Returns:
        A DataFrame with CASE_TABLE_COLUMNS.

    Raises:
        ValueError: the two are not over the same cases and trials.
    """
    import pandas as pd

    from .results import as_eval_result

    live, candidate = as_eval_result(live, "live").rows, as_eval_result(candidate, "candidate").rows
    if len(live) != len(candidate) or list(live["case"]) != list(candidate["case"]):
        raise ValueError("the two results are not over the same cases and trials")

    def text(value: Any) -> Any:  # a string column's missing value (NaN) is None here, as in the JSON
        return None if isinstance(value, float) and value != value else value

    rows = []
    for case, a in live.groupby("case", sort=False):
        b = candidate[candidate["case"] == case]
        ra, rb = float(a["correct"].mean()), float(b["correct"].mean())
        rows.append({"case": int(case), "input": text(a["input"].iloc[0]), "expected": text(a["expected"].iloc[0]),
                     "live_output": text(a["output"].iloc[0]), "candidate_output": text(b["output"].iloc[0]),
                     "live_correct": ra, "candidate_correct": rb,
                     "change": "win" if rb > ra else "loss" if rb < ra else "tie"})
    # object columns keep None (expected of a grader-scored case); a string column would make it NaN
    return pd.DataFrame(rows, columns=CASE_TABLE_COLUMNS, dtype=object).astype(
        {"case": int, "live_correct": float, "candidate_correct": float})


def build_report(machine: str, live: Any, candidate: Any, *, trained_on_holdout: int = 0) -> CandidateReport:
    """The CandidateReport of two evaluate_cases results over the same held-out cases.

    Args:
        machine: the machine's name.
        live: the live version's results (an EvalResult, a frame or a results JSON path).
        candidate: the candidate's, over the same cases and trials.
        trained_on_holdout: training rows whose input is a held-out case (default 0).

    Returns:
        The CandidateReport (its `live` and `candidate` the two results' rows).
    """
    from .compare import compare
    from .stats import mcnemar_exact

    from .results import as_eval_result

    live, candidate = as_eval_result(live, "live"), as_eval_result(candidate, "candidate")
    cases = case_table(live, candidate)
    wins, losses = int((cases["change"] == "win").sum()), int((cases["change"] == "loss").sum())
    return CandidateReport(
        machine=machine, live_name=live.summary.get("name", "live"),
        candidate_name=candidate.summary.get("name", "candidate"),
        trials=int(live.rows["trial"].max()) + 1 if len(live.rows) else 0, live=live, candidate=candidate,
        cases=cases, comparison=compare(live, candidate), wins=wins, losses=losses,
        ties=len(cases) - wins - losses, p_value=mcnemar_exact(losses, wins),
        live_accuracy=float(live.rows["correct"].mean()), candidate_accuracy=float(candidate.rows["correct"].mean()),
        trained_on_holdout=int(trained_on_holdout))


def report_html(report: CandidateReport, gate: Gate, passed: bool, reason: str, *, committed: str | None = None) -> str:
    """The report as HTML: the decision and rule, the numbers, the cases that flipped.

    Args:
        report: the CandidateReport.
        gate: the rule it was decided by.
        passed: the decision.
        reason: the gate's sentence.
        committed: the version id it was committed as (default None: not committed).

    Returns:
        An HTML fragment (the palette of machine_nb.core.theme: light and dark themes).
    """
    from ..core.theme import BORDER, FG, FG_MUTED, GREEN, RED, no_math, text_colour, tint
    from ..core.theme import escape as _escape

    def escape(value: Any) -> str:
        return "" if value is None or (isinstance(value, float) and value != value) else _escape(value)

    green, red = text_colour(GREEN), text_colour(RED)
    colour = green if passed else red
    status = (f"<b style='color:{colour}'>{'passes' if passed else 'refused'}</b>"
              + (f" · committed as <b>{escape(committed)}</b>" if committed else ""))
    rows = [("decision", status), ("why", escape(reason)), ("rule", escape(gate.describe())),
            (f"{escape(report.live_name)} accuracy", f"{report.live_accuracy:.1%}"),
            (f"{escape(report.candidate_name)} accuracy", f"{report.candidate_accuracy:.1%}"),
            ("cases won / tied / lost", f"<span style='color:{green}'>{report.wins}</span> / {report.ties} / "
                                        f"<span style='color:{red}'>{report.losses}</span> of {report.n_cases}"
                                        + (f" ({report.trials} trials each)" if report.trials > 1 else "")),
            ("sign test p", f"{report.p_value:.3g}")]
    # explicit alignment: notebook and nbconvert stylesheets right-align table cells
    cell = f"padding:2px 6px;border-bottom:1px solid {BORDER};vertical-align:top;white-space:pre-wrap;text-align:left"
    body = "".join(f"<tr><td style='{cell};color:{FG_MUTED};white-space:nowrap'>{k}</td><td style='{cell}'>{v}</td></tr>"
                   for k, v in rows)
    flips = report.flipped
    if len(flips):
        def out(text: Any, ok: float) -> str:
            return f"{'✓' if ok >= 1 else '✗' if ok <= 0 else f'{ok:.0%}'} {escape(str(text)[:300])}"

        trs = "".join(
            f"<tr class='mnb-{r['change']}' style='color:{FG};background:{tint(GREEN if r['change'] == 'win' else RED)}'>"
            f"<td style='{cell}'>{r['case']}</td><td style='{cell}'>{escape(r['input'])}</td>"
            f"<td style='{cell}'>{escape(r['expected'])}</td><td style='{cell}'>{out(r['live_output'], r['live_correct'])}</td>"
            f"<td style='{cell}'>{out(r['candidate_output'], r['candidate_correct'])}</td><td style='{cell}'>{r['change']}</td></tr>"
            for r in flips.to_dict("records"))
        head = "".join(f"<th style='{cell};text-align:left'>{h}</th>" for h in
                       ("case", "input", "expected", escape(report.live_name), escape(report.candidate_name), "change"))
        table = (f"<p style='margin:6px 0 2px'>{len(flips)} held-out case(s) flipped:</p><table class='mnb-candidate-flips' "
                 f"style='border-collapse:collapse;font-size:12px'><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
    else:
        table = "<p>No held-out case changed.</p>"
    return no_math(f"<div class='mnb-candidate' style='font-family:system-ui,sans-serif;font-size:13px'>"
                   f"<table class='mnb-candidate-numbers' style='border-collapse:collapse'>{body}</table>{table}</div>")


# ---------------------------------------------------------------------------------------------
# versions.json writes


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@contextlib.contextmanager
def versions_lock(workspace: str | os.PathLike, machine: str) -> Iterator[None]:
    """The lock every commit and revert of one machine holds.

    It lives in the workspace's private `.machine/` store, not beside the checked-in definition,
    so no lock file shows up in a diff.

    Args:
        workspace: the workspace.
        machine: the machine's name.

    Returns:
        A context manager holding the lock.
    """
    from ..store.workspace import machine_dir, name_segments

    d = machine_dir(workspace) / "locks"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(d / f"versions-{'--'.join(name_segments(machine, 'machine name'))}.lock", "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _replace_json(path: Path, value: Any) -> None:
    """Rewrite a JSON file whole (temp + fsync + rename), keeping its permission bits."""
    from ..core.jsonl import atomic_write_text

    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n", mode=mode)


def _set_model_json(d: Path, model: str) -> None:
    """Point model.json's `model` at the live version's model (other keys kept), when the file exists.

    Raises:
        MachineFormatError: model.json is not a JSON object (nothing written: the history must not
            name a live model that model.json does not).
    """
    from ..errors import MachineFormatError
    from ..store.workspace import read_json

    path = d / "model.json"
    if not path.exists():
        return
    config = read_json(path)
    if not isinstance(config, dict):
        raise MachineFormatError(path, f"model.json must be a JSON object such as {{\"model\": \"{model}\"}}, got "
                                       f"{type(config).__name__}: fix it by hand, then run this again")
    if config.get("model") != model:
        _replace_json(path, {**config, "model": model})


def _live_instructions(d: Path, live: dict) -> str:
    """The system prompt a version runs: its entry's `instructions`, else instructions.md's text
    (an entry Machine wrote may hold none), else ""."""
    from ..store.workspace import read_instructions

    text = live.get("instructions")
    return text if isinstance(text, str) else (read_instructions(d) or "")


def _next_id(versions: list[dict]) -> str:
    numbers = [int(v["id"][1:]) for v in versions if VERSION_ID.fullmatch(v["id"])]
    return f"v{max(numbers, default=0) + 1}"


def checkpoint_problem(checkpoint: str, engine: str | None = None) -> str | None:
    """Why a checkpoint of this process's local engine cannot be sampled (gone, or not a
    checkpoint), else None.

    A checkpoint served elsewhere (Tinker, or a separate `machine-nb serve` reached with
    engine="tinker") lives on that service and is not looked up here (None).

    Args:
        checkpoint: the sampler path.
        engine: where it is sampled (default None: the checkpoint's own engine).

    Returns:
        The reason, or None.
    """
    from .. import engines

    if (engine or engines.engine_for(checkpoint)) != "local":
        return None
    try:
        engines.checkpoint_base_model(str(checkpoint))
    except Exception as exc:  # EngineError, or the checkpoint's files missing or unreadable
        return str(exc) or type(exc).__name__
    return None


def revert(workspace: str | os.PathLike, machine: str, *, force: bool = False) -> dict:
    """Make the version that was live before the live one live again.

    That is the version live when the live one was committed (its `previousLive`), so two
    reverts never bring back a version already rolled back; an entry without that record steps
    back to the entry before it. Writes versions.json (the `live` flag moves; no entry is removed, so the history stays), and
    points model.json's `model` (and instructions.md, when that version recorded other
    instructions) back at it, under the same lock as commits.

    A version that runs a checkpoint of this process's local engine (`tinker://local-…`) whose
    files are gone is not restored: the machine would run nothing.

    Args:
        workspace: the workspace.
        machine: the machine whose live version steps back.
        force: restore it even when its local checkpoint cannot be found (default False; a
            checkpoint held by a separate `machine-nb serve` is not in this process's data dir).

    Returns:
        The restored version's entry.

    Raises:
        ValueError: the live version is the first one, or (without force) the version to restore
            runs a local checkpoint that cannot be sampled. Nothing is written.
    """
    d = machine_path(workspace, machine)
    with versions_lock(workspace, machine):
        versions = read_versions(workspace, machine)
        i, back = live_index(versions), previous_live_index(versions)
        if back is None:
            raise ValueError(f"{d / 'versions.json'}: {versions[i]['id']} is the first version of {machine}; "
                             "there is none before it to restore")
        model = versions[back]["model"]
        gone = None if force or not is_checkpoint(model) else checkpoint_problem(model)
        if gone is not None:
            raise ValueError(f"{d / 'versions.json'}: {versions[back]['id']} runs {model}, which cannot be sampled "
                             f"({gone}), so it cannot be the live version; {versions[i]['id']} stays live and "
                             "nothing was written. revert(…, force=True) (CLI: --force) restores it anyway")
        for v in versions:
            v.pop("live", None)
        previous = versions[back]
        previous["live"] = True
        _write_live(d, versions, previous, instructions=True)
    return dict(previous)


def _write_live(d: Path, versions: list[dict], live: dict, *, instructions: bool = False) -> None:
    """Write a machine's files for its new live version: model.json's `model` (and with
    `instructions`, instructions.md when the version recorded other instructions), then
    versions.json, each atomically. The history goes last: a process killed between the files
    leaves it as it was, so the same commit or revert run again finishes the job (written first,
    it would mark live a version whose model model.json does not name, and a commit could not be
    run again: "already committed"). The temporary files a killed write left beside these three
    go first; the caller holds the machine's lock, which every writer of them holds."""
    from ..core.jsonl import remove_stale_temporaries
    from ..store.workspace import read_instructions

    for name in ("model.json", "instructions.md", "versions.json"):  # a killed write's leftovers (lock held)
        remove_stale_temporaries(d / name)
    text = live.get("instructions")
    md = d / "instructions.md"
    # read before anything is written: instructions.md that is not UTF-8 stops the revert whole
    rewrite = instructions and isinstance(text, str) and md.exists() and read_instructions(d) != text
    _set_model_json(d, live["model"])
    if rewrite:
        from ..core.jsonl import atomic_write_text

        atomic_write_text(md, text, mode=md.stat().st_mode & 0o777)
    _replace_json(d / "versions.json", versions)


# ---------------------------------------------------------------------------------------------
# the candidate


@dataclass
class Candidate:
    """A proposed new version of a machine: a checkpoint, measured against the live version.

    workspace, machine: whose candidate it is. checkpoint: the sampler path it would run.
    base_model: the model it was trained from (the live version's). engine: where it ran.
    live_version: the versions.json entry it was measured against. report: the CandidateReport.
    gate: the rule it was decided by; passed / reason: the decision. id: names it in the version
    it becomes. committed: the version id once committed (None before): the one record of the
    candidate's state, which `state`, `status`, `summary()`, its HTML and every CandidateView read
    (`observe` tells views when it changes). instructions: the system prompt both versions were
    measured with (the live entry's, else instructions.md's); the committed version records it,
    and a commit finds a conflict when the live version's instructions differ by then (default
    None: whatever is live at commit).
    """

    workspace: str
    machine: str
    checkpoint: str
    base_model: str
    engine: str
    live_version: dict
    report: CandidateReport | None
    gate: Gate = field(default_factory=Gate)
    passed: bool = False
    reason: str = ""
    id: str = field(default_factory=lambda: f"cand-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dt%H%M%S}-{secrets.token_hex(2)}")
    committed: str | None = None
    instructions: str | None = None
    _observers: list = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def state(self) -> str:
        """Where the candidate stands: "committed", "passed" (not committed yet) or "refused"."""
        return "committed" if self.committed else "passed" if self.passed else "refused"

    @property
    def status(self) -> str:
        """The candidate's state in one sentence (what every view and print of it says).

        Returns:
            "Committed as v2: tutor runs <checkpoint>." / "Not committed yet: the gate passed it
            (commit() makes it live)." / "Not committed: the gate refused it. <reason>".
        """
        if self.committed:
            return f"Committed as {self.committed}: {self.machine} runs {self.checkpoint}."
        if self.passed:
            return "Not committed yet: the gate passed it (commit() makes it live)."
        return f"Not committed: the gate refused it. {self.reason}".strip()

    def observe(self, callback: Any) -> Any:
        """Call `callback(candidate)` whenever the candidate's state changes (a commit).

        Args:
            callback: a function of the candidate.

        Returns:
            A function that stops the calls.
        """
        self._observers.append(callback)
        return lambda: callback in self._observers and self._observers.remove(callback)

    def commit(self, force: bool = False, note: str | None = None) -> dict:
        """Make this candidate the machine's live version.

        Appends `{id: "v<N+1>", instructions, model: checkpoint, baseModel, rubricFingerprint,
        createdAt, source: {kind: "train", candidate, checkpoint}, previousLive: the live version's
        id (where `revert` goes back to), report, live: true}` to
        versions.json (the `live` flag moves from the old entry) and points model.json's `model`
        at the checkpoint. Under the machine's lock, after re-reading the file.

        Args:
            force: commit even though the gate refused (default False). Recorded as `forced`.
            note: a note kept in the entry's source (default None).

        Returns:
            The new versions.json entry.

        Raises:
            CommitRefused: (with `.reason` and `.report`) the gate did not pass and force is False,
                or the local checkpoint is gone (force does not help).
            CommitConflict: the live version changed since the measurement (another version, or
                its model, baseModel or instructions edited), or this candidate is already
                committed. Either way nothing is written.
        """
        if self.committed:
            raise CommitConflict(f"candidate {self.id} is already committed as {self.committed}")
        if not self.passed and not force:
            raise CommitRefused(f"{self.machine}: candidate {self.id} did not pass the promotion gate, so "
                                f"{self.live_version['id']} stays live. {self.reason} "
                                "(commit(force=True) commits it anyway.)", reason=self.reason, report=self.report)
        from ..store.workspace import load_machine

        d = machine_path(self.workspace, self.machine)
        gone = checkpoint_problem(self.checkpoint, self.engine)
        if gone is not None:
            raise CommitRefused(f"{self.machine}: candidate {self.id}'s checkpoint {self.checkpoint} cannot be sampled "
                                f"({gone}), so it cannot be the live version; {self.live_version['id']} stays live. "
                                "Train and measure a candidate again.", reason="checkpoint gone", report=self.report)
        with versions_lock(self.workspace, self.machine):
            versions = read_versions(self.workspace, self.machine)
            live = versions[live_index(versions)]
            done = next((v for v in versions if (v.get("source") or {}).get("candidate") == self.id), None)
            if done is not None:
                raise CommitConflict(f"{d / 'versions.json'}: candidate {self.id} is already committed as {done['id']}")
            if live["id"] != self.live_version["id"] or live.get("model") != self.live_version.get("model"):
                raise CommitConflict(
                    f"{d / 'versions.json'}: the live version is now {live['id']} ({live.get('model')}), not "
                    f"{self.live_version['id']}, which this candidate was measured against: another commit or revert "
                    "came first. Nothing was written; measure the candidate again with candidate(…).")
            for key in ("baseModel", "instructions"):
                if live.get(key) != self.live_version.get(key):
                    raise CommitConflict(
                        f"{d / 'versions.json'}: the {key} of the live version {live['id']} changed since this "
                        "candidate was measured against it, so its numbers are not the live version's. Nothing "
                        "was written; measure the candidate again with candidate(…).")
            instructions = _live_instructions(d, live)
            if self.instructions is not None and instructions != self.instructions:
                raise CommitConflict(
                    f"{d / 'instructions.md'}: the live version {live['id']} records no instructions of its own, and "
                    "instructions.md changed since this candidate was measured with it, so its numbers are not the "
                    "live version's. Nothing was written; measure the candidate again with candidate(…).")
            fp_key = "rubric" if "rubric" in live and "rubricFingerprint" not in live else "rubricFingerprint"
            rubric = load_machine(self.workspace, self.machine).get("rubric") or live.get(fp_key)
            source: dict[str, Any] = {"kind": "train", "candidate": self.id, "checkpoint": self.checkpoint}
            if note:
                source["note"] = note
            entry: dict[str, Any] = {"id": _next_id(versions), "instructions": instructions,
                                     "model": self.checkpoint, "baseModel": self.base_model, fp_key: rubric,
                                     "createdAt": _now(), "source": source, PREVIOUS_LIVE: live["id"]}
            if self.report is not None:
                r = self.report
                entry["report"] = {"live": live["id"], "cases": r.n_cases, "trials": r.trials,
                                   "live_accuracy": round(r.live_accuracy, 6),
                                   "candidate_accuracy": round(r.candidate_accuracy, 6), "wins": r.wins,
                                   "ties": r.ties, "losses": r.losses, "p_value": r.p_value, "passed": self.passed}
            if force and not self.passed:
                entry["forced"] = True
            entry["live"] = True
            for v in versions:
                v.pop("live", None)
            versions.append(entry)
            _write_live(d, versions, entry)
        self.committed = entry["id"]
        for callback in list(self._observers):
            callback(self)
        return entry

    def to_dict(self) -> dict[str, Any]:
        """The candidate as plain data.

        Returns:
            {id, workspace, machine, checkpoint, base_model, engine, live_version, passed, reason,
            committed, gate: {rule, max_losses, min_delta, alpha}, report: CandidateReport.to_dict()
            or None}.
        """
        g = self.gate
        return {"id": self.id, "workspace": self.workspace, "machine": self.machine, "checkpoint": self.checkpoint,
                "base_model": self.base_model, "engine": self.engine, "live_version": dict(self.live_version),
                "passed": self.passed, "reason": self.reason, "committed": self.committed,
                "gate": {"rule": g.describe(), "max_losses": g.max_losses, "min_delta": g.min_delta, "alpha": g.alpha},
                "report": None if self.report is None else self.report.to_dict()}

    def summary(self) -> str:
        """The candidate in one line.

        Returns:
            "Candidate <id> for <machine> (passes|refused: live → candidate accuracy …)".
        """
        r = self.report
        nums = "" if r is None else (f": {r.live_accuracy:.1%} → {r.candidate_accuracy:.1%} on {r.n_cases} held-out "
                                     f"cases, W/T/L {r.wins}/{r.ties}/{r.losses}")
        state = f", committed as {self.committed}" if self.committed else ""
        return f"Candidate {self.id} for {self.machine} ({'passes' if self.passed else 'refused'}{nums}{state})"

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        if self.report is None:
            from ..core.theme import escape, no_math

            return no_math(f"<p>{escape(self.summary())}</p>")
        return report_html(self.report, self.gate, self.passed, self.reason, committed=self.committed)


def check_distinct_cases(holdout: pd.DataFrame) -> None:
    """Refuse held-out cases given more than once (the same input, compared as export.case_key
    compares it, with the same files): the gate counts cases, so one case written six times would
    make one win six and the sign test "significant".

    Args:
        holdout: load_cases' held-out frame.

    Raises:
        MachineFormatError: naming the file, the first repeat and the case it repeats.
    """
    from ..data.export import case_key
    from ..errors import MachineFormatError

    first: dict[tuple[str, str], int] = {}
    repeats = []
    for i, (text, files) in enumerate(zip(holdout["input"], holdout["files"])):
        key = (case_key(text), json.dumps(files if isinstance(files, dict) else None, sort_keys=True))
        if key in first:
            repeats.append((i, first[key]))
        else:
            first[key] = i
    if repeats:
        i, j = repeats[0]
        text = str(holdout["input"].iloc[i])
        more = f" (and {len(repeats) - 1} more repeat(s))" if len(repeats) > 1 else ""
        path = holdout["path"].iloc[0] if "path" in holdout else None
        raise MachineFormatError(path, f"case {i + 1} repeats case {j + 1} ({text[:60]!r}){more}: the gate counts "
                                       "each held-out case once, so a repeat would count one result several times; "
                                       "remove the repeats", field=f"[{i}].input")


#: The files candidate() writes in its out_dir, and a key each holds that tells it is one of them.
OUT_FILES = {"live.json": "split", "candidate.json": "split", "report.json": "live_version"}


def check_out_dir(out: Path) -> None:
    """Refuse an out_dir whose live.json, candidate.json or report.json is not a file candidate()
    wrote (another tool's, or a user's): it would be replaced. Checked before anything is sampled.

    Args:
        out: the folder (it need not exist).

    Raises:
        FileExistsError: naming the file; or out, or the folder it would be made in, is a file
            (nothing could be written there once both versions were sampled).
    """
    from ..store.workspace import read_json

    held = next((p for p in (out, *out.parents) if p.exists()), None)  # the folder out is (or is made in)
    if held is not None and not held.is_dir():
        raise FileExistsError(f"{held}: is a file, not a folder, so out_dir {out} cannot hold the results: choose "
                              "another out_dir (CLI: --out; a folder, created if missing)")
    for name, key in OUT_FILES.items():
        path = out / name
        if not path.exists() and not path.is_symlink():
            continue
        try:
            held = read_json(path) if path.is_file() and not path.is_symlink() else None
        except ValueError:  # not JSON, or not readable
            held = None
        if not (isinstance(held, dict) and key in held and "machine" in held):
            raise FileExistsError(f"{path}: {name} is not a file candidate() wrote, and measuring would replace it: "
                                  "choose another out_dir (CLI: --out), or move that file")


def _training_inputs(data: Any) -> list[str]:
    """The user messages of training rows (a JSONL path, a list of lines, a DataFrame of them):
    SFT lines' `messages` and preference pairs' `prompt`. A row that is not an object is refused
    rather than skipped: the check would pass a candidate it never looked at."""
    from collections.abc import Mapping

    from ..core.chat import frame_rows
    from ..core.jsonl import read_jsonl
    from ..errors import MachineFormatError

    where = os.fspath(data) if isinstance(data, (str, os.PathLike)) else "<data>"
    if isinstance(data, (str, os.PathLike)):
        data = read_jsonl(data)
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):
        data = frame_rows(data)  # a frame read back through pyarrow holds arrays where rows held lists
    elif isinstance(data, Mapping):
        raise MachineFormatError(where, "one training row was given where a list of rows is taken: pass [row]")
    out = []
    for i, row in enumerate(data, start=1):
        if not isinstance(row, Mapping):
            raise MachineFormatError(where, f"training row {i} must be an object with messages (or a preference "
                                            f"pair's prompt), not a {type(row).__name__}", line=i)
        for key in ("messages", "prompt"):
            messages = row.get(key)
            for m in messages if isinstance(messages, (list, tuple)) else ():
                if isinstance(m, Mapping) and m.get("role") == "user":
                    out.append(content_text(m.get("content")))
    return out


def candidate(workspace: str | os.PathLike, machine: str, checkpoint: str, *, trials: int = 1,
              gate: Gate | None = None, engine: str | None = None, grader: Any = None, data: Any = None,
              max_tokens: int = 32, temperature: float = 0.0, seed: int | None = 0, max_usd: float | None = None,
              out_dir: str | os.PathLike | None = None, progress: bool | None = None) -> Candidate:
    """Measure a trained checkpoint against the machine's live version on its held-out cases.

    Never changes the machine: the result is a Candidate whose `.report` holds both versions'
    results and their paired comparison, `.passed` / `.reason` the gate's decision, and whose
    `.commit()` makes it live.

    Args:
        workspace: the workspace.
        machine: the machine (its versions.json, holdout.json, instructions).
        checkpoint: the sampler path to measure (`tinker://…`; `tinker://local-…` on the local
            engine). Its base model must be the live version's (ValueError otherwise: another
            renderer, another model).
        trials: samples per case per version (default 1; more only say something at temperature > 0).
        gate: the promotion rule (default `Gate()`: no case lost and a significant gain).
        engine: "local" or "tinker"; default None: the checkpoint's own (local for tinker://local-…).
        grader: for held-out cases that declare no expected answer (see evaluate_cases).
        data: the training data (a JSONL path, a list of its rows or a frame of them: SFT lines'
            messages or preference pairs' prompts), to check it held no held-out input: such a
            candidate is refused (default None: not checked).
        max_tokens: the reply budget per case (default 32, as evaluate).
        temperature: sampling temperature (default 0.0: greedy).
        seed: the sampling seed (default 0).
        max_usd: the spending limit in USD for both evaluations together, every trial, checked
            before either is sampled (default None: no budget).
        out_dir: also write `live.json`, `candidate.json` (evaluate's results schema) and
            `report.json` here, replacing earlier ones of candidate() (any other file of those
            names is refused, before sampling). Default None: nothing is written. A write that
            fails once sampled (a full disk) is a warning: the candidate is still returned.
        progress: progress bars (default None: on in a kernel or terminal unless
            MACHINE_NB_PROGRESS=0).

    Returns:
        A Candidate (report, passed, reason; commit() to make it live).

    Raises:
        MachineFormatError: a missing or malformed versions.json or holdout.json (or any other
            definition file), a held-out case given twice, or training data whose rows are not
            objects, before anything is sampled.
        ValueError: the checkpoint's base model is not the live version's, or trials is not a
            whole number of at least 1, before anything is sampled.
        FileExistsError: out_dir holds a live.json, candidate.json or report.json that
            candidate() did not write, before anything is sampled.
        TypeError: gate is not a Gate, before anything is sampled.
        BudgetExceeded: on Tinker, the estimate for both versions is over max_usd.
    """
    from .. import engines
    from .cases import evaluate_cases
    from ..data.export import case_key, held_out_keys
    from .sampling import SamplerTarget, open_sampler

    workspace = os.fspath(workspace)
    gate = Gate() if gate is None else gate
    if not isinstance(gate, Gate):  # decided only once both versions are sampled (and paid for)
        raise TypeError(f"gate must be a Gate, such as Gate(max_losses=1, min_delta=0.05), not {type(gate).__name__}")
    trials = check_trials(trials)
    versions = read_versions(workspace, machine)
    live = versions[live_index(versions)]
    holdout = load_cases(workspace, machine, "holdout")
    check_distinct_cases(holdout)
    check_grader(holdout, grader)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        check_out_dir(out)
    from ..store.workspace import load_machine

    load_machine(workspace, machine)  # the whole definition reads cleanly (cases.json too) before sampling
    trained_on = 0
    if data is not None:
        held = held_out_keys(holdout)
        trained_on = len({case_key(t) for t in _training_inputs(data)} & held)

    gone = checkpoint_problem(str(checkpoint), engine)
    if gone is not None:
        raise ValueError(f"{checkpoint} cannot be sampled ({gone}): nothing was measured; pass the sampler path "
                         "sft returned (TrainResult.checkpoint)")
    engine = engine or engines.engine_for(checkpoint)
    service = engines.service_client(engine)
    cand_client = open_sampler(SamplerTarget("", str(checkpoint), engine), service)  # its base model is asked
    base = cand_client.get_base_model()
    live_ckpt = live["model"] if is_checkpoint(live["model"]) else None
    live_base = live.get("baseModel") or (None if live_ckpt else live["model"])
    if live_base is not None and live_base != base:
        raise ValueError(f"{checkpoint} was trained from {base}, but {machine}'s live version {live['id']} runs "
                         f"{live_base}: a candidate must share the live version's base model (its renderer, "
                         "tokens and price), so train it from that one")
    engines.check_model(engine, live_ckpt or live_base)
    live_client = open_sampler(SamplerTarget(live_base or "", live_ckpt, engine), service)
    if live_base is None:
        live_base = live_client.get_base_model()
        if live_base != base:
            raise ValueError(f"{checkpoint} was trained from {base}, but {machine}'s live version {live['id']} "
                             f"({live_ckpt}) was trained from {live_base}: a candidate must share its base model")
    instructions = _live_instructions(machine_path(workspace, machine), live)
    if max_usd is not None and engine == "tinker":  # both versions, every trial, against the one budget
        from ..checks.pricing import estimate_eval_cost

        system = [{"role": "system", "content": instructions}] if instructions else []
        estimate_eval_cost([{"messages": system + [{"role": "user", "content": text}]} for text in holdout["input"]],
                           base, max_tokens=int(max_tokens), max_usd=max_usd, samples_per_row=2 * trials)
    common = dict(cases=holdout, trials=trials, engine=engine, grader=grader, instructions=instructions,
                  max_tokens=max_tokens, temperature=temperature, seed=seed, max_usd=max_usd, split="holdout",
                  progress=progress)
    live_res = evaluate_cases(workspace, machine, model=live_base, checkpoint=live_ckpt, name=f"live {live['id']}",
                             sampling_client=live_client, out=None if out is None else out / "live.json", **common)
    cand_res = evaluate_cases(workspace, machine, model=base, checkpoint=str(checkpoint), name="candidate",
                             sampling_client=cand_client, out=None if out is None else out / "candidate.json",
                             **common)
    report = build_report(machine, live_res, cand_res, trained_on_holdout=trained_on)
    passed, reason = gate.decide(report)
    result = Candidate(workspace=workspace, machine=machine, checkpoint=str(checkpoint), base_model=base,
                       engine=engine, live_version=dict(live), report=report, gate=gate, passed=passed, reason=reason,
                       instructions=instructions)
    if out is not None:
        from ..core.jsonl import atomic_write_text

        try:
            atomic_write_text(out / "report.json", json.dumps(
                {**report.to_dict(), "candidate": result.id, "checkpoint": result.checkpoint, "base_model": base,
                 "machine": machine, "live_version": live["id"], "gate": result.to_dict()["gate"],
                 "passed": passed, "reason": reason}, ensure_ascii=False, indent=1, default=str) + "\n")
        except OSError as exc:  # a full disk, a folder made read-only meanwhile: the measured candidate is kept
            import warnings

            from ..errors import user_stacklevel

            warnings.warn(f"{out / 'report.json'}: the report could not be written ({exc.strerror or exc}); the "
                          "candidate is returned (json.dump(candidate.to_dict(), open(PATH, 'w')) writes it)",
                          stacklevel=user_stacklevel())
    return result


__all__ = ["candidate", "Candidate", "CandidateReport", "Gate", "CommitRefused", "CommitConflict", "revert"]
