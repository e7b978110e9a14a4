import random

import pytest
from transformers import AutoTokenizer

from python_layer.tokenizer import ChatTemplate, get_tokenizer, parse_response
from python_layer.tokenizer.chat_template import ReasoningStream
from python_layer.tokenizer.qwen_tokenizer import ASSETS_DIR

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city (°C)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

CONVERSATIONS = {
    "single": [{"role": "user", "content": "What is 2 + 2?"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "你好！介绍一下你自己 🙂"}],
    "multi_turn_with_reasoning": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello!"},
        {"role": "user", "content": "Write code"},
        {"role": "assistant", "content": "```python\nprint(1)\n```", "reasoning_content": "Simple print."},
        {"role": "user", "content": "Thanks"},
    ],
    "tool_calls": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 °C in Paris."},
        {"role": "user", "content": "And Tokyo?"},
    ],
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(ASSETS_DIR)


def _hf_ids(hf, messages, **kw) -> list[int]:
    out = hf.apply_chat_template(messages, tokenize=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("enable_thinking", [True, False])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    hf_tokenizer, name: str, enable_thinking: bool, add_generation_prompt: bool
) -> None:
    messages = CONVERSATIONS[name]
    tools = [WEATHER_TOOL] if name == "tool_calls" else None
    fmt = ChatTemplate(get_tokenizer())
    kw = dict(add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, tools=tools)
    assert fmt.render_chat(messages, **kw) == hf_tokenizer.apply_chat_template(messages, tokenize=False, **kw)
    assert fmt.encode_chat(messages, **kw) == _hf_ids(hf_tokenizer, messages, **kw)


def test_thinking_off_inserts_empty_think_block() -> None:
    text = ChatTemplate().render_chat([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_bad_messages_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one message"):
        ChatTemplate().encode_chat([])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        ChatTemplate().encode_chat([{"content": "no role"}])


@pytest.mark.parametrize("text, expected", [
    ("<think>\nLet me think.\n</think>\n\nThe answer is 4.", ("Let me think.", "The answer is 4.")),
    ("Let me think.\n</think>\n\nFour.", ("Let me think.", "Four.")),  # the template already opened <think>
    ("<think>\n\n</think>\n\nNo thoughts.", ("", "No thoughts.")),
    ("<think>\nstill thinking when cut off", ("still thinking when cut off", "")),
    ("Plain answer.", (None, "Plain answer.")),
])
def test_parse_response(text: str, expected: tuple) -> None:
    assert parse_response(text) == expected


@pytest.mark.parametrize("text", [
    "<think>\nweigh the options\n\nthen pick\n</think>\n\nThe answer\n\nis 42.\n",
    "<think>\n\n</think>\n\nNo thinking here.",
    "  <think>x</think>y",
    "Plain text with a </thi partial tag and\n\ntrailing newlines\n\n",
    "<think>never finished\n",
])
def test_reasoning_stream_matches_parse_response_however_the_text_is_cut(text: str) -> None:
    rng = random.Random(len(text))
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), min(6, len(text) - 1)))
        stream, reasoning, content, fed = ReasoningStream(), "", "", 0
        for cut in cuts + [len(text)]:
            r, c = stream.feed(text[fed:cut], final=cut == len(text))
            reasoning, content, fed = reasoning + r, content + c, cut
        expected_reasoning, expected_content = parse_response(text)
        assert (reasoning, content) == (expected_reasoning or "", expected_content), cuts
