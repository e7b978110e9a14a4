"""A light asyncio load client for OpenAI-compatible /v1/completions: the cross-check of the load generator.

One aiohttp session, `concurrency` coroutines each sending its next request as soon as the last one ended
(a closed loop, like the generators' "concurrent" mode), streamed, timed per chunk with perf_counter."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass, field
from typing import List, Sequence

import aiohttp
import numpy as np


@dataclass
class RequestTiming:
    start: float
    ttft: float = 0.0  # seconds to the first streamed token
    e2e: float = 0.0
    chunk_times: List[float] = field(default_factory=list)  # arrival of every chunk that carried text
    output_tokens: int = 0
    error: str = ""

    @property
    def itls(self) -> List[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


async def _one(session: aiohttp.ClientSession, url: str, model: str, prompt: str, output_tokens: int,
               sampling: dict) -> RequestTiming:
    body = {"model": model, "prompt": prompt, "max_tokens": output_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **sampling}
    timing = RequestTiming(start=time.perf_counter())
    usage_tokens = None
    try:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                timing.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return timing
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                if any(choice.get("text") for choice in chunk.get("choices") or []):
                    timing.chunk_times.append(time.perf_counter())
    except aiohttp.ClientError as e:
        timing.error = repr(e)
        return timing
    end = time.perf_counter()
    if not timing.chunk_times:
        timing.error = "no tokens streamed"
        return timing
    timing.ttft = timing.chunk_times[0] - timing.start
    timing.e2e = end - timing.start
    # a server without stream usage: one token per text chunk (both servers stream token by token)
    timing.output_tokens = usage_tokens if usage_tokens is not None else len(timing.chunk_times)
    return timing


async def _run(url: str, model: str, prompts: Sequence[str], output_tokens: int, concurrency: int,
               sampling: dict) -> List[RequestTiming]:
    queue = list(reversed(prompts))
    timings: List[RequestTiming] = []
    # a connection per request: llama-server closes a streamed response's connection, and aiohttp's reuse of it
    # failed every second request ("Can not write request body")
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def worker() -> None:
            while queue:
                timings.append(await _one(session, url, model, queue.pop(), output_tokens, sampling))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return timings


def run_concurrency(url: str, model: str, prompts: Sequence[str], output_tokens: int, concurrency: int,
                    sampling: dict) -> tuple[List[RequestTiming], float, float]:
    """Send every prompt, `concurrency` at a time, with these sampling fields; returns the timings, the wall
    seconds and this client's CPU seconds (user + system of this process, to compare with the generator's)."""
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    timings = asyncio.run(_run(url.rstrip("/"), model, prompts, output_tokens, concurrency, sampling))
    return timings, time.perf_counter() - t0, _cpu_seconds() - cpu0


def summarize(timings: Sequence[RequestTiming], wall: float) -> dict:
    """The guidellm rows' fields from the light client's timings: output tok/s and TTFT / ITL / e2e percentiles."""
    ok = [t for t in timings if not t.error]
    row = {"requests": len(ok), "errors": len(timings) - len(ok), "duration_s": wall,
           "output_tok_s": sum(t.output_tokens for t in ok) / wall}
    series = {"ttft_ms": [t.ttft * 1e3 for t in ok], "itl_ms": [i * 1e3 for t in ok for i in t.itls],
              "e2e_s": [t.e2e for t in ok]}
    for name, values in series.items():
        row.update({f"{name}_p{q}": float(np.percentile(values, q)) if values else None for q in (50, 90, 99)})
    return row


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
