"""Preference pairs from what a team already said: a prompt with a chosen and a rejected reply.

Sources: a rewrite row (`/good --as`: the rewrite over the reply it replaced), a `/bad` row and a
`/good` row of the same conversation, runs of the same case whose scores differ by at least
`min_gap`, and eval results (the expected answer over the model's own wrong one). Held-out cases
are left out as `export.tagged_lines` leaves them out of SFT. Written out, pairs are
tinker-cookbook's comparison JSONL (what `preference.dpo` trains on) or TRL's conversational
preference format. Training on them is preference.py's.

pandas is imported at module level: every public function here returns a frame (`import
machine_nb` still loads none of this module).
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import MachineFormatError, user_stacklevel
from ..data.export import case_key, held_out_keys, run_case, say_excluded, tag_rows
# pair records and files are the store layer's (pricing reads pairs too)
from ..store.pairs import (FORMATS, PAIR_COLUMNS, canonical_json, checked_pair, comparison_line, has_text, is_reply,
                          last_user, pair_id, pair_line, pair_message, pair_record, pair_records, read_pair_records,
                          reply_key)
from ..store.tags import REPLACED as REPLACED_KEY  # the tag-row key holding the reply a rewrite replaced
from ..store.workspace import resolve_machine

#: Where pairs come from, in the order they are built (a duplicate keeps the first source's row).
SOURCES = ("rewrite", "tags", "scores")

# Skip reasons (`PreferencePairs.skipped`), one phrase each.
OTHER_MACHINE = "another machine"
NO_REPLY = "no assistant reply"
REPLACED_UNKNOWN = "rewrite whose replaced reply is unknown (no 'replaced' key, no tagged run to rebuild it from)"
TURN_DIFFERS = "rewrite whose tagged run no longer holds the tagged turn"
UNANSWERED = "rewrite of a turn that had no reply (nothing it replaced)"
NOT_OBJECT = "a message that is not an object"
NO_PROMPT = "no prompt text"
IDENTICAL = "identical completions"
TIE = "tie (equal scores)"
SMALL_GAP = "score gap below min_gap"
UNSCORED = "unscored run"
NOT_FINITE = "score not a finite number"
DUPLICATE = "duplicate pair"
CONTRADICTS = "contradicted by a pair the other way round"


class PairsSkipped(UserWarning):
    """Tag rows that should have made preference pairs and could not (each listed in `.skipped`)."""


class PreferencePairs(pd.DataFrame):
    """A pairs frame (PAIR_COLUMNS, one row per pair), plus what was left out and why.

    excluded: pair records left out because their input is a held-out case.
    skipped: `{"source", "id", "reason"}` dicts for rows, runs or pairs that gave no pair (ties,
    identical completions, duplicates, rewrites whose replaced reply is unknown, …).
    """

    _metadata = ["excluded", "skipped"]

    @property
    def _constructor(self):
        return PreferencePairs

    def skipped_counts(self) -> pd.Series:
        """How many were skipped for each reason.

        Returns:
            A Series: reason -> count, most first.
        """
        reasons = [s["reason"] for s in (getattr(self, "skipped", None) or [])]
        return pd.Series(reasons, dtype="object").value_counts().rename_axis("reason").rename("skipped")


#: Score differences at most this small are float rounding, not a judgement (totals are weighted
#: means in 0-1: 0.35 - 0.1 computes as 0.24999999999999997).
ROUNDING = 1e-9

# ---------------------------------------------------------------------------------------------
# messages


def split_reply(messages: list[dict]) -> tuple[list[dict], dict] | None:
    """A conversation split at its last assistant reply.

    A reply is an assistant message with text and no tool calls; what follows it is not part of
    the pair.

    Args:
        messages: chat messages.

    Returns:
        (the messages before the reply, the reply), both as pairs keep messages; None when there
        is no reply.
    """
    at = max((i for i, m in enumerate(messages) if is_reply(m)), default=-1)
    if at < 0:
        return None
    return [pair_message(m) for m in messages[:at]], pair_message(messages[at])


def _with_system(prompt: list[dict], system: str | None) -> list[dict]:
    if system and not (prompt and prompt[0].get("role") == "system"):
        return [{"role": "system", "content": system}] + prompt
    return prompt


# ---------------------------------------------------------------------------------------------
# inputs


def _tag_rows(store: Any) -> list[dict]:
    """The tag rows of a store, a frame or row dicts. A frame's rows (its `row` column, or its own
    rows) as core.chat.frame_rows reads them: one read back through pyarrow holds numpy arrays
    where the rows held lists, and None or NaN where a row lacked a key."""
    if store is None or isinstance(store, (str, os.PathLike)):
        from ..store.tags import tagged

        if store is not None and not Path(store).expanduser().exists():  # a path typed wrong, not an empty store
            raise MachineFormatError(Path(store).expanduser(), "no tag store here: check the path (or pass "
                                     "sources=['scores'] for score pairs alone, which read no store)")
        frame = tagged(store)
        return list(frame["row"])
    if isinstance(store, pd.DataFrame):
        return tag_rows(store)
    return [r for r in store]


def _run_id_of(row: dict) -> str | None:
    rid = row.get("run")
    if isinstance(rid, str) and rid:
        return rid
    src = row.get("source")
    return src[:-5] if isinstance(src, str) and src.endswith(".json") else None


def _run_records(runs: Any, workspace: Any, name: str | None) -> list[dict]:
    if runs is None:
        if workspace is None:
            return []
        from ..data.frames import load_runs

        runs = load_runs(workspace, name)
    from ..data.export import run_records

    records = run_records(runs)
    return [r for r in records if name is None or r.get("machine") == name]


# ---------------------------------------------------------------------------------------------
# the sources


class _Collector:
    """Pair records in order, with duplicates, contradictions and held-out inputs taken out."""

    def __init__(self, held: set[str]):
        self.held = held
        self.records: list[dict] = []
        self.excluded: list[dict] = []
        self.skipped: list[dict] = []
        self._seen: dict[tuple[str, str, str], int] = {}
        self._keys: set[tuple[str, str, str]] = set()  # every pair added, held-out ones included

    def skip(self, source: str, ident: Any, reason: str) -> None:
        self.skipped.append({"source": source, "id": ident, "reason": reason})

    @staticmethod
    def key(rec: dict) -> tuple[str, str, str]:
        """(prompt, chosen, rejected) as duplicates and contradictions are compared (reply_key)."""
        return (reply_key(canonical_json(rec["prompt"])), reply_key(rec["chosen"][0]["content"]),
                reply_key(rec["rejected"][0]["content"]))

    def add(self, rec: dict) -> None:
        ident = rec.get("chosen_tag") or rec.get("chosen_run") or rec["pair"]
        key = self.key(rec)
        if key[1] == key[2]:
            self.skip(rec["source"], ident, IDENTICAL)
            return
        if not has_text(rec["prompt"]):  # DPO refuses it: nothing the two replies answer
            self.skip(rec["source"], ident, NO_PROMPT)
            return
        if key in self._keys:  # before the held-out check: a held-out pair is left out (and counted) once
            self.skip(rec["source"], ident, DUPLICATE)
            return
        self._keys.add(key)
        if self.held and any(case_key(m["content"]) in self.held for m in rec["prompt"] if m.get("role") == "user"):
            self.excluded.append(rec)
            return
        self._seen[key] = len(self.records)
        self.records.append(rec)

    def result(self) -> list[dict]:
        """The records, less both sides of every contradiction (A over B and B over A)."""
        keys = set(self._seen)
        out = []
        for rec in self.records:
            k = self.key(rec)
            if (k[0], k[2], k[1]) in keys:
                self.skip(rec["source"], rec.get("chosen_tag") or rec["pair"], CONTRADICTS)
                continue
            out.append(rec)
        return out


class _RunLookup:
    """Runs by (machine, id), as tags match them (frames.attach_tags): run ids are unique within
    a machine only, so a row that names no machine (Machine's own) finds a run only when one
    machine alone has that id."""

    def __init__(self, runs: list[dict]):
        self.by_key = {(str(r.get("machine")), str(r.get("id"))): r for r in runs}
        by_id: dict[str, list[dict]] = {}
        for r in runs:
            by_id.setdefault(str(r.get("id")), []).append(r)
        self.unique = {rid: found[0] for rid, found in by_id.items() if len(found) == 1}

    def of(self, row: dict) -> dict | None:
        rid = _run_id_of(row)
        if rid is None:
            return None
        machine = row.get("machine")
        if isinstance(machine, str) and machine:
            return self.by_key.get((machine, rid))
        return self.unique.get(rid)


def _rebuilt_reply(row: dict, user: str, runs: _RunLookup) -> tuple[str | None, str | None]:
    """(the reply the rewrite replaced, the skip reason): read back from the tagged turn of the run.

    The tagged turn is the latest turn whose user text is the row's: a session goes on after a
    tag, so later turns may follow it.
    """
    from ..store.tags import extract_text, item_messages, latest_turn

    run = runs.of(row)
    if run is None:
        return None, REPLACED_UNKNOWN
    msgs, _ = item_messages(run)
    asked = [i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "user"]
    for n in reversed(range(len(asked))):
        start = asked[n]
        if extract_text(msgs[start].get("content")) != user.strip():
            continue
        end = asked[n + 1] if n + 1 < len(asked) else len(msgs)
        turn = [m for m in msgs[start:end] if isinstance(m, dict)]
        _, reply_i = latest_turn(turn, answered=False)
        if reply_i is None:
            return None, UNANSWERED
        return extract_text(turn[reply_i].get("content")), None
    return None, TURN_DIFFERS


def _from_tags(rows: list[dict], name: str | None, system: str | None, runs: _RunLookup,
               sources: set[str], out: _Collector) -> None:
    good: dict[str, list[tuple[dict, list[dict], dict]]] = {}
    bad: dict[str, list[tuple[dict, list[dict], dict]]] = {}
    unnamed = 0  # /good and /bad rows left out for naming no machine
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            continue
        if name is not None and row.get("machine") != name:
            # rows of other machines are not this machine's preferences (not counted); rows naming
            # none may be (Machine's own), so they are counted and said
            unnamed += row.get("machine") is None and row.get("tag") in ("good", "bad")
            continue
        machine = row.get("machine")
        if row.get("tag") not in ("good", "bad"):
            continue
        if not all(isinstance(m, dict) for m in row["messages"]):
            out.skip("tags", row.get("id"), NOT_OBJECT)
            continue
        split = split_reply(row["messages"])
        if split is None:
            out.skip("tags", row.get("id"), NO_REPLY)
            continue
        prompt, reply = split
        prompt = _with_system(prompt, system)
        entry = (row, prompt, reply)
        # one machine's replies only: another machine ran under other instructions than the turn shows
        key = canonical_json([machine, prompt])
        (good if row["tag"] == "good" else bad).setdefault(key, []).append(entry)
        if "rewrite" in sources and row["tag"] == "good" and row.get("rewritten") is True:
            replaced = row.get(REPLACED_KEY)
            reason = None
            if not isinstance(replaced, str) or not replaced.strip():  # a blank reply is no rejected completion
                replaced, reason = _rebuilt_reply(row, last_user(prompt), runs)
            if replaced is None:
                out.skip("rewrite", row.get("id"), reason or REPLACED_UNKNOWN)
                continue
            run = _run_id_of(row)
            out.add(pair_record("rewrite", row.get("machine"), prompt, reply,
                                {"role": "assistant", "content": replaced}, chosen_tag=row.get("id"),
                                rejected_tag=row.get("id"), chosen_run=run, rejected_run=run))
    if unnamed:
        warnings.warn(f"left out {unnamed} tag row(s) that name no machine (Machine's own /good and /bad rows "
                      f"record none), pairing only rows tagged for {name!r}: pass machine=None (with "
                      "instructions= and exclude=) to pair every row", stacklevel=user_stacklevel())
    if "tags" not in sources:
        return
    for key, goods in good.items():
        for g_row, prompt, g_reply in goods:
            for b_row, _, b_reply in bad.get(key, []):
                out.add(pair_record("tags", g_row.get("machine"), prompt, g_reply, b_reply,
                                    chosen_tag=g_row.get("id"), rejected_tag=b_row.get("id"),
                                    chosen_run=_run_id_of(g_row), rejected_run=_run_id_of(b_row)))


def _from_scores(runs: list[dict], system: str | None, min_gap: float, out: _Collector) -> None:
    from ..data.export import conversation

    groups: dict[tuple[str, str, str], list[tuple[float | None, tuple[str, str], dict, list[dict], dict]]] = {}
    for run in runs:
        # Run dicts given as runs= are not checked as load_runs checks run files
        if not isinstance(run, dict):
            continue
        if not all(isinstance(part, list) and all(isinstance(m, dict) for m in part)
                   for part in (run.get("history") or [], run.get("trajectory") or [])):
            out.skip("scores", run.get("id"), NOT_OBJECT)
            continue
        split = split_reply(conversation(run, system, reasoning=False))
        if split is None:
            continue
        prompt, reply = split
        card = run.get("scorecard")
        score = card.get("total") if isinstance(card, dict) else None
        score = float(score) if isinstance(score, numbers.Real) and not isinstance(score, bool) else None
        key = (str(run.get("machine")), run_case(run), canonical_json(prompt))
        # newest first: by start time, then by id (ids sort by time), so input order never decides
        newest = (str(run.get("startedAt") or ""), str(run.get("id") or ""))
        groups.setdefault(key, []).append((score, newest, run, prompt, reply))
    for members in groups.values():
        if len(members) < 2:
            continue
        scored = [m for m in members if m[0] is not None and math.isfinite(m[0])]
        for m in members:
            if m[0] is None:
                out.skip("scores", m[2].get("id"), UNSCORED)
            elif not math.isfinite(m[0]):  # NaN compares false with everything: no order to pair by
                out.skip("scores", m[2].get("id"), NOT_FINITE)
        if len(scored) < 2:
            continue
        # best: highest score, then newest (Machine's bestOf order); worst: lowest score, then newest
        top, bottom = max(m[0] for m in scored), min(m[0] for m in scored)
        best = max((m for m in scored if m[0] == top), key=lambda m: m[1])
        worst = max((m for m in scored if m[0] == bottom), key=lambda m: m[1])
        gap = best[0] - worst[0]
        if gap <= ROUNDING:
            out.skip("scores", best[2].get("id"), TIE)
            continue
        if gap < min_gap - ROUNDING:
            out.skip("scores", best[2].get("id"), SMALL_GAP)
            continue
        out.add(pair_record("scores", best[2].get("machine"), best[3], best[4], worst[4],
                            chosen_run=best[2].get("id"), rejected_run=worst[2].get("id"),
                            chosen_score=best[0], rejected_score=worst[0]))


def _frame(records: list[dict], excluded: list[dict], skipped: list[dict]) -> PreferencePairs:
    df = PreferencePairs(pd.DataFrame.from_records(records, columns=PAIR_COLUMNS))
    for col in ("chosen_score", "rejected_score"):
        df[col] = df[col].astype("float64")
    df.excluded = list(excluded)
    df.skipped = list(skipped)
    return df


def preference_pairs(store: Any = None, runs: Any = None, *, machine: str | dict | None = None,
                     workspace: str | os.PathLike | None = None, min_gap: float = 0.25,
                     exclude: Iterable[Any] | None = None, instructions: str | None = None,
                     sources: Iterable[str] = SOURCES) -> PreferencePairs:
    """Preference pairs (prompt, chosen, rejected) from tag rows and scored runs.

    - **rewrite**: a `/good --as` row (`rewritten: true`): chosen = the rewrite, rejected = the reply
      it replaced (the row's `replaced` key; for rows without it, such as Machine's own, or with a
      blank one, the reply of the tagged turn in the run the row names, read from `runs`: the latest
      turn with the row's user text, as later turns may follow it; else the row is skipped and
      counted).
    - **tags**: a `/good` row and a `/bad` row of the same machine with the same conversation up to
      the reply (every good x bad combination): chosen = the good reply, rejected = the bad one.
    - **scores**: runs of the same case and conversation whose scorecard totals differ by at least
      `min_gap`: chosen = the best run's reply, rejected = the worst's (newest first on equal scores:
      by startedAt, then id). A run whose total is missing, NaN or infinite is skipped, as is a run
      holding a message that is not an object.

    Identical completions, ties, duplicates (the first source keeps its row) and contradicting pairs
    (A over B and B over A: both go) are dropped and listed in `.skipped`, replies compared as
    store.pairs.reply_key compares them (Unicode NFC, surrounding whitespace stripped), as are pairs
    whose prompt has no text and tag rows holding a message that is not an object; pairs whose
    input is a held-out case are left out, listed in `.excluded` and counted in one
    HeldOutExcluded warning.

    Args:
        store: the tag rows: a tag store directory, a `tagged()` DataFrame (also one saved and read
            back, e.g. as Parquet), a DataFrame of tag rows, or tag row dicts.
            Default None: `store_dir()` of the current directory, as `tagged()` reads. A path
            given that is not there is an error (a store not yet made is no store to name).
        runs: runs for score pairs and for rebuilding rewrites: a `load_runs` frame or Run dicts.
            Default None: the runs of `workspace` (of `machine` when given), none without a workspace.
        machine: a machine name (its definition read from `workspace`) or definition dict. Rows and
            runs of other machines are left out, as are rows that name no machine (Machine's own),
            with one warning saying how many. Default None: every row and run.
        workspace: where the machine is defined and its runs live (default None).
        min_gap: the smallest scorecard difference that makes a score pair (default 0.25, a quarter
            of the 0-1 score range: closer scores are as likely a grader's noise as a preference).
        exclude: held-out cases never trained on (strings, `{input}` dicts or a load_cases frame).
            Default None: the machine's holdout cases (none known without a machine). `()`: none.
        instructions: the system message every prompt starts with (tag rows store only the turn).
            Default None: the machine's instructions, none when unknown; "" adds none.
        sources: which sources to use (default all of SOURCES).

    Returns:
        A PreferencePairs frame (PAIR_COLUMNS, one row per pair, in source order).

    Raises:
        ValueError: an unknown source, or a min_gap that is not a finite number above 0.
        MachineFormatError: a `store` path that is not there or not a tag store folder.
    """
    wanted = set(sources)
    unknown = wanted - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown pair source(s) {sorted(unknown)}; known: {', '.join(SOURCES)}")
    if isinstance(min_gap, bool) or not isinstance(min_gap, numbers.Real) or not (0 < min_gap < math.inf):
        raise ValueError(f"min_gap must be a finite number above 0 (equal scores are a tie, never a preference), "
                         f"got {min_gap!r}")
    mdef = resolve_machine(machine, workspace)
    name = mdef.get("name")
    system = mdef.get("instructions") if instructions is None else instructions
    held = held_out_keys(mdef.get("holdout") if exclude is None else exclude)
    if exclude is None and "holdout" not in mdef:
        warnings.warn(f"held-out cases were not checked: no definition of machine {name!r} was read (pass "
                      "workspace= for its holdout.json, or exclude= the cases never to train on)", stacklevel=user_stacklevel())
    out = _Collector(held)
    run_list = _run_records(runs, workspace, name) if (wanted & {"rewrite", "scores"}) else []
    if wanted & {"rewrite", "tags"}:
        rows = _tag_rows(store)
        _from_tags(rows, name, system, _RunLookup(run_list), wanted, out)
    if "scores" in wanted:
        _from_scores(run_list, system, float(min_gap), out)
    records = out.result()
    lost = [s for s in out.skipped if s["reason"] in (REPLACED_UNKNOWN, TURN_DIFFERS)]
    if lost:
        ids = ", ".join(str(s["id"]) for s in lost[:10]) + (" …" if len(lost) > 10 else "")
        warnings.warn(PairsSkipped(
            f"{len(lost)} rewrite row(s) gave no pair: the reply they replaced is unknown ({ids}). Pass the "
            "workspace (or runs=) holding the runs they name; rows written from now on keep it."), stacklevel=user_stacklevel())
    say_excluded(len(out.excluded), len(out.excluded) + len(records), "preference pair(s)",
                 f"{name}'s holdout.json" if exclude is None and name else "the exclude list")
    return _frame(records, out.excluded, out.skipped)


def pairs_from_results(results: Any, *, instructions: str | None = None, machine: str | None = None) -> PreferencePairs:
    """Pairs from eval results: the expected answer over the model's own wrong reply.

    One pair per row scored `exact` that the model got wrong (a right reply, an error or a rule
    that is not a literal answer, such as `contains`, gives none). Held-out cases' results make
    held-out pairs: a measure of whether a checkpoint prefers the answer to what the base model says.

    Args:
        results: an `evaluate` / `evaluate_cases` result (an EvalResult or its rows frame), or the
            path of a results JSON (read with results.load_results, which keeps each row's exact
            prompt `messages`).
        instructions: for rows without `messages` (an in-memory result), the system message of the
            prompt (`[system, user: input]`, as `evaluate_cases` prompts); default None: none.
            Ignored when rows carry messages.
        machine: recorded in the `machine` column (default None).

    Returns:
        A PreferencePairs frame with source "results" (`chosen_tag`/`rejected_tag` None).

    Raises:
        MachineFormatError: a results file that is not JSON or not a results file (naming its
            line and field), a row whose `messages` is not a list of chat messages, or a row that
            would make a pair and has no prompt (no `messages`, no `input` or `prompt` text).
    """
    from ..evaluation.results import as_eval_result

    res = as_eval_result(results)
    path = res.path if isinstance(results, (str, os.PathLike)) else None
    out = _Collector(set())
    system = [{"role": "system", "content": instructions}] if instructions else []
    for i, r in enumerate(res.rows.to_dict("records")):
        if r.get("match") != "exact" or r.get("correct") or isinstance(r.get("error"), str):
            continue
        expected, output = r.get("expected"), r.get("output")
        if not isinstance(expected, str) or not expected.strip() or not isinstance(output, str) or not output.strip():
            continue
        if isinstance(r.get("messages"), list):
            if not all(isinstance(m, dict) for m in r["messages"]):
                raise MachineFormatError(path, "must be a list of chat messages", field=f"rows.{i}.messages")
            prompt = [pair_message(m) for m in r["messages"]]
        else:
            text = next((r[k] for k in ("input", "prompt") if isinstance(r.get(k), str) and r[k].strip()), None)
            if text is None:
                raise MachineFormatError(path, "no prompt: the row has no 'messages' and no 'input' or 'prompt' "
                                               "text", field=f"rows.{i}.input")
            prompt = system + [{"role": "user", "content": text}]
        out.add(pair_record("results", machine, prompt, {"role": "assistant", "content": expected},
                            {"role": "assistant", "content": output}))
    return _frame(out.result(), [], out.skipped)


# ---------------------------------------------------------------------------------------------
# files


def write_pairs(pairs: Any, path: str | os.PathLike, format: str = "comparison") -> Path:
    """Write pairs to a JSONL file, atomically.

    Args:
        pairs: a pairs frame (or records with prompt, chosen, rejected).
        path: the file to write (replaced whole; parents created).
        format: "comparison" (default): tinker-cookbook's `{"comparison": {"prompt_conversation",
            "completion_A", "completion_B"}, "label": "A"}` (A = chosen); "trl": TRL's conversational
            preference format `{"prompt", "chosen", "rejected"}` (message lists). Either carries
            `pair` (the id of the pair as written), `source` and `machine` beside it, which neither
            reader looks at.

    Returns:
        The path written.

    Raises:
        MachineFormatError: a pair its reader would refuse (see store.pairs.checked_pair: a prompt
            or completion that is not chat messages, a completion that is not one assistant
            reply, the same reply on both sides, a prompt with no text), naming the path, the
            pair's line and the field; nothing is written.
        ValueError: no pairs (nothing is written: read_pairs refuses a file with none).
    """
    from ..core.jsonl import write_jsonl

    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    lines = []
    for line, rec in enumerate(pair_records(pairs), start=1):
        try:
            prompt, chosen, rejected = checked_pair(rec.get("prompt"), rec.get("chosen"), rec.get("rejected"), path,
                                                    line)
        except MachineFormatError as err:
            raise MachineFormatError(path, f"{err.reason}; nothing written", line=line, field=err.field) from None
        # the id of what is written, so an edited pair keeps no stale id
        lines.append(pair_line({**rec, "pair": pair_id(prompt, [chosen], [rejected]), "prompt": prompt,
                                "chosen": [chosen], "rejected": [rejected]}, format))
    if not lines:  # a file with none is refused by read_pairs and DPO: replacing a file with it loses that file
        raise ValueError(f"{path}: no pairs to write: nothing written")
    return write_jsonl(lines, path)


def read_pairs(path: str | os.PathLike) -> PreferencePairs:
    """Pairs from a JSONL file in either format `write_pairs` writes, as a frame.

    Args:
        path: the pairs JSONL (read by store.pairs.read_pair_records: a "B" label swaps the
            completions; ties, completions that are not one assistant reply and identical
            replies are refused).

    Returns:
        A PreferencePairs frame (source from the line, else "file").

    Raises:
        MachineFormatError: naming the file, line and field of the first bad line.
    """
    return _frame(read_pair_records(path), [], [])


__all__ = ["preference_pairs", "pairs_from_results", "write_pairs", "read_pairs", "comparison_line", "split_reply",
           "PreferencePairs", "PairsSkipped", "PAIR_COLUMNS", "SOURCES", "REPLACED_KEY"]
