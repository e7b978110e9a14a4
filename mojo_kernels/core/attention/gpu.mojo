# Paged attention on a GPU (the layout and the computation: common.mojo).
# One block per (query token, query head, split of its keys); keys in chunks of GPU_BLOCK, one key per
# thread for the scores, then one head dimension per thread for the weighted sum of values. Few blocks
# over long contexts (decode of a small batch) split the keys (gpu_splits); a second kernel merges the
# splits' partial softmax states.
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx
from max.gpu.sync import barrier
from max.gpu.primitives import block
from max.gpu.primitives.grid_controls import wait_on_dependent_grids
from std.math import exp
from std.memory import stack_allocation

from ...utils.types import F32, Ptr, GPU_BLOCK
from .common import split_keys, token_offset

comptime MAX_HEAD_DIM = 2 * GPU_BLOCK
"""The GPU kernel keeps q in shared memory and two head dimensions per thread."""
comptime GPU_BUSY_BLOCKS = 1024
"""Blocks (token x head) that keep the GPU busy without splitting the keys (an H100 has 132 SMs)."""
comptime GPU_SPLIT_KEYS = 512
"""The fewest keys per split."""
comptime GPU_MAX_SPLITS = 32
comptime MERGE_LOADS = 8
"""Splits' accumulators a merge thread loads before adding any: one at a time, the 64 splits of a batch-1 decode at
4,096 keys would be 64 trips to memory one after another."""


def _attention_gpu[dtype: DType, cache_type: DType](
    output: Ptr[dtype], partial: Ptr[F32], q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale_ptr: Ptr[F32],
    batch: Int32, max_pages: Int32, q_heads: Int32, kv_heads: Int32, head_dim: Int32, page_size: Int32, splits: Int32,
):
    """Block (t, h, split): query token t, query head h, split `split` of the keys t sees. With one split it
    writes the output; with more, its unnormalized accumulator, running max and sum go to
    partial[((t * Hq + h) * splits + split) * (D + 2):] for merge_splits_gpu."""
    var t = Int(block_idx.x)
    var h = Int(block_idx.y)
    var split = Int(block_idx.z)
    var tid = Int(thread_idx.x)
    var hq, hk, d, ps, n_splits = Int(q_heads), Int(kv_heads), Int(head_dim), Int(page_size), Int(splits)
    var lo = 0
    var hi = Int(batch) - 1
    while lo < hi:  # the sequence of token t: the last b with query_start[b] <= t
        var mid = (lo + hi + 1) // 2
        if Int(query_start.unsafe_load(mid)) <= t:
            lo = mid
        else:
            hi = mid - 1
    var b = lo
    var q_begin = Int(query_start.unsafe_load(b))
    var q_len = Int(query_start.unsafe_load(b + 1)) - q_begin
    var n_visible = Int(context_lens.unsafe_load(b)) - q_len + (t - q_begin) + 1
    var k_begin, k_end = split_keys(n_visible, n_splits, split, GPU_SPLIT_KEYS, GPU_BLOCK)  # a query sees itself
    var g = h // (hq // hk)
    var scale = scale_ptr.unsafe_load(0)
    var q_sh = stack_allocation[MAX_HEAD_DIM, F32, address_space=AddressSpace.SHARED]()
    var p_sh = stack_allocation[GPU_BLOCK, F32, address_space=AddressSpace.SHARED]()
    for x in range(tid, d, GPU_BLOCK):
        q_sh.unsafe_store(x, q.unsafe_load((t * hq + h) * d + x).cast[F32]() * scale)
    barrier()
    var m = Float32.MIN
    var l = Float32(0)
    var acc0 = Float32(0)
    var acc1 = Float32(0)
    for start in range(k_begin, k_end, GPU_BLOCK):
        var j = start + tid
        var s = Float32.MIN
        if j < k_end:
            var row = token_offset(page_table, b * Int(max_pages), j, ps, hk * d) + g * d
            s = 0
            for x in range(d):
                s += q_sh.unsafe_load(x) * k_cache.unsafe_load(row + x).cast[F32]()
        var m_new = max(m, block.max[block_size=GPU_BLOCK, broadcast=True](s))
        var p = exp(s - m_new) if j < k_end else Float32(0)
        p_sh.unsafe_store(tid, p)
        var keep = exp(m - m_new)
        l = l * keep + block.sum[block_size=GPU_BLOCK, broadcast=True](p)
        m = m_new
        barrier()
        acc0 *= keep
        acc1 *= keep
        for jj in range(min(GPU_BLOCK, k_end - start)):
            var key = start + jj
            var row = token_offset(page_table, b * Int(max_pages), key, ps, hk * d) + g * d
            var pj = p_sh.unsafe_load(jj)
            if tid < d:
                acc0 += pj * v_cache.unsafe_load(row + tid).cast[F32]()
            if tid + GPU_BLOCK < d:
                acc1 += pj * v_cache.unsafe_load(row + tid + GPU_BLOCK).cast[F32]()
        barrier()
    if n_splits == 1:
        var dst = (t * hq + h) * d
        if tid < d:
            output.unsafe_store(dst + tid, (acc0 / l).cast[dtype]())
        if tid + GPU_BLOCK < d:
            output.unsafe_store(dst + tid + GPU_BLOCK, (acc1 / l).cast[dtype]())
    else:
        var at = ((t * hq + h) * n_splits + split) * (d + 2)
        if tid < d:
            partial.unsafe_store(at + tid, acc0)
        if tid + GPU_BLOCK < d:
            partial.unsafe_store(at + tid + GPU_BLOCK, acc1)
        if tid == 0:
            partial.unsafe_store(at + d, m)
            partial.unsafe_store(at + d + 1, l)


