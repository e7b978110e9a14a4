from .kv_cache_manager import KVCacheAllocator, PagedKVCache
from .radix_cache import RadixAttentionCache

__all__ = ["PagedKVCache", "KVCacheAllocator", "RadixAttentionCache"]
