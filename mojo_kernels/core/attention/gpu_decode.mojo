# Decode attention on a GPU, split-KV ("flash-decoding"): every sequence has one new query token. A block per
# (sequence, KV head, split of its keys) computes all the query heads that share the KV head from one load of each
# K and V row. A row is read by a group of `lanes` threads, 16 bytes each (head_dim 128 in bfloat16: 16 lanes, two
# keys per warp); the group sums its partial dot products with warp shuffles, and every group keeps its own online
# softmax over the keys it read. The groups' states are merged through shared memory; with several splits, the
# splits' states go to `partial` for gpu.mojo's merge kernel (same layout as the general kernel's).
# Used by the ops `mili_paged_attention_flash` (paged_attention.mojo) and `mili_qkv_attention` (qkv_attention.mojo),
# which hands it the fused projection's output qkv instead of q: each block then norms and rotates its query heads
# itself, and the block whose split holds the token's own key norms, rotates and stores the token's K and V first
# (qk_norm_rope_store's work, without a kernel of its own).
from max.gpu.host import DeviceAttribute, DeviceContext
from max.gpu import thread_idx, block_idx, WARP_SIZE
from max.gpu.primitives import warp
from max.gpu.primitives.grid_controls import launch_dependent_grids, wait_on_dependent_grids
from max.gpu.sync import barrier
from std.bit import next_power_of_two
from std.math import exp, rsqrt
from std.memory import stack_allocation
from std.sys import size_of

from ...utils.dependent_launch import dependent_launch
from ...utils.types import addr, ptr, Addr, F32, Ptr, GPU_BLOCK, load_f32
from ..rope import rope_cos_sin_gpu
from .common import page_of, row_in_page, split_keys
from .gpu import merge_splits_gpu

comptime DECODE_THREADS = 128
comptime DECODE_WARPS = DECODE_THREADS // WARP_SIZE
comptime DECODE_MAX_HEAD_DIM = 256
comptime DECODE_SPLIT_KEYS = 32
"""The fewest keys per split: one iteration of the kernel's loop in bfloat16 (8 slots x DECODE_ROWS), so that a short
context is read in one trip to memory by more blocks rather than in two by fewer."""
comptime DECODE_MAX_SPLITS = 64
comptime DECODE_ROWS = 4
"""K/V rows a thread loads before it computes on any of them, so that their trips to memory overlap. With one row
ahead, a split of 64 keys at batch 1 took 8 trips one after another (page table, then K and V): 45 us at 4,096 keys
on an H100, where its bytes take 6 us."""


def decode_vector[cache_type: DType]() -> Int:
    """Cache elements per 16-byte load."""
    return 16 // size_of[cache_type]()


def decode_group_supported(group: Int) -> Bool:
    """Query heads a KV head that the decode kernel is built for (their states are kept in registers, a kernel for
    each count): Qwen3's 2 (0.6B, 1.7B), 4 (4B, 8B), 5 (14B) and 8 (32B), and 1."""
    return group in (1, 2, 4, 5, 8)


def decode_supported[cache_type: DType](
    tokens: Int, batch: Int, head_dim: Int, group: Int, from_qkv: Bool = False
) -> Bool:
    """Whether the split-KV decode kernel takes this batch: a decode batch (as many tokens as sequences: each has
    exactly one query token), a row in 1-32 lanes of 16 bytes (a power of two), and a decode_group_supported number
    of query heads a KV head. From qkv, a row spans 2 lanes at least: RoPE pairs element i with i + D/2, held by
    the lane lanes/2 away."""
    if tokens != batch:
        return False
    comptime VEC = decode_vector[cache_type]()
    var lanes = head_dim // VEC
    var pow2 = lanes > 0 and (lanes & (lanes - 1)) == 0
    var fits = head_dim % VEC == 0 and pow2 and lanes <= WARP_SIZE and decode_group_supported(group)
    return fits and (lanes >= 2 or not from_qkv)


