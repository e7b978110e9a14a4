"""Paged KV cache: per layer K and V of [num_pages, page_size, num_kv_heads, head_dim], reference-counted pages."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, List, Optional

import torch

from bindings.reference import kv_head_len

if TYPE_CHECKING:
    from ..model.config import Qwen3Config

# the KV cache when neither a page count nor a size is given: 2 GiB, at most 4096 pages (a small model's 2 GiB would
# be far more pages than it can use)
DEFAULT_KV_CACHE_GB, DEFAULT_MAX_KV_PAGES = 2.0, 4096
DEFAULT_PAGE_SIZE = 16  # tokens a page


def kv_page_bytes(config: Qwen3Config, page_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV page: K and V of page_size tokens in every layer."""
    head_bytes = kv_head_len(config.head_dim, dtype) * dtype.itemsize
    return 2 * config.num_hidden_layers * page_size * config.num_key_value_heads * head_bytes


def kv_pages_for(page_bytes: int, num_pages: Optional[int] = None, memory_gb: Optional[float] = None) -> int:
    """The pages of a KV cache: num_pages if given, else as many as memory_gb GiB hold (however many that is), else
    the default (DEFAULT_KV_CACHE_GB's worth, at most DEFAULT_MAX_KV_PAGES)."""
    if num_pages is not None:
        return num_pages
    if memory_gb is None:
        return min(DEFAULT_MAX_KV_PAGES, int(DEFAULT_KV_CACHE_GB * 2**30 // page_bytes))
    if memory_gb <= 0:
        raise ValueError(f"kv_cache_memory_gb must be > 0, got {memory_gb}")
    return max(1, int(memory_gb * 2**30 // page_bytes))


class PagedKVCache:
    """A pool of KV pages shared by every layer: page p holds tokens of one sequence (or a shared prefix)
    in K and V of all layers. Pages carry reference counts so that sequences can share them."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = DEFAULT_PAGE_SIZE,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"PagedKVCache needs num_pages >= 1 and page_size >= 1, got {num_pages} and {page_size}")
        self.num_pages, self.page_size = num_pages, page_size
        shape = (num_pages, page_size, num_kv_heads, kv_head_len(head_dim, dtype))
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.ref_counts = [0] * num_pages
        self.reserved_pages: List[int] = []  # taken out of the pool for good (reserve_page)
        self._free: List[int] = list(range(num_pages - 1, -1, -1))  # a stack: pop() gives page 0 first

    @classmethod
    def for_model(
        cls, config: Qwen3Config, num_pages: int, page_size: int = DEFAULT_PAGE_SIZE,
        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    ) -> "PagedKVCache":
        return cls(
            config.num_hidden_layers, num_pages, config.num_key_value_heads, config.head_dim, page_size, dtype, device
        )

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

    def reserve_page(self) -> int:
        """Take one page out of the pool for good (the padding rows of fixed-shape decode steps write there)."""
        pages = self.allocate_pages(1)
        if pages is None:
            raise RuntimeError("no free KV page left to reserve")
        self.reserved_pages.append(pages[0])
        return pages[0]

    @property
    def num_usable_pages(self) -> int:
        """Pages that sequences can hold: all but the reserved ones."""
        return self.num_pages - len(self.reserved_pages)

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
