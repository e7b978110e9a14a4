"""Qwen3 chat template (the jinja template of tokenizer_config.json) and reasoning/answer split."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, List, Optional, Tuple

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .qwen_tokenizer import QwenTokenizer, get_tokenizer

THINK_START, THINK_END = "<think>", "</think>"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators: Any = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile(template: str) -> jinja2.Template:
    """The jinja environment chat templates are written for (the one transformers renders them in)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class MessageFormatter:
    """Renders OpenAI-style messages with the tokenizer's chat template."""

    def __init__(self, tokenizer: Optional[QwenTokenizer] = None) -> None:
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
    ) -> List[int]:
        """The prompt token ids (what transformers' apply_chat_template(tokenize=True) gives)."""
        text = self.render_chat(messages, add_generation_prompt, enable_thinking, tools)
        return self.tokenizer.encode(text, add_special_tokens=False)


def _with_reasoning_alias(message: dict) -> dict:
    # Clients send an assistant turn's reasoning as reasoning_content, thinking or reasoning; the template reads the first
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
    """parse_response for streamed text: feed the text so far, get the (reasoning, content) that became final
    since the last call. Text that could still change the split (a partial <think> / </think> tag or trailing
    newlines, which parse_response strips) is held back until more text or `final=True` settles it."""

    def __init__(self) -> None:
        self._sent_reasoning = self._sent_content = ""

    def feed(self, text: str, final: bool = False) -> Tuple[str, str]:
        if not final:
            text = _settled(text)
        reasoning, content = parse_response(text)
        reasoning = reasoning or ""
        new_reasoning = reasoning[len(self._sent_reasoning):] if reasoning.startswith(self._sent_reasoning) else ""
        new_content = content[len(self._sent_content):] if content.startswith(self._sent_content) else ""
        self._sent_reasoning += new_reasoning
        self._sent_content += new_content
        return new_reasoning, new_content


def _settled(text: str) -> str:
    """text without a trailing partial tag or trailing newlines ("" while it may still open with <think>)."""
    if THINK_START.startswith(text.lstrip()):
        return ""
    for tag in (THINK_START, THINK_END):
        for n in range(len(tag) - 1, 0, -1):
            if text.endswith(tag[:n]):
                text = text[:-n]
                break
    return text.rstrip("\n")
