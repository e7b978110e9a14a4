"""Bad input gets a 4xx in OpenAI's error shape naming the problem, and the server goes on serving."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Iterator

import pytest
import uvicorn
from fastapi import FastAPI, Request

from python_layer.inference.sampling_params import SamplingParams
from python_layer.server.errors import HANDLERS, ApiError, _api_error
from python_layer.server.header_timeout import HeaderTimeoutProtocol
from python_layer.server.middleware import GuardMiddleware
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
    ("/generate", {"prompt": "hi", "max_tokens": 2**70}, 400, "max_model_len"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": 2}, 400, "top_p"),
    ("/v1/completions", {**COMPLETION, "prompt": []}, 400, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [5, 10**9]}, 400, "prompt token ids"),
    ("/v1/completions", {**COMPLETION, "prompt": "hi " * 600}, 400, "max_model_len"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 10**12}, 400, "max_model_len"),
    ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, 404, "gpt-4"),
    ("/v1/completions", {**COMPLETION, "stop": [""]}, 400, "stop"),
    ("/v1/completions", {**COMPLETION, "n": 0}, 400, "n"),
    ("/v1/completions", {**COMPLETION, "repetition_penalty": 5e-324}, 400, "repetition_penalty"),
    ("/v1/completions", {"model": MODEL_NAME}, 400, "prompt"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1}, 400, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 512}, 400, "max_model_len"),
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


def test_max_tokens_must_fit_in_the_context(server: LiveServer) -> None:
    """Asked for, max_tokens must fit after the prompt (400, as vLLM answers); left out, it is what the context
    leaves (on /generate, at most its default of 50)."""
    context, prompt = server.engine.max_model_len, "hi " * 480
    room = context - len(server.engine.tokenizer.encode(prompt))
    assert 0 < room < 50
    refused = server.client.post("/generate", json={"prompt": prompt, "max_tokens": room + 1})
    assert refused.status_code == 400 and f"max_tokens {room + 1}" in refused.json()["error"]["message"]
    fits = server.client.post("/generate", json={"prompt": prompt, "ignore_eos": True})
    assert fits.status_code == 200 and len(fits.json()["tokens"]) == room
    completion = server.client.post("/v1/completions", json={**COMPLETION, "prompt": prompt, "ignore_eos": True,
                                                              "max_tokens": None})
    assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == room


def test_malformed_json_wrong_content_type_oversized_body(server: LiveServer) -> None:
    broken = server.client.post(
        "/v1/completions", content=b'{"prompt": "hi",', headers={"content-type": "application/json"}
    )
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


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("route, raw, where", [
    ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": ["ok", "a\\udc00"], "max_tokens": 2}', "prompt[1]"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\ud800"], "max_tokens": 2}', "stop[0]"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "a\\ud800b"}]}',
     "messages[1].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages[0].content[0].text"),
    ("/generate", b'{"prompt": "a\\ud800b"}', "prompt"),
])
def test_unpaired_surrogates_are_a_400_naming_the_field(server: LiveServer, route: str, raw: bytes, where: str) -> None:
    response = server.client.post(route, content=raw, headers=JSON)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert f"{where} contains an unpaired UTF-16 surrogate (invalid Unicode)" in error["message"], error
    assert error["param"] == where.split("[")[0]


def test_a_surrogate_pair_is_a_valid_character(server: LiveServer) -> None:
    raw = b'{"prompt": "smile \\ud83d\\ude00", "max_tokens": 2}'
    assert server.client.post("/v1/completions", content=raw, headers=JSON).status_code == 200


def test_more_choices_than_the_server_can_hold_is_a_400(server: LiveServer) -> None:
    capacity = server.state.engine.capacity
    body = {**COMPLETION, "prompt": ["hi"] * (capacity // 16 + 1), "n": 16}
    response = server.client.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "n" and f"at most {capacity}" in error["message"]
    assert server.client.post("/v1/completions", json=COMPLETION).status_code == 200


@pytest.mark.parametrize("name, value", [
    ("repetition_penalty", 50), ("repetition_penalty", 150), ("repetition_penalty", 0.005), ("temperature", 2),
    ("temperature", 2.5), ("top_p", 0), ("top_p", 1), ("min_p", 1), ("min_p", 1.5), ("presence_penalty", -2.5),
    ("frequency_penalty", 2),
])
def test_the_api_and_sampling_params_share_their_bounds(server: LiveServer, name: str, value: float) -> None:
    try:
        SamplingParams(**{name: value})
        engine_accepts = True
    except ValueError:
        engine_accepts = False
    response = server.client.post("/v1/completions", json={**COMPLETION, "max_tokens": 1, name: value})
    assert response.status_code == (200 if engine_accepts else 400), response.text
    if not engine_accepts:
        assert response.json()["error"]["param"] == name


@pytest.mark.parametrize("value", [b"NaN", b"Infinity"])
def test_a_temperature_must_be_a_finite_number(server: LiveServer, value: bytes) -> None:
    raw = b'{"prompt": "hi", "temperature": ' + value + b"}"
    for route in ("/v1/completions", "/generate"):
        response = server.client.post(route, content=raw, headers=JSON)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "temperature" and "finite number" in error["message"], error


def test_every_503_says_when_to_retry() -> None:
    go = threading.Event()

    def load_later(metrics):
        go.wait(60)
        raise ValueError("this test never loads a model")

    live = LiveServer(load_later, wait=False)
    try:
        loading = live.client.post("/generate", json={"prompt": "hi"})
        assert loading.status_code == 503 and loading.headers["retry-after"] == "5"
    finally:
        go.set()
        live.stop()
    overloaded = asyncio.run(_api_error(None, ApiError(503, "at capacity", code="server_overloaded")))
    assert overloaded.status_code == 503 and overloaded.headers["retry-after"] == "1"


def _guarded_echo(body_timeout: float) -> GuardMiddleware:
    app = FastAPI()
    for exc, handler in HANDLERS.items():
        app.add_exception_handler(exc, handler)

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        body = await request.json()
        after = await request.receive()  # what comes once the body is in: the client's disconnect
        return {"body": body, "after": after["type"]}

    return GuardMiddleware(app, max_body_bytes=1000, body_timeout=body_timeout)


def _call(app: GuardMiddleware, messages: list) -> tuple[int, bytes]:
    """Call the ASGI app with a client that sends `messages` (a callable is awaited for its message) and then stalls."""
    sent = []

    async def receive() -> dict:
        if messages:
            message = messages.pop(0)
            return await message() if callable(message) else message
        await asyncio.Event().wait()

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/echo", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")]}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_body_not_sent_in_time_is_a_408() -> None:
    status, body = _call(_guarded_echo(0.2), [{"type": "http.request", "body": b'{"prompt":', "more_body": True}])
    assert status == 408 and b"the request body was not received within 0.2 s" in body


def test_the_body_timeout_ends_with_the_body() -> None:
    async def late_disconnect() -> dict:
        await asyncio.sleep(0.6)
        return {"type": "http.disconnect"}

    messages = [{"type": "http.request", "body": b'{"a":', "more_body": True}, {"type": "http.request", "body": b" 1}"},
                late_disconnect]
    status, body = _call(_guarded_echo(0.2), messages)
    assert status == 200 and body == b'{"body":{"a":1},"after":"http.disconnect"}'


class _QuickHeadTimeout(HeaderTimeoutProtocol):
    header_timeout = 0.3


@pytest.fixture(scope="module")
def slow_app_port() -> Iterator[int]:
    """A server whose only route answers after 0.6 s, with a 0.3 s deadline on request heads."""
    app = FastAPI()

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(0.6)
        return {"ok": True}

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", http=_QuickHeadTimeout))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(10)


def _exchange(port: int, *parts: bytes, pause: float = 0.1) -> bytes:
    """Everything the server sends until it closes (or 5 s pass) after `parts` are sent, `pause` s apart."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        for part in parts:
            s.sendall(part)
            time.sleep(pause)
        received = b""
        try:
            while chunk := s.recv(4096):
                received += chunk
        except TimeoutError:
            pass
        return received


REQUEST = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_request_head_not_sent_in_time_is_a_408(slow_app_port: int) -> None:
    started = time.monotonic()
    for parts in ([b"GET /slow HTTP/1.1\r\nHost: x\r\n"], [b"GE"], []):  # stalled in the headers, the line, before
        reply = _exchange(slow_app_port, *parts)
        assert reply.startswith(b"HTTP/1.1 408 ") and b"were not received within 0.3 s" in reply, (parts, reply)
    assert time.monotonic() - started < 4  # each closed after its deadline, not at the 5 s read timeout


def test_the_head_deadline_spares_slow_answers_and_kept_alive_requests(slow_app_port: int) -> None:
    # a head in two parts 0.1 s apart, an answer after 0.6 s, then a second request on the same connection
    closing = REQUEST.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    reply = _exchange(slow_app_port, closing[:10], closing[10:], pause=0.1)
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b'{"ok":true}'), reply
    with socket.create_connection(("127.0.0.1", slow_app_port), timeout=5) as s:
        for _ in range(2):
            s.sendall(REQUEST)
            reply = b""
            while not reply.endswith(b'{"ok":true}'):
                reply += s.recv(4096)
            assert reply.startswith(b"HTTP/1.1 200 ")
