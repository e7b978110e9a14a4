"""Loading, admission control, API keys, client disconnects and graceful shutdown of `mili serve`."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.live_server import MODEL_NAME, LiveServer, start_mili_serve, tiny_loader

# Holds the engine for seconds whatever the random weights say: /generate has no ignore_eos, so /v1/completions.
LONG = {"prompt": "tell me everything", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}


def test_health_is_503_while_loading_then_200(tiny_checkpoint: Path) -> None:
    go = threading.Event()
    load = tiny_loader(tiny_checkpoint)
    live = LiveServer(lambda metrics: go.wait(60) and load(metrics), wait=False)
    try:
        health = live.client.get("/health")
        assert health.status_code == 503
        assert health.json() == {"status": "loading", "model_loaded": False, "scheduler_ready": False}
        busy = live.client.post("/generate", json={"prompt": "hi"})
        assert busy.status_code == 503 and "still loading" in busy.json()["error"]["message"]
        go.set()
        live.wait_until_ready(60)
        assert live.client.post("/generate", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    finally:
        live.stop()


def test_a_failed_load_is_reported(tmp_path: Path) -> None:
    live = LiveServer(tiny_loader(tmp_path / "missing"), wait=False)
    try:
        deadline = time.monotonic() + 30
        while live.client.get("/health").json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        health = live.client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "missing" in health.json()["error"]
        assert "loading failed" in live.client.post("/generate", json={"prompt": "hi"}).json()["error"]["message"]
    finally:
        live.stop()


def test_full_queue_answers_503(tiny_checkpoint: Path) -> None:
    live = LiveServer(tiny_loader(tiny_checkpoint, max_queue_len=1, max_num_seqs=1))
    try:
        with live.client.stream("POST", "/v1/completions", json=LONG) as running, \
                live.client.stream("POST", "/v1/completions", json=LONG) as waiting:
            lines = running.iter_lines()  # kept: a discarded iterator closes the connection (the server aborts)
            next(lines)
            assert waiting.status_code == 200
            full = live.client.post("/generate", json={"prompt": "one more"})
            assert full.status_code == 503 and "at capacity" in full.json()["error"]["message"]
            assert live.client.get("/health").status_code == 200
        live.wait_idle()  # both streams closed early: their requests were aborted
        assert live.client.post("/generate", json={"prompt": "room again", "max_tokens": 2}).status_code == 200
    finally:
        live.stop()


def test_api_key(tiny_checkpoint: Path) -> None:
    live = LiveServer(tiny_loader(tiny_checkpoint), api_key="sesame")
    try:
        anonymous = httpx.Client(base_url=live.url)
        assert anonymous.get("/health").status_code == 200
        for method, route in (("GET", "/"), ("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/generate"),
                              ("GET", "/status/x"), ("POST", "/v1/chat/completions")):
            response = anonymous.request(method, route, json={})
            assert response.status_code == 401, route
            assert "API key" in response.json()["error"]["message"]
        wrong = openai.OpenAI(base_url=live.url + "/v1", api_key="open", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=live.url + "/v1", api_key="sesame", max_retries=0)
        assert right.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).choices[0].text is not None
        # the scheme is case-insensitive (RFC 7235); the key is not
        for given, status in (("bearer sesame", 200), ("BEARER  sesame", 200), ("Bearer SESAME", 401),
                              ("Basic sesame", 401), ("sesame", 401), ("Bearer", 401)):
            assert anonymous.get("/v1/models", headers={"Authorization": given}).status_code == status, given
    finally:
        live.stop()


def test_disconnects_abort_requests_and_free_pages(server: LiveServer) -> None:
    engine = server.engine
    with server.client.stream(
        "POST", "/v1/chat/completions", json={**LONG, "messages": [{"role": "user", "content": "go"}]}
    ) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert engine.num_request_pages > 0
    server.wait_idle()

    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
        httpx.post(server.url + "/v1/completions", json={**LONG, "stream": False, "max_tokens": 500}, timeout=0.2)
    server.wait_idle()
    aborted = [line for line in server.client.get("/metrics").text.splitlines()
               if line.startswith("mili_request_success_total") and 'finished_reason="abort"' in line]
    assert aborted and float(aborted[0].rsplit(" ", 1)[1]) >= 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_mili_serve_shuts_down_gracefully(tiny_checkpoint: Path, sig: signal.Signals) -> None:
    proc, url = start_mili_serve(tiny_checkpoint, "--kv-pages", "1024", "--served-model-name", MODEL_NAME,
                                 "--shutdown-timeout", "2")
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**LONG, "max_tokens": 5000}, timeout=60) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            proc.send_signal(sig)
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        # in flight past the grace period: aborted, not cut off
        assert events[-1]["choices"][0]["finish_reason"] == "abort"
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    output = proc.stdout.read()
    assert f"serving {MODEL_NAME} on {url}" in output and "building the model graph" in output


class _FailingSampler:
    """Raises for requests seeded 666, as a bug inside the engine would."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __call__(self, logits, params, generators, histories):
        if any(p.seed == 666 for p in params):
            raise RuntimeError("injected sampler failure")
        return self.sampler(logits, params, generators, histories)


def test_a_request_that_fails_in_the_engine_does_not_take_the_server_down(tiny_checkpoint: Path) -> None:
    load = tiny_loader(tiny_checkpoint)

    def loader(metrics):
        engine = load(metrics)
        engine.engine.sampler = _FailingSampler(engine.engine.sampler)
        return engine

    live = LiveServer(loader)
    try:
        failed = live.client.post("/v1/completions", json={"prompt": "boom", "max_tokens": 3, "seed": 666})
        assert failed.status_code == 500 and "injected sampler failure" in failed.json()["error"]["message"]
        with live.client.stream("POST", "/v1/completions", json={"prompt": "boom", "max_tokens": 3, "seed": 666,
                                                                  "stream": True}) as stream:
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert "injected sampler failure" in events[-2] and events[-1] == "data: [DONE]"
        live.wait_idle()
        fine = live.client.post("/v1/completions", json={"prompt": "fine", "max_tokens": 3, "seed": 1})
        assert fine.status_code == 200 and fine.json()["usage"]["completion_tokens"] == 3
        assert live.client.get("/health").status_code == 200
    finally:
        live.stop()