def decode_blocks_per_sm(group: Int) -> Int:
    """Blocks of DECODE_THREADS an SM runs at once, as the kernel's registers allow with `group` query heads a KV head
    (their states are kept in registers, as many as the next power of two; ptxas, sm_90a, bfloat16: 114, 125, 168,
    229 and 255 registers a thread for 1, 2, 4, 5 and 8 heads, so 4, 4, 3, 2 and 2 blocks of an SM's 65,536
    registers). tests/kernels/test_gpu_resources.py holds each kernel to its count, and checks that one block more
    would not fit."""
    if group <= 2:
        return 4
    return 3 if group <= 4 else 2


def decode_splits(batch: Int, kv_heads: Int, max_keys: Int, busy_blocks: Int) -> Int:
    """Splits of each sequence's keys: enough blocks to fill the GPU at small batches without going past one wave
    of them (busy_blocks: the blocks the GPU runs at once, its SMs x decode_blocks_per_sm; an H100's 132 x 4 = 528
    for Qwen3-0.6B's shape), none at large ones (batch 64 of 8 KV heads: 512 blocks, unsplit); more would only add
    a second, partial wave and a merge. max_keys bounds every context (the contexts themselves are on the GPU: the
    kernel gives a split DECODE_SPLIT_KEYS keys at least, so a short context fills only its first splits and the
    others exit at once)."""
    comptime assert DECODE_MAX_SPLITS <= GPU_BLOCK, "merge_splits_gpu reads a split's state a thread"
    return max(1, min(DECODE_MAX_SPLITS, max_keys // DECODE_SPLIT_KEYS, busy_blocks // (batch * kv_heads)))


struct QkvRope[dtype: DType](ImplicitlyCopyable):
    """What the decode kernel needs to take the fused projection's output qkv[T, (Hq + 2 Hk) * D] in place of q (as
    qk_norm_rope_store's inputs): the q and k norms' weights and epsilon, the tokens' positions, RoPE's inverse
    frequencies and cos/sin scale, and the tokens' cache slots (a negative one: K and V not stored)."""

    var q_norm: Addr[Self.dtype]
    var k_norm: Addr[Self.dtype]
    var eps: Addr[F32]
    var positions: Addr[DType.int32]
    var inv_freq: Addr[F32]
    var rope_scale: Addr[F32]
    var slots: Addr[DType.int32]

    def __init__(out self, q_norm: Ptr[Self.dtype], k_norm: Ptr[Self.dtype], eps: Ptr[F32], positions: Ptr[DType.int32],
                 inv_freq: Ptr[F32], rope_scale: Ptr[F32], slots: Ptr[DType.int32]):
        self.q_norm, self.k_norm, self.eps, self.positions = addr(q_norm), addr(k_norm), addr(eps), addr(positions)
        self.inv_freq, self.rope_scale, self.slots = addr(inv_freq), addr(rope_scale), addr(slots)

    @staticmethod
    def unread(q: Ptr[Self.dtype], floats: Ptr[F32], ints: Ptr[DType.int32]) -> Self:
        """For a kernel that reads q: stand-ins it never reads (a Pointer cannot be null)."""
        return Self(q, q, floats, ints, floats, floats, ints)


@always_inline
def _shuffle_xor[width: Int](v: SIMD[F32, width], offset: Int) -> SIMD[F32, width]:
    """warp.shuffle_xor lane by lane (it takes one float32 at a time)."""
    var out = SIMD[F32, width](0)
    comptime for i in range(width):
        out[i] = warp.shuffle_xor(v[i], UInt32(offset))
    return out


@always_inline
def _per_head[group: Int, VEC: Int](x: SIMD[F32, group]) -> SIMD[F32, group * VEC]:
    """Head h's value in lanes h * VEC ..< (h + 1) * VEC: scales the heads' accumulators, kept side by side."""
    var wide = SIMD[F32, group * VEC](0)
    comptime for h in range(group):
        wide = wide.insert[offset = h * VEC](SIMD[F32, VEC](x[h]))
    return wide


@always_inline
def _norm_rope_part[dtype: DType, VEC: Int](
    qkv: Ptr[dtype], row: Int, weight: Ptr[dtype], part: Int, lanes: Int, d: Int, eps: Float32, inv_freq: Ptr[F32],
    position: Float32, rope_scale: Float32,
) -> SIMD[dtype, VEC]:
    """Elements part ..< part + VEC of the head at qkv[row ..< row + d], normed and rotated as qk_norm_rope_store
    does (rounded to dtype after each step), by the `lanes` threads that hold the row (every thread of the warp
    calls it). Element i of the first half pairs with i + d/2, in the thread lanes/2 away."""
    var x = load_f32[dtype, VEC](qkv, row + part)
    var squares = (x * x).reduce_add()
    var offset = 1
    while offset < lanes:
        squares += warp.shuffle_xor(squares, UInt32(offset))
        offset *= 2
    var inv = rsqrt(squares / Float32(d) + eps)
    var normed = (x * inv * load_f32[dtype, VEC](weight, part)).cast[dtype]().cast[F32]()
    var other = _shuffle_xor(normed, lanes // 2)
    var half = d // 2
    var out = SIMD[F32, VEC](0)
    comptime for i in range(VEC):
        var c, s = rope_cos_sin_gpu(inv_freq, part % half + i, position, rope_scale)
        if part < half:  # x1 * c - x2 * s, x1 this thread's
            out[i] = normed[i] * c - other[i] * s
        else:  # x2 * c + x1 * s, x2 this thread's
            out[i] = normed[i] * c + other[i] * s
    return out.cast[dtype]()


@always_inline
def _row_pages[ROWS: Int](page_table: Ptr[DType.int32], table_row: Int, first: Int, slots: Int, last: Int,
                          page_size: Int) -> SIMD[DType.int32, ROWS]:
    """The page-table entries of a thread's rows in an iteration: row u is key min(first + u * slots, last)."""
    var pages = SIMD[DType.int32, ROWS](0)
    comptime for u in range(ROWS):
        pages[u] = Int32(page_of(page_table, table_row, min(first + u * slots, last), page_size))
    return pages


@always_inline
def _load_rows[cache_type: DType, VEC: Int, ROWS: Int](
    k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], pages: SIMD[DType.int32, ROWS], first: Int, slots: Int,
    last: Int, page_size: Int, row_len: Int, col: Int,
) -> Tuple[SIMD[cache_type, ROWS * VEC], SIMD[cache_type, ROWS * VEC]]:
    """A thread's VEC elements (from col) of the K and V rows of its keys in an iteration (_row_pages')."""
    var k_rows = SIMD[cache_type, ROWS * VEC](0)
    var v_rows = SIMD[cache_type, ROWS * VEC](0)
    comptime for u in range(ROWS):
        var at = row_in_page(Int(pages[u]), min(first + u * slots, last), page_size, row_len) + col
        k_rows = k_rows.insert[offset = u * VEC](k_cache.unsafe_load[width=VEC, alignment=16](at))
        v_rows = v_rows.insert[offset = u * VEC](v_cache.unsafe_load[width=VEC, alignment=16](at))
    return k_rows, v_rows


@always_inline
def _combine[group: Int, VEC: Int](
    mut m: SIMD[F32, group], mut l: SIMD[F32, group], mut acc: SIMD[F32, group * VEC],
    m_o: SIMD[F32, group], l_o: SIMD[F32, group], acc_o: SIMD[F32, group * VEC],
):
    """Merge another softmax state (max, sum, accumulators of every head) into this one."""
    var m_new = max(m, m_o)
    var keep = exp(m - m_new)
    var take = exp(m_o - m_new)
    l = l * keep + l_o * take
    acc = acc * _per_head[group, VEC](keep) + acc_o * _per_head[group, VEC](take)
    m = m_new


def _decode_attention_gpu[dtype: DType, cache_type: DType, group: Int, from_qkv: Bool](
    output: Ptr[dtype], partial: Ptr[F32], q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale_ptr: Ptr[F32],
    q_norm: Ptr[dtype], k_norm: Ptr[dtype], eps_ptr: Ptr[F32], positions: Ptr[DType.int32], inv_freq: Ptr[F32],
    rope_scale_ptr: Ptr[F32], cache_slots: Ptr[DType.int32], max_pages: Int32, kv_heads: Int32, head_dim: Int32,
    page_size: Int32, splits: Int32,
):
    """Block (b, g, split): sequence b's one query token, the `group` query heads of KV head g, split `split` of
    its keys. from_qkv: q is qkv, and q_norm ..< cache_slots are QkvRope's (else unused)."""
    comptime VEC = decode_vector[cache_type]()
    comptime HEADS = next_power_of_two(group)  # a SIMD's width: heads past `group` stay 0 and are never stored
    var b = Int(block_idx.x)
    var g = Int(block_idx.y)
    var split = Int(block_idx.z)
    var tid = Int(thread_idx.x)
    var hk, d, ps, n_splits = Int(kv_heads), Int(head_dim), Int(page_size), Int(splits)
    var hq = hk * group
    var lanes = d // VEC  # threads per K/V row
    var slots = DECODE_THREADS // lanes  # rows read at once by the block
    var slot = tid // lanes
    var part = (tid % lanes) * VEC  # this thread's elements of a row: part ..< part + VEC
    var t = Int(query_start.unsafe_load(b))
    var n = Int(context_lens.unsafe_load(b))
    var k_begin, k_end = split_keys(n, n_splits, split, DECODE_SPLIT_KEYS, slots)

    # Each iteration's page-table entries are read ahead: the first ones' trip to memory overlaps the launch's wait
    # and the query's loads (and norm and RoPE), each next one's this iteration's arithmetic. (K and V read ahead as
    # well took 151 registers a thread: 3 blocks an SM, not 4.) Every thread runs the same iterations (the shuffles
    # need the whole warp). An iteration takes DECODE_ROWS rows a slot: row u of slot `slot` is key
    # base + u * slots + slot; a slot past the end reads the split's last key again and drops it.
    comptime ROWS = DECODE_ROWS
    var step = slots * ROWS
    var last = k_end - 1
    var table_row = b * Int(max_pages)
    var row_len = hk * d
    var col = g * d + part
    var pages = SIMD[DType.int32, ROWS](0)
    if k_begin < k_end:  # else a padded row (no context): nothing to read
        pages = _row_pages[ROWS](page_table, table_row, k_begin + slot, slots, last, ps)
    wait_on_dependent_grids()  # the step's inputs and the cache were written before the kernel before this one began
    if k_begin == k_end and split > 0:  # an empty split (there is a merge): a sum of 0 tells it to skip this one
        if tid < group:
            partial.unsafe_store(((t * hq + g * group + tid) * n_splits + split) * (d + 2) + d + 1, 0)
        return

    var scale = scale_ptr.unsafe_load(0)
    # this thread's elements of every query head of the group (head h in lanes h * VEC ..), and their accumulators
    var qv = SIMD[F32, HEADS * VEC](0)
    comptime if from_qkv:
        var qkv_row = t * (hq + 2 * hk) * d
        var eps, rope_scale = eps_ptr.unsafe_load(0), rope_scale_ptr.unsafe_load(0)
        var position = positions.unsafe_load(t).cast[F32]()
        comptime for h in range(group):
            var head = _norm_rope_part[dtype, VEC](q, qkv_row + (g * group + h) * d, q_norm, part, lanes, d, eps,
                                                   inv_freq, position, rope_scale)
            qv = qv.insert[offset = h * VEC](head.cast[F32]() * scale)
        # the token's own key is its sequence's last: the block whose split holds it stores K and V, then reads them
        # back with the rest (its threads' global writes are visible to the block after the barrier)
        var cache_slot = Int(cache_slots.unsafe_load(t))
        if k_begin < n and k_end == n and cache_slot >= 0:
            var k_row = qkv_row + (hq + g) * d
            var k_new = _norm_rope_part[dtype, VEC](q, k_row, k_norm, part, lanes, d, eps, inv_freq, position,
                                                    rope_scale)
            if tid < lanes:
                var dst = (cache_slot * hk + g) * d + part
                k_cache.unsafe_store(dst, k_new.cast[cache_type]())
                v_cache.unsafe_store(dst, q.unsafe_load[width=VEC](k_row + hk * d + part).cast[cache_type]())
        barrier()
    else:
        comptime for h in range(group):
            qv = qv.insert[offset = h * VEC](load_f32[dtype, VEC](q, (t * hq + g * group + h) * d + part) * scale)
    # a state that saw no key: max MIN_FINITE (not -inf: merging two such states must not give -inf - -inf = nan)
    var m = SIMD[F32, HEADS](Float32.MIN_FINITE)
    var l = SIMD[F32, HEADS](0)
    var acc = SIMD[F32, HEADS * VEC](0)
    for base in range(k_begin, k_end, step):
        var k_rows, v_rows = _load_rows[cache_type, VEC, ROWS](k_cache, v_cache, pages, base + slot, slots, last, ps,
                                                               row_len, col)
        pages = _row_pages[ROWS](page_table, table_row, base + step + slot, slots, last, ps)
        # the rows' scores (row u's heads at u * HEADS ..), then one rescale of the state for all of them
        var scores = SIMD[F32, ROWS * HEADS](0)
        comptime for u in range(ROWS):
            var kv = k_rows.slice[VEC, offset = u * VEC]().cast[F32]()
            var s = SIMD[F32, HEADS](0)
            comptime for h in range(group):
                s[h] = (qv.slice[VEC, offset = h * VEC]() * kv).reduce_add()
            var offset = 1
            while offset < lanes:  # the row's dot products, summed over its lanes
                s += _shuffle_xor(s, offset)
                offset *= 2
            scores = scores.insert[offset = u * HEADS](s)
        var m_new = m
        comptime for u in range(ROWS):
            if base + u * slots + slot < k_end:
                m_new = max(m_new, scores.slice[HEADS, offset = u * HEADS]())
        var keep = exp(m - m_new)
        l *= keep
        acc *= _per_head[HEADS, VEC](keep)
        comptime for u in range(ROWS):
            if base + u * slots + slot < k_end:
                var p = exp(scores.slice[HEADS, offset = u * HEADS]() - m_new)
                l += p
                var vv = v_rows.slice[VEC, offset = u * VEC]().cast[F32]()
                var vv_all = SIMD[F32, HEADS * VEC](0)
                comptime for h in range(group):
                    vv_all = vv_all.insert[offset = h * VEC](vv)
                acc += vv_all * _per_head[HEADS, VEC](p)
        m = m_new
    launch_dependent_grids()  # the merge may launch: it waits for this kernel's writes

    # the slots of a warp into its first slot
    var offset = lanes
    while offset < WARP_SIZE:
        _combine[HEADS, VEC](m, l, acc, _shuffle_xor(m, offset), _shuffle_xor(l, offset), _shuffle_xor(acc, offset))
        offset *= 2
    # the warps into shared memory: warp w's state of head h at [(w * group + h) * (D + 2):], max and sum last
    comptime STATE = DECODE_MAX_HEAD_DIM + 2
    var states = stack_allocation[DECODE_WARPS * group * STATE, F32, address_space=AddressSpace.SHARED]()
    var w = tid // WARP_SIZE
    if tid % WARP_SIZE < lanes:
        comptime for h in range(group):
            var at = (w * group + h) * STATE
            states.unsafe_store(at + part, acc.slice[VEC, offset = h * VEC]())
            if part == 0:
                states.unsafe_store(at + DECODE_MAX_HEAD_DIM, m[h])
                states.unsafe_store(at + DECODE_MAX_HEAD_DIM + 1, l[h])
    barrier()
    # then each thread merges the warps for some (head, element) pairs
    for i in range(tid, group * d, DECODE_THREADS):
        var h = i // d
        var x = i % d
        var m_all = Float32.MIN_FINITE
        comptime for ww in range(DECODE_WARPS):
            m_all = max(m_all, states.unsafe_load((ww * group + h) * STATE + DECODE_MAX_HEAD_DIM))
        var l_all = Float32(0)
        var a_all = Float32(0)
        comptime for ww in range(DECODE_WARPS):
            var at = (ww * group + h) * STATE
            var weight = exp(states.unsafe_load(at + DECODE_MAX_HEAD_DIM) - m_all)
            l_all += states.unsafe_load(at + DECODE_MAX_HEAD_DIM + 1) * weight
            a_all += states.unsafe_load(at + x) * weight
        var row = t * hq + g * group + h
        if n_splits == 1:
            output.unsafe_store(row * d + x, (a_all / l_all).cast[dtype]())
        else:
            var dst = (row * n_splits + split) * (d + 2)
            partial.unsafe_store(dst + x, a_all)
            if x == 0:
                partial.unsafe_store(dst + d, m_all)
                partial.unsafe_store(dst + d + 1, l_all)


def _enqueue_decode[dtype: DType, cache_type: DType, group: Int, from_qkv: Bool, pdl: Bool](
    ctx: DeviceContext, output: Ptr[dtype], partial: Ptr[F32], q: Ptr[dtype], k_cache: Ptr[cache_type],
    v_cache: Ptr[cache_type], page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32],
    query_start: Ptr[DType.int32], scale: Ptr[F32], rope: QkvRope[dtype], batch: Int, max_pages: Int, kv_heads: Int,
    head_dim: Int, page_size: Int, splits: Int,
) raises:
    ctx.enqueue_function[_decode_attention_gpu[dtype, cache_type, group, from_qkv]](
        output, partial, q, k_cache, v_cache, page_table, context_lens, query_start, scale, ptr(rope.q_norm),
        ptr(rope.k_norm), ptr(rope.eps), ptr(rope.positions), ptr(rope.inv_freq), ptr(rope.rope_scale), ptr(rope.slots),
        Int32(max_pages), Int32(kv_heads),
        Int32(head_dim), Int32(page_size), Int32(splits),
        grid_dim=(batch, kv_heads, splits), block_dim=DECODE_THREADS, attributes=dependent_launch[pdl](),
    )


def decode_attention_gpu[dtype: DType, cache_type: DType, pdl: Bool, from_qkv: Bool = False](
    ctx: DeviceContext, output: Ptr[dtype], q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Ptr[F32],
    batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
    rope: Optional[QkvRope[dtype]] = None,
) raises:
    """Enqueues the split-KV decode kernel (decode_supported batches), then the merge when the keys are split.
    from_qkv: q is the fused projection's output qkv, with `rope`'s inputs (given). pdl: both launch with Hopper's
    programmatic dependent launch (utils/dependent_launch.mojo)."""
    var group = q_heads // kv_heads
    var sms = ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)
    var splits = decode_splits(batch, kv_heads, max_pages * page_size, sms * decode_blocks_per_sm(group))
    var partial = ctx.enqueue_create_buffer[DType.float32](batch * q_heads * splits * (head_dim + 2) if splits > 1 else 1)
    var p = partial.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    var qkv_rope = rope.value() if rope else QkvRope[dtype].unread(q, scale, context_lens)
    comptime for gr in range(1, 9):
        comptime if decode_group_supported(gr):
            if group == gr:
                _enqueue_decode[dtype, cache_type, gr, from_qkv, pdl](ctx, output, p, q, k_cache, v_cache, page_table,
                                                                context_lens, query_start, scale, qkv_rope, batch,
                                                                max_pages, kv_heads, head_dim, page_size, splits)
    if splits > 1:
        ctx.enqueue_function[merge_splits_gpu[dtype]](
            output, p, Int32(q_heads), Int32(head_dim), Int32(splits), grid_dim=(batch, q_heads), block_dim=GPU_BLOCK,
            attributes=dependent_launch[pdl](),
        )
    _ = partial^  # freed in stream order, after the kernels that use it
