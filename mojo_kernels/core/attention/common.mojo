# Paged causal attention over a ragged batch (GQA when Hq is a multiple of Hkv).
#   q[T, Hq, D]; K/V caches [pages, page_size, Hkv, D]; page_table[B, max_pages]; context_lens[B];
#   query_start[B + 1]. Sequence b owns queries query_start[b]..query_start[b+1]; its context_lens[b] keys
#   (new ones included, already stored) sit in its pages. Query i of a sequence of q_len queries is at
#   position context_len - q_len + i and sees keys 0..that position. Prefill, extension of a cached
#   prefix and decode (q_len 1) are the same computation: an online softmax over the visible keys,
#   accumulated in float32.
# What the CPU and GPU kernels share: where a token sits in the cache, the merge of the splits' partial softmax
# states, and the shape checks.
from std.math import exp
from std.sys import is_gpu

from ...utils.types import F32, Ptr, check_same


@always_inline
def token_offset(page_table: Ptr[DType.int32], table_row: Int, j: Int, page_size: Int, row_len: Int) -> Int:
    """Element offset in the cache of token j's K (or V) row, all heads; table_row = sequence * max_pages."""
    comptime if is_gpu():
        # in 32 bits: a GPU divides 64-bit integers in a called routine of dozens of instructions
        var at = UInt32(j)
        var size = UInt32(page_size)
        var page = Int(page_table.unsafe_load(table_row + Int(at // size)))
        return (page * page_size + Int(at % size)) * row_len
    else:
        var page = Int(page_table.unsafe_load(table_row + j // page_size))
        return (page * page_size + j % page_size) * row_len


@always_inline
def merge_splits[dtype: DType](
    output: Ptr[dtype], dst: Int, partial: Ptr[F32], first: Int, stride: Int, acc_at: Int, m_at: Int, l_at: Int,
    splits: Int, x_begin: Int, x_end: Int, x_step: Int,
):
    """Writes output[dst + x] for x in x_begin ..< x_end by x_step from the partial softmax states of one row's splits
    of the keys (CPU and GPU): split s keeps its unnormalized accumulator at partial[first + s * stride + acc_at:],
    its running max at partial[first + s * stride + m_at] and its sum at partial[first + s * stride + l_at]. Split
    0's accumulator is overwritten (x_begin ..< x_end by x_step only: each GPU thread merges its own elements)."""
    var m = Float32.MIN
    for s in range(splits):
        m = max(m, partial.unsafe_load(first + s * stride + m_at))
    # one exp per split, not per element: the splits' accumulators are summed into split 0's (scratch)
    var total = Float32(0)
    for s in range(splits):
        var at = first + s * stride
        var weight = exp(partial.unsafe_load(at + m_at) - m)
        total += partial.unsafe_load(at + l_at) * weight
        for x in range(x_begin, x_end, x_step):
            var scaled = partial.unsafe_load(at + acc_at + x) * weight
            if s > 0:
                scaled += partial.unsafe_load(first + acc_at + x)
            partial.unsafe_store(first + acc_at + x, scaled)
    for x in range(x_begin, x_end, x_step):
        output.unsafe_store(dst + x, (partial.unsafe_load(first + acc_at + x) / total).cast[dtype]())


def check_attention(batch: Int, q_heads: Int, head_dim: Int, kv_heads: Int, cache_head_dim: Int, k_cache_size: Int,
                    v_cache_size: Int, page_table_rows: Int, query_start_size: Int) raises:
    check_same["paged_attention"](cache_head_dim, head_dim, "cache head_dim", "q head_dim")
    check_same["paged_attention"](v_cache_size, k_cache_size, "v_cache size", "k_cache size")
    check_same["paged_attention"](query_start_size, batch + 1, "query_start size", "sequences + 1")
    check_same["paged_attention"](page_table_rows, batch, "page_table rows", "sequences")
    check_same["paged_attention"](q_heads % kv_heads, 0, "q heads % kv heads", "zero")
