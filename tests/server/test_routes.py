"""Every route on a real server: the design documents' API with httpx, the OpenAI API with the official
client, streaming and not. Greedy output over HTTP equals the offline engine's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest

from python_layer import InferenceEngine, SamplingParams
from tests.server.live_server import MODEL_NAME, LiveServer


@pytest.fixture(scope="module")
def offline(tiny_checkpoint: Path) -> InferenceEngine:
    return InferenceEngine.from_pretrained(tiny_checkpoint, num_kv_pages=64)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _greedy(offline: InferenceEngine, prompt, n: int, **kw) -> list[int]:
    return offline.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw))[0].token_ids


def _sse(response: httpx.Response) -> list:
    events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_root_health_models(server: LiveServer) -> None:
    root = server.client.get("/").json()
    assert (
        root["name"] == "MILI"
        and root["model"] == MODEL_NAME
        and "/v1/chat/completions (POST)" in root["links"].values()
    )
    health = server.client.get("/health")
    assert health.status_code == 200
    assert health.json() == {"status": "healthy", "model_loaded": True, "scheduler_ready": True}
    models = server.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL_NAME] and models["data"][0]["max_model_len"] == 512


def test_generate_matches_offline_engine(server: LiveServer, offline: InferenceEngine) -> None:
    body = {"prompt": "Hello, world!", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    out = server.client.post("/generate", json=body).json()
    assert out["tokens"] == _greedy(offline, "Hello, world!", 6)
    assert out["prompt_tokens"] == 4 and out["total_tokens"] == 10 and out["finish_reason"] == "length"
    assert out["generated_text"] == offline.tokenizer.decode(out["tokens"])
    status = server.client.get(f"/status/{out['request_id']}").json()
    assert status == {"request_id": out["request_id"], "status": "completed", "finish_reason": "length",
                      "tokens_generated": 6, "tokens_remaining": 0}
    assert server.client.get("/status/never-seen").json() == {"request_id": "never-seen", "status": "not_found"}

    with server.client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse(response)
    *pieces, final = events
    assert [t for e in pieces for t in e["tokens"]] == out["tokens"] and final["tokens"] == out["tokens"]
    assert "".join(e["text"] for e in pieces) == final["generated_text"] == out["generated_text"]
    assert pieces[-1]["finish_reason"] == "length" and all(e["finish_reason"] is None for e in pieces[:-1])


def test_server_sampling_defaults_fill_what_requests_leave_out(server: LiveServer, client: openai.OpenAI,
                                                              offline: InferenceEngine) -> None:
    """A config file's `sampling` (ServerConfig.sampling_defaults): with temperature 0 there, requests that give
    none are greedy on both APIs; a request's own value still wins."""
    server.state.config.sampling_defaults = {"temperature": 0.0}
    try:
        greedy = _greedy(offline, "Hello, world!", 6)
        out = server.client.post(
            "/generate", json={"prompt": "Hello, world!", "max_tokens": 6, "ignore_eos": True}
        ).json()
        assert out["tokens"] == greedy
        completion = client.completions.create(model=MODEL_NAME, prompt="Hello, world!", max_tokens=6,
                                               extra_body={"ignore_eos": True})
        assert completion.choices[0].text == offline.tokenizer.decode(greedy)
        sampled = [client.completions.create(model=MODEL_NAME, prompt="Hello, world!", max_tokens=6, temperature=2.0,
                                             seed=s, extra_body={"ignore_eos": True}).choices[0].text for s in range(4)]
        assert any(text != completion.choices[0].text for text in sampled)
    finally:
        server.state.config.sampling_defaults = {}


