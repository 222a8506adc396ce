"""Machine Messages and chat messages: which message is a tool call, which tool result answers it,
whether a call failed, and Machine's run messages as OpenAI-style chat messages.

The store layer's rules for messages, so reading a tagged turn (`store/tags.py`) and exporting
training lines (`export.py`, which re-exports these names) apply the same ones. How message
content reads as text is `chat.content_text`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Container, Sequence
from typing import Any

from ..core.chat import content_text
from ..core.jsonl import parse_json

# A failed-tool predicate: (tool call message, tool result message) -> whether the call failed.
FailedPredicate = Callable[[dict, dict], bool]

# "Error…" or "error:" (any case) after leading whitespace; a regex, so long outputs are not copied
_ERROR_TEXT = re.compile(r"\s*(?:Error|(?i:error:))")


def default_failed(call: dict, result: dict) -> bool:
    """The default rule for a failed tool call, judged from its result message alone.

    A result failed when it carries `"isError": true` or a non-empty `"error"` key, or when its
    text content starts with "Error" or "error:" (after leading whitespace). Machine's own
    `stepFailed` also consults the machine's tool code, which is not in its files, so this is a
    guess a user can see and replace: pass `failed=` (a `(call, result) -> bool` predicate) to
    `messages()`, `training_lines()` or `step_failed()`.

    Args:
        call: the tool call message (not consulted by this rule; a replacement may use it).
        result: the tool result message.

    Returns:
        Whether the call failed.
    """
    if result.get("isError") is True or result.get("is_error") is True or result.get("error"):
        return True
    content = result.get("content")
    if isinstance(content, list):  # chat parts
        content = content_text(content)
    return isinstance(content, str) and _ERROR_TEXT.match(content) is not None


def is_tool_call(message: dict) -> bool:
    """Whether a Machine Message is an assistant tool call (one message per call).

    Args:
        message: a Machine Message.

    Returns:
        True for an assistant message with a `toolCallId` or `toolInput`, or with a `name` and no
        content.
    """
    return message.get("role") == "assistant" and (
        message.get("toolCallId") is not None or message.get("toolInput") is not None
        or (message.get("name") is not None and not message.get("content")))


def tool_results(messages: Sequence[dict]) -> dict[str, dict]:
    """Tool result messages by the call id they answer (the last one, where an id repeats; to
    pair a call with its own result, use result_after).

    Args:
        messages: Machine Messages or chat messages.

    Returns:
        {call id: result message} from Machine's `toolCallId` or chat's `tool_call_id`.
    """
    out = {}
    for m in messages:
        if m.get("role") == "tool":
            cid = m.get("toolCallId", m.get("tool_call_id"))
            if cid is not None:
                out[cid] = m
    return out


def result_positions(messages: Sequence[dict]) -> dict[Any, list[int]]:
    """Where the tool results are, by the call id they answer, in order (for result_after).

    Args:
        messages: Machine Messages or chat messages.

    Returns:
        {call_id_key(call id): positions in `messages` of the tool results carrying it, ascending}.
    """
    out: dict[Any, list[int]] = {}
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            cid = m.get("toolCallId", m.get("tool_call_id"))
            if cid is not None:
                out.setdefault(call_id_key(cid), []).append(i)
    return out


def call_id_key(value: Any) -> Any:
    """A tool call id as the JSON value it is, for pairing a call with its result: ids pair when
    their JSON values are equal (7 and 7.0 do; 7 and "7" do not, nor true and 1). Machine's runs
    carry string ids; a chat row may carry any JSON value.

    Args:
        value: a call's id or a result's `tool_call_id` / `toolCallId`, as parsed from JSON.

    Returns:
        A hashable key (a string id is its own key); None for a missing id (it pairs with nothing).
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)  # 7 == 7.0, with one hash
    return ("json", json.dumps(value, sort_keys=True, default=str))


def result_after(messages: Sequence[dict], positions: dict[Any, list[int]], cid: Any, at: int) -> dict | None:
    """The result of the call with id `cid` made at position `at`: the first tool result after it
    that carries its id (compared by call_id_key). Harnesses that number calls per reply
    ("call_0") reuse an id in later steps, so the id alone does not say which result answers
    which call.

    Args:
        messages: the conversation.
        positions: result_positions(messages).
        cid: the call's id (None: no result can be found).
        at: the position of the message making the call.

    Returns:
        The result message, or None when none follows.
    """
    import bisect

    found = positions.get(call_id_key(cid)) if cid is not None else None
    if not found:
        return None
    k = bisect.bisect_right(found, at)
    return messages[found[k]] if k < len(found) else None


def _pair(positions: dict[Any, list[int]], cid: Any, at: int, taken: Container[int]) -> int | None:
    """The position of the result of the call with id `cid` made at `at`: the first tool result
    after it that carries its id and answers no earlier call (parallel calls may share an id)."""
    import bisect

    found = positions.get(call_id_key(cid)) if cid is not None else None
    if not found:
        return None
    return next((found[k] for k in range(bisect.bisect_right(found, at), len(found)) if found[k] not in taken), None)


