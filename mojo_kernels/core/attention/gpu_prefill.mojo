# Prefill / extend attention on a GPU, FlashAttention-2 style, bfloat16 on tensor cores (mma.sync m16n8k16, float32
# accumulators). A block of 4 warps takes 64 rows of one sequence: row r is query token r // group and query head
# r % group of one KV head's group, so the query heads that share a KV head share every K/V tile. The block stages
# tiles of 64 keys of K and V in shared memory, straight from the paged cache with cp.async: V's tile loads while
# the warps compute S = Q K^T and the softmax, the next K tile while they compute O += P V. Each warp computes S
# for its 16 rows (Q in registers, K's fragments by ldmatrix), the online softmax on S's fragments (in log2 units,
# the scale folded into one fma per score), and O += P V with P reused from S's registers (V's fragments by
# ldmatrix.trans).
# Key tiles past the block's last visible position are skipped (causal); only the tiles on the diagonal are masked
# per row. The grid has a block per row tile of the step's sequences (prefill_block_tile), not per sequence and
# row tile the longest sequence has; within a sequence the row tiles with the most key tiles start first, those of
# every KV head before any lighter one. The output is normalized once at the end. Fragment layouts: PTX ISA,
# "mma.m16n8k16" (gid = lane / 4, tig = lane % 4).
# The op `mili_paged_attention_flash` (paged_attention.mojo), the default on a GPU.
from max.gpu.host import DeviceContext
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx, block_idx, WARP_SIZE
from max.gpu.compute.mma import ld_matrix, mma
from max.gpu.memory import async_copy, async_copy_commit_group, async_copy_wait_group
from max.gpu.primitives import warp
from max.gpu.sync import barrier
from std.math import ceildiv, exp2
from std.memory import stack_allocation
from std.utils.static_tuple import StaticTuple

from ...utils.types import F32, Ptr
from .common import token_offset

comptime BF16 = DType.bfloat16
comptime PREFILL_WARPS = 4
comptime PREFILL_THREADS = PREFILL_WARPS * WARP_SIZE
comptime BLOCK_ROWS = 16 * PREFILL_WARPS
"""Rows (query token x query head of the group) per block: 16 per warp, the m of an mma."""
comptime BLOCK_KEYS = 64
"""Keys per K/V tile in shared memory."""
comptime LOG2E: Float32 = 1.4426950408889634
comptime SharedTile = Pointer[Scalar[BF16], MutUntrackedOrigin, address_space=AddressSpace.SHARED]
comptime SharedOffsets = Pointer[Scalar[DType.int64], MutUntrackedOrigin, address_space=AddressSpace.SHARED]


def prefill_supported[dtype: DType, cache_type: DType](head_dim: Int, group: Int) -> Bool:
    return dtype == BF16 and cache_type == BF16 and head_dim in (64, 128) and group in (1, 2, 4, 8)


@always_inline
def _row_reduce_max(x: Float32) -> Float32:
    """Max over the 4 lanes (tig) that hold one row of an accumulator fragment."""
    var y = max(x, warp.shuffle_xor(x, UInt32(1)))
    return max(y, warp.shuffle_xor(y, UInt32(2)))


@always_inline
def _row_reduce_sum(x: Float32) -> Float32:
    var y = x + warp.shuffle_xor(x, UInt32(1))
    return y + warp.shuffle_xor(y, UInt32(2))


def prefill_blocks(tokens: Int, batch: Int, group: Int) -> Int:
    """Blocks per KV head: enough for every sequence's row tiles, however the tokens split (prefill_block_tile)."""
    return ceildiv(tokens * group, BLOCK_ROWS) + batch


@always_inline
def prefill_block_tile[group: Int](query_start: Ptr[DType.int32], batch: Int, i: Int) -> Tuple[Int, Int]:
    """The sequence and row tile of a KV head's block i; for a block with none, the row tile past the sequence's
    last. Sequence b's row tiles are the blocks from first(b) = ceil(query_start[b] * group / BLOCK_ROWS) + b on,
    the last row tile first: the ranges never overlap (first(b + 1) - first(b) >= b's row tiles) and end within
    prefill_blocks. A block per sequence and row tile of the longest one left most blocks empty in a mixed step (a
    prefill among 255 decodes: 99%)."""
    # in 32 bits, as token_offset: a GPU's 64-bit arithmetic takes register pairs
    comptime G = Int32(group)
    comptime ROWS = Int32(BLOCK_ROWS)
    var at, lo, hi = Int32(i), Int32(0), Int32(batch)  # the last b with first(b) <= i is in lo ..< hi
    while hi - lo > 1:
        var mid = (lo + hi) // 2
        if ceildiv(query_start.unsafe_load(mid) * G, ROWS) + mid <= at:
            lo = mid
        else:
            hi = mid
    var begin = query_start.unsafe_load(lo)
    var tiles = ceildiv((query_start.unsafe_load(lo + 1) - begin) * G, ROWS)
    var t = at - (ceildiv(begin * G, ROWS) + lo)
    return (Int(lo), Int(tiles - 1 - t if t < tiles else tiles))


