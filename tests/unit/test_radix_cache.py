import random

import pytest

from python_layer.memory.kv_cache_manager import PagedKVCache
from python_layer.memory.radix_cache import RadixAttentionCache, RadixNode

PS = 4


def make(num_pages: int = 16) -> tuple[PagedKVCache, RadixAttentionCache]:
    kv = PagedKVCache(num_layers=1, num_pages=num_pages, num_kv_heads=1, head_dim=4, page_size=PS)
    return kv, RadixAttentionCache(kv)


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def cache_seq(kv: PagedKVCache, cache: RadixAttentionCache, tokens: list[int]) -> list[int]:
    """Simulate a finished request: allocate its pages, insert them, drop the request's own references."""
    pages = kv.allocate_pages(kv.pages_for(len(tokens)))
    assert pages is not None
    cache.insert(tokens, pages)
    kv.free_pages(pages)
    return pages


def test_match_on_empty_tree() -> None:
    kv, cache = make()
    pages, node = cache.match_prefix(seq(10))
    assert pages == [] and node is cache.root
    cache.release(node)  # releasing the root is a no-op
    assert cache.match_prefix([]) == ([], cache.root)
    assert cache.num_cached_pages == 0 and kv.num_free_pages == 16


def test_insert_then_match_takes_references_and_locks() -> None:
    kv, cache = make()
    pages = kv.allocate_pages(3)
    tokens = seq(10)  # 2 full pages + 2 tokens
    node, path = cache.insert(tokens, pages)
    assert path == pages[:2] and node.pages == pages[:2] and cache.num_cached_pages == 2
    assert kv.ref_counts[pages[0]] == 2 and kv.ref_counts[pages[1]] == 2 and kv.ref_counts[pages[2]] == 1
    kv.free_pages(pages)
    assert kv.ref_counts[pages[0]] == 1 and kv.ref_counts[pages[2]] == 0
    assert sorted(cache.cached_pages()) == pages[:2] and cache.num_cached_pages == 2

    got, node = cache.match_prefix(seq(12) + [99])
    assert got == pages[:2] and node.pages == pages[:2]
    assert kv.ref_counts[pages[0]] == 2 and node.lock_ref == 1
    assert cache.num_evictable_pages == 0
    cache.release(node)
    assert node.lock_ref == 0 and cache.num_evictable_pages == 2
    kv.free_pages(got)
    assert kv.ref_counts[pages[0]] == 1


def test_never_matches_the_whole_prompt() -> None:
    kv, cache = make()
    pages = cache_seq(kv, cache, seq(12))  # 3 pages cached
    got, node = cache.match_prefix(seq(12))  # exactly 3 pages: one must stay to compute
    assert got == pages[:2]
    cache.release(node)
    got, node = cache.match_prefix(seq(13))  # 3 pages + 1 token
    assert got == pages
    cache.release(node)
    got, node = cache.match_prefix(seq(4))  # a single page prompt matches nothing
    assert got == [] and node is cache.root


def test_match_diverging_inside_a_node_splits_it() -> None:
    kv, cache = make()
    pages = cache_seq(kv, cache, seq(16))  # one node of 4 pages
    prompt = seq(8) + [100, 101, 102, 103, 104]
    got, node = cache.match_prefix(prompt)
    assert got == pages[:2]
    assert node.key == tuple(seq(8)) and node.lock_ref == 1 and node.parent is cache.root
    (child,) = node.children.values()
    assert child.key == tuple(seq(8, 8)) and child.pages == pages[2:] and child.lock_ref == 0
    assert cache.num_evictable_pages == 2  # only the tail half is unlocked
    cache.release(node)
    kv.free_pages(got)
    # diverging in the middle of a page: only the whole pages before it count
    got, node = cache.match_prefix(seq(6) + [100, 101, 102])
    assert got == pages[:1] and node.key == tuple(seq(4))
    cache.release(node)
    kv.free_pages(got)
    assert cache.num_cached_pages == 4 and cache.num_evictable_pages == 4
    assert all(kv.ref_counts[p] == 1 for p in pages)


def test_split_of_a_locked_node_keeps_the_lock_on_both_halves() -> None:
    kv, cache = make()
    cache_seq(kv, cache, seq(16))
    got, deep = cache.match_prefix(seq(17))  # locks the whole 4-page node
    other, shallow = cache.match_prefix(seq(8) + [50] * 5)  # splits it after 2 pages
    assert shallow.lock_ref == 2 and deep.lock_ref == 1 and deep.parent is shallow
    cache.release(deep)
    assert shallow.lock_ref == 1 and deep.lock_ref == 0 and cache.num_evictable_pages == 2
    cache.release(shallow)
    assert cache.num_evictable_pages == 4
    kv.free_pages(got + other)


