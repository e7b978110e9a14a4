# Paged causal attention over a ragged batch (GQA when Hq is a multiple of Hkv).
#   q[T, Hq, D]; K/V caches [pages, page_size, Hkv, D]; page_table[B, max_pages]; context_lens[B];
#   query_start[B + 1]. Sequence b owns queries query_start[b]..query_start[b+1]; its context_lens[b] keys
#   (new ones included, already stored) sit in its pages. Query i of a sequence of q_len queries is at
#   position context_len - q_len + i and sees keys 0..that position. Prefill, extension of a cached
#   prefix and decode (q_len 1) are the same computation: an online softmax over the visible keys,
#   accumulated in float32.
# CPU: one task per (sequence, KV head): each key row is read once for all query heads of its group.
# GPU: one block per (query token, query head); keys in chunks of GPU_BLOCK, one key per thread for the
#      scores, then one head dimension per thread for the weighted sum of values.
from extensibility import register, InputTensor, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx
from max.gpu.sync import barrier
from max.gpu.primitives import block
from max.algorithm import parallelize
from std.math import exp
from std.memory import stack_allocation

from ..utils.types import F32, F32_WIDTH, Ptr, GPU_BLOCK, check_same

comptime MAX_HEAD_DIM = 2 * GPU_BLOCK
"""The GPU kernel keeps q in shared memory and two head dimensions per thread."""


@always_inline
def _dot[dtype: DType](a: Ptr[F32], a_off: Int, b: Ptr[dtype], b_off: Int, n: Int) -> Float32:
    var acc = SIMD[F32, F32_WIDTH](0)
    var i = 0
    while i + F32_WIDTH <= n:
        acc += a.unsafe_load[width=F32_WIDTH](a_off + i) * b.unsafe_load[width=F32_WIDTH](b_off + i).cast[F32]()
        i += F32_WIDTH
    var s = acc.reduce_add()
    while i < n:
        s += a.unsafe_load(a_off + i) * b.unsafe_load(b_off + i).cast[F32]()
        i += 1
    return s


@always_inline
def _scale_add[dtype: DType](acc: Ptr[F32], acc_off: Int, keep: Float32, p: Float32, v: Ptr[dtype], v_off: Int, n: Int):
    """acc = acc * keep + p * v over n elements."""
    var i = 0
    while i + F32_WIDTH <= n:
        var a = acc.unsafe_load[width=F32_WIDTH](acc_off + i)
        acc.unsafe_store(acc_off + i, a * keep + v.unsafe_load[width=F32_WIDTH](v_off + i).cast[F32]() * p)
        i += F32_WIDTH
    while i < n:
        acc.unsafe_store(acc_off + i, acc.unsafe_load(acc_off + i) * keep + v.unsafe_load(v_off + i).cast[F32]() * p)
        i += 1


