"""Tool calls through the official openai client: Qwen3's <tool_call> blocks come back as OpenAI tool_calls (ids,
finish_reason "tool_calls"), streamed as deltas with no piece of a tag in the content; tool_choice none / auto /
required / a named function; malformed calls stay content. A real server and engine whose sampler writes a
scripted answer (a random-weight model never calls tools)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import openai
import pytest

from tests.server.live_server import MODEL_NAME, LiveServer, tiny_loader
from tests.server.test_reasoning import ScriptedSampler

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALLS = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>')
ASK = [{"role": "user", "content": "Weather and time in Paris?"}]


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    load = tiny_loader(tiny_checkpoint)

    def loader(metrics):
        engine = load(metrics)
        engine.engine.sampler = ScriptedSampler([0])
        return engine

    live = LiveServer(loader)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def script(server: LiveServer, answer: str) -> None:
    server.wait_idle()
    server.engine.sampler.token_ids = server.engine.tokenizer.encode(answer)


def streamed(client: openai.OpenAI, **kw) -> tuple[str, dict, str]:
    """(content, {index: (id, name, arguments)}, finish_reason) assembled from the deltas, as a client does."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model=MODEL_NAME, stream=True, **kw):
        choice = chunk.choices[0]
        assert "<tool" not in (choice.delta.content or "") and "</tool" not in (choice.delta.content or "")
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            call_id, name, arguments = calls.get(d.index, (None, None, ""))
            calls[d.index] = (d.id or call_id, (d.function.name if d.function else None) or name,
                              arguments + ((d.function.arguments or "") if d.function else ""))
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_tool_calls_come_back_as_tool_calls(server: LiveServer, client: openai.OpenAI) -> None:
    script(server, CALLS)
    kw = dict(messages=ASK, tools=[WEATHER, TIME], max_tokens=200, temperature=0)
    choice = client.chat.completions.create(model=MODEL_NAME, **kw).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id

    content, streamed_calls, finish = streamed(client, **kw)
    assert finish == "tool_calls" and content.strip() == "Let me look."
    assert [(name, json.loads(arguments)) for _, name, arguments in streamed_calls.values()] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert all(call_id.startswith("call_") for call_id, _, _ in streamed_calls.values())


def test_the_conversation_goes_on_with_the_tool_results(server: LiveServer, client: openai.OpenAI) -> None:
    script(server, CALLS)
    first = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=[WEATHER, TIME], max_tokens=200
    ).choices[0]
    script(server, "It is sunny in Paris at noon.<|im_end|>")
    results = [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"result": i})}
               for i, c in enumerate(first.message.tool_calls)]
    messages = [*ASK, first.message.model_dump(exclude_none=True), *results]
    second = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER, TIME], max_tokens=50)
    assert second.choices[0].message.content == "It is sunny in Paris at noon."
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    prompt = server.engine.tokenizer.decode(server.engine.finished[second.id].prompt_token_ids)
    assert prompt.count("<tool_response>") == 2 and '"get_time"' in prompt


def test_tool_choice_none_leaves_the_answer_as_content(server: LiveServer, client: openai.OpenAI) -> None:
    script(server, CALLS)
    choice = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=[WEATHER], tool_choice="none",
                                            max_tokens=200).choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == CALLS.removesuffix("<|im_end|>")


def test_malformed_calls_are_content_not_errors(server: LiveServer, client: openai.OpenAI) -> None:
    for answer in ('<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>',
                   '<tool_call>\n{"arguments": {}}\n</tool_call>',
                   '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'):  # cut off: no closing tag
        script(server, answer + "<|im_end|>")
        kw = dict(messages=ASK, tools=[WEATHER], max_tokens=200)
        choice = client.chat.completions.create(model=MODEL_NAME, **kw).choices[0]
        assert choice.message.tool_calls is None and choice.finish_reason == "stop"
        assert choice.message.content == answer
        content, calls, finish = streamed_raw(client, **kw)
        assert content == answer and not calls and finish == "stop"


def streamed_raw(client: openai.OpenAI, **kw) -> tuple[str, dict, str]:
    """streamed() without its check on tags: a malformed call is content, tags and all."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model=MODEL_NAME, stream=True, **kw):
        content += chunk.choices[0].delta.content or ""
        calls.update({d.index: d for d in chunk.choices[0].delta.tool_calls or []})
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish


def test_a_named_tool_choice_is_honoured(server: LiveServer, client: openai.OpenAI) -> None:
    """The answer is begun with the call of that function: the model writes only its arguments."""
    script(server, '{"city": "Oslo"}}\n</tool_call><|im_end|>')
    kw = dict(messages=ASK, tools=[WEATHER, TIME], max_tokens=50,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    response = client.chat.completions.create(model=MODEL_NAME, **kw)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Oslo"})]
    prompt = server.engine.tokenizer.decode(server.engine.finished[response.id].prompt_token_ids)
    assert prompt.endswith('<tool_call>\n{"name": "get_weather", "arguments": ') and '"get_time"' not in prompt
    _, calls, finish = streamed(client, **kw)
    assert finish == "tool_calls" and [(n, json.loads(a)) for _, n, a in calls.values()] == [
        ("get_weather", {"city": "Oslo"})
    ]

    script(server, '{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>')  # required: the model picks
    choice = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=[WEATHER, TIME], max_tokens=50,
                                            tool_choice="required").choices[0]
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("get_time", "{}")]


@pytest.mark.parametrize("tool_choice, tools, message", [
    ({"type": "function", "function": {"name": "nope"}}, [WEATHER], "'nope'"),
    ("required", None, "needs tools"),
    ("sometimes", [WEATHER], "tool_choice"),
])
def test_impossible_tool_choices_are_400(client: openai.OpenAI, tool_choice, tools, message: str) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL_NAME, messages=ASK, tools=tools, tool_choice=tool_choice, max_tokens=5
        )
    assert message in str(error.value)
