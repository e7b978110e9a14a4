"""Bad input gets a 4xx in OpenAI's error shape naming the problem, and the server goes on serving."""

from __future__ import annotations

import pytest

from tests.server.live_server import MODEL_NAME, LiveServer

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}

CASES = [
    ("/generate", {"max_tokens": 3}, 400, "prompt"),
    ("/generate", {"prompt": ""}, 400, "prompt"),
    ("/generate", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/generate", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("/generate", {"prompt": "hi", "temperature": -0.1}, 400, "temperature"),
    ("/generate", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/generate", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/generate", {"prompt": "hi " * 600}, 400, "max_model_len"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": 2}, 400, "top_p"),
    ("/v1/completions", {**COMPLETION, "prompt": []}, 400, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [5, 10**9]}, 400, "prompt token ids"),
    ("/v1/completions", {**COMPLETION, "prompt": "hi " * 600}, 400, "max_model_len"),
    ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, 404, "gpt-4"),
    ("/v1/completions", {**COMPLETION, "stop": [""]}, 400, "stop"),
    ("/v1/completions", {**COMPLETION, "n": 0}, 400, "n"),
    ("/v1/completions", {**COMPLETION, "repetition_penalty": 5e-324}, 400, "repetition_penalty"),
    ("/v1/completions", {"model": MODEL_NAME}, 400, "prompt"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1}, 400, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"enable_thinking": "maybe"}}, 400, "enable_thinking"),
    ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "nope"),
]


@pytest.mark.parametrize("route, body, status, mentions", CASES)
def test_bad_request_bodies(server: LiveServer, route: str, body: dict, status: int, mentions: str) -> None:
    response = server.client.post(route, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert mentions in error["message"] or mentions == error["param"], error
    assert error["type"] in ("invalid_request_error", "not_found_error")


def test_malformed_json_wrong_content_type_oversized_body(server: LiveServer) -> None:
    broken = server.client.post("/v1/completions", content=b'{"prompt": "hi",', headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    form = server.client.post("/generate", data={"prompt": "hi"})
    assert form.status_code == 415 and "application/json" in form.json()["error"]["message"]
    big = server.client.post("/generate", json={"prompt": "x" * (2**20 + 10)})
    assert big.status_code == 413 and "larger than the limit" in big.json()["error"]["message"]

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(2**20 // 2**16 + 1):
            yield b"x" * 2**16
        yield b'"}'

    streamed = server.client.post("/generate", content=chunked(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert server.client.get("/v1/nothing-here").status_code == 404
    assert server.client.get("/generate").status_code == 405
    assert server.client.get("/health").status_code == 200
    assert server.client.post("/generate", json={"prompt": "still serving", "max_tokens": 2}).status_code == 200
