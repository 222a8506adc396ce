"""The local model's chat format as a tinker-cookbook Renderer (registered as "machine_nb/local_chat").

    <|bos|><|system|> You are terse.<|end|><|user|> What is 47 plus 15?<|end|><|assistant|> 47 + 15 = 62<|end|>

Every message is a role token, a space, its text and <|end|>; sampling stops at <|end|>. The
space before the text makes a reply's first word the same token as mid-sentence (" answer").
Build-time pretraining (build.py) renders its corpus with this class, so the base model sees
exactly the prompts the engine will give it.
"""

from __future__ import annotations

import json
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


class LocalChatRenderer(Renderer):
    """tinker-cookbook renderer for the local engine's models (see the module docstring for the format).

    Unknown roles render with the <|system|> token followed by `ROLE: `, so no row is refused.
    """

    @property
    def has_extension_property(self) -> bool:
        return True  # nothing is stripped from history

    @property
    def _bos_tokens(self) -> list[int]:
        return [self.tokenizer.bos_token_id]

    @property
    def _end_message_token(self) -> int:
        return self.tokenizer.eos_token_id

    def _encode(self, text: str) -> list[int]:
        # message text never turns into role/end tokens, whatever it contains
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = message["role"]
        text = message_text(message)
        if role in _ROLE_TOKENS:
            header = [self.tokenizer.token_id(_ROLE_TOKENS[role])]
        else:
            header = [self.tokenizer.token_id("<|system|>")]
            text = f"{role}: {text}"
        output = self._encode(_PREFIX + text) + [self._end_message_token]
        return RenderedMessage(
            header=tinker.types.EncodedTextChunk(tokens=header),
            output=[tinker.types.EncodedTextChunk(tokens=output)],
        )

    def get_stop_sequences(self) -> list[int]:
        """Sampling stops at <|end|>."""
        return [self._end_message_token]

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        """The assistant message in sampled tokens: STOP_SEQUENCE when <|end|> ended it, else MALFORMED.

        Text after the first <|end|> (a sampler that ran past it) is dropped.
        """
        response = list(response)
        end = self._end_message_token
        if end in response:
            body, term = response[: response.index(end)], ParseTermination.STOP_SEQUENCE
        else:
            body, term = response, ParseTermination.MALFORMED
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