def test_insert_overlapping_sequence_keeps_tree_pages_and_adds_tail() -> None:
    kv, cache = make()
    first = cache_seq(kv, cache, seq(8) + [20, 21, 22, 23])
    # the same first 2 pages of tokens, computed into different pages, then a new tail
    tokens = seq(8) + [30, 31, 32, 33, 34, 35, 36, 37, 38]
    dup = kv.allocate_pages(5)
    node, path = cache.insert(tokens, dup)
    assert path == first[:2] + dup[2:4] and node.pages == dup[2:4]  # the tree's own pages where it had them
    assert cache.num_cached_pages == 5
    assert [kv.ref_counts[p] for p in dup] == [1, 1, 2, 2, 1]  # duplicates of cached pages get no tree reference
    kv.free_pages(dup)
    assert kv.ref_counts[dup[0]] == 0 and kv.ref_counts[dup[1]] == 0
    assert sorted(cache.cached_pages()) == sorted(first + dup[2:4])
    got, node = cache.match_prefix(tokens)
    assert got == first[:2] + dup[2:4]
    cache.release(node)
    kv.free_pages(got)
    assert cache.insert(tokens, got + [dup[4]]) == (node, got)  # already fully cached: nothing new
    assert cache.insert(seq(3), []) == (cache.root, [])  # no full page
    assert cache.num_cached_pages == 5


def test_evict_lru_leaves_then_parents_and_skips_locked() -> None:
    kv, cache = make()
    a = cache_seq(kv, cache, seq(8) + seq(8, 100))  # root -> [shared 2 pages] -> a-tail
    b = cache_seq(kv, cache, seq(8) + seq(8, 200))  # splits: shared node with tails a and b
    c = cache_seq(kv, cache, seq(8, 300))
    assert cache.num_cached_pages == 8 and kv.num_free_pages == 8
    # touch: a-tail is now the most recent, then c; b-tail is the least recently used
    got, node_c = cache.match_prefix(seq(8, 300) + [1])
    cache.release(node_c)
    kv.free_pages(got)
    got, node_a = cache.match_prefix(seq(8) + seq(8, 100) + [1])
    cache.release(node_a)
    kv.free_pages(got)

    free_before = set(kv.free_page_ids())
    assert cache.evict(1) == 2  # a whole leaf goes: b's tail
    assert set(kv.free_page_ids()) - free_before == set(b[2:])
    assert cache.evict(2) == 2
    assert set(kv.free_page_ids()) - free_before == set(b[2:] + c)

    got, node_a = cache.match_prefix(seq(8) + seq(8, 100) + [1])  # lock a's path
    assert cache.evict(10) == 0 and cache.num_cached_pages == 4 and cache.num_evictable_pages == 0
    cache.release(node_a)
    kv.free_pages(got)
    assert cache.evict(1) == 2  # a's tail; the shared parent is now a leaf but not needed yet
    assert set(kv.free_page_ids()) - free_before == set(b[2:] + c + a[2:])
    assert cache.cached_pages() == a[:2]
    assert cache.evict(1) == 2 and cache.num_cached_pages == 0 and kv.num_free_pages == 16


def test_evict_counts_only_pages_returned_to_the_pool() -> None:
    kv, cache = make()
    pages = kv.allocate_pages(2)
    cache.insert(seq(8), pages)  # the "request" still holds its references and holds no lock
    assert cache.num_evictable_pages == 2
    assert cache.evict(2) == 0
    assert cache.num_cached_pages == 0 and [kv.ref_counts[p] for p in pages] == [1, 1]
    kv.free_pages(pages)
    assert kv.num_free_pages == 16


def test_parent_becomes_evictable_after_its_children() -> None:
    kv, cache = make()
    a = cache_seq(kv, cache, seq(4) + seq(4, 100))
    b = cache_seq(kv, cache, seq(4) + seq(4, 200))
    assert a[0] != b[0] and kv.ref_counts[b[0]] == 0  # b's copy of the shared page was not cached
    assert cache.evict(3) == 3  # both tails, then their parent
    assert cache.num_cached_pages == 0 and kv.num_free_pages == 16


def test_stats_and_hit_rate() -> None:
    kv, cache = make()
    assert cache.hit_rate == 0.0
    cache_seq(kv, cache, seq(12))
    got, node = cache.match_prefix(seq(10))  # 2 pages = 8 tokens hit of 10
    cache.release(node)
    kv.free_pages(got)
    got, node = cache.match_prefix(seq(10, 50))
    assert cache.hit_tokens == 8 and cache.queried_tokens == 20
    assert cache.hit_rate == pytest.approx(0.4)


