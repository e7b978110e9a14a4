"""64 concurrent streaming clients against one server: all complete with the right number of tokens, no
errors, no leaked KV pages, and /health keeps answering during the load."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx

from tests.server.live_server import MODEL_NAME, LiveServer


async def _stream_one(client: httpx.AsyncClient, i: int, max_tokens: int) -> tuple[int, str, str]:
    body = {
        "model": MODEL_NAME,
        "prompt": f"Client {i} says" + " hello" * (i % 7),
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    text, finish, usage = "", None, None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                text += choice["text"]
                finish = choice["finish_reason"] or finish
            usage = chunk.get("usage") or usage
    return usage["completion_tokens"], finish, text


async def _load(url: str, clients: int) -> tuple[list, list[float]]:
    rng = random.Random(0)
    lengths = [rng.randint(4, 32) for _ in range(clients)]
    health_latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=clients + 4)) as client:
        done = asyncio.Event()

        async def probe_health() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=10) as prober:
                while not done.is_set():
                    started = time.perf_counter()
                    assert (await prober.get("/health")).status_code == 200
                    health_latencies.append(time.perf_counter() - started)
                    await asyncio.sleep(0.05)

        prober = asyncio.create_task(probe_health())
        results = await asyncio.gather(*(_stream_one(client, i, n) for i, n in enumerate(lengths)))
        done.set()
        await prober
    return list(zip(lengths, results)), health_latencies


def test_64_concurrent_streaming_clients(server: LiveServer) -> None:
    results, health = asyncio.run(_load(server.url, 64))
    for asked, (generated, finish, text) in results:
        assert generated == asked and finish == "length" and text
    assert len(health) >= 3 and max(health) < 2.0, health
    server.wait_idle()
