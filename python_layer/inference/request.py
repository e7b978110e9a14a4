"""The state of one request inside the engine, and what the engine reports about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from ..tokenizer.detokenizer import IncrementalDetokenizer
from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class RequestPhase(enum.Enum):
    PREFILL = 1  # prompt tokens (or, after a preemption, prompt and output) still to compute
    DECODE = 2  # one new token per step


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    token_ids: List[int]
    text: str
    finish_reason: Optional[str]  # "stop" | "length" | "abort"; None while running
    logprobs: Optional[List[Any]] = None  # one sampler.TokenLogprobs per output token, when asked for
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class InferenceRequest:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    max_total_tokens: int  # prompt + output may not exceed this (min of max_model_len and prompt + max_tokens)
    generator: Optional[torch.Generator] = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: List[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    page_ids: List[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # tokens whose K/V are in the cache
    prefix_node: Optional[Any] = None  # the radix-cache node this request locks
    num_cached_prompt_tokens: Optional[int] = None  # prefix-cache hit at the first admission
    logprobs: Optional[List[Any]] = None

    @property
    def all_token_ids(self) -> List[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def phase(self) -> RequestPhase:
        return RequestPhase.DECODE if self.num_tokens - self.num_cached_tokens == 1 else RequestPhase.PREFILL

    def output(self) -> RequestOutput:
        logprobs = None if self.logprobs is None else list(self.logprobs)
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids), list(self.output_token_ids),
                             self.text, self.finish_reason, logprobs, self.num_cached_prompt_tokens or 0)


RequestMetadata = InferenceRequest  # the design documents' name for a request's state
