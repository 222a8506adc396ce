"""The local engine's chat formats as tinker-cookbook Renderers.

`LocalChatRenderer` ("machine_nb/local_chat") is the tiny model's own format;
`ChatMLRenderer` ("machine_nb/smollm2_chatml") is SmolLM2's ChatML template, token for token
(see its docstring). The tiny model's format:

    <|bos|><|system|> You are terse.<|end|><|user|> What is 47 plus 15?<|end|><|assistant|> 47 + 15 = 62<|end|>

Every message is a role token, a space, its text and <|end|>; sampling stops at <|end|>. The
space before the text makes a reply's first word the same token as mid-sentence (" answer").
Build-time pretraining (build.py) renders its corpus with this class, so the base model sees
exactly the prompts the engine will give it.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import tinker
from tinker_cookbook.renderers.base import (
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    ToolSpec,
)

RENDERER_NAME = "machine_nb/local_chat"
CHATML_RENDERER_NAME = "machine_nb/smollm2_chatml"

_ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
_PREFIX = " "  # before every message's text; parse_response removes it again


def _tool_call_text(call: Any) -> str:
    """One tool call as plain text: `call NAME ARGUMENTS_JSON` (ToolCall objects or OpenAI dicts)."""
    if hasattr(call, "function"):
        name, args = call.function.name, call.function.arguments
    elif isinstance(call, dict):
        fn = call.get("function") or {}
        name, args = fn.get("name", call.get("name", "")), fn.get("arguments", call.get("arguments", ""))
    else:
        name, args = "", str(call)
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return f"call {name} {args}".rstrip()


def message_text(message: Message) -> str:
    """A message's content as the plain text the local model reads.

    Text parts are joined with no separator; thinking parts become `<think>…</think>`; images and
    audio become `[image]` / `[audio]`; each tool call (OpenAI `tool_calls` or parsed ToolCall)
    adds a line `call NAME ARGUMENTS_JSON`; a tool result is prefixed with `NAME: ` when the message
    names its tool. The tiny model never learns these; they render so any row has real token counts.
    """
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        pieces = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                pieces.append(str(part.get("text", "")))
            elif kind == "thinking":
                pieces.append(f"<think>{part.get('thinking', '')}</think>")
            elif kind in ("image", "image_url"):
                pieces.append("[image]")
            elif kind in ("audio", "input_audio"):
                pieces.append("[audio]")
            else:
                pieces.append(json.dumps(part, ensure_ascii=False, sort_keys=True, default=str))
        text = "".join(pieces)
    calls = list(message.get("tool_calls") or []) + list(message.get("unparsed_tool_calls") or [])
    lines = [text] if text else []
    for call in calls:
        raw = getattr(call, "raw_text", None)
        lines.append(raw if raw is not None else _tool_call_text(call))
    text = "\n".join(lines)
    if message.get("role") == "tool" and message.get("name"):
        text = f"{message['name']}: {text}"
    return text


def _special_id(tokenizer: Any, token: str) -> int:
    """The id of a special token such as "<|im_end|>", by any tokenizer with an `encode`
    (ValueError when it is no single token there)."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"{token} is not one token in this tokenizer")
    return ids[0]


class _EndTokenRenderer(Renderer):
    """What both renderers share: every message ends with one end token (`_end_message_token`),
    sampling stops at it, and nothing is stripped from history."""

    @property
    def has_extension_property(self) -> bool:
        return True  # nothing is stripped from history

    def get_stop_sequences(self) -> list[int]:
        """Sampling stops at the end-of-message token."""
        return [self._end_message_token]

    def _until_end(self, response: list[int]) -> tuple[list[int], ParseTermination]:
        """The sampled tokens before the first end token (STOP_SEQUENCE), or all of them when
        none ended the reply (MALFORMED); tokens after it (a sampler that ran past it) are dropped."""
        response = list(response)
        end = self._end_message_token
        if end in response:
            return response[: response.index(end)], ParseTermination.STOP_SEQUENCE
        return response, ParseTermination.MALFORMED


