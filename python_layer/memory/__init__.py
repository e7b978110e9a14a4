from .kv_cache_manager import KVCacheAllocator, PagedKVCache

__all__ = ["PagedKVCache", "KVCacheAllocator"]
