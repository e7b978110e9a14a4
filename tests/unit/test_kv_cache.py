import pytest

from python_layer.memory.kv_cache_manager import PagedKVCache


def test_allocate_share_free_reference_counts() -> None:
    cache = PagedKVCache(num_layers=2, num_pages=4, num_kv_heads=2, head_dim=8)
    a = cache.allocate_pages(3)
    assert len(set(a)) == 3 and cache.num_free_pages == 1
    assert cache.allocate_pages(2) is None and cache.num_free_pages == 1  # all or nothing
    cache.add_reference(a[:1])
    cache.free_pages(a)
    assert cache.num_free_pages == 3 and cache.ref_counts[a[0]] == 1
    cache.free_pages(a[:1])
    assert cache.num_free_pages == 4
    with pytest.raises(RuntimeError, match="freed twice"):
        cache.free_pages(a[:1])
    with pytest.raises(RuntimeError, match="is free"):
        cache.add_reference(a[:1])



def test_a_reserved_page_never_returns_to_the_pool() -> None:
    cache = PagedKVCache(num_layers=1, num_pages=3, num_kv_heads=1, head_dim=8)
    pad = cache.reserve_page()
    assert cache.reserved_pages == [pad] and cache.num_usable_pages == 2 and cache.num_free_pages == 2
    pages = cache.allocate_pages(2)
    assert pad not in pages and cache.allocate_pages(1) is None
    cache.free_pages(pages)
    assert sorted(cache.free_page_ids()) == sorted(pages)
    cache.allocate_pages(2)
    with pytest.raises(RuntimeError, match="no free KV page left to reserve"):
        cache.reserve_page()
