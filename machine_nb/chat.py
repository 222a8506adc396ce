"""Chat rows: a message's content as text, and the rules a row's shape follows.

One home for what every step needs to agree on: how message content reads as text (tag keys,
overlap digests, prompts in results), which rows are valid training, eval or probe rows (validate
reports every problem as a finding; trainers and evals refuse the first with MachineFormatError),
and which messages a training row trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


__all__ = ["content_text", "prompt_text"]
