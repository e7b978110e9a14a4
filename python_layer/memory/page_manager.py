"""KVPageManager: the one owner of the KV pages requests hold, as vLLM's KVCacheManager. It keeps the books of the
page pool (PagedKVCache) and, with prefix caching, of the radix tree (RadixAttentionCache); the scheduler decides
who runs and asks it for pages with per-request verbs: match the prefix, grow, record computed tokens, release."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from .kv_cache_manager import PagedKVCache
from .radix_cache import RadixAttentionCache, common_pages

if TYPE_CHECKING:
    from ..inference.request import InferenceRequest


class KVPageManager:
    """With a prefix cache, the full pages of a prompt enter the radix tree after each prefill chunk (SGLang's
    cache_unfinished_req), so requests that share a long system prompt reuse it while it is still being computed."""

    def __init__(self, kv_cache: PagedKVCache, prefix_cache: Optional[RadixAttentionCache] = None) -> None:
        self.kv_cache, self.prefix_cache = kv_cache, prefix_cache

    def match_prefix(self, request: "InferenceRequest") -> None:
        """Give a request about to be admitted the cached pages of its prompt's longest cached prefix (once)."""
        if self.prefix_cache is None or request.prefix_node is not None:
            return
        pages, node = self.prefix_cache.match_prefix(request.token_ids)
        request.page_ids, request.prefix_node = pages, node
        request.num_cached_tokens = len(pages) * self.kv_cache.page_size

    def prefix_in_flight(self, request: "InferenceRequest", running: Sequence["InferenceRequest"]) -> bool:
        """Whether a running request is computing full pages of this one's prefix that are not cached yet: then
        this one had better wait for them than compute them too."""
        if self.prefix_cache is None:
            return False
        ps = self.kv_cache.page_size
        matchable = (request.num_tokens - 1) // ps  # match_prefix never takes a whole prompt
        for other in running:
            cached = other.num_cached_tokens // ps
            if other.num_tokens - other.num_cached_tokens > 1 and cached < matchable:
                if common_pages(request.token_ids, other.token_ids, ps, matchable) > cached:
                    return True
        return False

    def grow(self, request: "InferenceRequest", n: int) -> bool:
        """Pages for n more tokens of the request, evicting unused prefix-cache pages when the pool is short; False,
        with nothing taken, when even that is not enough."""
        needed = self._pages_short(request, n)
        if needed <= 0:
            return True
        short = needed - self.kv_cache.num_free_pages
        if short > 0 and self.prefix_cache is not None:
            self.prefix_cache.evict(short)
        pages = self.kv_cache.allocate_pages(needed)
        if pages is None:
            return False
        request.page_ids += pages
        return True

    def grow_from_free_pages(self, requests: Sequence["InferenceRequest"], n: int) -> bool:
        """Pages for n more tokens of each request, from the free pool alone (no eviction); False, with nothing
        taken, where the pool is short."""
        needed = [self._pages_short(r, n) for r in requests]
        if sum(k for k in needed if k > 0) > self.kv_cache.num_free_pages:
            return False
        for request, k in zip(requests, needed):
            if k > 0:
                request.page_ids += self.kv_cache.allocate_pages(k)
        return True

    def computed(self, request: "InferenceRequest", n: int) -> None:
        """Record that a step computed n more tokens of the request (their KV is in its pages). After a prefill
        chunk its full pages enter the prefix cache at once; where another request cached the same tokens first,
        the request drops its copy for the cached page."""
        request.num_cached_tokens += n
        if self.prefix_cache is None or n <= 1:
            return
        ps = self.kv_cache.page_size
        full = request.num_cached_tokens // ps
        node, pages = self.prefix_cache.insert(request.token_ids[: full * ps], request.page_ids[:full])
        for i, page in enumerate(pages):
            if request.page_ids[i] != page:
                self.kv_cache.add_reference([page])
                self.kv_cache.free_pages([request.page_ids[i]])
                request.page_ids[i] = page
        self.prefix_cache.lock(node)
        if request.prefix_node is not None:
            self.prefix_cache.release(request.prefix_node)
        request.prefix_node = node

    def release(self, request: "InferenceRequest", cache: bool) -> None:
        """Give up the request's pages and prefix lock; with cache=True its computed full pages go to the prefix
        cache first, so a recomputation or a later request with the same prefix can reuse them."""
        if self.prefix_cache is not None:
            if cache:
                self.prefix_cache.insert(request.token_ids[: request.num_cached_tokens], request.page_ids)
            if request.prefix_node is not None:
                self.prefix_cache.release(request.prefix_node)
        self.kv_cache.free_pages(request.page_ids)
        request.page_ids, request.prefix_node, request.num_cached_tokens = [], None, 0

    def check_accounting(self, running: Sequence["InferenceRequest"], waiting: Sequence["InferenceRequest"]) -> None:
        """Raise AssertionError unless every page is free or held by exactly the references that should hold it: the
        running requests' page tables, the prefix cache and the pool's reservations. Cheap enough to run after every
        step."""
        expected = [0] * self.kv_cache.num_pages
        for p in self.kv_cache.reserved_pages:
            expected[p] += 1
        for request in running:
            for p in request.page_ids:
                expected[p] += 1
        for request in waiting:
            assert not request.page_ids, f"waiting request {request.request_id} holds pages {request.page_ids}"
        for p in self.prefix_cache.cached_pages() if self.prefix_cache is not None else []:
            expected[p] += 1
        actual = self.kv_cache.ref_counts
        wrong = [(p, e, a) for p, (e, a) in enumerate(zip(expected, actual)) if e != a]
        assert not wrong, f"KV page reference counts (page, expected, actual): {wrong[:10]}"
        free = self.kv_cache.free_page_ids()
        assert len(free) == len(set(free)), "a KV page is in the free pool twice"
        assert sorted(free) == [p for p, e in enumerate(expected) if e == 0], (
            "the free pool and the reference counts disagree"
        )

    def _pages_short(self, request: "InferenceRequest", n: int) -> int:
        """Pages the request lacks for n more tokens (0 or less: none)."""
        return self.kv_cache.pages_for(request.num_cached_tokens + n) - len(request.page_ids)

