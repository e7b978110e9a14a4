"""Qwen3 chat template (the jinja template of tokenizer_config.json) and reasoning/answer split."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, List, Optional, Tuple

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .qwen_tokenizer import CheckpointTokenizer, get_tokenizer

THINK_START, THINK_END = "<think>", "</think>"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile(template: str) -> jinja2.Template:
    """The jinja environment chat templates are written for (the one transformers renders them in)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class ChatTemplate:
    """Renders OpenAI-style messages with the tokenizer's chat template."""

    def __init__(self, tokenizer: Optional[CheckpointTokenizer] = None) -> None:
        self.tokenizer = tokenizer or get_tokenizer()
        if not self.tokenizer.chat_template:
            raise ValueError(f"The tokenizer in {self.tokenizer.path} has no chat_template")
        self._template = _compile(self.tokenizer.chat_template)

    def render_chat(
        self,
        messages: List[dict],
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Optional[List[dict]] = None,
    ) -> str:
        """The prompt text. Messages are dicts with role, content, and optionally reasoning_content and tool_calls."""
        if not messages:
            raise ValueError("messages must hold at least one message")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"messages[{i}] must be a dict with a 'role', got {m!r}")
        t = self.tokenizer
        return self._template.render(
            messages=[_with_reasoning_alias(m) for m in messages],
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            eos_token=t.eos_token,
            pad_token=t.pad_token,
            bos_token=t.bos_token,
        )

    def encode_chat(
        self,
        messages: List[dict],
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Optional[List[dict]] = None,
        answer_start: str = "",
    ) -> List[int]:
        """The prompt token ids (what transformers' apply_chat_template(tokenize=True) gives), followed by
        answer_start: text the answer is made to begin with."""
        text = self.render_chat(messages, add_generation_prompt, enable_thinking, tools)
        return self.tokenizer.encode(text + answer_start, add_special_tokens=False)


def _with_reasoning_alias(message: dict) -> dict:
    # Clients send an assistant turn's reasoning as reasoning_content, thinking or reasoning; the template reads the
    # first
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    return message if reasoning is None else {**message, "reasoning_content": reasoning}


def parse_response(text: str) -> Tuple[Optional[str], str]:
    """Split generated text into (reasoning, content). Reasoning is the text inside <think>...</think>
    (None when the model did not think); an unterminated <think> block is all reasoning."""
    if THINK_END in text:
        reasoning, content = text.split(THINK_END, 1)
        reasoning = reasoning.split(THINK_START, 1)[-1]
        return reasoning.strip("\n"), content.lstrip("\n")
    stripped = text.lstrip()
    if stripped.startswith(THINK_START):
        return stripped[len(THINK_START):].strip("\n"), ""
    return None, text


class ReasoningStream:
    """parse_response for streamed text: feed each new piece, get the (reasoning, content) that became final.
    Work per piece does not grow with the text before it. Text that could still change the split (a partial
    <think> / </think> tag, newlines that parse_response strips) is held back until more text or
    `final=True` settles it. Text that does not open with <think> is all content here."""

    def __init__(self) -> None:
        self._mode = "start"  # start -> reasoning -> content, or start -> plain
        self._held = ""  # text not handed out yet
        self._started = False  # whether the current part (reasoning or content) has begun past its newlines

    def feed(self, text: str, final: bool = False) -> Tuple[str, str]:
        held = self._held + text
        self._held = ""
        if self._mode == "start":
            opening = held.lstrip()
            if opening.startswith(THINK_START):
                self._mode, held = "reasoning", opening[len(THINK_START):]
            elif THINK_START.startswith(opening) and not final:
                self._held = held
                return "", ""
            else:
                self._mode = "plain"
        if self._mode == "plain":
            return "", held
        reasoning = ""
        if self._mode == "reasoning":
            end = held.find(THINK_END)
            if end < 0:
                return self._part(held, final, trailing=THINK_END), ""
            reasoning = self._part(held[:end], final=True)
            self._mode, self._started, held = "content", False, held[end + len(THINK_END):]
        return reasoning, self._part(held, final)

    def _part(self, text: str, final: bool, trailing: str = "") -> str:
        """The settled text of the current part: without its leading newlines, and (unless final) holding back
        a trailing partial `trailing` tag and trailing newlines (stripped at the end of reasoning)."""
        if not self._started:
            text = text.lstrip("\n")
            self._started = bool(text)
        if self._mode == "content":
            return text
        if final:
            return text.rstrip("\n")
        keep = next((n for n in range(len(trailing) - 1, 0, -1) if text.endswith(trailing[:n])), 0)
        settled = text[: len(text) - keep].rstrip("\n")
        self._held = text[len(settled):]
        return settled
