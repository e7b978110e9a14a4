"""Radix-tree prefix cache over a PagedKVCache (SGLang-style RadixAttention), at page granularity.

Each node's key is a tuple of token ids whose length is a multiple of page_size, and node.pages holds one KV
page per page_size tokens of it. The tree holds one reference to each of its pages; requests that reuse a
cached prefix take their own reference and lock the matched path so it cannot be evicted under them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .kv_cache_manager import PagedKVCache


class RadixNode:
    __slots__ = ("children", "key", "last_access", "lock_ref", "pages", "parent")

    def __init__(self, key: tuple[int, ...] = (), pages: Sequence[int] = (), parent: RadixNode | None = None) -> None:
        self.key = key
        self.pages: list[int] = list(pages)
        self.children: dict[tuple[int, ...], RadixNode] = {}  # keyed by the first page's tokens
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0


class RadixAttentionCache:
    """Shares the KV pages of common prompt prefixes between requests; evicts unlocked leaves LRU first."""

    def __init__(self, kv_cache: PagedKVCache) -> None:
        self.kv_cache = kv_cache
        self.page_size: int = kv_cache.page_size
        self.root = RadixNode()
        self.hit_tokens = 0
        self.queried_tokens = 0
        self._clock = 0  # logical time for LRU: deterministic, unlike wall time
        self._num_cached = 0
        self._num_evictable = 0

    # ---- queries -------------------------------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], RadixNode]:
        """Pages of the longest cached prefix, in whole pages and never the whole prompt (so at least one
        token is left to compute), plus the deepest node matched. The caller gets one reference to each page
        and must `release(node)` when done with it."""
        ps = self.page_size
        max_pages = max(0, (len(token_ids) - 1) // ps)
        tokens = tuple(token_ids[: max_pages * ps])
        node, pages = self.root, []
        while len(pages) < max_pages:
            child = node.children.get(tokens[len(pages) * ps : (len(pages) + 1) * ps])
            if child is None:
                break
            n = self._common_pages(child.key, tokens[len(pages) * ps :])
            if n < len(child.pages):
                child = self._split(child, n)
            pages.extend(child.pages)
            node = child
        self.kv_cache.add_reference(pages)
        self._touch(node)
        self.lock(node)
        self.queried_tokens += len(token_ids)
        self.hit_tokens += len(pages) * ps
        return pages, node

    def lock(self, node: RadixNode) -> None:
        """Keep node and its ancestors from eviction until `release(node)`."""
        self._lock(node, +1)

    def release(self, node: RadixNode) -> None:
        """Undo a lock (the one match_prefix takes, or `lock`)."""
        self._lock(node, -1)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def num_cached_pages(self) -> int:
        return self._num_cached

    @property
    def num_evictable_pages(self) -> int:
        return self._num_evictable

    def cached_pages(self) -> list[int]:
        pages, stack = [], [self.root]
        while stack:
            node = stack.pop()
            pages.extend(node.pages)
            stack.extend(node.children.values())
        return pages

    # ---- updates -------------------------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], page_ids: Sequence[int]) -> tuple[RadixNode, list[int]]:
        """Cache the full pages of a sequence. Returns the node that ends them and the tree's pages for them:
        where the tree already held a page for the same tokens, that page rather than the one given (the
        caller may swap its own copy for it, as SGLang's cache_unfinished_req does)."""
        ps = self.page_size
        n = len(token_ids) // ps
        if len(page_ids) < n:
            raise ValueError(f"{len(token_ids)} tokens need {n} full page(s), got {len(page_ids)}")
        tokens, pages = tuple(token_ids[: n * ps]), list(page_ids[:n])
        node, i, path = self.root, 0, []
        while i < n:
            child = node.children.get(tokens[i * ps : (i + 1) * ps])
            if child is None:
                child = RadixNode(tokens[i * ps :], pages[i:], node)
                node.children[child.key[:ps]] = child
                self.kv_cache.add_reference(child.pages)
                self._num_cached += n - i
                self._num_evictable += n - i
                path += child.pages
                node = child
                break
            m = self._common_pages(child.key, tokens[i * ps :])
            if m < len(child.pages):
                child = self._split(child, m)
            path += child.pages
            node, i = child, i + m
        self._touch(node)
        return node, path

    def evict(self, num_pages: int) -> int:
        """Drop unlocked leaves, least recently used first, until num_pages pages went back to the free pool
        (or nothing is evictable). Returns the number of pages actually freed to the pool."""
        heap, seq = [], 0  # seq breaks ties: nodes themselves do not compare
        for node in self._nodes():
            if not node.children and node.lock_ref == 0:
                heap.append((node.last_access, seq, node))
                seq += 1
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.key[: self.page_size]]
            before = self.kv_cache.num_free_pages
            self.kv_cache.free_pages(node.pages)  # a page a request still references stays allocated
            freed += self.kv_cache.num_free_pages - before
            self._num_cached -= len(node.pages)
            self._num_evictable -= len(node.pages)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, seq, parent))
                seq += 1
        return freed

    def reset(self) -> None:
        """Drop every unlocked node (everything when nothing is locked)."""
        self.evict(self._num_cached + 1)  # more than can ever be freed: drains every evictable node

    # ---- internals -----------------------------------------------------------------------------------------
    def _nodes(self) -> list[RadixNode]:
        nodes, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    def _common_pages(self, key: tuple[int, ...], tokens: tuple[int, ...]) -> int:
        return common_pages(key, tokens, self.page_size, min(len(key), len(tokens)) // self.page_size)

    def _split(self, child: RadixNode, n: int) -> RadixNode:
        """Cut child after its n-th page; returns the new parent holding the first n pages."""
        ps = self.page_size
        mid = RadixNode(child.key[: n * ps], child.pages[:n], child.parent)
        # every lock through child also passes through mid
        mid.lock_ref, mid.last_access = child.lock_ref, child.last_access
        child.parent.children[mid.key[:ps]] = mid
        child.key, child.pages, child.parent = child.key[n * ps :], child.pages[n:], mid
        mid.children[child.key[:ps]] = child
        return mid

    def _touch(self, node: RadixNode | None) -> None:
        self._clock += 1
        while node is not None:
            node.last_access = self._clock
            node = node.parent

    def _lock(self, node: RadixNode, delta: int) -> None:
        while node is not self.root:
            if node.lock_ref == 0 and delta > 0:
                self._num_evictable -= len(node.pages)
            node.lock_ref += delta
            if node.lock_ref < 0:
                raise RuntimeError("RadixAttentionCache.release without a matching match_prefix")
            if node.lock_ref == 0:
                self._num_evictable += len(node.pages)
            node = node.parent


def common_pages(a: Sequence[int], b: Sequence[int], page_size: int, limit: int) -> int:
    """Full pages (at most `limit`) that token sequences a and b share from their start."""
    n = 0
    while n < limit and a[n * page_size : (n + 1) * page_size] == b[n * page_size : (n + 1) * page_size]:
        n += 1
    return n
