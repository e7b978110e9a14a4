"""Turns the requests of one step into flat ragged-batch tensors and runs the model on them."""

from __future__ import annotations

from typing import List, Tuple

import torch

from ..memory.kv_cache_manager import PagedKVCache
from ..model.qwen3_model import AttentionMetadata, Qwen3Model
from .request import InferenceRequest


def _int32(values: list, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


class ModelRunner:
    def __init__(self, model: Qwen3Model, kv_cache: PagedKVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache

    def run(self, batch: List[Tuple[InferenceRequest, int]]) -> Tuple[torch.Tensor, List[InferenceRequest]]:
        """batch: (request, number of its next uncached tokens to compute); the requests' pages must already
        cover those tokens. Returns the logits [S, vocab] of the S requests whose computed tokens reach their
        last token (they sample next; a prompt chunk that stops short of it has nothing to sample), and those
        requests."""
        page_size, device = self.kv_cache.page_size, self.model.device
        input_ids: List[int] = []
        positions: List[int] = []
        slots: List[int] = []
        query_start, context_lens, logits_indices, sampling = [0], [], [], []
        for req, n in batch:
            start = req.num_cached_tokens
            input_ids += req.all_token_ids[start : start + n]
            positions += range(start, start + n)
            slots += [req.page_ids[p // page_size] * page_size + p % page_size for p in range(start, start + n)]
            query_start.append(query_start[-1] + n)
            context_lens.append(start + n)
            if start + n == req.num_tokens:
                logits_indices.append(query_start[-1] - 1)
                sampling.append(req)
        max_pages = max(len(req.page_ids) for req, _ in batch)
        page_table = [req.page_ids + [0] * (max_pages - len(req.page_ids)) for req, _ in batch]
        attn = AttentionMetadata(
            query_start=_int32(query_start, device),
            context_lens=_int32(context_lens, device),
            page_table=_int32(page_table, device),
            slot_mapping=_int32(slots, device),
        )
        logits = self.model.forward(_int32(input_ids, device), _int32(positions, device), attn, self.kv_cache,
                                    _int32(logits_indices, device))
        return logits, sampling
