"""Which runs are worth training on: Machine's `selectRuns` over a load_runs DataFrame. Turning
the selected runs into training lines is `export.training_lines`.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .export import held_out_keys, case_key, one_or_many, run_case, run_records, say_excluded
from ..store.workspace import resolve_machine

if TYPE_CHECKING:
    import pandas as pd

_UNSET: Any = object()


def _candidates(runs: Any, machine: str, min_score: float, rubric: str | None, models: set | None) -> list[int] | None:
    """Positions of the rows the frame's own columns do not already rule out (machine, harness,
    score, rubric, final, model), so only their records are read: on an indexed frame of a million
    runs each record is a file. None for a list of records (nothing to pre-filter on)."""
    if not hasattr(runs, "columns"):
        return None
    import numpy as np

    keep = np.ones(len(runs), dtype=bool)
    if "machine" in runs:
        keep &= (runs["machine"] == machine).to_numpy(dtype=bool, na_value=False)
    if "harness" in runs:
        keep &= (runs["harness"] != "echo").to_numpy(dtype=bool, na_value=True)
    if "score" in runs:
        keep &= (runs["score"] >= min_score).to_numpy(dtype=bool, na_value=False)
    if rubric is not None and "rubric" in runs:
        keep &= (runs["rubric"] == rubric).to_numpy(dtype=bool, na_value=False)
    if "final" in runs:
        keep &= (runs["final"] != False).to_numpy(dtype=bool, na_value=True)  # noqa: E712 - NA keeps
    if models is not None and "model" in runs:
        keep &= runs["model"].isin(models).to_numpy(dtype=bool, na_value=False)
    return [int(i) for i in np.flatnonzero(keep)]


def select_runs(runs: Any, machine: dict | str, *, rubric: str | None = _UNSET,
                instructions: str | None = _UNSET, min_score: float = 1, best_of: int = 2,
                exclude: Iterable[Any] | None = None, models: Iterable[str] | None = None,
                workspace: str | os.PathLike | None = None) -> pd.DataFrame | list[dict]:
    """Graded runs worth training on, by Machine's selectRuns: scored under the current rubric, at
    least min_score, the best few per case.

    Always left out: other machines' runs, the `echo` harness, unscored runs (a total that is not
    a number, or NaN), non-final turns of a conversation, and a second listing of the same run
    (machine and id: a frame concatenated with itself counts each run once).

    Args:
        runs: a load_runs DataFrame (or Run dicts).
        machine: a name (its definition read with store.workspace.resolve_machine from
            `workspace`, else the workspace the runs were loaded from; a machine without a
            checked-in definition is known by name only) or a definition dict (`name`, `rubric`,
            `instructions`, `tools`, `holdout`, as load_machine returns).
        rubric: the rubric fingerprint runs must be scored under; default: the machine's. None
            keeps runs under any rubric (only when you know the rubric did not change).
        instructions: runs that recorded other instructions are left out (not, say, an optimizer's
            rewrite); default: the machine's; None disables the check.
        min_score: lowest scorecard total to train on. Default 1: only runs that met every criterion.
        best_of: keep at most this many runs per case, best first (then newest). Default 2.
        exclude: cases never to train on, matched against a run's case and its input (strings, or
            `{input}` case dicts, or one of them; compared as `export.case_key` does: whitespace
            and case aside).
            Default None: the machine's holdout cases (holdout.json is never shown to a trainer);
            `()` excludes nothing. Runs left out this way are counted in one HeldOutExcluded warning.
        models: only runs by these models (or this one model), when given (e.g. the live model,
            for rejection sampling).
        workspace: where a machine given by name is defined (default None: the runs' workspace).

    Returns:
        The kept rows of `runs` (the same columns), grouped by case in order of first appearance,
        best first then newest (higher id) in each; a list of records for a list. `training_lines`
        resolves the same definition itself (pass it the same `machine` and `workspace`).

    Raises:
        ValueError: no rubric fingerprint is known (pass rubric=), a definition dict without a name,
            a min_score that is not a number (or NaN), or a best_of that is not a whole number, 1 or more.
    """
    if isinstance(machine, dict) and not isinstance(machine.get("name"), str):
        raise ValueError("a machine definition dict needs a 'name'")
    if isinstance(min_score, bool) or not isinstance(min_score, numbers.Real) or min_score != min_score:
        raise ValueError(f"min_score must be a number (the lowest scorecard total to train on), got {min_score!r}")
    if isinstance(best_of, bool) or not isinstance(best_of, numbers.Integral) or best_of < 1:
        raise ValueError(f"best_of must be a whole number, 1 or more (the runs kept per case), got {best_of!r}")
    mdef = resolve_machine(machine, workspace, runs=runs, undefined="name")
    fp = mdef.get("rubric") if rubric is _UNSET else rubric
    if rubric is _UNSET and fp is None:
        raise ValueError(f"no rubric fingerprint known for machine {mdef['name']!r}: pass rubric='<fingerprint>' "
                         "(the scorecard.rubric value to train on), or rubric=None to accept any rubric")
    want_instructions = mdef.get("instructions") if instructions is _UNSET else instructions
    source = f"{mdef['name']}'s holdout.json" if exclude is None else "the exclude list"
    if exclude is None:
        exclude = mdef.get("holdout") or []
    excluded = held_out_keys(exclude)
    n_excluded = 0
    model_set = set(one_or_many(models)) if models is not None else None

    groups: dict[str, list[tuple[float, str, int]]] = {}
    seen: set[tuple[Any, Any]] = set()  # (machine, id): a run listed twice is one run
    positions = _candidates(runs, mdef["name"], min_score, fp, model_set)
    records = run_records(runs.iloc[positions] if positions is not None else runs)
    for pos, run in zip(positions if positions is not None else range(len(records)), records):
        card = run.get("scorecard")
        if run.get("machine") != mdef["name"] or run.get("harness") == "echo" or not isinstance(card, dict):
            continue
        conv = run.get("conversation")
        if isinstance(conv, dict) and not conv.get("final"):
            continue
        total = card.get("total")
        # a bool is no score (as check_run has it), and NaN compares false with everything
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not total >= min_score:
            continue
        if fp is not None and card.get("rubric") != fp:
            continue
        if model_set is not None and run.get("model") not in model_set:
            continue
        if want_instructions is not None and run.get("instructions") is not None \
                and run["instructions"] != want_instructions:
            continue
        key = (run.get("machine"), run.get("id"))
        if key[1] is not None:
            if key in seen:
                continue
            seen.add(key)
        case = run_case(run)  # held-out last, so the warning counts runs that would otherwise be kept
        if excluded and (case_key(case) in excluded or case_key(run.get("input") or "") in excluded):
            n_excluded += 1
            continue
        groups.setdefault(case, []).append((total, run.get("id") or "", pos))
    say_excluded(n_excluded, n_excluded + sum(len(g) for g in groups.values()), "run(s)", source)
    keep: list[int] = []
    for group in groups.values():
        group.sort(key=lambda t: (t[0], t[1]), reverse=True)
        keep.extend(pos for _, _, pos in group[:best_of])
    if hasattr(runs, "columns"):
        return runs.iloc[keep].reset_index(drop=True)
    return [records[i] for i in keep]  # a list of records: positions are the records' own
