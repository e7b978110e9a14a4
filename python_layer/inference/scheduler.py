"""ContinuousBatchScheduler: which requests run in the next step and how many tokens each computes.

Each step has a token budget. Running requests in decode go first (one token each), then running requests
whose prompt is still being prefilled, then waiting requests (FIFO) take what is left of the budget, their
prompts split into chunks over several steps when long. KV pages come from the KVPageManager as tokens need them;
when the pool is short it evicts unused prefix-cache pages, and when that is not enough the scheduler preempts the
most recently admitted running request (its pages are freed and it waits to be recomputed). Nothing is dropped;
nothing deadlocks, because the engine admits no request that could need more pages than the whole pool. A waiting
request whose prefix a running one is computing right now waits for it rather than computing it again."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

from ..memory.kv_cache_manager import PagedKVCache
from ..memory.page_manager import KVPageManager
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
        self.pages = KVPageManager(kv_cache, prefix_cache)
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
            self.pages.release(request, cache=True)
        request.finish_reason, request.status = reason, RequestStatus.FINISHED
        del self.requests[request.request_id]

    def update_request(self, request: InferenceRequest, num_computed: int) -> None:
        """Record that the step computed `num_computed` more tokens of the request (their KV is cached)."""
        self.pages.computed(request, num_computed)

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
            if self.pages.prefix_in_flight(request, self.running):
                continue
            self.pages.match_prefix(request)
            n = min(request.num_tokens - request.num_cached_tokens, budget())
            if not self.pages.grow(request, n):
                self.pages.release(request, cache=False)
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
        while not self.pages.grow(request, n):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is request:
                return False
        return True

    def _preempt(self, request: InferenceRequest, batch: ScheduledBatch) -> None:
        self.running.remove(request)
        self.pages.release(request, cache=True)
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        batch.preempted.append(request)
        batch.drop(request)
        self.num_preemptions += 1

    # ---- debugging ---------------------------------------------------------------------------------------------

    def check_page_accounting(self) -> None:
        """Raise AssertionError unless every KV page is free or held by exactly the references that should hold it
        (KVPageManager.check_accounting)."""
        self.pages.check_accounting(self.running, self.waiting)
