"""Shared HTML for the widgets: chat cards per message and the token view coloured by loss weight.

Pure functions from plain data (a training line's messages, token rows) to self-contained HTML
with inline styles, so the same markup serves the live widget and the static fallback that an
nbconvert export or GitHub shows with no kernel and no stylesheet. Message text is redacted
(core/redact.py: a tool that printed a key would otherwise leave it in the saved notebook) and
cut when huge. Which messages are trained on
is decided in `chat.trained_indices` (sft's rule); the token rows come from `previewer.token_frame`.
Colours are JupyterLab theme variables (see `_base`), so the cards read in light and dark themes.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from ..core.chat import content_text
from ..core.redact import scrub, secret_values
from ..core.theme import BG, BG_ALT, BLUE, BORDER, BORDER_STRONG, CYAN, FG, FG_MUTED, GREEN, GREY, ORANGE, text_colour, tint
from ._base import escape

# Fold a tool result or message text behind <details> past this size: long tool output would
# push the rest of the conversation off screen (peers collapse it too).
FOLD_LINES = 20
FOLD_CHARS = 2000
# A folded text keeps at most this many characters (a tool that printed megabytes would otherwise
# stall the browser and swell the saved notebook); the rest is counted, not shown.
FOLD_MAX_CHARS = 100_000
# Redaction reads this far past the cut, so a secret that straddles it is found whole.
_REDACT_MARGIN = 4096

ROLE_COLOURS = {
    "system": GREY,
    "user": BLUE,
    "assistant": GREEN,
    "tool": ORANGE,
}
OTHER_ROLE = CYAN

CARD = (f"border:1px solid {BORDER};border-left:4px solid {{colour}};border-radius:6px;"
        f"margin:6px 0;padding:6px 10px;background:{BG};color:{FG};font-family:system-ui,sans-serif;")
PRE = "white-space:pre-wrap;word-break:break-word;margin:4px 0;font-family:ui-monospace,monospace;font-size:12px;"
BADGE = "display:inline-block;border-radius:4px;padding:0 6px;margin-left:6px;font-size:11px;"


def content_parts(content: Any) -> list[dict]:
    """A message's content as a list of parts.

    Args:
        content: a message's "content": a string, a list of parts, None or anything else.

    Returns:
        Parts `{"type": "text"|"thinking"|other, ...}`: a plain string is one text part, None is
        no parts, a non-dict list item or other value becomes a text part of its str(); unknown
        part types are kept as they are (shown as JSON), so nothing in a line is hidden from the
        reader.
    """
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [p if isinstance(p, dict) else {"type": "text", "text": str(p)} for p in content]
    return [{"type": "text", "text": str(content)}]


def message_text(message: dict, *, reasoning: bool = False) -> str:
    """The text of a message's content, parts joined with "" (chat.content_text).

    Args:
        message: a chat message.
        reasoning: include the text of reasoning ("thinking") parts too (default False).

    Returns:
        The text.
    """
    return content_text(message.get("content"), reasoning=reasoning)


def _redacted(text: str, secrets: list[str] | None) -> str:
    return scrub(text, secret_values() if secrets is None else secrets)[0]


def folded(text: str, *, label: str = "output", secrets: list[str] | None = None) -> str:
    """Text in a <pre>, redacted, folded behind <details> when long.

    Args:
        text: the text (redacted and escaped here).
        label: what the text is, in the fold's summary line (escaped here; default "output").
        secrets: the values to redact (default None: redact.secret_values() of the environment).

    Returns:
        The HTML: the whole text, or, past FOLD_LINES lines or FOLD_CHARS characters, its first
        five lines and a <details> holding all of it, cut at FOLD_MAX_CHARS characters with a line
        saying how many more there are.
    """
    n_lines, n_chars = text.count("\n") + 1, len(text)
    if n_lines <= FOLD_LINES and n_chars <= FOLD_CHARS:
        return f'<pre style="{PRE}">{escape(_redacted(text, secrets))}</pre>'
    shown = _shown(text, secrets, FOLD_MAX_CHARS)  # redacted once, for the head and the whole
    head = "\n".join(shown.splitlines()[:5])[:400]
    return (f'<pre style="{PRE}">{escape(head)}</pre>'
            f'<details><summary style="cursor:pointer;color:{FG_MUTED}">{escape(label)}: {n_lines:,} lines, '
            f'{n_chars:,} chars (show all)</summary><pre style="{PRE}">{_shown_html(shown, n_chars, FOLD_MAX_CHARS)}</pre></details>')


def _shown(text: str, secrets: list[str] | None, limit: int) -> str:
    """A text's first `limit` characters, redacted reading past them (a secret across the cut shows
    no part of itself)."""
    return _redacted(text[:limit + _REDACT_MARGIN], secrets)[:limit]


def _shown_html(shown: str, total: int, limit: int) -> str:
    """What _shown kept of a text of `total` characters cut at `limit`, escaped, then a line
    counting the characters past the cut."""
    if total <= limit:
        return escape(shown)
    return f'{escape(shown)}\n<span style="color:{FG_MUTED}">… {total - limit:,} more characters not shown</span>'


def text_html(text: str, secrets: list[str] | None = None, *, limit: int = FOLD_MAX_CHARS) -> str:
    """A text as HTML that is safe to show and to save: redacted, escaped, cut when long.

    Args:
        text: the text.
        secrets: the values to redact (default None: redact.secret_values() of the environment).
        limit: the most characters shown (default FOLD_MAX_CHARS). Redaction reads past it, so a
            secret across the cut shows no part of itself.

    Returns:
        The escaped text: its first `limit` characters, then a line counting the rest.
    """
    return _shown_html(_shown(text, secrets, limit), len(text), limit)


def _arguments(raw: Any) -> str:
    """Tool-call arguments pretty-printed when they are JSON (they arrive as a JSON string)."""
    if isinstance(raw, str):
        from ..core.jsonl import parse_json

        try:
            return json.dumps(parse_json(raw), indent=2, ensure_ascii=False)
        except ValueError:  # not JSON, or nested too deep to walk: shown as it came
            return raw
    return json.dumps(raw, indent=2, ensure_ascii=False, default=str)


def tool_calls(message: dict) -> list[tuple[Any, Any, Any]]:
    """A message's tool calls as (id, function name, arguments), whatever shape they came in.

    Args:
        message: a chat message.

    Returns:
        One tuple per call: an OpenAI-style `{"id", "function": {"name", "arguments"}}` gives its
        three fields; a call whose function is a bare string gives that as the name; a call that
        is not an object (a hand-written line's "get_weather(city='Oslo')") gives its str() as the
        arguments, so it is shown, not dropped. A single call not in a list counts as one.
    """
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        calls = [calls]
    out = []
    for call in calls:
        if not isinstance(call, dict):
            out.append((None, None, str(call)))
            continue
        fn = call.get("function")
        if isinstance(fn, dict):
            out.append((call.get("id"), fn.get("name"), fn.get("arguments")))
        else:
            out.append((call.get("id"), fn, call.get("arguments")))
    return out


def call_results(messages: list[dict]) -> dict[int, list[str | None]]:
    """What came back for each tool call of a conversation.

    A call's result is the first tool message after it whose `tool_call_id` is the call's id as
    a JSON value (7 and 7.0 pair; 7 and "7" do not), the rule export follows
    (store.messages.result_after): harnesses that number calls per reply reuse "call_0" in later
    steps, so the id alone does not say which result answers which call.

    Args:
        messages: the chat messages.

    Returns:
        {index of a message with tool calls: the text of each call's result, in tool_calls order,
        None where none came back}.
    """
    from ..store.messages import result_after, result_positions

    positions = result_positions(messages)
    out: dict[int, list[str | None]] = {}
    for i, m in enumerate(messages):
        calls = tool_calls(m)
        if not calls:
            continue
        found = [result_after(messages, positions, call_id, i) for call_id, _name, _arguments in calls]
        out[i] = [message_text(r) if r is not None else None for r in found]
    return out


def message_card(message: dict, *, index: int, trained: bool, results: list[str | None] | None = None,
                 secrets: list[str] | None = None) -> str:
    """One chat card: role header, a "trained" badge, text, collapsed reasoning, tool calls; the
    text, reasoning, call arguments and results redacted.

    Args:
        message: a chat message.
        index: its position in the conversation (shown as "#index").
        trained: whether sft trains on it ("trained" badge; an assistant message that is not
            gets "context only").
        results: the output of each of its tool calls, in tool_calls order (None where none came
            back; see call_results), shown under the call (default None: calls alone).
        secrets: the values to redact (default None: redact.secret_values() of the environment).

    Returns:
        The card's HTML.
    """
    secrets = secret_values() if secrets is None else secrets
    role = str(message.get("role", "?"))
    colour = ROLE_COLOURS.get(role, OTHER_ROLE)
    badges = ""
    if trained:
        badges += f'<span class="mnb-trained" style="{BADGE}background:{tint(GREEN, 40)};color:{FG}">trained</span>'
    elif role == "assistant":
        badges += f'<span style="{BADGE}background:{BG_ALT};color:{FG}">context only</span>'
    extra = ""
    if role == "tool":
        name = message.get("name") or ""
        extra = f' <span style="color:{FG_MUTED};font-size:12px">{escape(name)} · {escape(message.get("tool_call_id"))}</span>'
    body = []
    for part in content_parts(message.get("content")):
        kind = part.get("type")
        if kind == "thinking":
            text = str(part.get("thinking") or "")
            body.append(f'<details class="mnb-reasoning"><summary style="cursor:pointer;color:{FG_MUTED}">'
                        f'reasoning ({len(text):,} chars)</summary><pre style="{PRE}color:{FG_MUTED}">'
                        f'{text_html(text, secrets)}</pre></details>')
        elif kind == "text":
            text = str(part.get("text") or "")
            if text:
                body.append(folded(text, label=role, secrets=secrets))
        else:
            shown = _redacted(json.dumps(part, default=str)[:FOLD_CHARS + _REDACT_MARGIN], secrets)[:FOLD_CHARS]
            body.append(f'<pre style="{PRE}color:{FG_MUTED}">{escape(shown)}</pre>')
    for n, (call_id, name, arguments) in enumerate(tool_calls(message)):
        body.append(f'<div class="mnb-tool-call" style="border:1px dashed {BORDER_STRONG};border-radius:4px;padding:4px 8px;margin:4px 0">'
                    f'<b>call</b> <code>{escape(name)}</code> '
                    f'<span style="color:{FG_MUTED};font-size:12px">{escape(call_id)}</span>'
                    f'{folded(_arguments(arguments), label="arguments", secrets=secrets)}')
        result = results[n] if results is not None and n < len(results) else None
        if result is not None:
            body.append(f'<b>result</b>{folded(result, label="result", secrets=secrets)}')
        body.append("</div>")
    return (f'<div class="mnb-card mnb-role-{escape(role)}" style="{CARD.format(colour=colour)}">'
            f'<div style="font-size:12px;color:{text_colour(colour)};font-weight:600">#{index} {escape(role)}{badges}{extra}</div>'
            f'{"".join(body)}</div>')


def chat_cards(messages: list[dict], trained: Iterable[int] = ()) -> str:
    """Cards for a whole conversation, each tool call with its result (see call_results).

    Args:
        messages: the chat messages.
        trained: indices of the messages trained on (default none).

    Returns:
        The cards' HTML, one per message (text redacted, see message_card).
    """
    trained = set(trained)
    results = call_results(messages)
    secrets = secret_values()
    return "".join(message_card(m, index=i, trained=i in trained, results=results.get(i), secrets=secrets)
                   for i, m in enumerate(messages))


def weight_colour(weight: float) -> str:
    """The background of a token in the token view.

    Args:
        weight: the token's loss weight.

    Returns:
        A CSS colour: the theme's second layout colour for weight 0 (context), green deepening
        with the weight (22% to 45% over the page colour, so the theme's text stays above 4.5:1
        on it in light and dark themes).
    """
    if weight <= 0:
        return BG_ALT
    return tint(GREEN, round(22 + 23 * min(1.0, float(weight))))


def _token_style(weight: float) -> str:
    return f"background:{weight_colour(weight)};color:{FG}"


def _visible(text: str) -> str:
    # Show whitespace that would otherwise vanish at a token boundary.
    return escape(text).replace("\n", "↵\n").replace("\t", "→")


def token_view(tokens: Iterable[dict], *, max_tokens: int = 4000) -> str:
    """Tokens as boxed spans (boundaries visible), coloured by loss weight, with a legend.

    Args:
        tokens: dicts with `token_id`, `text`, `weight` (previewer.token_frame's rows).
        max_tokens: draw at most this many (default 4,000, so a browser stays responsive); the
            rest is summarised in one line.

    Returns:
        The HTML: a legend with the counts, then the spans.
    """
    rows = list(tokens)
    trained = sum(1 for r in rows if r["weight"] > 0)
    spans = []
    for r in rows[:max_tokens]:
        trained_cls = " mnb-tok-trained" if r["weight"] > 0 else ""
        spans.append(f'<span class="mnb-tok{trained_cls}" title="id {r["token_id"]} · weight {r["weight"]:g}" '
                     f'style="{_token_style(r["weight"])};border:1px solid {BORDER};'
                     f'border-radius:2px;margin:0 1px 1px 0;padding:0 1px">{_visible(r["text"])}</span>')
    more = ""
    if len(rows) > max_tokens:
        more = f'<div style="color:{FG_MUTED}">… {len(rows) - max_tokens:,} more tokens not drawn</div>'
    legend = (f'<div style="font-size:12px;margin:4px 0">{len(rows):,} tokens, {trained:,} trained on · '
              f'<span class="mnb-legend-trained" style="{_token_style(1)};padding:0 4px">weight &gt; 0 (trained)</span> '
              f'<span class="mnb-legend-context" style="{_token_style(0)};padding:0 4px">weight 0 (context)</span></div>')
    return (f'<div class="mnb-tokens">{legend}<div style="{PRE}line-height:1.7">{"".join(spans)}</div>{more}</div>')
