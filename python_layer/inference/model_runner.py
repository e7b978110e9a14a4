"""Turns the requests of one step into the forward's inputs and runs the model on them."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..memory.kv_cache_manager import PagedKVCache
from ..model.attention_metadata import SequenceChunk, build_step_inputs, int32_tensor
from ..model.decode_graphs import DecodeGraphs
from ..model.qwen3_model import Qwen3CausalLM
from .request import InferenceRequest


class ModelRunner:
    def __init__(
        self, model: Qwen3CausalLM, kv_cache: PagedKVCache, decode_graphs: Optional[DecodeGraphs] = None
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.decode_graphs = decode_graphs  # runs the steps that only decode, when given

    def run(self, batch: List[Tuple[InferenceRequest, int]]) -> Tuple[torch.Tensor, List[InferenceRequest]]:
        """batch: (request, number of its next uncached tokens to compute); the requests' pages must already
        cover those tokens. Returns the logits [S, vocab] of the S requests whose computed tokens reach their
        last token (they sample next; a prompt chunk that stops short of it has nothing to sample), and those
        requests."""
        chunks, logits_indices, sampling, offset = [], [], [], 0
        for req, n in batch:
            start = req.num_cached_tokens
            chunks.append(SequenceChunk(req.token_ids[start : start + n], start, req.page_ids))
            offset += n
            if start + n == req.num_tokens:
                logits_indices.append(offset - 1)
                sampling.append(req)
        if self.decode_graphs is not None and self.only_decodes(batch):
            return self.decode_graphs(chunks), sampling
        device = self.model.device
        inputs = build_step_inputs(chunks, self.kv_cache.page_size, device)
        indices = int32_tensor(logits_indices, device)
        logits = self.model.forward(inputs.input_ids, inputs.positions, inputs.attn, self.kv_cache, indices)
        return logits, sampling

    @staticmethod
    def only_decodes(batch: List[Tuple[InferenceRequest, int]]) -> bool:
        """Whether every request of the batch computes one token, its last (a decode step: decode graphs run it)."""
        return all(n == 1 and req.num_cached_tokens + 1 == req.num_tokens for req, n in batch)

    def run_following(self, requests: List[InferenceRequest], input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [len(requests), vocab] of a decode step whose tokens the step before sampled and has not handed
        to the host yet: input_ids holds them on the device (int32), and each request's next position is its
        num_cached_tokens. Only with decode graphs."""
        chunks = [SequenceChunk((0,), r.num_cached_tokens, r.page_ids) for r in requests]
        return self.decode_graphs(chunks, input_ids)