@always_inline
def _find_tile_keys(
    key_at: SharedOffsets, page_table: Ptr[DType.int32], table_row: Int, key_start: Int, key_end: Int,
    page_size: Int, row_len: Int, tid: Int,
):
    """Where keys key_start ..< key_start + BLOCK_KEYS sit in the cache, one key per thread, for the copies of the
    tile's K and V rows. Keys from key_end on are key key_end - 1 again: masked out later, but finite (a stale NaN
    in a tile would turn P's zeros into NaN)."""
    if tid < BLOCK_KEYS:
        var key = min(key_start + tid, key_end - 1)
        key_at.unsafe_store(tid, Int64(token_offset(page_table, table_row, key, page_size, row_len)))


@always_inline
def _stage_tile[D: Int](tile: SharedTile, cache: Ptr[BF16], key_at: SharedOffsets, head_at: Int, tid: Int):
    """Starts copying a tile's K (or V) rows of one KV head into shared memory, 16 bytes per cp.async, as one commit
    group; key_at holds the tile's keys (_find_tile_keys, before a barrier)."""
    comptime CHUNKS = D // 8  # 16-byte chunks per row
    comptime ROW = D + 8
    comptime for i in range(BLOCK_KEYS * CHUNKS // PREFILL_THREADS):
        var c = tid + i * PREFILL_THREADS
        var key = c // CHUNKS
        var x = (c % CHUNKS) * 8
        async_copy[16](
            cache.unsafe_offset(Int(key_at.unsafe_load(key)) + head_at + x).unsafe_address_space_cast[AddressSpace.GLOBAL](),
            tile.unsafe_offset(key * ROW + x),
        )
    async_copy_commit_group()


# at most 168 registers, so that 3 blocks fit in an SM's registers
@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(PREFILL_THREADS)),
                 `nvvm.minctasm`=SIMDLength(3))