def test_reset_drops_unlocked_nodes() -> None:
    kv, cache = make()
    cache_seq(kv, cache, seq(12))
    cache_seq(kv, cache, seq(8, 100))
    got, node = cache.match_prefix(seq(9))  # locks the first 2 pages of the first sequence
    cache.reset()
    assert cache.cached_pages() == got and cache.num_evictable_pages == 0
    cache.release(node)
    kv.free_pages(got)
    cache.reset()
    assert cache.num_cached_pages == 0 and cache.root.children == {} and kv.num_free_pages == 16


def _check_tree(
    cache: RadixAttentionCache, page_tokens: dict[int, tuple[int, ...]], locked_nodes: list[RadixNode]
) -> None:
    """Structure, page contents and lock counts of every node; the cache's page counters."""
    evictable, stack = 0, [(cache.root, ())]
    while stack:
        node, prefix = stack.pop()
        if node is not cache.root:
            assert len(node.key) == len(node.pages) * PS > 0
            for j, p in enumerate(node.pages):
                assert page_tokens[p] == node.key[j * PS : (j + 1) * PS]
            below = 0
            for n in locked_nodes:
                while n is not None and n is not node:
                    n = n.parent
                below += n is node
            assert node.lock_ref == below
            evictable += len(node.pages) if node.lock_ref == 0 else 0
        for first, child in node.children.items():
            assert child.parent is node and child.key[:PS] == first
            stack.append((child, prefix + child.key))
    assert cache.num_evictable_pages == evictable
    assert cache.num_cached_pages == len(cache.cached_pages())


def test_randomized_against_a_simulation() -> None:
    rng = random.Random(1234)
    kv, cache = make(num_pages=24)
    page_tokens: dict[int, tuple[int, ...]] = {}  # what the simulation "wrote" into each page
    live: list[tuple[list[int], list[int], RadixNode]] = []  # (tokens, own pages, locked node)
    bases = [[rng.randrange(3) for _ in range(24)] for _ in range(3)]

    def prompt() -> list[int]:
        base = rng.choice(bases)
        keep = rng.randrange(len(base) + 1)
        return base[:keep] + [rng.randrange(3) for _ in range(rng.randrange(6))]

    def check() -> None:
        tree = cache.cached_pages()
        assert len(tree) == len(set(tree))
        held = [p for _, pages, _ in live for p in pages]
        for p in range(kv.num_pages):
            assert kv.ref_counts[p] == (p in tree) + held.count(p), p
        free = kv.free_page_ids()
        assert len(free) == len(set(free))
        assert sorted(free) == [p for p in range(kv.num_pages) if kv.ref_counts[p] == 0]
        _check_tree(cache, page_tokens, [node for _, _, node in live])

    for _ in range(600):
        op = rng.random()
        if op < 0.45:  # a new request
            tokens = prompt()
            pages, node = cache.match_prefix(tokens)
            assert len(pages) <= max(0, (len(tokens) - 1) // PS)
            for i, p in enumerate(pages):
                assert page_tokens[p] == tuple(tokens[i * PS : (i + 1) * PS])
            need = kv.pages_for(len(tokens)) - len(pages)
            new = kv.allocate_pages(need)
            if new is None:
                cache.evict(need - kv.num_free_pages)
                new = kv.allocate_pages(need)
            if new is None:  # out of memory: give up the request
                cache.release(node)
                kv.free_pages(pages)
            else:
                for i, p in enumerate(new, start=len(pages)):
                    page_tokens[p] = tuple(tokens[i * PS : (i + 1) * PS])
                live.append((tokens, pages + new, node))
        elif op < 0.8 and live:  # a request finishes (usually caching its KV) or caches it while running
            idx = rng.randrange(len(live))
            tokens, pages, node = live[idx]
            if rng.random() < 0.85:
                cache.insert(tokens, pages)
            if rng.random() < 0.8:
                live.pop(idx)
                kv.free_pages(pages)
                cache.release(node)
        elif op < 0.97:
            before = kv.num_free_pages
            assert cache.evict(rng.randrange(1, 8)) == kv.num_free_pages - before
        else:
            cache.reset()
        check()

    for _tokens, pages, node in live:
        kv.free_pages(pages)
        cache.release(node)
    live.clear()
    check()
    cache.reset()
    assert cache.num_cached_pages == 0 and kv.num_free_pages == kv.num_pages
    assert 0.0 < cache.hit_rate < 1.0
