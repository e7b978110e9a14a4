"""A served request as the server sees it: what its deltas have said so far (the engine, which may run in
another process, owns the request itself), for /status, the final response and the latency metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

from .request import RequestDelta, RequestOutput


@dataclass(eq=False)
class ClientRequest:
    request_id: str
    prompt_token_ids: List[int]
    max_tokens: int  # output tokens at most: max_tokens, clamped to the context
    logprobs: Optional[List[Any]] = None  # a list when the request asked for logprobs
    token_ids: List[int] = field(default_factory=list)  # the output tokens
    text_pieces: List[str] = field(default_factory=list)
    finish_reason: Optional[str] = None
    num_cached_tokens: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    last_token_time: Optional[float] = None
    token_interval: Optional[float] = None  # seconds between the last two deltas with tokens (None after the first)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, delta: RequestDelta, now: float) -> None:
        if delta.token_ids:
            if self.last_token_time is not None:
                self.token_interval = now - self.last_token_time
            self.last_token_time = now
            self.token_ids += delta.token_ids
        if delta.text:
            self.text_pieces.append(delta.text)
        if self.logprobs is not None and delta.logprobs:
            self.logprobs += delta.logprobs
        self.finish_reason = delta.finish_reason
        self.num_cached_tokens = delta.num_cached_tokens

    def status_dict(self) -> dict:
        """The design documents' /status shape: {"status": "processing" | "completed", ...}; phase "waiting" until
        the first token."""
        generated = len(self.token_ids)
        if self.finished:
            return {"status": "completed", "finish_reason": self.finish_reason, "tokens_generated": generated,
                    "tokens_remaining": 0}
        return {"status": "processing", "phase": "running" if generated else "waiting", "tokens_generated": generated,
                "tokens_remaining": self.max_tokens - generated}

    def output(self) -> RequestOutput:
        logprobs = None if self.logprobs is None else list(self.logprobs)
        return RequestOutput(self.request_id, None, self.prompt_token_ids, list(self.token_ids),
                             "".join(self.text_pieces), self.finish_reason, logprobs, self.num_cached_tokens)
