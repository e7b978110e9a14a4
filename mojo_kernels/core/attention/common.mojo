# Paged causal attention over a ragged batch (GQA when Hq is a multiple of Hkv).
#   q[T, Hq, D]; K/V caches [pages, page_size, Hkv, D]; page_table[B, max_pages]; context_lens[B];
#   query_start[B + 1]. Sequence b owns queries query_start[b]..query_start[b+1]; its context_lens[b] keys
#   (new ones included, already stored) sit in its pages. Query i of a sequence of q_len queries is at
#   position context_len - q_len + i and sees keys 0..that position. Prefill, extension of a cached
#   prefix and decode (q_len 1) are the same computation: an online softmax over the visible keys,
#   accumulated in float32.
# What the kernels share: where a token sits in the cache, the GPU kernels' split of the keys, and the shape checks.
from std.math import ceildiv
from std.sys import is_gpu

from ...memory.kv_format import kv_head_dim
from ...utils.types import F32, Ptr, check_same


@always_inline
def page_of(page_table: Ptr[DType.int32], table_row: Int, j: Int, page_size: Int) -> Int:
    """The cache page that holds token j of the sequence whose page-table row starts at table_row
    (sequence * max_pages)."""
    comptime if is_gpu():
        # in 32 bits: a GPU divides 64-bit integers in a called routine of dozens of instructions
        return Int(page_table.unsafe_load(table_row + Int(UInt32(j) // UInt32(page_size))))
    else:
        return Int(page_table.unsafe_load(table_row + j // page_size))


@always_inline
def row_in_page(page: Int, j: Int, page_size: Int, row_len: Int) -> Int:
    """Element offset in the cache of token j's K (or V) row, all heads, j held by page `page`."""
    comptime if is_gpu():
        return (page * page_size + Int(UInt32(j) % UInt32(page_size))) * row_len
    else:
        return (page * page_size + j % page_size) * row_len


@always_inline
def token_offset(page_table: Ptr[DType.int32], table_row: Int, j: Int, page_size: Int, row_len: Int) -> Int:
    """Element offset in the cache of token j's K (or V) row, all heads; table_row = sequence * max_pages."""
    return row_in_page(page_of(page_table, table_row, j, page_size), j, page_size, row_len)


@always_inline
def split_keys(n: Int, splits: Int, split: Int, fewest: Int, multiple: Int) -> Tuple[Int, Int]:
    """Keys begin ..< end of split `split` of n keys cut into `splits`: `fewest` keys a split at least, rounded up to
    a multiple of `multiple` (the keys a block reads at once). A short context fills only its first splits; the
    others are empty (begin = end = n). Split 0 holds a key whenever n > 0."""
    var per_split = ceildiv(max(ceildiv(n, splits), fewest), multiple) * multiple
    var begin = min(split * per_split, n)
    return begin, min(begin + per_split, n)


def check_attention[cache_type: DType](batch: Int, q_heads: Int, head_dim: Int, kv_heads: Int, cache_head_len: Int,
                                       k_cache_size: Int, v_cache_size: Int, page_table_rows: Int,
                                       query_start_size: Int) raises:
    check_same["paged_attention"](kv_head_dim[cache_type](cache_head_len), head_dim, "cache head_dim", "q head_dim")
    check_same["paged_attention"](v_cache_size, k_cache_size, "v_cache size", "k_cache size")
    check_same["paged_attention"](query_start_size, batch + 1, "query_start size", "sequences + 1")
    check_same["paged_attention"](page_table_rows, batch, "page_table rows", "sequences")
    check_same["paged_attention"](q_heads % kv_heads, 0, "q heads % kv heads", "zero")