def _attention_cpu[dtype: DType](
    output: Ptr[dtype], q: Ptr[dtype], k_cache: Ptr[dtype], v_cache: Ptr[dtype], page_table: Ptr[DType.int32],
    context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Float32,
    batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
):
    var group = q_heads // kv_heads

    def do_item(item: Int) {var output, var q, var k_cache, var v_cache, var page_table, var context_lens, var query_start,
                            var scale, var max_pages, var q_heads, var kv_heads, var head_dim, var page_size, var group}:
        var b = item // kv_heads
        var g = item % kv_heads
        var q_begin = Int(query_start.unsafe_load(b))
        var q_len = Int(query_start.unsafe_load(b + 1)) - q_begin
        var context = Int(context_lens.unsafe_load(b))
        # per query head of the group: scaled q, running max m, running sum l, accumulator acc[head_dim]
        var buffers = List[Float32](length=group * (2 * head_dim + 2), fill=0)
        var qs = buffers.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var acc_off = group * head_dim
        var m_off = 2 * group * head_dim
        var l_off = m_off + group
        for i in range(q_len):
            var t = q_begin + i
            var last = context - q_len + i
            for h in range(group):
                var src = (t * q_heads + g * group + h) * head_dim
                for x in range(head_dim):
                    qs.unsafe_store(h * head_dim + x, q.unsafe_load(src + x).cast[F32]() * scale)
            for j in range(last + 1):
                var page = Int(page_table.unsafe_load(b * max_pages + j // page_size))
                var row = ((page * page_size + j % page_size) * kv_heads + g) * head_dim
                for h in range(group):
                    var s = _dot[dtype](qs, h * head_dim, k_cache, row, head_dim)
                    var m = qs.unsafe_load(m_off + h)
                    if j == 0:
                        qs.unsafe_store(m_off + h, s)
                        qs.unsafe_store(l_off + h, 1)
                        _scale_add[dtype](qs, acc_off + h * head_dim, 0, 1, v_cache, row, head_dim)
                    elif s > m:
                        var keep = exp(m - s)
                        qs.unsafe_store(m_off + h, s)
                        qs.unsafe_store(l_off + h, qs.unsafe_load(l_off + h) * keep + 1)
                        _scale_add[dtype](qs, acc_off + h * head_dim, keep, 1, v_cache, row, head_dim)
                    else:
                        var p = exp(s - m)
                        qs.unsafe_store(l_off + h, qs.unsafe_load(l_off + h) + p)
                        _scale_add[dtype](qs, acc_off + h * head_dim, 1, p, v_cache, row, head_dim)
            for h in range(group):
                var inv = 1 / qs.unsafe_load(l_off + h)
                var dst = (t * q_heads + g * group + h) * head_dim
                for x in range(head_dim):
                    output.unsafe_store(dst + x, (qs.unsafe_load(acc_off + h * head_dim + x) * inv).cast[dtype]())
        _ = buffers^  # keep the buffers alive until here: only their pointer is used above

    parallelize(do_item, batch * kv_heads)


def _attention_gpu[dtype: DType](
    output: Ptr[dtype], q: Ptr[dtype], k_cache: Ptr[dtype], v_cache: Ptr[dtype], page_table: Ptr[DType.int32],
    context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale_ptr: Ptr[F32],
    batch: Int32, max_pages: Int32, q_heads: Int32, kv_heads: Int32, head_dim: Int32, page_size: Int32,
):
    var t = Int(block_idx.x)
    var h = Int(block_idx.y)
    var tid = Int(thread_idx.x)
    var hq, hk, d, ps = Int(q_heads), Int(kv_heads), Int(head_dim), Int(page_size)
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
    var last = Int(context_lens.unsafe_load(b)) - q_len + (t - q_begin)
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
    for start in range(0, last + 1, GPU_BLOCK):
        var j = start + tid
        var s = Float32.MIN
        if j <= last:
            var page = Int(page_table.unsafe_load(b * Int(max_pages) + j // ps))
            var row = ((page * ps + j % ps) * hk + g) * d
            s = 0
            for x in range(d):
                s += q_sh.unsafe_load(x) * k_cache.unsafe_load(row + x).cast[F32]()
        var m_new = max(m, block.max[block_size=GPU_BLOCK, broadcast=True](s))
        var p = exp(s - m_new) if j <= last else Float32(0)
        p_sh.unsafe_store(tid, p)
        var keep = exp(m - m_new)
        l = l * keep + block.sum[block_size=GPU_BLOCK, broadcast=True](p)
        m = m_new
        barrier()
        acc0 *= keep
        acc1 *= keep
        for jj in range(min(GPU_BLOCK, last + 1 - start)):
            var key = start + jj
            var page = Int(page_table.unsafe_load(b * Int(max_pages) + key // ps))
            var row = ((page * ps + key % ps) * hk + g) * d
            var pj = p_sh.unsafe_load(jj)
            if tid < d:
                acc0 += pj * v_cache.unsafe_load(row + tid).cast[F32]()
            if tid + GPU_BLOCK < d:
                acc1 += pj * v_cache.unsafe_load(row + tid + GPU_BLOCK).cast[F32]()
        barrier()
    var dst = (t * hq + h) * d
    if tid < d:
        output.unsafe_store(dst + tid, (acc0 / l).cast[dtype]())
    if tid + GPU_BLOCK < d:
        output.unsafe_store(dst + tid + GPU_BLOCK, (acc1 / l).cast[dtype]())


@register("mili_paged_attention")
struct PagedAttention:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        output: OutputTensor[dtype=dtype, rank=3, ...],
        k_cache: MutableInputTensor[dtype=dtype, rank=4, ...],  # read only; mutable so graphs pass the caches by reference
        v_cache: MutableInputTensor[dtype=dtype, rank=4, ...],
        q: InputTensor[dtype=dtype, rank=3, ...],
        page_table: InputTensor[dtype=DType.int32, rank=2, ...],
        context_lens: InputTensor[dtype=DType.int32, rank=1, ...],
        query_start: InputTensor[dtype=DType.int32, rank=1, ...],
        scale: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var tokens = q.dim_size[0]()
        var q_heads = q.dim_size[1]()
        var head_dim = q.dim_size[2]()
        var kv_heads = k_cache.dim_size[2]()
        var batch = context_lens.dim_size[0]()
        check_same["paged_attention"](k_cache.dim_size[3](), head_dim, "cache head_dim", "q head_dim")
        check_same["paged_attention"](v_cache.size(), k_cache.size(), "v_cache size", "k_cache size")
        check_same["paged_attention"](query_start.dim_size[0](), batch + 1, "query_start size", "sequences + 1")
        check_same["paged_attention"](page_table.dim_size[0](), batch, "page_table rows", "sequences")
        check_same["paged_attention"](q_heads % kv_heads, 0, "q heads % kv heads", "zero")
        if tokens == 0:
            return
        comptime if target == "cpu":
            _attention_cpu[dtype](output.unsafe_ptr(), q.unsafe_ptr(), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(),
                                  page_table.unsafe_ptr(), context_lens.unsafe_ptr(), query_start.unsafe_ptr(),
                                  scale.unsafe_ptr().unsafe_load(0), batch, page_table.dim_size[1](), q_heads,
                                  kv_heads, head_dim, k_cache.dim_size[1]())
        else:
            if head_dim > MAX_HEAD_DIM:
                raise Error("paged_attention: head_dim ", head_dim, " exceeds the GPU kernel's ", MAX_HEAD_DIM)
            ctx.enqueue_function[_attention_gpu[dtype]](
                output.unsafe_ptr(), q.unsafe_ptr(), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), page_table.unsafe_ptr(),
                context_lens.unsafe_ptr(), query_start.unsafe_ptr(), scale.unsafe_ptr(), Int32(batch),
                Int32(page_table.dim_size[1]()), Int32(q_heads), Int32(kv_heads), Int32(head_dim),
                Int32(k_cache.dim_size[1]()), grid_dim=(tokens, q_heads), block_dim=GPU_BLOCK,
            )
