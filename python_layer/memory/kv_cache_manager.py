"""Paged KV cache: per layer K and V of [num_pages, page_size, num_kv_heads, head_dim], reference-counted pages."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, List, Optional

import torch

if TYPE_CHECKING:
    from ..model.config import Qwen3Config

_CACHE_TYPES = ("k", "v")


class PagedKVCache:
    """A pool of KV pages shared by every layer: page p holds tokens of one sequence (or a shared prefix)
    in K and V of all layers. Pages carry reference counts so that sequences can share them."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"PagedKVCache needs num_pages >= 1 and page_size >= 1, got {num_pages} and {page_size}")
        self.num_pages, self.page_size = num_pages, page_size
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.ref_counts = [0] * num_pages
        self._free: List[int] = list(range(num_pages - 1, -1, -1))  # a stack: pop() gives page 0 first

    @classmethod
    def for_model(
        cls, config: Qwen3Config, num_pages: int, page_size: int = 16,
        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    ) -> "PagedKVCache":
        return cls(config.num_hidden_layers, num_pages, config.num_key_value_heads, config.head_dim, page_size, dtype, device)

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def free_page_ids(self) -> List[int]:
        return list(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.page_size)

    def allocate_pages(self, num_pages: int) -> Optional[List[int]]:
        """`num_pages` fresh pages (reference count 1 each), or None when the pool has fewer free."""
        if num_pages > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(num_pages)]
        for p in pages:
            self.ref_counts[p] = 1
        return pages

    def add_reference(self, page_ids: List[int]) -> None:
        for p in page_ids:
            if self.ref_counts[p] < 1:
                raise RuntimeError(f"KV page {p} is free: a free page cannot be shared")
            self.ref_counts[p] += 1

    def free_pages(self, page_ids: List[int]) -> None:
        """Drop one reference of each page; a page with no reference left returns to the pool."""
        for p in page_ids:
            if self.ref_counts[p] < 1:
                raise RuntimeError(f"KV page {p} freed twice")
            self.ref_counts[p] -= 1
            if self.ref_counts[p] == 0:
                self._free.append(p)

    def _cache(self, cache_type: str, layer: int) -> torch.Tensor:
        if cache_type not in _CACHE_TYPES:
            raise ValueError(f"cache_type must be 'k' or 'v', got {cache_type!r}")
        return (self.k_caches if cache_type == "k" else self.v_caches)[layer]

    def get_page(self, page_id: int, cache_type: str = "k", layer: int = 0) -> torch.Tensor:
        """One page, [page_size, num_kv_heads, head_dim] (a view)."""
        return self._cache(cache_type, layer)[page_id]

    def gather_pages(self, page_ids: List[int], seq_len: int, cache_type: str = "k", layer: int = 0) -> torch.Tensor:
        """The first seq_len tokens held by page_ids, contiguous: [seq_len, num_kv_heads, head_dim]."""
        if seq_len > len(page_ids) * self.page_size:
            raise ValueError(f"seq_len {seq_len} exceeds the {len(page_ids)} page(s) given ({len(page_ids) * self.page_size} tokens)")
        cache = self._cache(cache_type, layer)
        return cache[torch.tensor(page_ids, dtype=torch.long)].flatten(0, 1)[:seq_len].clone()

    def write_pages(self, page_ids: List[int], data: torch.Tensor, cache_type: str = "k", layer: int = 0) -> None:
        """Write data [n, num_kv_heads, head_dim] into page_ids, from the first slot of the first page on."""
        if data.shape[0] > len(page_ids) * self.page_size:
            raise ValueError(f"{data.shape[0]} tokens do not fit in {len(page_ids)} page(s) of {self.page_size}")
        cache = self._cache(cache_type, layer)
        for i, p in enumerate(page_ids):
            chunk = data[i * self.page_size : (i + 1) * self.page_size]
            if chunk.shape[0] == 0:
                break
            cache[p, : chunk.shape[0]] = chunk.to(cache.dtype)


class KVCacheAllocator(PagedKVCache):
    """The design documents' page-at-a-time API over PagedKVCache."""

    def __init__(
        self,
        config: Qwen3Config,
        max_batch_size: int = 64,
        max_seq_length: int = 32768,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cpu",
        num_pages: Optional[int] = None,
        page_size: int = 16,
    ) -> None:
        self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
        super().__init__(
            config.num_hidden_layers, num_pages or math.ceil(max_seq_length / page_size),
            config.num_key_value_heads, config.head_dim, page_size, dtype, device,
        )

    def allocate_page(self) -> int:
        pages = self.allocate_pages(1)
        if pages is None:
            raise RuntimeError(f"Insufficient pages in KV cache: all {self.num_pages} pages are in use")
        return pages[0]

    def free_page(self, page_id: int) -> None:
        self.free_pages([page_id])

    def add_page_reference(self, page_id: int) -> None:
        self.add_reference([page_id])