def test_status_while_processing(server: LiveServer) -> None:
    body = {"prompt": "count", "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
    with server.client.stream("POST", "/generate", json=body) as response:
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        status = server.client.get(f"/status/{first['request_id']}").json()
        assert status["status"] == "processing" and status["tokens_generated"] >= 1
        assert status["tokens_generated"] + status["tokens_remaining"] == 400
    server.wait_idle()  # leaving the stream early aborted the request


def test_status_reports_the_output_limit_the_context_leaves(server: LiveServer) -> None:
    body = {"model": MODEL_NAME, "prompt": [7], "temperature": 0, "stream": True, "ignore_eos": True}  # no max_tokens
    with server.client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()  # kept referenced: a dropped iterator closes the connection (an abort)
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        status = server.client.get(f"/status/{first['id']}").json()
        assert status["tokens_generated"] + status["tokens_remaining"] == 512 - 1  # max_model_len - prompt tokens
    server.wait_idle()


def test_status_knows_openai_ids_and_ids_are_random(server: LiveServer, client: openai.OpenAI) -> None:
    kw = dict(model=MODEL_NAME, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    completion = client.completions.create(prompt="Hi", **kw)
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **kw)
    for call_id in (completion.id, chat.id):
        assert server.client.get(f"/status/{call_id}").json() == {
            "request_id": call_id, "status": "completed", "finish_reason": "length", "tokens_generated": 3,
            "tokens_remaining": 0}
    several = client.completions.create(prompt="Hi", n=2, **kw)  # each choice has its own id: ID-INDEX
    assert [server.client.get(f"/status/{several.id}-{i}").json()["status"] for i in range(2)] == ["completed"] * 2
    choice = {"status": "completed", "finish_reason": "length", "tokens_generated": 3, "tokens_remaining": 0}
    assert server.client.get(f"/status/{several.id}").json() == {  # the call's id answers for its choices
        "request_id": several.id, "status": "completed", "tokens_generated": 6, "tokens_remaining": 0,
        "choices": [{"index": 0, **choice}, {"index": 1, **choice}]}
    ids = [
        server.client.post("/generate", json={"prompt": "a", "max_tokens": 1}).json()["request_id"] for _ in range(2)
    ]
    assert all(re.fullmatch(r"gen-[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1]
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", completion.id) and re.fullmatch(r"chatcmpl-[0-9a-f]{32}", chat.id)


def test_completions(server: LiveServer, client: openai.OpenAI, offline: InferenceEngine) -> None:
    prompt = "The capital of France is"
    expected = _greedy(offline, prompt, 5)
    out = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.object == "text_completion" and out.model == MODEL_NAME
    assert out.choices[0].text == offline.tokenizer.decode(expected) and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (5, 5, 10)

    token_prompt = offline.tokenizer.encode(prompt)
    batch = client.completions.create(model=MODEL_NAME, prompt=[token_prompt, "Hi"], max_tokens=3, temperature=0, n=2,
                                      extra_body={"ignore_eos": True})
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text == offline.tokenizer.decode(expected[:3])
    assert batch.usage.completion_tokens == 12 and batch.usage.prompt_tokens == 5 + 1

    streamed = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 5


def test_completion_sampling_options(client: openai.OpenAI, offline: InferenceEngine) -> None:
    kw = dict(
        model=MODEL_NAME,
        prompt="Once upon a time",
        max_tokens=8,
        extra_body={"ignore_eos": True, "top_k": 50, "min_p": 0.01},
    )
    seeded = [client.completions.create(seed=7, temperature=0.9, top_p=0.9, **kw).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]  # a seed reproduces a sampled completion
    two = client.completions.create(seed=7, temperature=1.0, n=2, **kw)
    assert len(two.choices) == 2

    greedy = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=8, temperature=0,
                                       logprobs=3, extra_body={"ignore_eos": True})
    lp = greedy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and max(top.values()) == pytest.approx(logprob) and top[token] == pytest.approx(logprob)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == greedy.choices[0].text

    penalized = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=8, temperature=0,
                                          frequency_penalty=2.0, presence_penalty=2.0, extra_body={"ignore_eos": True})
    expected = offline.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                                     frequency_penalty=2.0, presence_penalty=2.0))[0]
    assert penalized.choices[0].text == expected.text


def test_stop_strings_are_cut_from_the_text(client: openai.OpenAI, offline: InferenceEngine) -> None:
    full = offline.tokenizer.decode(_greedy(offline, "Hello", 12))
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), full
    out = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=12, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == full[: full.index(stop)]
    streamed = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=12, temperature=0, stop=stop,
                                         stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text  # no part of the stop string leaks


def test_chat_completions(client: openai.OpenAI, offline: InferenceEngine) -> None:
    from python_layer import MessageFormatter

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
    prompt = MessageFormatter(offline.tokenizer).encode_chat(messages, enable_thinking=False)
    expected = offline.tokenizer.decode(_greedy(offline, prompt, 6))
    kw = dict(model=MODEL_NAME, messages=messages, temperature=0,
              extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
    out = client.chat.completions.create(max_completion_tokens=6, logprobs=True, top_logprobs=2, **kw)
    message = out.choices[0].message
    assert out.object == "chat.completion" and message.role == "assistant" and message.content == expected
    assert out.usage.prompt_tokens == len(prompt) and out.usage.completion_tokens == 6
    content_logprobs = out.choices[0].logprobs.content
    assert len(content_logprobs) == 6 and all(len(t.top_logprobs) == 2 for t in content_logprobs)
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content_logprobs)  # greedy

    chunks = list(
        client.chat.completions.create(max_tokens=6, stream=True, stream_options={"include_usage": True}, **kw)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == message.content
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.total_tokens == out.usage.total_tokens

    thinking = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4, temperature=0)
    assert thinking.usage.prompt_tokens == len(prompt) - 4  # without the empty <think>\n\n</think>\n\n block


def _metric_values(server: LiveServer) -> dict:
    text = server.client.get("/metrics").text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and line[0] != "#"
    }


def test_metrics(server: LiveServer) -> None:
    server.wait_idle()
    before = _metric_values(server)
    server.client.post("/generate", json={"prompt": "the engine's metrics, counted", "max_tokens": 3})
    server.wait_idle()
    values = _metric_values(server)
    label = f'{{model_name="{MODEL_NAME}"}}'
    for name in ("mili_prompt_tokens_total", "mili_generation_tokens_total", "mili_time_to_first_token_seconds_count",
                 "mili_inter_token_latency_seconds_count", "mili_e2e_request_latency_seconds_count",
                 "mili_prefix_cache_queries_total"):
        assert values[name + label] > 0, name
    assert values["mili_num_requests_running" + label] == 0 and values["mili_num_requests_waiting" + label] == 0
    assert values["mili_kv_cache_usage_perc" + label] == 0
    assert "mili_prefix_cache_hits_total" + label in values
    assert values[f'mili_request_success_total{{finished_reason="length",model_name="{MODEL_NAME}"}}'] >= 1

    def added(name: str, **labels: str) -> float:
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "model_name": MODEL_NAME}.items())) + "}"
        return values[key] - before.get(key, 0.0)

    # the engine's steps: the prompt (several tokens) in one step, then a decode step per further token
    assert added("mili_engine_steps_total", kind="prefill") == 1
    assert added("mili_engine_steps_total", kind="decode") == added("mili_engine_step_rows_total", kind="decode") == 2
    assert added("mili_engine_step_tokens_total", kind="prefill") >= 1
    for phase in ("schedule", "prefill", "decode", "sample", "output", "deliver"):
        assert added("mili_engine_phase_seconds_total", phase=phase) > 0, phase
