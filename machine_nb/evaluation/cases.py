"""A machine's cases as an eval: `machines/<name>/cases.json` (what training learns from) and
`holdout.json` (never shown to a trainer), run through the machine's instructions on an engine and
scored. Sampling and scoring are `evaluate.evaluate`'s; whether a candidate may replace the live
version is decided in `candidate.py`, from two of these results.

Machine's case format (what its case loader accepts): a non-empty JSON array of strings or
`{input, files?}` objects.
A case may also declare how a reply is scored, as an eval row does: `expected` (the answer) and
`match` (`exact` by default; `prefix`, `contains`, `regex`, `number`), optionally `format` (a regex
the reply's shape should fully match). Those three keys are this project's; Machine's validation
ignores them. A case without `expected` is scored by a grader the caller passes.

The machine's versions (`versions.json`, which version is live and what it runs) are read here
too: an eval of "the machine" means its live version.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MachineFormatError

if TYPE_CHECKING:
    import pandas as pd

    from .results import EvalResult

SPLITS = {"cases": "cases.json", "holdout": "holdout.json"}

CASE_COLUMNS = ["case", "input", "files", "expected", "match", "format", "split", "path"]
"""Columns of `load_cases`: case (0-based position in the file), input, files (`{path: text}` or
None), expected / match / format (the case's eval rule; None when it declares none), split
("cases" | "holdout"), path (the file)."""

CASE_RESULT_COLUMNS = ["row", "case", "trial", "input", "prompt", "expected", "match", "output", "correct",
                       "format_ok", "prompt_tokens", "output_tokens", "latency_s", "stop_reason", "error"]
"""Columns of `evaluate_cases`: row (0-based, case-major: case × trials + trial), case, trial
(0-based), input and prompt (the case's input text), expected / match (the rule; match "grader"
and expected None for grader-scored cases), then evaluate()'s columns (output, correct, format_ok,
prompt_tokens, output_tokens, latency_s, stop_reason, error)."""

#: A version id: "v" and a number (Machine numbers its versions v1, v2, …).
VERSION_ID = re.compile(r"v[1-9][0-9]{0,8}")
#: The versions.json key of a committed entry naming the version that was live before it (ours).
PREVIOUS_LIVE = "previousLive"

# `(case, reply) -> bool` (or a score, correct at >= 1): scores a case that declares no expected answer.
Grader = Callable[[dict, str], Any]


def machine_path(workspace: str | os.PathLike, machine: str) -> Path:
    """A machine's definition directory, `<workspace>/machines/<name>/`.

    Args:
        workspace: the workspace root (holding `machines/`).
        machine: the machine's name ("tutor", "chatbot/triage").

    Returns:
        The directory.

    Raises:
        MachineFormatError: no such machine, naming the machines found.
    """
    from ..store.workspace import list_machines, name_segments, workspace_root

    d = workspace_root(workspace) / "machines" / Path(*name_segments(machine, "machine name"))
    if not d.is_dir():
        known = ", ".join(list_machines(workspace)) or "none"
        raise MachineFormatError(d, f"no machine {machine!r} in this workspace (machines found: {known})")
    return d


def _check_rule(case: dict, i: int, path: Path) -> dict:
    """The case's eval rule {expected, match, format}, checked as evaluate checks an eval row; a
    case whose input is empty (or only whitespace) is refused: the model would answer nothing."""
    from ..core.chat import check_row

    if not case["input"].strip():
        raise MachineFormatError(path, f"case {i + 1} has an empty input: give it the text the machine is asked, "
                                       "or remove it", field=f"[{i}].input")
    if "expected" not in case or case["expected"] is None:
        for key in ("match", "format"):
            if case.get(key) is not None:
                raise MachineFormatError(path, f'case {i + 1} has "{key}" but no "expected" answer to score against',
                                         field=f"[{i}].expected")
        return {"expected": None, "match": None, "format": None}
    try:
        row = check_row({"messages": [{"role": "user", "content": case["input"]}], "expected": case["expected"],
                         **{k: case[k] for k in ("match", "format") if case.get(k) is not None}})
    except MachineFormatError as exc:
        raise MachineFormatError(path, f"case {i + 1}: {exc.reason}", field=f"[{i}].{exc.field}") from None
    return {"expected": row["expected"], "match": row["match"], "format": row["format"]}


def load_cases(workspace: str | os.PathLike, machine: str, split: str = "cases") -> pd.DataFrame:
    """A machine's cases (`split="cases"`, cases.json) or held-out cases (`"holdout"`, holdout.json).

    Args:
        workspace: the workspace root (holding `machines/`).
        machine: the machine's name ("tutor", "chatbot/triage").
        split: "cases" (default: what training learns from) or "holdout".

    Returns:
        A DataFrame with CASE_COLUMNS, one row per case, in file order.

    Raises:
        MachineFormatError: naming the file (and the case and field) when the file is missing,
            is not a non-empty JSON array of cases (Machine's wording: "holdout.json must be a
            non-empty JSON array of cases."), or a case's files or eval rule are malformed.
        ValueError: an unknown split.
    """
    import pandas as pd

    from ..store.workspace import read_cases

    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    path = machine_path(workspace, machine) / SPLITS[split]
    if not path.exists():
        raise MachineFormatError(path, f"file not found: machine {machine!r} has no "
                                       f"{'held-out cases' if split == 'holdout' else 'cases'} ({SPLITS[split]})")
    rows = []
    cases = read_cases(path)
    for i, case in enumerate(cases):
        rule = _check_rule(case, i, path)
        rows.append({"case": i, "input": case["input"], "files": case.get("files"), **rule, "split": split,
                     "path": str(path)})
    other = path.with_name(SPLITS["holdout" if split == "cases" else "cases"])
    if other.exists():
        try:
            other_cases = read_cases(other)
        except MachineFormatError:
            other_cases = []  # reported when that file is loaded
        warn_holdout_in_cases(*((path, cases, other, other_cases) if split == "cases" else
                                (other, other_cases, path, cases)))
    # object columns keep None for a case without a rule (a string column would turn it into NaN)
    return pd.DataFrame(rows, columns=CASE_COLUMNS, dtype=object).astype({"case": int})


class HoldoutInCases(UserWarning):
    """A held-out case (holdout.json) is also in cases.json, what training learns from."""


def warn_holdout_in_cases(cases_path: Path, cases: list[dict], holdout_path: Path, holdout: list[dict]) -> None:
    """One HoldoutInCases warning naming each cases.json case that is a held-out case too.

    Inputs are compared as export.case_key compares them (whitespace collapsed, case ignored),
    as training data is kept apart from held-out cases.

    Args:
        cases_path / cases: cases.json and its cases (read_cases).
        holdout_path / holdout: holdout.json and its cases.
    """
    import warnings

    from ..errors import user_stacklevel
    from ..data.export import case_key

    held = {}
    for j, case in enumerate(holdout):
        held.setdefault(case_key(case["input"]), j)
    both = [(i, held[case_key(c["input"])]) for i, c in enumerate(cases) if case_key(c["input"]) in held]
    if not both:
        return
    listed = ", ".join(f"case {i + 1} (held-out case {j + 1})" for i, j in both[:10])
    more = f" and {len(both) - 10} more" if len(both) > 10 else ""
    warnings.warn(HoldoutInCases(
        f"{cases_path}: {len(both)} case(s) are also held-out cases in {holdout_path.name}: {listed}{more}. "
        "A held-out case is never shown to a trainer, and a score on it measures nothing if it is trained on: "
        f"remove them from {cases_path.name}."), stacklevel=user_stacklevel())


# ---------------------------------------------------------------------------------------------
# versions


def read_versions(workspace: str | os.PathLike, machine: str) -> list[dict]:
    """The machine's `versions.json`: a non-empty JSON array of version objects, oldest first.

    Args:
        workspace: the workspace root.
        machine: the machine's name.

    Returns:
        The entries as dicts. Each has a string `id` (unique, VERSION_ID: "v" and a number) and a
        string `model`; `instructions`, `baseModel` and `previousLive` (an id of the file) are
        strings, `source` an object and `live` a boolean when present.

    Raises:
        MachineFormatError: naming the file, entry and field (a missing file says the machine has
            no recorded versions).
    """
    from ..store.workspace import read_json

    path = machine_path(workspace, machine) / "versions.json"
    if not path.exists():
        raise MachineFormatError(path, f"file not found: machine {machine!r} has no recorded versions (Machine "
                                       "writes versions.json when a machine gets its first version)")
    versions = read_json(path)
    if not isinstance(versions, list) or not versions:
        raise MachineFormatError(path, "versions.json must be a non-empty JSON array of versions.")
    seen: set[str] = set()
    for i, v in enumerate(versions):
        if not isinstance(v, dict):
            raise MachineFormatError(path, f"version {i + 1} must be an object, got {type(v).__name__}", field=f"[{i}]")
        if not isinstance(v.get("id"), str) or not v["id"]:
            raise MachineFormatError(path, f"version {i + 1} needs a string id (\"v1\", \"v2\", …)", field=f"[{i}].id")
        if not VERSION_ID.fullmatch(v["id"]):
            raise MachineFormatError(path, f"version {i + 1} has id {v['id'][:20]!r}{'…' if len(v['id']) > 20 else ''}: "
                                           "version ids are \"v\" and a number (v1, v2, … up to 9 digits); fix the "
                                           "entry by hand", field=f"[{i}].id")
        if v["id"] in seen:
            raise MachineFormatError(path, f"version id {v['id']!r} appears twice", field=f"[{i}].id")
        seen.add(v["id"])
        if not isinstance(v.get("model"), str) or not v["model"]:
            raise MachineFormatError(path, f"version {v['id']} needs a string model", field=f"[{i}].model")
        for key in ("instructions", "baseModel", PREVIOUS_LIVE):
            if v.get(key) is not None and not isinstance(v[key], str):
                raise MachineFormatError(path, f"version {v['id']}: expected a string, got {type(v[key]).__name__}",
                                         field=f"[{i}].{key}")
        if v.get("source") is not None and not isinstance(v["source"], dict):
            raise MachineFormatError(path, f"version {v['id']}: source must be an object such as "
                                           f"{{\"kind\": \"initial\"}}, got {type(v['source']).__name__}",
                                     field=f"[{i}].source")
        if v.get("live") is not None and not isinstance(v["live"], bool):
            raise MachineFormatError(path, f"version {v['id']}: live must be true or false, got "
                                           f"{type(v['live']).__name__}", field=f"[{i}].live")
    for i, v in enumerate(versions):
        before = v.get(PREVIOUS_LIVE)
        if before is not None and (before not in seen or before == v["id"]):
            raise MachineFormatError(path, f"version {v['id']} says {before!r} was live before it, but "
                                           + ("that is itself" if before == v["id"] else "there is no such version"),
                                     field=f"[{i}].{PREVIOUS_LIVE}")
    return versions


def previous_live_index(versions: list[dict]) -> int | None:
    """Which version was live before the live one: where `revert` goes back to.

    A committed entry records the version live when it was committed (`previousLive`), so
    reverting twice walks back through what was live, never to a version already rolled back
    (v2 committed, reverted, v3 committed: reverting v3 brings back v1). An entry without it
    (written by hand, or by Machine) steps back to the entry before it in the file.

    Args:
        versions: read_versions' entries, oldest first.

    Returns:
        The index of that version, or None when the live one is the first.
    """
    i = live_index(versions)
    before = versions[i].get(PREVIOUS_LIVE)
    if before is not None:
        return next(k for k, v in enumerate(versions) if v["id"] == before)
    return i - 1 if i > 0 else None


def live_index(versions: list[dict]) -> int:
    """Which version is live.

    Args:
        versions: read_versions' entries, oldest first.

    Returns:
        The index of the newest entry marked `"live": true`, else of the last entry.
    """
    for i in range(len(versions) - 1, -1, -1):
        if versions[i].get("live") is True:
            return i
    return len(versions) - 1


def is_checkpoint(model: str) -> bool:
    """Whether a version's model is a sampler checkpoint path rather than a model name.

    Args:
        model: a version's `model`.

    Returns:
        True for a checkpoint path (`tinker://…`).
    """
    return "://" in str(model)


def live_version(workspace: str | os.PathLike, machine: str) -> dict:
    """The machine's live version.

    Args:
        workspace: the workspace root.
        machine: the machine's name.

    Returns:
        Its versions.json entry (see read_versions and live_index).
    """
    versions = read_versions(workspace, machine)
    return versions[live_index(versions)]


# ---------------------------------------------------------------------------------------------
# running cases


def _check_case_numbers(records: list[dict], path: str | None) -> None:
    """Refuse two cases under one number: results, compare()'s clustering and case_accuracy would
    take them for trials of one case. load_cases numbers each file from 0, so a frame of both
    splits (pd.concat) reuses every number."""
    from collections import Counter

    counts = Counter(int(c.get("case", i)) for i, c in enumerate(records))
    reused = [(k, n) for k, n in counts.items() if n > 1]
    if reused:
        listed = ", ".join(f"case {k} is given {n} times" for k, n in reused[:5])
        more = f" and {len(reused) - 5} more numbers" if len(reused) > 5 else ""
        raise MachineFormatError(path, f"{listed}{more}: each case needs its own number, or its trials and "
                                       "scores merge with another case's; renumber them (a frame: "
                                       "cases.assign(case=range(len(cases))))", field="case")


def _case_records(cases: Any, workspace: Any, machine: str, split: str) -> tuple[list[dict], str | None]:
    """Case dicts (input, expected, match, format, …) and the file they came from (None in memory)."""
    if cases is None:
        cases = load_cases(workspace, machine, split)
    if hasattr(cases, "to_dict") and hasattr(cases, "columns"):
        # a frame stores a missing rule as NaN where the column also holds strings
        records = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                   for r in cases.to_dict("records")]
        path = cases["path"].iloc[0] if "path" in cases and len(cases) else None
        _check_case_numbers(records, path)
        return records, path
    if isinstance(cases, (str, dict)):  # one case, as held_out_keys takes one
        cases = [cases]
    if isinstance(cases, (bytes, os.PathLike)) or not hasattr(cases, "__iter__"):
        way = ": read a file with load_cases(workspace, machine, split)" if isinstance(cases, os.PathLike) else ""
        raise MachineFormatError(None, "cases must be a list of case strings or {input, expected?, match?} objects, "
                                       f"or a load_cases frame, not a {type(cases).__name__}{way}")
    out = []
    for i, c in enumerate(cases):
        case = {"input": c} if isinstance(c, str) else dict(c) if isinstance(c, dict) else {}
        if not isinstance(case.get("input"), str):
            raise MachineFormatError(None, f"case {i + 1} must be a string or an object with a string \"input\".",
                                     field=f"[{i}].input")
        out.append({"case": i, **case, **_check_rule(case, i, Path("<cases>"))})
    if not out:
        raise MachineFormatError(None, "no cases given")
    _check_case_numbers(out, None)
    return out, None


def check_grader(cases: Any, grader: Grader | None, path: str | None = None, *,
                 way_out: str = "pass grader=(case, reply) -> bool") -> None:
    """Refuse cases that declare no expected answer when no grader is given to score them.

    Args:
        cases: case dicts (each with "case" and "expected"), or a load_cases frame.
        grader: the grader evaluate_cases would be given (None: none).
        path: the file the cases came from (default None: the frame's `path`, else "<cases>").
        way_out: what the message tells the caller to do (default: pass a grader).

    Raises:
        MachineFormatError: naming the file, the first such case and how many there are.
        TypeError: a grader that cannot be called (a match mode's name, say): every reply would
            fail to be graded, once sampled.
    """
    if grader is not None:
        if not callable(grader):
            raise TypeError(f"grader must be a function (case, reply) -> bool, not {type(grader).__name__}: a case "
                            "scored by a match mode declares it in its \"match\" with an \"expected\" answer")
        return
    if hasattr(cases, "to_dict") and hasattr(cases, "columns"):
        if path is None and "path" in cases and len(cases):
            path = cases["path"].iloc[0]
        cases = cases.to_dict("records")
    unscored = [c for c in cases if c.get("expected") is None or (isinstance(c["expected"], float)
                                                                   and c["expected"] != c["expected"])]
    if unscored:
        raise MachineFormatError(path or "<cases>", f"case {int(unscored[0]['case']) + 1} declares no expected answer "
                                                    f"({len(unscored)} of {len(cases)} do not): {way_out}",
                                 field=f"[{int(unscored[0]['case'])}].expected")


def _grade(grader: Grader, case: dict, reply: str) -> tuple[bool, str | None]:
    """A grader's verdict on one reply: (correct, None), or (False, why) when the grader raised or
    returned something that is neither true/false nor a number. A bad verdict is that row's error
    rather than an exception, so the replies already sampled (and paid for) are kept. The reason
    is redacted: a grader that calls a judge may fail with its key in the message."""
    import math
    import numbers

    import numpy as np

    from ..core.redact import redacted

    try:
        value = grader(case, reply)
    except Exception as exc:  # the grader's own bug or a reply it cannot parse
        return False, redacted(f"grader raised {type(exc).__name__}: {exc}")
    if isinstance(value, (bool, np.bool_)):  # numpy's bool is not a numbers.Real
        return bool(value), None
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return value >= 1, None  # a score: full marks count as correct, as a scorecard total of 1 does
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:60] + "…"
    return False, redacted(f"grader returned {shown} ({type(value).__name__}): return True/False, or a finite "
                           "score (1 or more counts as correct)")


def check_trials(trials: Any) -> int:
    """Refuse a trial count that is not a whole number of at least 1 (1.5 would run 1, "2" is text).

    Args:
        trials: samples per case.

    Returns:
        It, as an int.

    Raises:
        ValueError: naming the value.
    """
    import numbers

    if isinstance(trials, bool) or not isinstance(trials, numbers.Integral) or trials < 1:
        raise ValueError(f"trials must be at least 1, a whole number, not {trials!r}")
    return int(trials)


def evaluate_cases(workspace: str | os.PathLike, machine: str, model: str | None = None,
                   checkpoint: str | None = None, *, split: str = "holdout", cases: Any = None, trials: int = 1,
                   engine: str | None = None, grader: Grader | None = None, instructions: str | None = None,
                   max_tokens: int = 32, temperature: float = 0.0, seed: int | None = 0,
                   concurrency: int | None = None, name: str | None = None, out: str | os.PathLike | None = None,
                   max_usd: float | None = None, sampling_client: Any = None, service_client: Any = None,
                   progress: bool | None = None) -> EvalResult:
    """Run a machine's cases through its instructions on an engine and score each reply.

    Each case becomes the prompt `[system: instructions, user: input]` and is sampled `trials`
    times through `machine_nb.evaluation.evaluate` (greedy by default, so trials agree; with temperature > 0
    trial t uses seed + t). A case is scored by its own eval rule (`expected` + `match`, see the
    module docstring); a case without one by `grader(case, reply)`.

    Args:
        workspace: the workspace root (holding `machines/`).
        machine: the machine's name.
        model: the base model (its renderer formats prompts). Default None: the live version's
            (`versions.json`; its `baseModel` when the live model is a checkpoint).
        checkpoint: a sampler path to run instead of the base model. Default None: when `model`
            is None too, the live version's checkpoint if it runs one, else the base model.
        split: "holdout" (default: the cases no trainer sees) or "cases".
        cases: a list of case strings/dicts or a load_cases frame to run instead of the file; a
            single string or dict is one case (default None: the file's).
        trials: samples per case, a whole number (default 1).
        engine: "local" | "tinker"; default the model's own (local for local/… and tinker://local-…).
        grader: `(case dict, reply text) -> bool` (a finite number counts as correct at >= 1) for
            cases that declare no expected answer; when it raises or returns anything else, that
            row records why in `error` and counts as wrong (with a warning). Default None: such a
            case is an error.
        instructions: the system prompt. Default None: the live version's instructions, else
            instructions.md; "" sends none.
        max_tokens, temperature, seed, concurrency, max_usd: as in `evaluate` (defaults 32, 0.0
            greedy, 0, the engine's, no budget); max_usd bounds all trials together, checked
            before the first.
        name: the results' label (default "live <version id>" or the checkpoint's last segment).
        out: write the results JSON (evaluate's schema, rows carrying case and trial) here.
            Default None: nothing is written. A write that fails (a full disk, a read-only
            folder) is a warning: the results are returned unsaved, with `path` None.
        sampling_client / service_client: seams (default: the engine's own; one sampler is
            opened and reused for every trial).
        progress: evaluate's progress bar per trial. Default None: on in a kernel or terminal
            unless MACHINE_NB_PROGRESS=0.

    Returns:
        An EvalResult: `rows` with CASE_RESULT_COLUMNS, `summary` the results JSON without its
        rows (name, model, checkpoint, engine, machine, split, trials, version, n_cases, n,
        correct, accuracy, case_accuracy, errors, tokens, cost, times), `path` the file written
        (None when out is None).

    Raises:
        MachineFormatError: a missing or malformed definition file, `cases` that is not a list
            of cases (a path, bytes), or a case without an expected answer and no grader.
        ValueError: trials is not a whole number of at least 1.
        BudgetExceeded: on Tinker, the estimate for every trial is over max_usd (nothing sampled).
    """
    import pandas as pd

    from .evaluate import evaluate
    from .results import EvalResult, file_sha256, results_name, utc_now

    trials = check_trials(trials)
    records, cases_path = _case_records(cases, workspace, machine, split)
    check_grader(records, grader, cases_path)
    live = None
    if model is None or instructions is None:
        try:
            live = live_version(workspace, machine)
        except MachineFormatError:
            if model is None and checkpoint is None:
                raise
    if model is None:
        if checkpoint is None and live is not None and is_checkpoint(live["model"]):
            checkpoint = live["model"]
            model = live.get("baseModel")
        elif checkpoint is None and live is not None:
            model = live["model"]
    if instructions is None:
        if live is not None and isinstance(live.get("instructions"), str):
            instructions = live["instructions"]
        else:  # without an editor's byte-order mark; text that is not UTF-8 named
            from ..store.workspace import read_instructions

            instructions = read_instructions(machine_path(workspace, machine)) or ""
    if engine is None:
        from ..engines import engine_for

        engine = engine_for(str(checkpoint or model))
    if sampling_client is None:
        from .sampling import SamplerTarget, open_sampler  # the SDK's client itself (not its future), errors explained

        sampling_client = open_sampler(SamplerTarget(model, str(checkpoint) if checkpoint else None, engine),
                                       service_client)
    if model is None:  # a checkpoint's base model: its renderer formats the prompts
        model = sampling_client.get_base_model()
    label = name or (results_name(checkpoint) if checkpoint else f"live {live['id']}" if live else "baseline")

    system = [{"role": "system", "content": instructions}] if instructions else []
    rows = [{"messages": system + [{"role": "user", "content": c["input"]}],
             "expected": c["expected"] if c.get("expected") is not None else "(?s).*",
             "match": (c.get("match") or "exact") if c.get("expected") is not None else "regex",
             **({"format": c["format"]} if c.get("format") else {})} for c in records]
    if max_usd is not None and engine == "tinker":  # every trial against the one budget, before the first
        from ..checks.pricing import estimate_eval_cost

        estimate_eval_cost(rows, model, max_tokens=int(max_tokens), max_usd=max_usd, samples_per_row=trials)
    started, t0 = utc_now(), time.perf_counter()
    trial_results = []
    for t in range(trials):
        trial_results.append(evaluate(rows, model=model, checkpoint=checkpoint, engine=engine,
                                      max_tokens=max_tokens, temperature=temperature,
                                      seed=None if seed is None else seed + t, concurrency=concurrency, save=False,
                                      name=label, max_usd=max_usd, sampling_client=sampling_client,
                                      progress=progress))
    wall = time.perf_counter() - t0

    out_rows, grader_errors = [], []
    for ci, case in enumerate(records):
        for t, res in enumerate(trial_results):
            r = res.rows.iloc[ci]
            graded = case.get("expected") is None
            failed = isinstance(r["error"], str)
            correct = bool(r["correct"])
            if graded and not failed:
                correct, why = _grade(grader, case, r["output"])
                if why is not None:
                    failed = True
                    r = {**r.to_dict(), "error": why}
                    grader_errors.append((len(out_rows), why))
            elif graded:
                correct = False
            out_rows.append({
                "row": len(out_rows), "case": int(case.get("case", ci)), "trial": t, "input": case["input"],
                "prompt": case["input"], "expected": None if graded else case["expected"],
                "match": "grader" if graded else r["match"], "output": r["output"], "correct": bool(correct),
                "format_ok": _present(r["format_ok"]), "prompt_tokens": int(r["prompt_tokens"]),
                "output_tokens": int(r["output_tokens"]), "latency_s": float(r["latency_s"]),
                "stop_reason": _present(r["stop_reason"]), "error": r["error"] if failed else None})
    if grader_errors:
        import warnings

        from ..errors import user_stacklevel

        listed = "\n".join(f"  row {i}: {why}" for i, why in grader_errors[:10])
        warnings.warn(f"{len(grader_errors)} of {len(out_rows)} reply(ies) could not be graded and count as wrong "
                      f"(their error says why; fix the grader):\n{listed}", stacklevel=user_stacklevel())
    result = pd.DataFrame(out_rows, columns=CASE_RESULT_COLUMNS)
    per_case = result.groupby("case", sort=False)["correct"].mean()
    costs = [r.summary["cost"] for r in trial_results]
    usd = None if any(c.get("usd") is None for c in costs) else round(sum(c["usd"] for c in costs), 9)
    first = trial_results[0].summary
    summary = {
        "name": label, "model": model, "checkpoint": checkpoint, "engine": engine, "renderer": first["renderer"],
        "machine": machine, "split": split, "trials": int(trials), "version": None if live is None else live["id"],
        "instructions_sha256": hashlib.sha256(instructions.encode("utf-8")).hexdigest(),
        "parameters": {**first["parameters"], "seed": seed},
        "data": {"path": cases_path, "sha256": file_sha256(cases_path)},
        "n_cases": len(records), "n": len(result), "correct": int(result["correct"].sum()),
        "accuracy": float(result["correct"].mean()), "case_accuracy": float(per_case.mean()),
        "errors": int(sum(isinstance(e, str) for e in result["error"])),
        "prompt_tokens": int(result["prompt_tokens"].sum()), "output_tokens": int(result["output_tokens"].sum()),
        "cost": {"usd": usd, "source": costs[0].get("source")},
        "started_at": started, "finished_at": utc_now(), "wall_s": round(wall, 3),
    }
    path = None
    if out is not None:
        from .results import write_results

        prompt_of = {int(c.get("case", i)): rows[i]["messages"] for i, c in enumerate(records)}
        per_row = [{**rec, "messages": prompt_of[rec["case"]]} for rec in out_rows]
        path = write_results(out, summary, per_row)  # None, warned, when it cannot be written
    return EvalResult(result, summary, path)


def _present(value: Any) -> Any:
    """A frame's missing value (NaN, where the column also holds strings) as None, so the results
    JSON stays strict JSON."""
    return None if isinstance(value, float) and value != value else value


__all__ = ["load_cases", "evaluate_cases", "read_versions", "live_version", "previous_live_index", "HoldoutInCases",
           "CASE_COLUMNS", "CASE_RESULT_COLUMNS"]