def merge_splits_gpu[dtype: DType](output: Ptr[dtype], partial: Ptr[F32], q_heads: Int32, head_dim: Int32, splits: Int32):
    """Block (t, h) of GPU_BLOCK threads: the output of query token t, head h from its splits' partial softmax
    states (splits <= GPU_BLOCK). Thread s reads split s's max and sum; a split that saw no key (sum 0: past a short
    context in a wide page table) is skipped, its accumulator unread. Waits for the kernel before it
    (utils/dependent_launch.mojo)."""
    wait_on_dependent_grids()
    var row = Int(block_idx.x) * Int(q_heads) + Int(block_idx.y)
    var d, n_splits, tid = Int(head_dim), Int(splits), Int(thread_idx.x)
    var first = row * n_splits * (d + 2)
    var m_s = Float32.MIN_FINITE
    var l_s = Float32(0)
    if tid < n_splits:
        l_s = partial.unsafe_load(first + tid * (d + 2) + d + 1)
        if l_s > 0:
            m_s = partial.unsafe_load(first + tid * (d + 2) + d)
    var m = block.max[block_size=GPU_BLOCK, broadcast=True](m_s)
    var weight = exp(m_s - m) if l_s > 0 else Float32(0)
    var total = block.sum[block_size=GPU_BLOCK, broadcast=True](l_s * weight)
    var weights = stack_allocation[GPU_BLOCK, F32, address_space=AddressSpace.SHARED]()
    weights.unsafe_store(tid, weight)
    barrier()
    for x in range(tid, d, GPU_BLOCK):
        var acc = Float32(0)
        for s0 in range(0, n_splits, MERGE_LOADS):
            var parts = SIMD[F32, MERGE_LOADS](0)
            comptime for u in range(MERGE_LOADS):
                var s = min(s0 + u, n_splits - 1)  # past the last split: its state again, weighted 0
                var w = weights.unsafe_load(s) if s0 + u < n_splits else Float32(0)
                var v = partial.unsafe_load(first + s * (d + 2) + x)
                parts[u] = v * w if w > 0 else Float32(0)  # an empty split's accumulator is never written
            acc += parts.reduce_add()
        output.unsafe_store(row * d + x, (acc / total).cast[dtype]())


def gpu_splits(tokens: Int, q_heads: Int, max_keys: Int) -> Int:
    """Splits of the keys per (token, head) on GPU: long contexts with few (token, head) blocks (decode of a
    small batch) would leave most of the GPU idle. max_keys bounds every context (pages per sequence x page
    size): the contexts themselves are on the GPU."""
    comptime assert GPU_MAX_SPLITS <= GPU_BLOCK, "merge_splits_gpu reads a split's state a thread"
    if tokens * q_heads >= GPU_BUSY_BLOCKS:
        return 1
    return max(1, min(GPU_MAX_SPLITS, max_keys // GPU_SPLIT_KEYS, GPU_BUSY_BLOCKS // (tokens * q_heads)))


def attention_gpu[dtype: DType, cache_type: DType](
    ctx: DeviceContext, output: Ptr[dtype], q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Ptr[F32],
    tokens: Int, batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
) raises:
    """Enqueues the attention kernel on ctx's stream, then the merge when the keys are split."""
    if head_dim > MAX_HEAD_DIM:
        raise Error("paged_attention: head_dim ", head_dim, " exceeds the GPU kernel's ", MAX_HEAD_DIM)
    var splits = gpu_splits(tokens, q_heads, max_pages * page_size)
    var partial = ctx.enqueue_create_buffer[DType.float32](tokens * q_heads * splits * (head_dim + 2) if splits > 1 else 1)
    ctx.enqueue_function[_attention_gpu[dtype, cache_type]](
        output, partial.unsafe_ptr(), q, k_cache, v_cache, page_table, context_lens, query_start, scale, Int32(batch),
        Int32(max_pages), Int32(q_heads), Int32(kv_heads), Int32(head_dim), Int32(page_size), Int32(splits),
        grid_dim=(tokens, q_heads, splits), block_dim=GPU_BLOCK,
    )
    if splits > 1:
        ctx.enqueue_function[merge_splits_gpu[dtype]](
            output, partial.unsafe_ptr(), Int32(q_heads), Int32(head_dim), Int32(splits),
            grid_dim=(tokens, q_heads), block_dim=GPU_BLOCK,
        )
    _ = partial^  # freed in stream order, after the kernels that use it