def _prefill_attention_gpu[D: Int, group: Int](
    output: Ptr[BF16], q: Ptr[BF16], k_cache: Ptr[BF16], v_cache: Ptr[BF16], page_table: Ptr[DType.int32],
    context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale_ptr: Ptr[F32], batch: Int32,
    max_pages: Int32, kv_heads: Int32, page_size: Int32,
):
    """Block (g, i): rows tile * 64 ..< tile * 64 + 64 of sequence b's (query token, head of KV head g), (b, tile) =
    prefill_block_tile(i). Blocks start in the order of their index, x fastest: the KV heads side by side (with the
    heads outermost, the heavy tiles of the last heads waited behind the light ones of the first)."""
    comptime KSTEPS = D // 16  # k-steps of S = Q K^T
    comptime DTILES = D // 8  # n-tiles of O
    comptime KTILES = BLOCK_KEYS // 8  # n-tiles of S
    comptime ROW = D + 8  # shared-memory row, padded: the 8 rows an mma reads land in different banks
    var g = Int(block_idx.x)
    var b, tile = prefill_block_tile[group](query_start, Int(batch), Int(block_idx.y))
    var q_begin = Int(query_start.unsafe_load(b))
    var q_len = Int(query_start.unsafe_load(b + 1)) - q_begin
    var first_row = tile * BLOCK_ROWS
    if first_row >= q_len * group:
        return
    var tid = Int(thread_idx.x)
    var lane = tid % WARP_SIZE
    var wid = tid // WARP_SIZE
    var gid = lane // 4
    var tig = lane % 4
    var hk, ps = Int(kv_heads), Int(page_size)
    var hq = hk * group
    var n_ctx = Int(context_lens.unsafe_load(b))
    var offset = n_ctx - q_len  # query token i is at position offset + i
    # scores stay unscaled: p = 2^(s * scale * log2(e) - m * scale * log2(e)), one fma per score
    var scale_log2 = scale_ptr.unsafe_load(0) * LOG2E

    # this thread's two rows: gid and gid + 8 of its warp's 16; -1 for rows past the sequence's queries
    var rows = SIMD[DType.int32, 2](Int32(first_row + wid * 16 + gid), Int32(first_row + wid * 16 + gid + 8))
    var pos = SIMD[DType.int32, 2](-1)
    comptime for r in range(2):
        if Int(rows[r]) < q_len * group:
            pos[r] = Int32(offset + Int(rows[r]) // group)

    # where the two rows' q and output elements start; in 32 bits, kept through the key loop
    var row_at = SIMD[DType.int32, 2](0)
    comptime for r in range(2):
        var row = Int(rows[r])
        row_at[r] = Int32(((q_begin + row // group) * hq + g * group + row % group) * D + tig * 2)
    # Q as A fragments, k-step by k-step: a0 a1 (row gid, dims tig*2 ..), a2 a3 (row gid + 8), a4 .. a7 (+8 dims)
    var qf = SIMD[BF16, 8 * KSTEPS](0)
    comptime for r in range(2):
        if pos[r] >= 0:
            var at = Int(row_at[r])
            comptime for ks in range(KSTEPS):
                qf = qf.insert[offset = ks * 8 + r * 2](q.unsafe_load[width=2](at + ks * 16))
                qf = qf.insert[offset = ks * 8 + 4 + r * 2](q.unsafe_load[width=2](at + ks * 16 + 8))

    # 16-byte aligned: cp.async's 16-byte copies and ldmatrix's row addresses
    var k_sh = stack_allocation[BLOCK_KEYS * ROW, BF16, address_space=AddressSpace.SHARED, alignment=16]()
    var v_sh = stack_allocation[BLOCK_KEYS * ROW, BF16, address_space=AddressSpace.SHARED, alignment=16]()
    var o = SIMD[F32, 4 * DTILES](0)
    var m = SIMD[F32, 2](Float32.MIN_FINITE)  # MIN_FINITE, not -inf: a fully masked tile keeps 2^(m - m) = 1
    var l = SIMD[F32, 2](0)
    # keys up to the block's last visible position; tiles from the first row's position on need the causal mask
    var last_row = min(first_row + BLOCK_ROWS, q_len * group) - 1
    var key_end = offset + last_row // group + 1
    var first_pos = offset + first_row // group
    var table_row = b * Int(max_pages)
    var row_len = hk * D
    var head_at = g * D  # KV head g's elements in a cache row
    # the cache offsets of two tiles' keys: tile j's in key_at[j % 2], found during tile j - 1
    var key_at = stack_allocation[2 * BLOCK_KEYS, DType.int64, address_space=AddressSpace.SHARED, alignment=16]()
    _find_tile_keys(key_at, page_table, table_row, 0, key_end, ps, row_len, tid)
    barrier()
    _stage_tile[D](k_sh, k_cache, key_at, head_at, tid)
    for key_start in range(0, key_end, BLOCK_KEYS):
        var here_at = ((key_start // BLOCK_KEYS) % 2) * BLOCK_KEYS
        var here = key_at.unsafe_offset(here_at)
        var next = key_at.unsafe_offset(BLOCK_KEYS - here_at)
        async_copy_wait_group(0)
        barrier()  # K's tile is in; every warp is done with the previous V tile and its keys' offsets
        _stage_tile[D](v_sh, v_cache, here, head_at, tid)
        if key_start + BLOCK_KEYS < key_end:
            _find_tile_keys(next, page_table, table_row, key_start + BLOCK_KEYS, key_end, ps, row_len, tid)

        # S = Q K^T: n-tile nt holds keys nt * 8 + tig * 2 + {0, 1} of rows gid (s0 s1) and gid + 8 (s2 s3). K's B
        # fragments of two k-steps come from one ldmatrix.x4: matrix i is keys nt * 8 ..< + 8, dims 8 i ..< 8 i + 8 of
        # the pair, and lane l gives the address of row l % 8 of matrix l // 8
        var s = SIMD[F32, 4 * KTILES](0)
        comptime for nt in range(KTILES):
            var acc = SIMD[F32, 4](0)
            comptime for kp in range(KSTEPS // 2):
                var bf = ld_matrix[8](k_sh.unsafe_offset((nt * 8 + lane % 8) * ROW + kp * 32 + (lane // 8) * 8))
                comptime for half in range(2):
                    var d = SIMD[F32, 4](0)
                    mma(d, qf.slice[8, offset = (kp * 2 + half) * 8](), bf.slice[4, offset = half * 4](), acc)
                    acc = d
            s = s.insert[offset = nt * 4](acc)
        if key_start + BLOCK_KEYS - 1 > first_pos:  # a tile on the diagonal: each row's later keys out
            comptime for nt in range(KTILES):
                comptime for i in range(4):
                    if key_start + nt * 8 + tig * 2 + i % 2 > Int(pos[i // 2]):
                        s[nt * 4 + i] = -Float32.MAX
        # the online softmax of each of the two rows
        var row_max = SIMD[F32, 2](Float32.MIN_FINITE)
        comptime for nt in range(KTILES):
            comptime for i in range(4):
                row_max[i // 2] = max(row_max[i // 2], s[nt * 4 + i])
        var m_new = SIMD[F32, 2](_row_reduce_max(row_max[0]), _row_reduce_max(row_max[1]))
        m_new = max(m, m_new)
        var keep = exp2((m - m_new) * scale_log2)
        var m_scaled = m_new * scale_log2
        var row_sum = SIMD[F32, 2](0)
        comptime for nt in range(KTILES):
            comptime for i in range(4):
                var p = exp2(s[nt * 4 + i].fma(scale_log2, -m_scaled[i // 2]))
                s[nt * 4 + i] = p
                row_sum[i // 2] += p
        l = l * keep + SIMD[F32, 2](_row_reduce_sum(row_sum[0]), _row_reduce_sum(row_sum[1]))
        m = m_new
        comptime for dt in range(DTILES):
            comptime for i in range(4):
                o[dt * 4 + i] *= keep[i // 2]

        async_copy_wait_group(0)
        barrier()  # V's tile is in; every warp is done with K's
        if key_start + BLOCK_KEYS < key_end:
            _stage_tile[D](k_sh, k_cache, next, head_at, tid)
        # O += P V: P's A fragment for keys 16 kk .. is S's n-tiles 2 kk and 2 kk + 1; V's B fragment holds
        # keys 16 kk + tig * 2 + {0, 1} (b0 b1) and + 8 (b2 b3) of dim dt * 8 + gid. Those of two n-tiles come from
        # one ldmatrix.x4.trans: matrix i is keys 16 kk + 8 (i % 2) ..< + 8, dims 8 (2 dp + i // 2) ..< + 8
        comptime for kk in range(BLOCK_KEYS // 16):
            var pf = s.slice[8, offset = kk * 8]().cast[BF16]()
            var key = kk * 16 + ((lane // 8) % 2) * 8 + lane % 8
            comptime for dp in range(DTILES // 2):
                var vf = ld_matrix[8, transpose=True](v_sh.unsafe_offset(key * ROW + (dp * 2 + lane // 16) * 8))
                comptime for half in range(2):
                    comptime dt = dp * 2 + half
                    var d = SIMD[F32, 4](0)
                    mma(d, pf, vf.slice[4, offset = half * 4](), o.slice[4, offset = dt * 4]())
                    o = o.insert[offset = dt * 4](d)

    # O / l, rows gid (o0 o1) and gid + 8 (o2 o3), dims dt * 8 + tig * 2 + {0, 1}
    var inv_l = 1 / l
    comptime for r in range(2):
        if pos[r] >= 0:
            var at = Int(row_at[r])
            comptime for dt in range(DTILES):
                var pair = o.slice[2, offset = dt * 4 + r * 2]() * inv_l[r]
                output.unsafe_store(at + dt * 8, pair.cast[BF16]())


def prefill_attention_gpu(
    ctx: DeviceContext, output: Ptr[BF16], q: Ptr[BF16], k_cache: Ptr[BF16], v_cache: Ptr[BF16],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Ptr[F32],
    tokens: Int, batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
) raises:
    """Enqueues the tensor-core kernel (prefill_supported shapes)."""
    var group = q_heads // kv_heads
    var grid = (kv_heads, prefill_blocks(tokens, batch, group))
    comptime for i in range(2):
        comptime d = 64 << i
        comptime for j in range(4):
            comptime gr = 1 << j
            if head_dim == d and group == gr:
                ctx.enqueue_function[_prefill_attention_gpu[d, gr]](
                    output, q, k_cache, v_cache, page_table, context_lens, query_start, scale, Int32(batch),
                    Int32(max_pages), Int32(kv_heads), Int32(page_size), grid_dim=grid, block_dim=PREFILL_THREADS,
                )
