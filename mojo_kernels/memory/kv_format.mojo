# How a KV cache holds one head's K or V row of head_dim values, by the cache's dtype:
#   float32, bfloat16  the values (rounded to nearest even)
#   uint8              FP8 e4m3 bits: the values saturated to +-448 and rounded to nearest even, no scale (vLLM's
#                      fp8 cache with its default scale of 1)
#   int8               q = round(x * 127 / max |x|) over the head's row, then the scale max |x| / 127 as the 4 bytes
#                      of a float32: head_dim + 4 bytes a head (llama.cpp's q8_0 cache: a scale per 32 values)
# A cache is [pages, page_size, kv_heads, kv_head_len(head_dim)]. Readers widen a head's values (utils/types.widen)
# and multiply what they sum by kv_scale. The 8-bit caches are CPU only.
from std.memory import bitcast

from ..utils.types import convert_row, largest_abs, load_f32, round_even, is_fp8, F32, F32_WIDTH, FP8_SCALE, Ptr

comptime KV_SCALE_BYTES = 4
comptime FP8_MAX = Float32(448)
comptime I8_MAX = Float32(127)


@always_inline
def is_8bit_kv[cache_type: DType]() -> Bool:
    return cache_type == DType.int8 or is_fp8[cache_type]()


@always_inline
def kv_head_len[cache_type: DType](head_dim: Int) -> Int:
    """Elements a head takes in a cache row."""
    comptime if cache_type == DType.int8:
        return head_dim + KV_SCALE_BYTES
    else:
        return head_dim


@always_inline
def kv_head_dim[cache_type: DType](head_len: Int) -> Int:
    """The head_dim of a cache whose heads take head_len elements."""
    comptime if cache_type == DType.int8:
        return head_len - KV_SCALE_BYTES
    else:
        return head_len


@always_inline
def kv_scale[cache_type: DType](cache: Ptr[cache_type], at: Int, head_dim: Int) -> Float32:
    """What the widened values of the head row at cache[at] are multiplied by."""
    comptime if cache_type == DType.int8:
        return cache.unsafe_offset(at + head_dim).unsafe_bitcast[Float32]().unsafe_load[alignment=1]()
    elif is_fp8[cache_type]():
        return FP8_SCALE
    else:
        return 1


@always_inline
def _store_int8_head[src_type: DType](cache: Ptr[DType.int8], at: Int, src: Ptr[src_type], src_at: Int, n: Int):
    comptime W = F32_WIDTH
    var largest = largest_abs(src, src_at, n)
    var inv = I8_MAX / largest if largest > 0 else Float32(0)
    var i = 0
    while i + W <= n:
        cache.unsafe_store(at + i, round_even(load_f32[src_type, W](src, src_at + i) * inv).cast[DType.int8]())
        i += W
    for t in range(i, n):
        cache.unsafe_store(at + t, round_even[1](load_f32[src_type, 1](src, src_at + t) * inv).cast[DType.int8]())
    cache.unsafe_offset(at + n).unsafe_bitcast[Float32]().unsafe_store[alignment=1](largest / I8_MAX)


@always_inline
def _fp8_bits[width: Int](v: SIMD[F32, width]) -> SIMD[DType.uint8, width]:
    return bitcast[DType.uint8, width](min(max(v, -FP8_MAX), FP8_MAX).cast[DType.float8_e4m3fn]())


def store_kv_heads[src_type: DType, cache_type: DType](cache: Ptr[cache_type], at: Int, src: Ptr[src_type],
                                                       src_at: Int, heads: Int, head_dim: Int):
    """`heads` adjacent head rows of src at src_at into the cache at element `at` (a slot * heads * kv_head_len)."""
    comptime if cache_type == DType.int8:
        for h in range(heads):
            _store_int8_head(rebind[Ptr[DType.int8]](cache), at + h * (head_dim + KV_SCALE_BYTES), src,
                             src_at + h * head_dim, head_dim)
    elif is_fp8[cache_type]():
        comptime W = F32_WIDTH
        var bits = cache.unsafe_bitcast[UInt8]()
        var n = heads * head_dim
        var i = 0
        while i + W <= n:
            bits.unsafe_store(at + i, _fp8_bits(load_f32[src_type, W](src, src_at + i)))
            i += W
        for t in range(i, n):
            bits.unsafe_store(at + t, _fp8_bits[1](load_f32[src_type, 1](src, src_at + t)))
    else:
        convert_row(cache, at, src, src_at, heads * head_dim)
