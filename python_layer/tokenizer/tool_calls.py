"""Qwen3's tool calls in its answer, as its chat template asks for them (the Hermes format):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

parsed into OpenAI tool calls. A call whose JSON is malformed (or that names no function, or is cut off before
its closing tag) stays in the content as the model wrote it."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import List, Optional, Tuple

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str
    """The arguments object as JSON text (what OpenAI's function.arguments holds)."""

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_call(body: str) -> Optional[ToolCall]:
    """The call between a pair of tags; None unless it is a JSON object with a string `name` and an object (or
    JSON text of an object) as `arguments`."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return None
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(f"call_{secrets.token_hex(12)}", call["name"], json.dumps(arguments, ensure_ascii=False))


class ToolCallStream:
    """Splits the content as it streams into text and tool calls: feed each new piece, get the (text, calls)
    that became final. A partial <tool_call> tag is held back, so no piece of a tag is ever handed out as text;
    a call is handed out whole once its closing tag arrives. Whitespace between calls is dropped."""

    def __init__(self) -> None:
        self._held = ""  # text not handed out yet: a partial tag or an open call
        self._space = ""  # whitespace not handed out yet: it may only separate two calls
        self._in_call = False
        self.calls = 0  # handed out so far

    def feed(self, text: str, final: bool = False) -> Tuple[str, List[ToolCall]]:
        held, out, calls = self._held + text, self._space, []
        self._held = self._space = ""
        while held:
            if not self._in_call:
                start = held.find(TOOL_CALL_START)
                if start < 0:
                    keep = 0 if final else _partial_tag(held, TOOL_CALL_START)
                    out, held = out + held[: len(held) - keep], held[len(held) - keep:]
                    break
                out, held, self._in_call = out + held[:start], held[start:], True
            end = held.find(TOOL_CALL_END)
            if end < 0:
                if final:  # never closed: the model's text as it is
                    out, held = out + held, ""
                break
            raw, held = held[: end + len(TOOL_CALL_END)], held[end + len(TOOL_CALL_END):]
            call = parse_call(raw[len(TOOL_CALL_START): -len(TOOL_CALL_END)])
            if call is None:
                out += raw
            else:
                calls.append(call)
            self._in_call = False
        self.calls += len(calls)
        if not out.strip():
            if not final:
                self._space, out = out, ""
            elif self.calls:
                out = ""
        self._held = held
        return out, calls


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:n])), 0)


def split_tool_calls(text: str) -> Tuple[Optional[str], List[ToolCall]]:
    """(content, calls) of a whole answer; content None when the answer is only calls."""
    content, calls = ToolCallStream().feed(text, final=True)
    content = content.strip() if calls else content
    return (content or None) if calls else content, calls
