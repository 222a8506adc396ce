"""Preference-pair files as plain records: tinker-cookbook's comparison JSONL and TRL's
conversational preference format, read line by line into pair records and written from them.

A pair record is `{"pair", "source", "machine", "input", "prompt", "chosen", "rejected", …}`
(PAIR_COLUMNS): chat messages as pairs keep them, reasoning dropped. Building pairs from tags,
runs and eval results, and the pairs frame, are `pairs.py`'s; training on them is
`preference.py`'s; pricing a DPO run reads its pairs through `pair_records` here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.chat import content_text, frame_rows
from ..errors import MachineFormatError
from .messages import without_thinking

PAIR_COLUMNS = ["pair", "source", "machine", "input", "prompt", "chosen", "rejected", "chosen_tag", "rejected_tag",
                "chosen_run", "rejected_run", "chosen_score", "rejected_score"]
"""Columns of a pairs frame: pair (12 hex of sha256 over prompt, chosen and rejected: the same pair
has the same id everywhere), source ("rewrite" | "tags" | "scores" | "results" | "file"), machine,
input (the last user message's text), prompt (the chat messages before the reply, starting with
the machine's instructions as a system message when known), chosen and rejected (each a list
holding one assistant message, TRL's conversational shape), chosen_tag / rejected_tag (tag row
ids; a rewrite row is both), chosen_run / rejected_run (run ids), chosen_score / rejected_score
(scorecard totals, for score pairs)."""

FORMATS = ("comparison", "trl")
"""The file formats: "comparison" (tinker-cookbook's, what preference.dpo trains on) and "trl"."""


def pair_message(m: Mapping[str, Any]) -> dict:
    """A message as pairs keep it.

    Args:
        m: a chat message.

    Returns:
        A copy with reasoning dropped, content a string and no `trainable` flag.
    """
    out = {k: v for k, v in without_thinking(dict(m)).items() if k != "trainable"}
    out["content"] = content_text(out.get("content"))
    return out


def is_reply(m: Any) -> bool:
    """Whether a message is a reply a pair can hold.

    Args:
        m: a chat message (or anything).

    Returns:
        True for an assistant message with text and no tool calls.
    """
    return (isinstance(m, Mapping) and m.get("role") == "assistant" and not m.get("tool_calls")
            and bool(content_text(m.get("content")).strip()))


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a value (sorted keys, compact): what pair ids and duplicate checks compare.

    Args:
        value: a JSON-able value.

    Returns:
        Its JSON text.
    """
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def reply_key(text: str) -> str:
    """What two replies (or prompts' JSON texts) are compared by: the text in Unicode NFC, stripped.

    Replies that differ only in surrounding whitespace or in how the same characters are encoded
    ("ü" as one code point or as "u" plus a combining mark) read the same to a person, so a pair of
    them is no preference and two pairs of them are one pair.

    Args:
        text: a reply's text.

    Returns:
        The key.
    """
    return unicodedata.normalize("NFC", text).strip()


def pair_id(prompt: list[dict], chosen: list[dict], rejected: list[dict]) -> str:
    """The id of a pair, the same in every file.

    Args:
        prompt: the messages before the reply.
        chosen / rejected: the two completions (each a list of one assistant message).

    Returns:
        12 hex digits of sha256 over the pair's canonical JSON.
    """
    return hashlib.sha256(canonical_json([prompt, chosen, rejected]).encode("utf-8")).hexdigest()[:12]


def last_user(prompt: list[dict]) -> str:
    """The text of a prompt's last user message ("" when it has none).

    Args:
        prompt: pair messages (content already a string).

    Returns:
        The text.
    """
    return next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), "")


def pair_record(source: str, machine: Any, prompt: list[dict], chosen: dict, rejected: dict, **ids: Any) -> dict:
    """One pair record (PAIR_COLUMNS).

    Args:
        source: where the pair came from ("rewrite", "tags", "scores", "results", "file").
        machine: the machine it belongs to (or None).
        prompt: the messages before the reply.
        chosen / rejected: the preferred and the other reply (one assistant message each).
        **ids: chosen_tag, rejected_tag, chosen_run, rejected_run, chosen_score, rejected_score
            (each None when not given).

    Returns:
        The record, its `pair` id computed and `input` the prompt's last user text.
    """
    c, r = [chosen], [rejected]
    rec = {"pair": pair_id(prompt, c, r), "source": source, "machine": machine, "input": last_user(prompt),
           "prompt": prompt, "chosen": c, "rejected": r}
    for col in PAIR_COLUMNS[7:]:
        rec[col] = ids.get(col)
    return rec


def check_messages(value: Any, path: str | os.PathLike | None, line: int | None, field: str, *,
                   reply: bool = False) -> list[dict]:
    """A prompt or completion as pair messages, or the problem raised.

    Args:
        value: the messages as read.
        path / line / field: where they came from, named in the error.
        reply: a completion: exactly one assistant reply (default False: a prompt).

    Returns:
        The messages as pairs keep them (pair_message).

    Raises:
        MachineFormatError: not a list of messages with string roles, or (reply) not one
            assistant reply with text and no tool calls.
    """
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise MachineFormatError(path, "must be a list of chat messages", line=line, field=field)
    for i, m in enumerate(value):
        if not isinstance(m.get("role"), str):
            raise MachineFormatError(path, "each message needs a string 'role'", line=line, field=f"{field}.{i}.role")
    if reply:
        if not value or not is_reply(value[-1]):
            raise MachineFormatError(path, "must end with an assistant reply (with text, no tool calls)",
                                     line=line, field=field)
        if len(value) > 1:
            raise MachineFormatError(path, "a completion is one assistant message (DPO scores the last one only)",
                                     line=line, field=field)
    return [pair_message(m) for m in value]


def comparison_line(pair: Mapping[str, Any]) -> dict:
    """A pair as tinker-cookbook's ComparisonBuilderFromJsonl reads it: completion A is the chosen one.

    The label is always "A": the cookbook's DPO builder treats anything else, "Tie" included, as B
    winning, which is why ties never become pairs.

    Args:
        pair: a pair record (prompt, chosen, rejected).

    Returns:
        `{"comparison": {"prompt_conversation", "completion_A", "completion_B"}, "label": "A"}`.
    """
    return {"comparison": {"prompt_conversation": pair["prompt"], "completion_A": pair["chosen"],
                           "completion_B": pair["rejected"]}, "label": "A"}


def pair_line(pair: Mapping[str, Any], format: str = "comparison") -> dict:
    """One line of a pairs file.

    Args:
        pair: a pair record.
        format: "comparison" (default) or "trl" (see FORMATS).

    Returns:
        The line, with the record's `pair`, `source` and `machine` beside it when set (neither
        reader looks at them; None and NaN are left out).
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    body = comparison_line(pair) if format == "comparison" else {
        "prompt": pair["prompt"], "chosen": pair["chosen"], "rejected": pair["rejected"]}
    return {**body, **{k: pair.get(k) for k in ("pair", "source", "machine") if not _missing(pair.get(k))}}


def _missing(value: Any) -> bool:
    """A value that stands for none: None, or a float NaN (what pandas puts in an empty cell)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def checked_pair(prompt: Any, chosen: Any, rejected: Any, path: str | os.PathLike | None, line: int | None,
                 fields: tuple[str, str, str] = ("prompt", "chosen", "rejected")) -> tuple[list[dict], dict, dict]:
    """A prompt and its two completions, checked as a pairs file holds them.

    Args:
        prompt / chosen / rejected: the values as read (message lists).
        path / line: where they came from (or go), named in the error.
        fields: the names of the three values in the line, named in the error (default "prompt",
            "chosen", "rejected").

    Returns:
        (the prompt as pair messages, the chosen reply, the rejected reply).

    Raises:
        MachineFormatError: see check_messages; or the two replies are the same (reply_key); or
            the prompt has no text.
    """
    p = check_messages(prompt, path, line, fields[0])
    c = check_messages(chosen, path, line, fields[1], reply=True)
    r = check_messages(rejected, path, line, fields[2], reply=True)
    if reply_key(c[0]["content"]) == reply_key(r[0]["content"]):
        raise MachineFormatError(path, "chosen and rejected are the same reply: no preference to learn",
                                 line=line, field=fields[1])
    if not has_text(p):
        raise MachineFormatError(path, "the prompt has no text: a preference needs the conversation its two "
                                       "replies answer", line=line, field=fields[0])
    return p, c[0], r[0]


def has_text(prompt: list[dict]) -> bool:
    """Whether a prompt (pair messages) holds any text: DPO refuses a pair whose prompt has none.

    Args:
        prompt: pair messages (content a string).

    Returns:
        True when some message's content is more than whitespace.
    """
    return any(m["content"].strip() for m in prompt)


def _implicit_prompt(row: dict, path: Path, line: int) -> tuple[list, list, list]:
    """(prompt, chosen, rejected) of a TRL implicit-prompt row: two whole conversations, the same
    up to their last message, which is the completion."""
    chosen = check_messages(row.get("chosen"), path, line, "chosen")
    rejected = check_messages(row.get("rejected"), path, line, "rejected")
    if not chosen or not rejected or chosen[:-1] != rejected[:-1]:
        raise MachineFormatError(path, "with no 'prompt', chosen and rejected must start with the same prompt "
                                       "(TRL's implicit prompt: the same messages up to the last one)",
                                 line=line, field="rejected")
    return chosen[:-1], chosen[-1:], rejected[-1:]


def read_pair_records(path: str | os.PathLike) -> list[dict]:
    """The pairs of a JSONL file in either format (recognised line by line), as records.

    A comparison line labelled "B" is read with its completions swapped; "Tie" and any other label
    is refused, as are completions that are not one assistant reply, pairs whose two replies
    are the same (reply_key) and prompts with no text. A TRL line without `prompt` (TRL's
    implicit prompt) holds two whole conversations: what they share before their last message
    is the prompt.

    Args:
        path: the pairs JSONL.

    Returns:
        Pair records (PAIR_COLUMNS; source from the line, else "file"), in file order.

    Raises:
        MachineFormatError: naming the file, line and field of the first bad line, or a file
            with no pairs.
    """
    from ..core.jsonl import iter_jsonl

    path = Path(path)
    records = []
    for line, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise MachineFormatError(path, "a pair must be a JSON object", line=line)
        if "comparison" in row:
            comp = row["comparison"]
            if not isinstance(comp, dict):
                raise MachineFormatError(path, "must be an object", line=line, field="comparison")
            label = row.get("label")
            if label not in ("A", "B"):
                raise MachineFormatError(path, f"must be \"A\" or \"B\", not {label!r} (a tie is no preference)",
                                         line=line, field="label")
            a = comp.get("completion_A"), "comparison.completion_A"
            b = comp.get("completion_B"), "comparison.completion_B"
            (won, won_field), (lost, lost_field) = (a, b) if label == "A" else (b, a)
            prompt, chosen, rejected = checked_pair(comp.get("prompt_conversation"), won, lost, path, line,
                                                    ("comparison.prompt_conversation", won_field, lost_field))
        elif "chosen" in row:
            if "prompt" in row:
                if isinstance(row["prompt"], str):
                    raise MachineFormatError(path, "is text, as in TRL's standard format: pairs are chat "
                                                   "messages, so give the prompt as a list of messages",
                                             line=line, field="prompt")
                parts = row["prompt"], row.get("chosen"), row.get("rejected")
            else:
                parts = _implicit_prompt(row, path, line)
            prompt, chosen, rejected = checked_pair(*parts, path, line)
        else:
            raise MachineFormatError(path, "neither a comparison line ('comparison', 'label') nor a TRL line "
                                           "('prompt', 'chosen', 'rejected')", line=line)
        records.append(pair_record(str(row.get("source") or "file"), row.get("machine"), prompt, chosen, rejected))
    if not records:
        raise MachineFormatError(path, "no pairs in the file")
    return records


def pair_records(pairs: Any) -> list[dict]:
    """Pair records from any form pairs come in.

    Args:
        pairs: a pairs JSONL path (read with read_pair_records), a pairs DataFrame, or records.

    Returns:
        The records as dicts, in order; a frame's rows as core.chat.frame_rows gives them (lists
        where pyarrow holds arrays, no missing cells).
    """
    if isinstance(pairs, (str, os.PathLike)):
        return read_pair_records(pairs)
    if hasattr(pairs, "to_dict") and hasattr(pairs, "columns"):  # a DataFrame, perhaps read back through pyarrow
        return list(frame_rows(pairs))
    return [dict(p) for p in pairs]


__all__ = ["PAIR_COLUMNS", "FORMATS", "pair_message", "is_reply", "canonical_json", "reply_key", "has_text",
           "pair_id", "last_user", "pair_record", "check_messages", "checked_pair", "comparison_line", "pair_line",
           "read_pair_records", "pair_records"]
