from .kv_cache_manager import PagedKVCache
from .radix_cache import RadixAttentionCache

__all__ = ["PagedKVCache", "RadixAttentionCache"]