class LocalChatRenderer(_EndTokenRenderer):
    """tinker-cookbook renderer for the local engine's models (see the module docstring for the format).

    Unknown roles render with the <|system|> token followed by `ROLE: `, so no row is refused.
    Works over the engine's `LocalTokenizer` and over its Hugging Face form (what the tinker SDK's
    `get_tokenizer()` loads), with the same tokens.
    """

    @property
    def _bos_tokens(self) -> list[int]:
        return [self.tokenizer.bos_token_id]

    @property
    def _end_message_token(self) -> int:
        return self.tokenizer.eos_token_id

    def _encode(self, text: str) -> list[int]:
        """Message text as tokens that are never role/end tokens, whatever it contains."""
        added = getattr(self.tokenizer, "get_added_vocab", None)
        if added is None:  # LocalTokenizer: split_special_tokens spells them as plain text
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        # The Hugging Face form holds the special tokens in its model's vocabulary too, so it encodes
        # their text as them even when told to split it: such text is encoded a character at a time,
        # as the local tokenizer spells it (no word piece holds their characters).
        specials = sorted(added(), key=len, reverse=True)
        ids: list[int] = []
        pattern = "(" + "|".join(re.escape(t) for t in specials) + ")"
        for i, piece in enumerate(re.split(pattern, text) if specials else [text]):
            if i % 2:
                for ch in piece:
                    ids += self.tokenizer.encode(ch, add_special_tokens=False)
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False)
        return ids

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = message["role"]
        text = message_text(message)
        if role in _ROLE_TOKENS:
            header = [_special_id(self.tokenizer, _ROLE_TOKENS[role])]
        else:
            header = [_special_id(self.tokenizer, "<|system|>")]
            text = f"{role}: {text}"
        output = self._encode(_PREFIX + text) + [self._end_message_token]
        return RenderedMessage(
            header=tinker.types.EncodedTextChunk(tokens=header),
            output=[tinker.types.EncodedTextChunk(tokens=output)],
        )

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        """The assistant message in sampled tokens: STOP_SEQUENCE when <|end|> ended it, else MALFORMED.

        Text after the first <|end|> (a sampler that ran past it) is dropped.
        """
        body, term = self._until_end(response)
        text = self.tokenizer.decode(body).removeprefix(_PREFIX)
        return Message(role="assistant", content=text), term

    def create_conversation_prefix_with_tools(self, tools: list[ToolSpec], system_prompt: str = "") -> list[Message]:
        """A system message: the prompt, then one `tool NAME: DESCRIPTION PARAMETERS_JSON` line per tool."""
        lines = [system_prompt] if system_prompt else []
        for t in tools:
            params = json.dumps(t.get("parameters", {}), ensure_ascii=False, sort_keys=True)
            lines.append(f"tool {t.get('name', '')}: {t.get('description', '')} {params}")
        return [Message(role="system", content="\n".join(lines))]


def renderer_factory(tokenizer: Any, image_processor: Any = None) -> LocalChatRenderer:
    """What `renderers.register_renderer` stores (the cookbook passes an image processor; unused)."""
    return LocalChatRenderer(tokenizer)


# ---------------------------------------------------------------------------------------------
# SmolLM2's ChatML

#: The system turn SmolLM2's chat template adds when a conversation has none.
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml_text(message: Message) -> str:
    """A message's content as the text between `<|im_start|>ROLE\\n` and `<|im_end|>`.

    A string is itself; parts join as `message_text` joins them (thinking as `<think>…</think>`,
    images and audio as placeholders); each tool call adds a line
    `<tool_call>{"name": …, "arguments": …}</tool_call>` (`ChatMLRenderer.parse_response` reads it
    back, and SmolLM2's own list form). The chat template gives the same tokens for a message whose
    content is this text.
    """
    calls = list(message.get("tool_calls") or []) + list(message.get("unparsed_tool_calls") or [])
    text = message_text({**message, "tool_calls": [], "unparsed_tool_calls": []}) if calls else message_text(message)
    lines = [text] if text else []
    for call in calls:
        raw = getattr(call, "raw_text", None)
        if raw is not None:
            lines.append(raw)
            continue
        if hasattr(call, "function"):
            name, args = call.function.name, call.function.arguments
        elif isinstance(call, dict):
            fn = call.get("function") or {}
            name, args = fn.get("name", call.get("name", "")), fn.get("arguments", call.get("arguments", {}))
        else:
            name, args = "", str(call)
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        lines.append("<tool_call>" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "</tool_call>")
    return "\n".join(lines)


