"""ContinuousBatchScheduler: which requests run in the next step and how many tokens each computes.

Each step has a token budget. Running requests in decode go first (one token each), then running requests
whose prompt is still being prefilled, then waiting requests (FIFO) take what is left of the budget, their
prompts split into chunks over several steps when long. KV pages are taken as tokens need them; when the
pool is short the scheduler evicts unused prefix-cache pages, then preempts the most recently admitted
running request (its pages are freed and it waits to be recomputed). Nothing is dropped; nothing deadlocks,
because the engine admits no request that could need more pages than the whole pool.

With a prefix cache, the full pages of a prompt enter the radix tree after each prefill chunk (SGLang's
cache_unfinished_req), so requests that share a long system prompt reuse it while it is still being
computed; a waiting request whose prefix a running one is computing right now waits for it rather than
computing it again."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from ..memory.kv_cache_manager import PagedKVCache
from ..memory.radix_cache import RadixAttentionCache
from .request import InferenceRequest, RequestStatus


@dataclass
class ScheduledBatch:
    items: List[Tuple[InferenceRequest, int]] = field(default_factory=list)  # (request, tokens to compute)
    preempted: List[InferenceRequest] = field(default_factory=list)
    num_tokens: int = 0  # kept as items change: summing them for every request made a step O(requests^2)

    def add(self, request: InferenceRequest, n: int) -> None:
        self.items.append((request, n))
        self.num_tokens += n

    def drop(self, request: InferenceRequest) -> None:
        self.num_tokens -= sum(n for r, n in self.items if r is request)
        self.items = [(r, n) for r, n in self.items if r is not request]

    def __bool__(self) -> bool:
        return bool(self.items)


class ContinuousBatchScheduler:
    def __init__(
        self,
        kv_cache: PagedKVCache,
        prefix_cache: Optional[RadixAttentionCache] = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_seqs and max_num_batched_tokens must be >= 1, got {max_num_seqs}, {max_num_batched_tokens}"
            )
        self.kv_cache, self.prefix_cache = kv_cache, prefix_cache
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: Deque[InferenceRequest] = deque()
        self.running: List[InferenceRequest] = []  # in admission order: the last one is preempted first
        self.requests: Dict[str, InferenceRequest] = {}  # the unfinished ones by id
        self.num_preemptions = 0

    # ---- requests in and out --------------------------------------------------------------------------------

    def add_request(self, request: InferenceRequest) -> str:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return request.request_id

    def finish_request(self, request: InferenceRequest, reason: str) -> None:
        """End a request (finished or aborted): its computed pages go to the prefix cache, its own references
        are freed at once."""
        if request.status == RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
            self._release_pages(request, cache=True)
        request.finish_reason, request.status = reason, RequestStatus.FINISHED
        del self.requests[request.request_id]

    def update_request(self, request: InferenceRequest, num_computed: int) -> None:
        """Record that the step computed `num_computed` more tokens of the request (their KV is cached). After a
        prefill chunk, its full pages enter the prefix cache at once."""
        request.num_cached_tokens += num_computed
        if self.prefix_cache is not None and num_computed > 1:
            self._cache_computed_pages(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ------------------------------------------------------------------------------------------

    def get_next_batch(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = lambda: self.max_num_batched_tokens - batch.num_tokens
        decoding = [r for r in self.running if r.num_tokens - r.num_cached_tokens == 1]
        prefilling = [r for r in self.running if r.num_tokens - r.num_cached_tokens > 1]
        for request in decoding + prefilling:
            if budget() == 0:
                break
            if request.status != RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(request.num_tokens - request.num_cached_tokens, budget())
            if self._grow_or_preempt(request, n, batch):
                batch.add(request, n)
        for request in list(self.waiting):
            if budget() == 0 or len(self.running) >= self.max_num_seqs or batch.preempted:
                break
            if self._prefix_in_flight(request):
                continue
            self._match_prefix(request)
            n = min(request.num_tokens - request.num_cached_tokens, budget())
            if not self._grow(request, n):
                self._release_pages(request, cache=False)
                break
            self.waiting.remove(request)
            request.status = RequestStatus.RUNNING
            if request.num_cached_prompt_tokens is None:  # the first admission's prefix hit is what users see
                request.num_cached_prompt_tokens = request.num_cached_tokens
            self.running.append(request)
            batch.add(request, n)
        return batch

    schedule = get_next_batch

    def _grow_or_preempt(self, request: InferenceRequest, n: int, batch: ScheduledBatch) -> bool:
        """Pages for n more tokens of a running request, preempting newer requests when the pool is short.
        False when the request itself had to be preempted."""
        while not self._grow(request, n):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is request:
                return False
        return True

    def grow_from_free_pages(self, requests: Sequence[InferenceRequest], n: int) -> bool:
        """Pages for n more tokens of each request, from the free pool alone (no eviction, no preemption); False,
        with nothing taken, where the pool is short."""
        needed = [self._pages_short(r, n) for r in requests]
        if sum(k for k in needed if k > 0) > self.kv_cache.num_free_pages:
            return False
        for request, k in zip(requests, needed):
            if k > 0:
                request.page_ids += self.kv_cache.allocate_pages(k)
        return True

    def _pages_short(self, request: InferenceRequest, n: int) -> int:
        """Pages the request lacks for n more tokens (0 or less: none)."""
        return self.kv_cache.pages_for(request.num_cached_tokens + n) - len(request.page_ids)

    def _grow(self, request: InferenceRequest, n: int) -> bool:
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

    def _preempt(self, request: InferenceRequest, batch: ScheduledBatch) -> None:
        self.running.remove(request)
        self._release_pages(request, cache=True)
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        batch.preempted.append(request)
        batch.drop(request)
        self.num_preemptions += 1

    def _match_prefix(self, request: InferenceRequest) -> None:
        if self.prefix_cache is None or request.prefix_node is not None:
            return
        pages, node = self.prefix_cache.match_prefix(request.token_ids)
        request.page_ids, request.prefix_node = pages, node
        request.num_cached_tokens = len(pages) * self.kv_cache.page_size

    def _prefix_in_flight(self, request: InferenceRequest) -> bool:
        """Whether a running request is computing full pages of this one's prefix that are not cached yet:
        then this one waits for them instead of computing them too."""
        if self.prefix_cache is None:
            return False
        ps = self.kv_cache.page_size
        matchable = (request.num_tokens - 1) // ps  # match_prefix never takes a whole prompt
        for other in self.running:
            cached = other.num_cached_tokens // ps
            if other.num_tokens - other.num_cached_tokens > 1 and cached < matchable:
                if _common_pages(request.token_ids, other.token_ids, ps, matchable) > cached:
                    return True
        return False

    def _cache_computed_pages(self, request: InferenceRequest) -> None:
        """Put the request's computed full pages in the prefix cache and move its lock to their node. Where
        another request cached the same tokens first, the request drops its copy for the cached page."""
        ps = self.kv_cache.page_size
        n = request.num_cached_tokens // ps
        node, pages = self.prefix_cache.insert(request.token_ids[: n * ps], request.page_ids[:n])
        for i, page in enumerate(pages):
            if request.page_ids[i] != page:
                self.kv_cache.add_reference([page])
                self.kv_cache.free_pages([request.page_ids[i]])
                request.page_ids[i] = page
        self.prefix_cache.lock(node)
        if request.prefix_node is not None:
            self.prefix_cache.release(request.prefix_node)
        request.prefix_node = node

    def _release_pages(self, request: InferenceRequest, cache: bool) -> None:
        """Give up the request's pages and prefix lock; with cache=True its computed full pages go to the
        prefix cache first, so a recomputation or a later request with the same prefix can reuse them."""
        if self.prefix_cache is not None:
            if cache:
                self.prefix_cache.insert(request.token_ids[: request.num_cached_tokens], request.page_ids)
            if request.prefix_node is not None:
                self.prefix_cache.release(request.prefix_node)
        self.kv_cache.free_pages(request.page_ids)
        request.page_ids, request.prefix_node, request.num_cached_tokens = [], None, 0

    # ---- debugging ---------------------------------------------------------------------------------------------

    def check_page_accounting(self) -> None:
        """Raise AssertionError unless every page is free or held by exactly the references that should hold it: the
        running requests' page tables, the prefix cache and the cache's reservations. Cheap enough to run after every
        step."""
        expected = [0] * self.kv_cache.num_pages
        for p in self.kv_cache.reserved_pages:
            expected[p] += 1
        for request in self.running:
            for p in request.page_ids:
                expected[p] += 1
        for request in self.waiting:
            assert not request.page_ids, f"waiting request {request.request_id} holds pages {request.page_ids}"
        if self.prefix_cache is not None:
            for p in self.prefix_cache.cached_pages():
                expected[p] += 1
        actual = self.kv_cache.ref_counts
        wrong = [(p, e, a) for p, (e, a) in enumerate(zip(expected, actual)) if e != a]
        assert not wrong, f"KV page reference counts (page, expected, actual): {wrong[:10]}"
        free = self.kv_cache.free_page_ids()
        assert len(free) == len(set(free)), "a KV page is in the free pool twice"
        assert sorted(free) == [p for p, e in enumerate(expected) if e == 0], (
            "the free pool and the reference counts disagree"
        )


def _common_pages(a: Sequence[int], b: Sequence[int], page_size: int, limit: int) -> int:
    """Full pages (at most `limit`) that token lists a and b share from their start."""
    n = 0
    while n < limit and a[n * page_size : (n + 1) * page_size] == b[n * page_size : (n + 1) * page_size]:
        n += 1
    return n
