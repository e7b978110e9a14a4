"""The state of one request inside the engine, and what the engine reports about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from ..tokenizer.detokenizer import IncrementalDetokenizer
from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    token_ids: List[int]
    text: str
    finish_reason: Optional[str]  # "stop" | "length" | "abort"; None while running

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

    @property
    def all_token_ids(self) -> List[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def output(self) -> RequestOutput:
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids), list(self.output_token_ids),
                             self.text, self.finish_reason)
