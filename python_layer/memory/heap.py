"""Giving the C heap's free memory back to the OS after a model loads."""

from __future__ import annotations

import ctypes
import ctypes.util


def return_free_heap() -> None:
    """glibc's malloc_trim(0): loading reads, converts and frees every checkpoint tensor, and glibc keeps much of what
    was freed in its heap (its mmap threshold rises after large frees), ~0.4 GB for Qwen3-0.6B. A no-op where the C
    library has no malloc_trim (not glibc)."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)
