"""One request's whole state inside the engine (`InferenceRequest`, the one owner of it), what each step hands
out about it (`RequestDelta`: only what is new), and its result once finished (`RequestOutput`)."""

from __future__ import annotations

import enum
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from ..tokenizer.detokenizer import IncrementalDetokenizer
from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def new_request_id(prefix: str = "req") -> str:
    """A random id: ids reveal neither uptime nor how many requests came before."""
    return f"{prefix}-{uuid.uuid4().hex}"


def choice_request_id(call_id: str, index: int) -> str:
    """The id of request `index` of an API call that made several (n choices, several prompts)."""
    return f"{call_id}-{index}"


@dataclass
class RequestDelta:
    """What one step added to a request: its new tokens, the text that became final, their logprobs, and the
    finish reason on the last delta. Text that might still turn into a stop string is held back until the
    request goes on or finishes, so joining the deltas' text gives the finished request's text."""

    request_id: str
    token_ids: List[int]
    text: str
    logprobs: Optional[List[Any]]  # one sampler.TokenLogprobs per new token, when asked for
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort"; None while running

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A finished request's result (what `InferenceEngine.generate` returns)."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    token_ids: List[int]
    text: str
    finish_reason: Optional[str]
    logprobs: Optional[List[Any]] = None  # one sampler.TokenLogprobs per output token, when asked for
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class InferenceRequest:
    """A request from admission to its end: tokens, text, pages, prefix-cache lock, timings. The engine thread
    writes it; once FINISHED it no longer changes. Its prompt was validated before it was made."""

    request_id: str
    prompt: Optional[str]
    token_ids: List[int]  # prompt, then output tokens: one list, appended to as tokens come
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    max_total_tokens: int  # prompt + output never exceed this (min of max_model_len and prompt + max_tokens)
    generator: Optional[torch.Generator] = None
    num_prompt_tokens: int = field(init=False)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: Optional[str] = None
    text_pieces: List[str] = field(default_factory=list)  # the text handed out so far
    held_text: str = ""  # text not handed out yet: it may still turn into a stop string
    logprobs: Optional[List[Any]] = None
    page_ids: List[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # tokens whose K/V are in the cache
    prefix_node: Optional[Any] = None  # the radix-cache node this request locks
    num_cached_prompt_tokens: Optional[int] = None  # prefix-cache hit at the first admission
    arrival_time: float = field(default_factory=time.perf_counter)
    last_token_time: Optional[float] = None
    token_interval: Optional[float] = None  # seconds between the last two tokens (None after the first)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> List[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> List[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def max_tokens(self) -> int:
        """Output tokens this request can produce at most: max_tokens, clamped to the context."""
        return self.max_total_tokens - self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def text(self) -> str:
        return "".join(self.text_pieces)

    def status_dict(self) -> dict:
        """The design documents' /status shape: {"status": "processing" | "completed", ...}."""
        generated = self.num_output_tokens
        if self.finished:
            return {"status": "completed", "finish_reason": self.finish_reason, "tokens_generated": generated,
                    "tokens_remaining": 0}
        return {"status": "processing", "phase": self.status.value, "tokens_generated": generated,
                "tokens_remaining": self.max_tokens - generated}

    def output(self) -> RequestOutput:
        """The whole result (built once, when asked: never per step)."""
        logprobs = None if self.logprobs is None else list(self.logprobs)
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, self.output_token_ids, self.text,
                             self.finish_reason, logprobs, self.num_cached_prompt_tokens or 0)
