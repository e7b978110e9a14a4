"""AsyncEngine's hand-off from the engine thread to the event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from python_layer import InferenceEngine, SamplingParams
from python_layer.inference.async_engine import AsyncEngine


def test_a_step_wakes_the_event_loop_once_whatever_its_batch(tiny_checkpoint: Path) -> None:
    engine = InferenceEngine.from_pretrained(tiny_checkpoint, num_kv_pages=256)
    async_engine = AsyncEngine(engine)

    async def run() -> tuple[int, list]:
        loop = asyncio.get_running_loop()
        wakes, call_soon_threadsafe = 0, loop.call_soon_threadsafe

        def counted(*args):
            nonlocal wakes
            wakes += 1
            return call_soon_threadsafe(*args)

        loop.call_soon_threadsafe = counted
        params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0)
        stream = async_engine.add_requests([[1, 2, 3 + i] for i in range(4)], [params] * 4, [f"r{i}" for i in range(4)])
        deltas = [delta async for delta in stream]
        return wakes, deltas

    try:
        wakes, deltas = asyncio.run(run())
    finally:
        async_engine.shutdown()
    assert sum(len(d.token_ids) for d in deltas) == 4 * 6
    assert sorted(d.request_id for d in deltas if d.finished) == ["r0", "r1", "r2", "r3"]
    assert wakes <= sum(engine.times.steps.values()) < 4 * 6  # one wake-up a step, not one a token