def _parts(text: str, thinking: str | None) -> Any:
    if thinking:
        parts: list[dict] = [{"type": "thinking", "thinking": thinking}]
        if text:
            parts.append({"type": "text", "text": text})
        return parts
    return text


def without_thinking(message: dict) -> dict:
    """The message without reasoning.

    Args:
        message: a chat message.

    Returns:
        The message itself when its content is not a list of parts; else a copy whose content is
        the text of its text parts (thinking parts dropped), or, when other parts remain (images,
        audio), the list of parts without the thinking ones.
    """
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [part for part in content if not (isinstance(part, dict) and part.get("type") == "thinking")]
    if any(not isinstance(part, dict) or part.get("type") != "text" for part in kept):
        return {**message, "content": kept}
    return {**message, "content": content_text(content)}


def _arguments(tool_input: Any) -> str:
    if isinstance(tool_input, str):
        try:
            parse_json(tool_input)  # bounded nesting: never a RecursionError on a hostile string
            return tool_input  # already a JSON string
        except ValueError:
            pass
    return json.dumps({} if tool_input is None else tool_input, ensure_ascii=False, separators=(",", ":"))


def to_chat(messages: Sequence[dict], reasoning: bool | Callable[[str], str] | None = True,
            failed: FailedPredicate | None = None) -> tuple[list[dict], list[bool]]:
    """Machine Messages as chat messages, with whether each is a failed step.

    Consecutive assistant tool-call messages (and the assistant prose right before them) become
    one assistant message with OpenAI `tool_calls` `[{id, type: "function", function: {name,
    arguments: JSON string}}]`; tool results become `{role: "tool", tool_call_id, name, content}`.
    A call is paired with the first later result carrying its id that answers no earlier call; a
    call whose id is missing or empty gets one (`call_<message>_<call>`), and its result carries
    the same.

    Args:
        messages: Machine Messages in order.
        reasoning: True (default) keeps each message's `reasoning` as a thinking part; a function
            rewrites it (Machine's `transformReasoning`); False or None drops it.
        failed: the failed-tool predicate, judged on the Machine messages where the error flags
            live (default None: `default_failed`).

    Returns:
        (chat messages, one flag per chat message: an assistant step whose tool calls all failed).
    """
    positions = result_positions(messages)
    answers: dict[int, Any] = {}  # position of a tool result -> the id of the call it answers
    failed = failed or default_failed
    out: list[dict] = []
    flags: list[bool] = []
    pending_calls: list[tuple[dict, dict]] = []  # (machine call message, its result) of the open step
    step_at = [-1]  # index in `out` of the assistant step the pending calls belong to

    def close_step() -> None:
        if pending_calls and step_at[0] >= 0:
            flags[step_at[0]] = all(res is not None and failed(call, res) for call, res in pending_calls)
        pending_calls.clear()

    def think(m: dict) -> str | None:
        r = m.get("reasoning")
        if not r or not reasoning:
            return None
        return reasoning(r) if callable(reasoning) else r

    for at, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content") or ""
        if role == "assistant" and is_tool_call(m):
            given = m.get("toolCallId")
            cid = given if given is not None and given != "" else f"call_{len(out)}_{len(pending_calls)}"
            found = _pair(positions, given, at, answers)
            if found is not None:
                answers[found] = cid
            call = {"id": cid, "type": "function",
                    "function": {"name": m.get("name") or "", "arguments": _arguments(m.get("toolInput"))}}
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and not prev.get("_closed"):
                # merge into the open assistant step: its prose, reasoning and earlier calls
                prev.setdefault("tool_calls", []).append(call)
                prev["_text"] = "\n".join(t for t in (prev["_text"], content) if t)
                prev["_think"] = "\n\n".join(t for t in (prev["_think"], think(m)) if t) or None
            else:
                close_step()
                out.append({"role": "assistant", "_text": content, "_think": think(m), "tool_calls": [call]})
                flags.append(False)
            step_at[0] = len(out) - 1
            pending_calls.append((m, messages[found] if found is not None else None))
            continue
        if out and out[-1]["role"] == "assistant":
            out[-1]["_closed"] = True
        if role == "assistant":
            close_step()
            out.append({"role": "assistant", "_text": content, "_think": think(m)})
            flags.append(False)
            continue
        if role != "tool":
            close_step()
        msg: dict[str, Any] = {"role": role, "content": content}
        if role == "tool":
            if at in answers:
                msg["tool_call_id"] = answers[at]
            elif m.get("toolCallId") is not None:
                msg["tool_call_id"] = m["toolCallId"]
            if m.get("name") is not None:
                msg["name"] = m["name"]
        out.append(msg)
        flags.append(False)
    close_step()
    for msg in out:
        if "_text" in msg:
            text, thinking = msg.pop("_text"), msg.pop("_think")
            msg.pop("_closed", None)
            calls = msg.pop("tool_calls", None)
            msg["content"] = _parts(text, thinking)
            if calls:
                msg["tool_calls"] = calls
    return out, flags


__all__ = ["FailedPredicate", "default_failed", "is_tool_call", "tool_results", "result_positions", "result_after",
           "without_thinking", "to_chat"]
