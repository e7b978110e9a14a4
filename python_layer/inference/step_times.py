"""Where an engine's time goes: cumulative seconds per phase of its steps, and what its steps computed. /metrics
exports them (mili_engine_*); readers take differences over a window."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import ContextManager, Dict, Iterator, List, Tuple

PHASES = ("schedule", "prefill", "decode", "sample", "output", "deliver")
"""schedule: choosing the batch and its KV pages; prefill: the model on a step where some row computes prompt
tokens (inputs and graph); decode: the model on a step where every row computes its one next token; sample: the
sampler; output: tokens into text, stop checks; deliver (served engines): handing deltas to the server's streams.
The rest of the engine thread's time is idle, or bookkeeping between phases. On a GPU a forward returns once the
device has its work: the wait for it falls in sample, where the tokens are read."""
STEP_KINDS = ("prefill", "decode")


class StepTimes:
    def __init__(self) -> None:
        self.seconds: Dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.steps: Dict[str, int] = dict.fromkeys(STEP_KINDS, 0)
        self.rows: Dict[str, int] = dict.fromkeys(STEP_KINDS, 0)
        self.tokens: Dict[str, int] = dict.fromkeys(STEP_KINDS, 0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def forward(self, items: List[Tuple[object, int]], decode: bool) -> ContextManager[None]:
        """Counts a step ((request, tokens it computes) per row); time its forward inside."""
        kind = "decode" if decode else "prefill"
        self.steps[kind] += 1
        self.rows[kind] += len(items)
        self.tokens[kind] += sum(n for _, n in items)
        return self.phase(kind)
