"""Qwen3's reasoning comes back apart from the answer: `reasoning_content` in the message, and its own deltas
when streamed. The engine here samples a scripted answer (a real server and engine; only the sampler is
replaced), since a random-weight model never writes <think> blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import openai
import pytest

from python_layer.inference.sampler import SamplerOutput
from tests.server.live_server import MODEL_NAME, LiveServer, tiny_loader

ANSWER = "<think>\nThe user greets me.\n\nGreet back.\n</think>\n\nHello there!"


class ScriptedSampler:
    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids

    def __call__(self, logits, params, generators, histories) -> SamplerOutput:
        return SamplerOutput([self.token_ids[len(h.output_token_ids) % len(self.token_ids)] for h in histories],
                             [None] * len(params))


@pytest.fixture(scope="module")
def scripted(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    load = tiny_loader(tiny_checkpoint)

    def loader(metrics):
        engine = load(metrics)
        engine.engine.sampler = ScriptedSampler(engine.engine.tokenizer.encode(ANSWER))
        return engine

    live = LiveServer(loader)
    yield live
    live.stop()


def test_reasoning_is_split_from_the_answer(scripted: LiveServer) -> None:
    client = openai.OpenAI(base_url=scripted.url + "/v1", api_key="unused", max_retries=0)
    n = len(scripted.engine.tokenizer.encode(ANSWER))
    kw = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=n, temperature=0,
              extra_body={"ignore_eos": True})
    message = client.chat.completions.create(**kw).choices[0].message
    assert message.reasoning_content == "The user greets me.\n\nGreet back." and message.content == "Hello there!"

    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks]
    reasoning = [d.reasoning_content for d in deltas if getattr(d, "reasoning_content", None)]
    content = [d.content for d in deltas if d.content]
    assert len(reasoning) > 1 and "".join(reasoning) == message.reasoning_content
    assert "".join(content) == message.content
    assert not any(getattr(d, "reasoning_content", None) and d.content for d in deltas)  # separate deltas
    assert "<think>" not in "".join(reasoning + content)

    plain = client.completions.create(
        model=MODEL_NAME, prompt="Hi", max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
    )
    assert plain.choices[0].text == ANSWER  # /v1/completions returns the raw text
