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

