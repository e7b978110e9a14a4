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

    def run(self, batch: List[Tuple[InferenceRequest, int]]) -> torch.Tensor:
        """batch: (request, number of its next uncached tokens to compute). Returns the logits [B, vocab]
        of each request's last computed token. The requests' pages must already cover those tokens."""
        page_size, device = self.kv_cache.page_size, self.model.device
        input_ids: List[int] = []
        positions: List[int] = []
        slots: List[int] = []
        query_start, context_lens = [0], []
        for req, n in batch:
            start = req.num_cached_tokens
            input_ids += req.all_token_ids[start : start + n]
            positions += range(start, start + n)
            slots += [req.page_ids[p // page_size] * page_size + p % page_size for p in range(start, start + n)]
            query_start.append(query_start[-1] + n)
            context_lens.append(start + n)
        max_pages = max(len(req.page_ids) for req, _ in batch)
        page_table = [req.page_ids + [0] * (max_pages - len(req.page_ids)) for req, _ in batch]
        attn = AttentionMetadata(
            query_start=_int32(query_start, device),
            context_lens=_int32(context_lens, device),
            page_table=_int32(page_table, device),
            slot_mapping=_int32(slots, device),
        )
        logits_indices = _int32([s - 1 for s in query_start[1:]], device)
        return self.model.forward(_int32(input_ids, device), _int32(positions, device), attn, self.kv_cache, logits_indices)