#: A tool call span in a reply; its JSON may run over several lines.
_TOOL_CALL_SPAN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _strict_json(text: str) -> Any:
    """`json.loads` that refuses NaN and Infinity (no JSON parser of a tool's arguments reads them)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _tool_calls(payload: str) -> list[tuple[str, str]] | None:
    """(name, arguments as a JSON object's text) of each call in a `<tool_call>` span's JSON: one
    call object or a list of them, each with a non-empty string name and arguments that are an
    object (or a string holding one's JSON; absent: {}). None when the span is not such calls."""
    try:
        value = _strict_json(payload.strip())
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        args = item.get("arguments", {})
        if isinstance(args, str):
            try:
                args = _strict_json(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        out.append((item["name"], json.dumps(args)))
    return out or None


class ChatMLRenderer(_EndTokenRenderer):
    """SmolLM2's ChatML chat template as a tinker-cookbook renderer.

        <|im_start|>system\\nYou are terse.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n

    A conversation that does not start with a system message gets the template's default one.
    Tokens equal the tokenizer's `apply_chat_template` on the same messages (with
    `add_generation_prompt=True` for `build_generation_prompt`): `ROLE\\nCONTENT` is encoded as one
    piece, as the template's rendered string is, and split into header and trained output at the
    first token that reaches past `ROLE\\n`. The newline after `<|im_end|>` opens the next
    message's header; after the last message it is the trained `stop_overlap`. Sampling stops at
    `<|im_end|>`.

    Text inside a message that spells one of the tokenizer's special tokens (`<|im_end|>`,
    `<|im_start|>`, `<|endoftext|>` and the file's other control tokens) is encoded as that
    control token, as the chat template's rendered string is: a reply whose text holds
    `<|im_end|>` trains the model to end there.
    """

    @property
    def _bos_tokens(self) -> list[int]:
        return []

    def _special(self, token: str) -> int:
        return _special_id(self.tokenizer, token)

    @property
    def _end_message_token(self) -> int:
        return self._special("<|im_end|>")

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _role_and_content(self, role: str, text: str) -> tuple[list[int], list[int]]:
        head = f"{role}\n"
        ids = self._encode(head + text)
        k = 0
        while k < len(ids):
            piece = self.tokenizer.decode(ids[: k + 1])
            if len(piece) > len(head) or not head.startswith(piece):
                break
            k += 1
        return ids[:k], ids[k:]

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = str(message["role"])
        start = self._special("<|im_start|>")
        newline = self._encode("\n")
        prefix: list[int] = []
        if ctx.idx == 0 and role != "system":
            sys_head, sys_body = self._role_and_content("system", SMOLLM2_DEFAULT_SYSTEM)
            prefix = [start, *sys_head, *sys_body, self._end_message_token, *newline]
        elif ctx.idx > 0:
            prefix = list(newline)
        head, body = self._role_and_content(role, chatml_text(message))
        return RenderedMessage(
            header=tinker.types.EncodedTextChunk(tokens=[*prefix, start, *head]),
            output=[tinker.types.EncodedTextChunk(tokens=[*body, self._end_message_token])],
            stop_overlap=tinker.types.EncodedTextChunk(tokens=list(newline)),
        )

    def _get_generation_suffix(self, role: Any, ctx: RenderContext) -> list[int]:
        start = self._special("<|im_start|>")
        head, body = self._role_and_content(str(role), "")
        return ([] if ctx.idx == 0 else self._encode("\n")) + [start, *head, *body]

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        """The assistant message in sampled tokens: STOP_SEQUENCE when <|im_end|> ended it, else
        MALFORMED (a reply cut at max_tokens: its text alone, no tool calls, as the cookbook's
        renderers give it).

        In a whole reply, each `<tool_call>…</tool_call>` span (on one line or several, beside
        text or not) whose JSON is a call `{"name": …, "arguments": {…}}` or a list of them (the
        form SmolLM2's function-calling prompt asks for) becomes tool calls (`_tool_calls`), and
        lines left holding nothing else are dropped from the content; any other span stays text.
        """
        from tinker_cookbook.renderers.base import ToolCall

        body, term = self._until_end(response)
        text = self.tokenizer.decode(body)
        if not term.is_stop_sequence:
            return Message(role="assistant", content=text), term
        calls: list[Any] = []
        taken = f"\x00{secrets.token_hex(16)}\x00"  # stands for a parsed span while the lines are sorted

        def take(match: re.Match) -> str:
            found = _tool_calls(match.group(1))
            if found is None:
                return match.group(0)
            calls.extend(ToolCall(function=ToolCall.FunctionBody(name=name, arguments=args)) for name, args in found)
            return taken

        marked = _TOOL_CALL_SPAN.sub(take, text)
        if not calls:
            return Message(role="assistant", content=text), term
        kept = [line.replace(taken, "") for line in marked.split("\n")
                if taken not in line or line.replace(taken, "").strip()]
        msg = Message(role="assistant", content="\n".join(kept))
        msg["tool_calls"] = calls
        return msg, term

    def create_conversation_prefix_with_tools(self, tools: list[ToolSpec], system_prompt: str = "") -> list[Message]:
        """A system message: the prompt, then the tools as a JSON list inside `<tools>…</tools>`,
        and how to call them."""
        listed = json.dumps([{"name": t.get("name", ""), "description": t.get("description", ""),
                              "parameters": t.get("parameters", {})} for t in tools], ensure_ascii=False)
        lines = [system_prompt] if system_prompt else []
        lines.append(f"You can call these tools: <tools>{listed}</tools>")
        lines.append('To call one, answer with a line <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')
        return [Message(role="system", content="\n".join(lines))]


def chatml_renderer_factory(tokenizer: Any, image_processor: Any = None) -> ChatMLRenderer:
    """What `renderers.register_renderer` stores for "machine_nb/smollm2_chatml"."""
    return ChatMLRenderer(tokenizer)


#: Renderer name -> factory, for registration (engines/local/__init__.py).
FACTORIES = {RENDERER_NAME: renderer_factory, CHATML_RENDERER_NAME: chatml_renderer_factory}
