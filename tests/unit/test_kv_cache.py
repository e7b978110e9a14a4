import pytest
import torch

from python_layer.memory.kv_cache_manager import KVCacheAllocator, PagedKVCache
from python_layer.model.config import Qwen3Config


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


def test_write_then_gather_across_non_contiguous_pages() -> None:
    cache = PagedKVCache(num_layers=2, num_pages=6, num_kv_heads=2, head_dim=4, page_size=4)
    pages = [5, 1, 3]
    data = torch.randn(10, 2, 4)
    cache.write_pages(pages, data, cache_type="v", layer=1)
    torch.testing.assert_close(cache.gather_pages(pages, 10, cache_type="v", layer=1), data)
    torch.testing.assert_close(cache.get_page(1, "v", layer=1), data[4:8])
    assert cache.gather_pages(pages, 10, cache_type="k", layer=1).abs().sum() == 0
    with pytest.raises(ValueError, match="cache_type"):
        cache.get_page(0, "q")
    with pytest.raises(ValueError, match="exceeds"):
        cache.gather_pages(pages, 13)


def test_kv_cache_allocator_design_document_api() -> None:
    config = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    alloc = KVCacheAllocator(config, max_seq_length=48, dtype=torch.float32)
    assert alloc.num_pages == 3 and alloc.get_page(0).shape == (16, 2, 32)
    pages = [alloc.allocate_page() for _ in range(3)]
    with pytest.raises(RuntimeError, match="Insufficient pages"):
        alloc.allocate_page()
    alloc.add_page_reference(pages[0])
    alloc.free_page(pages[0])
    assert alloc.num_free_pages == 0
    alloc.free_page(pages[0])
    assert alloc.allocate_page() == pages[0]
