"""Chat rows: a message's content as text, and the rules a row's shape follows.

One home for what every step needs to agree on: how message content reads as text (tag keys,
overlap digests, prompts in results), which rows are valid training, eval or probe rows (validate
reports every problem as a finding; trainers and evals refuse the first with MachineFormatError),
which messages a training row trains, and the rows sft trains on (`prepare_data`).
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from . import patterns
from .jsonl import parse_json
from ..errors import MachineFormatError
from ..evaluation.scoring import DEFAULT_MATCH, MATCH_MODES, normalize, to_number

ROLES = ("system", "user", "assistant", "tool")
PART_TYPES = ("text", "thinking", "image", "audio")
KINDS = ("train", "eval", "probe")
"""train: the last message is the assistant's reply (the target). eval: the prompt only, ending
with the user's question, plus "expected", "match" and "format". probe: a prompt (a trailing
assistant reply is dropped) and an optional "format"."""


def content_text(content: Any, *, sep: str = "", strip: bool = False, reasoning: bool = False) -> str:
    """A message's content as plain text.

    Args:
        content: a message's "content": a string, a list of parts (`{"type": "text", "text": …}`,
            `{"type": "thinking", "thinking": …}`, images, …), None, or a part-like object with
            "text" (or a nested "content").
        sep: what goes between the text of two parts (default "": parts are pieces of one text;
            "\\n" reads as Machine's extractMessageText, " " keeps words apart for comparison).
        strip: strip surrounding whitespace from the result (default False).
        reasoning: include "thinking" parts' text, in order (default False: what was said only).

    Returns:
        The text. Parts that are not text (images, audio, unknown types, non-objects) and parts
        whose text is not a string add nothing; any other value reads as `str(content)`.
    """
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        pieces = []
        for part in content:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif reasoning and kind == "thinking" and isinstance(part.get("thinking"), str):
                pieces.append(part["thinking"])
        text = sep.join(pieces)
    elif isinstance(content, Mapping):
        if isinstance(content.get("text"), str):
            text = content["text"]
        else:
            return content_text(content.get("content"), sep=sep, strip=strip, reasoning=reasoning)
    else:
        text = str(content)
    return text.strip() if strip else text


def prompt_text(messages: list[Any]) -> str:
    """The text a reader recognises a row by: its last user message.

    Args:
        messages: a row's chat messages.

    Returns:
        The last user message's text (content_text, parts joined with ""); the last message's
        when no message is the user's; "" for no messages.
    """
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return content_text(message.get("content"))
    last = messages[-1] if messages else None
    return content_text(last.get("content")) if isinstance(last, Mapping) else ""


# --------------------------------------------------------------------------- row shapes

class Finding(NamedTuple):
    """One problem with a row.

    Args:
        severity: "error" (the row cannot be used) or "warning".
        code: a stable code for the kind of problem (e.g. "no_match").
        message: what is wrong and where, in words.
        field: the dotted field it is in (e.g. "messages.1.role"); None: the row itself.
    """

    severity: str
    code: str
    message: str
    field: str | None


# characters that show as nothing (zero-width spaces and joiners, word joiners, a BOM, a soft hyphen)
_INVISIBLE = re.compile("[\u00ad\u200b-\u200f\u2060-\u2064\ufeff]")


def text_key(text: str) -> str:
    """Text as two prompts or inputs are compared (validate's overlap check, held-out cases): the
    same characters however Unicode spells them (NFKC: é composed or as e + accent, the ﬁ ligature,
    full-width letters), invisible characters dropped, case folded (ß as ss) and each run of
    whitespace one space, none at either end.

    Args:
        text: the text.

    Returns:
        The key.
    """
    return " ".join(_INVISIBLE.sub("", unicodedata.normalize("NFKC", text)).casefold().split())


# A code point no UTF-8 file or tokenizer can hold: half of a UTF-16 pair (a character cut in two)
_SURROGATE = re.compile("[\ud800-\udfff]")
_READ_FIELDS = ("messages", "expected", "format")


def _unpaired_surrogate(row: Mapping[str, Any]) -> Finding | None:
    """The first string (keys too, in order) of the fields training and evals read ("messages",
    "expected", "format") that holds an unpaired UTF-16 surrogate."""
    stack: list[tuple[Any, str]] = [(row[k], k) for k in reversed(_READ_FIELDS) if k in row]
    while stack:
        value, field = stack.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found is not None:
                return Finding("error", "bad_text", f"field {field!r} holds an unpaired UTF-16 surrogate "
                                                    f"(U+{ord(found.group()):04X} at character {found.start() + 1}): "
                                                    "half of a character, as text cut at a UTF-16 length leaves "
                                                    "it; no UTF-8 file or tokenizer can hold it. Remove it or "
                                                    "complete the character", field)
        elif isinstance(value, Mapping):
            for key, item in reversed(list(value.items())):
                name = f"{field}.{key}"
                stack.append((item, name))
                if isinstance(key, str):
                    stack.append((key, name))
        elif isinstance(value, list):
            stack.extend((item, f"{field}.{j}") for j, item in reversed(list(enumerate(value))))
    return None


def _message_findings(messages: list[Any]) -> list[Finding]:
    """Problems of each message: role, content, trainable flag, tool calls and their results."""
    out = []
    calls: dict[str, int] = {}  # tool_call id -> message index
    answered: set[str] = set()
    for i, m in enumerate(messages):
        where, at = f"messages[{i}]", f"messages.{i}"
        if not isinstance(m, Mapping):
            out.append(Finding("error", "bad_message", f"{where} is a {type(m).__name__}, not an object", at))
            continue
        role = m.get("role")
        if role not in ROLES:
            out.append(Finding("error", "unknown_role", f"{where}.role is {role!r}; known roles: {', '.join(ROLES)}",
                               f"{at}.role"))
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                ptype = part.get("type") if isinstance(part, Mapping) else None
                if ptype not in PART_TYPES:
                    out.append(Finding("error", "bad_content", f"{where}.content[{j}] has type {ptype!r}; known part "
                                                               f"types: {', '.join(PART_TYPES)}", f"{at}.content.{j}"))
                elif ptype in ("text", "thinking") and not isinstance(part.get(ptype), str):
                    out.append(Finding("error", "bad_content", f"{where}.content[{j}] needs a string field {ptype!r}",
                                       f"{at}.content.{j}.{ptype}"))
        elif not isinstance(content, str) and not (content is None and role == "assistant" and m.get("tool_calls")):
            what = "missing" if content is None else f"a {type(content).__name__}"
            out.append(Finding("error", "bad_content", f"{where}.content is {what}; it must be a string or a list "
                                                       "of parts", f"{at}.content"))
        if "trainable" in m and not isinstance(m["trainable"], bool):
            out.append(Finding("error", "bad_trainable", f"{where}.trainable must be true or false", f"{at}.trainable"))
        tool_calls = m.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant" or not isinstance(tool_calls, list):
                out.append(Finding("error", "bad_tool_call", f"{where}.tool_calls must be a list on an assistant "
                                                             "message", f"{at}.tool_calls"))
            else:
                for j, call in enumerate(tool_calls):
                    fn = call.get("function") if isinstance(call, Mapping) else None
                    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                            or not isinstance(fn.get("arguments"), str):
                        out.append(Finding("error", "bad_tool_call", f"{where}.tool_calls[{j}] needs function.name "
                                                                     "and function.arguments (a JSON string)",
                                           f"{at}.tool_calls.{j}.function"))
                        continue
                    try:  # the renderers parse it to write the call (Qwen's, GLM's, DeepSeek's, …)
                        parse_json(fn["arguments"])
                    except ValueError as exc:
                        reason = getattr(exc, "reason", exc)
                        out.append(Finding("error", "bad_tool_call", f"{where}.tool_calls[{j}].function.arguments "
                                                                     f"is not valid JSON ({reason}): it must be the "
                                                                     "call's arguments as a JSON string, e.g. "
                                                                     "'{\"path\": \"a.txt\"}'",
                                           f"{at}.tool_calls.{j}.function.arguments"))
                    if isinstance(call.get("id"), str):
                        calls[call["id"]] = i
        if role == "tool":
            ref = m.get("tool_call_id")
            if ref is None:
                out.append(Finding("warning", "tool_result_unlinked", f"{where} (role tool) has no tool_call_id",
                                   f"{at}.tool_call_id"))
            elif not isinstance(ref, str):
                out.append(Finding("error", "orphan_tool_result", f"{where}.tool_call_id must be a string",
                                   f"{at}.tool_call_id"))
            elif ref not in calls:
                out.append(Finding("error", "orphan_tool_result",
                                   f"{where}.tool_call_id {ref!r} answers no earlier assistant tool call",
                                   f"{at}.tool_call_id"))
            else:
                answered.add(ref)
    last_index = len(messages) - 1
    for ref, i in calls.items():
        if ref not in answered and i != last_index:  # the final message's calls are the target: no result yet
            out.append(Finding("warning", "unanswered_tool_call", f"messages[{i}] tool call {ref!r} has no tool result",
                               f"messages.{i}.tool_calls"))
    return out


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def _expected_text(expected: str | int | float) -> str:
    """An eval row's expected answer as text; a whole number as its digits even when it arrives as a
    float (4.0: JavaScript writes it "4", and pandas reads a column of 4 and 2.5 as floats)."""
    if isinstance(expected, float) and expected.is_integer() and abs(expected) < 1e21:
        return str(int(expected))
    return str(expected)


def _eval_findings(row: Mapping[str, Any]) -> list[Finding]:
    """Problems of an eval row's answer fields: expected, match and format."""
    out = []
    expected = row.get("expected")
    if expected is None:
        out.append(Finding("error", "no_expected", "missing field 'expected': the answer to score against", "expected"))
    elif isinstance(expected, bool) or not isinstance(expected, (str, int, float)):
        out.append(Finding("error", "bad_expected", f"field 'expected' must be a string (or a number), got "
                                                    f"{type(expected).__name__}", "expected"))
        expected = None
    elif isinstance(expected, float) and not math.isfinite(expected):
        out.append(Finding("error", "bad_expected", f"field 'expected' must be a finite number, got {expected!r}",
                           "expected"))
        expected = None
    else:
        expected = _expected_text(expected)
    match = row.get("match")
    if match is None:
        out.append(Finding("warning", "no_match", f"field 'match' is missing; evaluate() uses {DEFAULT_MATCH!r}",
                           "match"))
        match = DEFAULT_MATCH
    elif match not in MATCH_MODES:
        out.append(Finding("error", "unknown_match", f"unknown match mode {match!r} in field 'match' (known: "
                                                     f"{', '.join(MATCH_MODES)})", "match"))
    if expected is not None:
        if match == "regex":
            try:
                patterns.compile_pattern(expected)
            except patterns.pattern_error() as exc:
                out.append(Finding("error", "bad_regex", "not a valid regular expression in field 'expected' for "
                                                         f"match 'regex': {exc}", "expected"))
        elif match == "number" and to_number(expected) is None:
            out.append(Finding("error", "bad_number", f"match 'number' needs a number in field 'expected', got "
                                                      f"{expected!r}", "expected"))
        elif match in ("prefix", "contains") and not normalize(expected):
            out.append(Finding("error", "empty_expected", f"field 'expected' is empty after normalisation: match "
                                                          f"{match!r} would accept every output", "expected"))
    return out


def _format_findings(row: Mapping[str, Any]) -> list[Finding]:
    fmt = row.get("format")
    if fmt is None:
        return []
    if not isinstance(fmt, str):
        return [Finding("error", "bad_format", f"field 'format' must be a regular expression string, got "
                                               f"{type(fmt).__name__}", "format")]
    try:
        patterns.compile_pattern(fmt)
    except patterns.pattern_error() as exc:
        return [Finding("error", "bad_format", f"not a valid regular expression in field 'format': {exc}", "format")]
    return []


def row_findings(row: Any, kind: str = "train") -> list[Finding]:
    """Every shape problem of one row (pure: no renderer, no file).

    Args:
        row: one row as read from JSONL: `{"messages": [...], ...}`.
        kind: "train", "eval" or "probe" (see KINDS). Every kind checks the messages (known
            roles, content a string or known parts, boolean `trainable` flags, tool calls with a
            name and arguments that are a string of valid JSON, tool results that answer an
            earlier call), "tools", and that no string in "messages", "expected" or "format" holds
            an unpaired UTF-16 surrogate (no UTF-8 file or tokenizer can hold one). train: the
            last message is the assistant's, and a whole run or a row with `trainable` flags
            trains at least one of its assistant messages (as train_messages requires). eval: the
            last message is the user's; "expected" is there (a string or a finite number), "match"
            is a known mode (missing: "exact", with a warning) the expected answer can be scored
            by, and "format" is a valid regex. probe: a trailing assistant message is dropped,
            then the prompt ends with the user's message; "format" is a valid regex.

    Returns:
        Findings (severity, code, message, field) in row order; an empty list for a good row.
        validate reports all of them; check_row raises the first error.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not isinstance(row, Mapping):
        what = "a prompt string or an object with \"messages\"" if kind == "probe" else "a JSON object"
        article = "an" if kind == "eval" else "a"
        return [Finding("error", "not_object", f"{article} {kind} row must be {what}, got {type(row).__name__}",
                        None)]
    messages = row.get("messages")
    if not isinstance(messages, list):
        what = "missing" if messages is None else f"a {type(messages).__name__}, not a list"
        return [Finding("error", "no_messages", f"field 'messages' is {what}; a row needs a non-empty list of chat "
                                                "messages", "messages")]
    if not messages:
        return [Finding("error", "empty_messages", "field 'messages' is an empty list; a row needs a non-empty list "
                                                   "of chat messages", "messages")]
    out = _message_findings(messages)
    if "whole_run" in row and not isinstance(row["whole_run"], bool):  # "no" would read as set
        out.append(Finding("error", "bad_whole_run", f"whole_run must be true or false, got {row['whole_run']!r}",
                           "whole_run"))
    last = len(messages) - 1
    if kind == "train":
        if _role(messages[last]) != "assistant":
            lead = "no assistant message to train on: " if not any(_role(m) == "assistant" for m in messages) else ""
            out.append(Finding("error", "last_not_assistant", f"{lead}the last message is {_role(messages[last])!r}; a "
                                                              "training row ends with the assistant's reply (the target)",
                                f"messages.{last}.role"))
        elif isinstance(row.get("whole_run", False), bool) and is_flagged(row) \
                and not any(trainable_flags(messages, whole_run=bool(row.get("whole_run")))):
            out.append(Finding("error", "no_trainable_tokens", _no_trainable_message(bool(row.get("whole_run"))),
                               "messages"))
    else:
        if kind == "probe" and _role(messages[last]) == "assistant":
            last -= 1  # a training-style row: its prompt is probed
            if last < 0:
                out.append(Finding("error", "empty_messages", "no prompt left once the assistant reply is dropped",
                                   "messages"))
        if last >= 0 and _role(messages[last]) != "user":
            what = "an eval row holds the prompt only (the answer goes in 'expected')" if kind == "eval" else \
                "a probe row holds a prompt"
            out.append(Finding("error", "last_not_user", f"the last message is {_role(messages[last])!r}: {what}, "
                                                         "ending with the user's question the model answers",
                               f"messages.{last}.role"))
        if kind == "eval":
            out.extend(_eval_findings(row))
        out.extend(_format_findings(row))
    tools = row.get("tools")
    if tools is not None and (not isinstance(tools, list) or
                              not all(isinstance(t, Mapping) and isinstance(t.get("name"), str) for t in tools)):
        out.append(Finding("error", "bad_tools", "field 'tools' must be a list of {name, description, parameters}",
                           "tools"))
    cut = _unpaired_surrogate(row)
    if cut is not None:
        out.append(cut)
    return out


def check_row(row: Any, kind: str = "eval", *, path: str | os.PathLike | None = None,
              line: int | None = None) -> dict:
    """One row checked by row_findings' rules and filled in, or the first problem raised.

    Args:
        row: one row.
        kind: "eval" (default), "train" or "probe".
        path / line: where the row came from, named in the error (default None: in-memory rows).

    Returns:
        eval: the row with "expected" as a string (a whole number as its digits: 4.0 as "4"),
        "match" (default "exact"), "format" (None when absent) and "line". probe: {"messages":
        the prompt (a trailing assistant reply dropped), "format", "line"}. train: a copy of the row.

    Raises:
        MachineFormatError: naming the file, line and field of the row's first error, so a bad
        row of 24 is found without guessing.
    """
    for finding in row_findings(row, kind):
        if finding.severity == "error":
            raise MachineFormatError(path, finding.message, line=line, field=finding.field)
    if kind == "train":
        return dict(row)
    messages = list(row["messages"])
    if kind == "probe":
        if _role(messages[-1]) == "assistant":
            messages = messages[:-1]
        return {"messages": messages, "format": row.get("format"), "line": line}
    match = row.get("match")
    return {**row, "messages": messages, "expected": _expected_text(row["expected"]),
            "match": DEFAULT_MATCH if match is None else match, "format": row.get("format"), "line": line}


# --------------------------------------------------------------------------- trainable flags
# Which messages a training row trains: sft's rule (Machine's export). A row that is a whole run
# (`"whole_run": true`) or carries per-message `trainable` flags trains exactly the assistant
# messages flagged true; any other row trains its last assistant message. The cookbook's
# CUSTOMIZED mode needs a flag on every message (its renderers assert all or none).

def is_flagged(row: Mapping[str, Any]) -> bool:
    """Whether a training row chooses its trained messages itself.

    Args:
        row: a training row.

    Returns:
        True for a whole run (`"whole_run": true`) or a row with a `trainable` key on any message.
    """
    messages = row.get("messages") or []
    return bool(row.get("whole_run")) or any(isinstance(m, Mapping) and "trainable" in m for m in messages)


def _no_trainable_message(whole_run: bool) -> str:
    """Why a flagged training row trains nothing (row_findings' and train_messages' words)."""
    why = "a whole run trains only" if whole_run else "its flags leave untrained all"
    return f"no trainable assistant message: {why} the assistant messages flagged \"trainable\": true"


def trainable_flags(messages: list[Any], *, whole_run: bool = False) -> list[bool]:
    """The `trainable` flag sft gives each message of a row trained in CUSTOMIZED mode.

    Args:
        messages: the row's messages.
        whole_run: the row is a whole run (default False).

    Returns:
        One flag per message: a message with a `trainable` key (or any message of a whole run)
        is trained when the flag is true and the message is the assistant's; a message without
        one in any other row is trained when it is the last assistant message.
    """
    roles = [_role(m) for m in messages]
    last = max((i for i, r in enumerate(roles) if r == "assistant"), default=-1)
    return [bool(m.get("trainable")) and roles[i] == "assistant"
            if isinstance(m, Mapping) and (whole_run or "trainable" in m) else i == last
            for i, m in enumerate(messages)]


def trained_indices(messages: list[Any], train_on_what: Any = None, *, whole_run: bool = False) -> list[int]:
    """Which messages of a row are trained.

    Args:
        messages: the row's messages.
        train_on_what: the cookbook's TrainOnWhat (or its value). Default None: sft's choice for
            the row (CUSTOMIZED when it is a whole run or carries flags, else the last assistant
            message). "customized" applies trainable_flags.
        whole_run: the row is a whole run (default False).

    Returns:
        The indices of the trained messages, in order.
    """
    roles = [_role(m) for m in messages]
    assistants = [i for i, r in enumerate(roles) if r == "assistant"]
    if train_on_what is None:
        flagged = whole_run or any(isinstance(m, Mapping) and "trainable" in m for m in messages)
        mode = "customized" if flagged else "last_assistant_message"
    else:
        mode = str(getattr(train_on_what, "value", train_on_what))
    if mode == "customized":
        return [i for i, flag in enumerate(trainable_flags(messages, whole_run=whole_run)) if flag]
    if mode == "last_assistant_message":
        return assistants[-1:]
    if mode == "last_assistant_turn":
        users = [i for i, r in enumerate(roles) if r == "user"]
        return [i for i in assistants if i > (users[-1] if users else -1)]
    if mode == "all_assistant_messages":
        return assistants
    if mode == "all_user_and_system_messages":
        return [i for i, r in enumerate(roles) if r in ("user", "system")]
    if mode in ("all_messages", "all_tokens"):
        return list(range(len(messages)))
    raise ValueError(f"unknown train_on_what {mode!r}")


def train_messages(row: Mapping[str, Any], *, customized: bool | None = None, path: str | os.PathLike | None = None,
                   line: int | None = None) -> list[dict]:
    """The messages sft hands the cookbook for one checked training row.

    Args:
        row: a training row that passed check_row(row, "train").
        customized: give every message its `trainable` flag (trainable_flags). Default None:
            when the row is flagged (is_flagged). sft passes True for every row of a file in
            which any row is flagged: the cookbook loads rows with `datasets`, which gives every
            message every key seen in the file.
        path / line: where the row came from, named in the error.

    Returns:
        Copies of the messages, flagged when customized.

    Raises:
        MachineFormatError: customized and no message is trainable (field "messages").
    """
    messages = [dict(m) for m in row["messages"]]
    if customized is None:
        customized = is_flagged(row)
    if not customized:
        return messages
    flags = trainable_flags(messages, whole_run=bool(row.get("whole_run")))
    if not any(flags):
        raise MachineFormatError(path, _no_trainable_message(bool(row.get("whole_run"))), line=line, field="messages")
    for message, flag in zip(messages, flags):
        message["trainable"] = flag
    return messages


def refuse_jsonl_text(data: Any) -> None:
    """Refuse a string of JSONL text given where a file's path goes (a cell's `open(f).read()`).

    Such a string is not a path: as one it is missing, or too long for the file system to look up.

    Args:
        data: what a caller was given as its data.

    Raises:
        ValueError: a string that holds a newline, or reads as a JSON object or array ("{…}",
            "[…]"), and names no file.
    """
    if not isinstance(data, str):
        return
    bare = data.strip()
    if "\n" not in bare and not (bare[:1] + bare[-1:] in ("{}", "[]")):
        return
    try:
        if os.path.lexists(data):
            return
    except (OSError, ValueError):  # too long a name, or a NUL byte: no file has it
        pass
    raise ValueError(f"got JSONL text, not a file path ({data[:40]!r}…, {len(data):,} characters): write it to a "
                     "file and pass its path, or pass the rows as a list ([json.loads(line) for line in "
                     "text.splitlines() if line.strip()])")


def _source_rows(data: Any) -> tuple[str, Iterator[tuple[int, Any]]]:
    """(name for messages, (line number, row) pairs) of a JSONL path or an in-memory list/DataFrame."""
    if isinstance(data, (str, os.PathLike)):
        refuse_jsonl_text(data)
        path = Path(data)
        if not _names_a_file(path):
            raise FileNotFoundError(f"No training data at {path}")
        from .jsonl import iter_jsonl

        return str(path), iter_jsonl(path)
    return "<data>", enumerate(list(frame_rows(data)), start=1)


def frame_rows(data: Any) -> Any:
    """A DataFrame's rows as dicts without their missing cells (None, NaN, pd.NA, NaT), as the rows
    were before pandas gave every row every key some row has (a NaN `whole_run` would read as set);
    anything else as given.

    A frame read back through pyarrow (`pd.read_parquet`, `datasets`' `to_pandas`) holds numpy
    arrays where the rows held lists, and every message carries every key some message has, as
    None: arrays become lists, and a message's None keys other than "content" are left out (a
    None `trainable` would read as a flag).

    Args:
        data: a DataFrame, or rows.

    Returns:
        An iterator of row dicts for a DataFrame, else `data`.
    """
    if not (hasattr(data, "to_dict") and hasattr(data, "columns")):
        return data
    import numpy as np
    import pandas as pd

    def missing(value: Any) -> bool:
        return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))

    def plain(value: Any) -> Any:  # numpy arrays as lists and numpy scalars as Python's, all the way down
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, np.ndarray)):
            return [plain(v) for v in value]
        return value.item() if isinstance(value, np.generic) else value

    def row(record: Mapping[str, Any]) -> dict:
        out = {k: plain(v) for k, v in record.items() if not missing(v)}
        if isinstance(out.get("messages"), list):
            out["messages"] = [{k: v for k, v in m.items() if v is not None or k == "content"}
                               if isinstance(m, dict) else m for m in out["messages"]]
        return out

    return (row(record) for record in data.to_dict("records"))


def prepare_data(data: Any) -> tuple[list[dict], str]:
    """Check chat rows and choose what to train on, as `sft` writes them to its train.jsonl.

    Each row must pass check_row's training-row rules (the shape rules validate applies: known
    roles, content, tool calls, and the assistant's reply last). Rows are step examples (train
    the last assistant message) unless some are whole runs (`"whole_run": true`) or carry
    per-message `trainable` flags: then every row states its flags ("customized",
    trainable_flags): whole-run rows keep theirs (assistant messages without one are not
    trained), other rows train their last assistant message. Stating every flag matters because
    the cookbook loads rows with `datasets`, which gives every message every key seen in the file;
    for the same loader, when any message's content is a list of parts, every string content
    becomes one text part (the same tokens).

    Args:
        data: a chat JSONL path, a list of rows, or a DataFrame of export lines.

    Returns:
        (rows for the cookbook, each `{"messages": [...]}` only; the cookbook's train_on_what value).

    Raises:
        MachineFormatError: naming the file, line and field of the first bad row, or no rows.
        FileNotFoundError: a path that is not there.
        ValueError: JSONL text given instead of a file's path.
    """
    name, source = _source_rows(data)
    checked = [(line, check_row(row, "train", path=name, line=line)) for line, row in source]
    if not checked:
        raise MachineFormatError(name, "no training rows")
    flagged = any(is_flagged(row) for _, row in checked)
    # only `messages`: the cookbook's loader reads nothing else, and `datasets` would have to
    # unify the schemas of every other key (tools' JSON schemas differ from run to run)
    rows = [{"messages": train_messages(row, customized=flagged, path=name, line=line)} for line, row in checked]
    return _uniform_content(rows), ("customized" if flagged else "last_assistant_message")


def _uniform_content(rows: list[dict]) -> list[dict]:
    """Every message's content of one kind across the file: when any message holds a list of parts,
    a string becomes one text part, "" included (no part at all renders differently). `datasets`
    needs one type per field in a file (a string and a list in one field stop it: "cannot mix list
    and non-list")."""
    if not any(isinstance(m.get("content"), list) for row in rows for m in row["messages"]):
        return rows
    for row in rows:
        for m in row["messages"]:
            if isinstance(m.get("content"), str):
                m["content"] = [{"type": "text", "text": m["content"]}]
    return rows


# --------------------------------------------------------------------------- eval and probe rows

def load_eval_rows(path: str | os.PathLike) -> list[dict]:
    """Read and check an eval JSONL file: `{"messages", "expected", "match"?, "format"?}` per line.

    Args:
        path: the eval file.

    Returns:
        The rows as check_row returns them, each with its `line` number.

    Raises:
        MachineFormatError: invalid JSON, a missing "expected", an unknown "match", a bad regex
            or an empty file, naming the file, line and field. Every row is checked before
            anything is sampled (a bad row 23 should not cost 22 samples).
        ValueError: JSONL text given instead of a file's path.
    """
    from .jsonl import iter_jsonl

    refuse_jsonl_text(path)
    rows = [check_row(value, "eval", path=path, line=number) for number, value in iter_jsonl(path)]
    if not rows:
        raise MachineFormatError(path, "no eval rows (the file is empty)")
    return rows


def eval_rows(data: Any) -> tuple[list[dict], str | None]:
    """Checked eval rows from a path or from in-memory rows.

    Args:
        data: an eval JSONL path, a list of row dicts, or a DataFrame of rows (frame_rows: its
            missing cells left out). Line numbers of rows in memory are 1-based positions.

    Returns:
        (rows as check_row returns them, the file's path or None for in-memory rows).

    Raises:
        MachineFormatError: a bad row (file, line, field) or no rows.
        ValueError: JSONL text given instead of a file's path.
    """
    if isinstance(data, (str, os.PathLike)):
        return load_eval_rows(data), os.fspath(data)
    rows = [check_row(r, "eval", line=i + 1) for i, r in enumerate(frame_rows(data))]
    if not rows:
        raise MachineFormatError(None, "no eval rows given")
    return rows, None


def _names_a_file(text: str | os.PathLike) -> bool:
    """Whether `text` is the path of something that exists; a string no path can be (longer than
    the file system allows a name) is not, rather than an OSError."""
    try:
        return Path(text).exists()
    except OSError:
        return False


def probe_rows(prompts: Any) -> list[dict]:
    """Checked probe prompts from a JSONL path, one prompt string, or a list of strings and rows.

    Args:
        prompts: a probe JSONL path (a Path, or a string naming an existing file or ending in
            .jsonl), a prompt string, a list of prompt strings and `{"messages": [...], "format"?}` rows, or a
            DataFrame of such rows (frame_rows: its missing cells left out).

    Returns:
        Rows {"messages", "format", "line"}: a string becomes one user message; a row's trailing
        assistant reply is dropped (check_row with kind "probe").

    Raises:
        MachineFormatError: a bad row (file, line, field) or no prompts.
    """
    from .jsonl import iter_jsonl

    if isinstance(prompts, os.PathLike) or (isinstance(prompts, str) and (Path(prompts).suffix == ".jsonl"
                                                                         or _names_a_file(prompts))):
        items, path = list(iter_jsonl(prompts)), os.fspath(prompts)
    elif isinstance(prompts, str):
        items, path = [(1, prompts)], None
    else:
        items, path = list(enumerate(frame_rows(prompts), start=1)), None
    rows = []
    for line, item in items:
        if isinstance(item, str):
            rows.append({"messages": [{"role": "user", "content": item}], "format": None, "line": line})
        else:
            rows.append(check_row(item, "probe", path=path, line=line))
    if not rows:
        raise MachineFormatError(path, "no probe prompts")
    return rows


__all__ = ["ROLES", "PART_TYPES", "KINDS", "Finding", "content_text", "prompt_text", "row_findings", "check_row",
           "is_flagged", "trainable_flags", "trained_indices", "train_messages", "prepare_data", "frame_rows",
           "refuse_jsonl_text", "load_eval_rows", "eval_rows", "probe_rows"]
