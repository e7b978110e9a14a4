# Prefill / extend attention on a GPU, FlashAttention-2 style, bfloat16 on tensor cores (mma.sync m16n8k16, float32
# accumulators). A block of 4 warps takes 128 rows of one sequence, 32 per warp (two m-tiles, as FlashAttention-2's
# 128-row blocks: each K and V fragment read from shared memory feeds two mmas, where 16 rows a warp fed one and
# spent shared memory's bandwidth twice as fast). Row r is query token r // group and query head r % group of one
# KV head's group, so the query heads that share a KV head share every K/V tile. The block stages its Q rows and
# tiles of 64 keys of K and V in shared memory, two of each (103 KB at head_dim 128: dynamic shared memory; two blocks
# fit an SM), straight from the paged cache with cp.async: the next tile's K and V load while the warps compute on
# this one's, a whole tile's time (one barrier a tile; with one K and one V buffer, V loaded behind S = Q K^T and the
# next K behind O += P V, two barriers a tile, each load behind half a tile). Each warp computes S for its rows (Q's
# and K's fragments by ldmatrix), the online softmax on S's fragments (in log2 units, the scale folded into one fma
# per score), and O += P V with P reused from S's registers (V's fragments by ldmatrix.trans).
# Key tiles past the block's last visible position are skipped (causal), and by each warp those past its own rows'
# (the warps of a partial last row tile with no rows skip all). The key loop runs twice, as FlashAttention-2's: the
# tiles before the block's first row see every key unmasked, then those on the diagonal mask each row's later keys
# (one loop with the mask behind a branch ran its compares and selects, predicated, in every tile).
# The grid has a block per row tile of the step's sequences (prefill_block_tile), not per sequence and row tile the
# longest sequence has; within a sequence the row tiles with the most key tiles start first, those of every KV head
# before any lighter one. Where there are more row tiles than SMs, a block takes two of its sequence's row tiles in
# turn, a heavy one and its mirror (prefill_row_tile), so that every block has the same work (below). The output is
# normalized once at the end. Fragment layouts: PTX ISA, "mma.m16n8k16" (gid = lane / 4, tig = lane % 4).
# The op `mili_paged_attention_flash` (paged_attention.mojo), the default on a GPU.
from max.gpu.host import DeviceAttribute, DeviceContext, FuncAttribute
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx, block_idx, WARP_SIZE
from max.gpu.compute.mma import ld_matrix, mma
from max.gpu.memory import async_copy, async_copy_commit_group, async_copy_wait_group, external_memory
from max.gpu.primitives import warp
from max.gpu.sync import barrier
from std.math import ceildiv, exp2
from std.sys import size_of
from std.utils.static_tuple import StaticTuple

from ...utils.types import F32, Ptr
from .common import token_offset

comptime BF16 = DType.bfloat16
comptime PREFILL_WARPS = 4
comptime PREFILL_THREADS = PREFILL_WARPS * WARP_SIZE
comptime M_TILES = 2
"""m-tiles (16 rows, the m of an mma) per warp: each K and V fragment read from shared memory feeds M_TILES mmas."""
comptime WARP_ROWS = 16 * M_TILES
comptime BLOCK_ROWS = WARP_ROWS * PREFILL_WARPS
"""Rows (query token x query head of the group) per block."""
comptime BLOCK_KEYS = 64
"""Keys per K/V tile in shared memory."""
comptime LOG2E: Float32 = 1.4426950408889634
comptime SharedTile = Pointer[Scalar[BF16], MutUntrackedOrigin, address_space=AddressSpace.SHARED]
comptime SharedOffsets = Pointer[Scalar[DType.int64], MutUntrackedOrigin, address_space=AddressSpace.SHARED]


def prefill_supported[dtype: DType, cache_type: DType](tokens: Int, batch: Int, head_dim: Int) -> Bool:
    """Whether the tensor-core kernel takes this batch: some sequence has more than one query token (a decode batch
    goes to the decode kernel), bfloat16, head_dim 64 or 128. Any number of query heads a KV head: a block's rows
    are (query token, head) pairs, however many heads there are."""
    return tokens > batch and dtype == BF16 and cache_type == BF16 and head_dim in (64, 128)


@always_inline
def _row_reduce_max(x: Float32) -> Float32:
    """Max over the 4 lanes (tig) that hold one row of an accumulator fragment."""
    var y = max(x, warp.shuffle_xor(x, UInt32(1)))
    return max(y, warp.shuffle_xor(y, UInt32(2)))


@always_inline
def _row_reduce_sum(x: Float32) -> Float32:
    var y = x + warp.shuffle_xor(x, UInt32(1))
    return y + warp.shuffle_xor(y, UInt32(2))


def prefill_tiles_per_block(row_tiles: Int, sms: Int, pairs: Int) -> Int:
    """Row tiles per block: 2 where the step's row tiles (over all KV heads) outnumber the SMs, else 1.
    Causal row tile t takes t + 1 key tiles, and the blocks start heaviest first, so with two blocks an SM (i and
    i + SMs, in launch order) the heavy tiles share their SMs with the middle ones: at 2,048 tokens (256 blocks on
    132 SMs) the SM with the heaviest tile has 48 key tiles to run where the mean is 33. A block taking tile t and
    its mirror T - 1 - t has T + 1, whichever it gets, at one block an SM. `pairs` (GpuOptions.prefill_pairs,
    bindings/gpu_options.py) forces the choice: 1 two row tiles a block, 0 one, -1 this rule."""
    if pairs == 1:
        return 2
    if pairs == 0:
        return 1
    return 2 if row_tiles > sms else 1


def prefill_diagonal_start(first_position: Int) -> Int:
    """The first key of the first key tile that a block whose first row is at `first_position` must mask: the
    tiles before it hold only keys at or before every row's position."""
    return (first_position + 1) // BLOCK_KEYS * BLOCK_KEYS


def prefill_blocks(tokens: Int, batch: Int, group: Int, tiles_per_block: Int) -> Int:
    """Blocks per KV head: enough for every sequence's row tiles, however the tokens split (prefill_block_tile)."""
    return ceildiv(tokens * group, BLOCK_ROWS * tiles_per_block) + batch


@always_inline
def _token_of(row: Int, group: Int) -> Int:
    """The query token of block row `row` (a row per query head of the token's KV head group): in 32 bits, as
    token_offset (a GPU divides 64-bit integers in a called routine)."""
    return Int(UInt32(row) // UInt32(group))


@always_inline
def prefill_block_tile(
    query_start: Ptr[DType.int32], batch: Int, i: Int, tiles_per_block: Int, group: Int
) -> Tuple[Int, Int, Int]:
    """(b, j, tiles): a KV head's block i is the j-th of sequence b, which has `tiles` row tiles; j may be past the
    blocks b needs (prefill_row_tile says which tiles a block takes). Sequence b's blocks start at first(b) =
    ceil(query_start[b] * group / span) + b, span = BLOCK_ROWS * tiles_per_block rows: the ranges never overlap
    (first(b + 1) - first(b) >= b's blocks) and end within prefill_blocks. A block per sequence and row tile of the
    longest one left most blocks empty in a mixed step (a prefill among 255 decodes: 99%)."""
    # in 32 bits, as token_offset: a GPU's 64-bit arithmetic takes register pairs
    var G = Int32(group)
    comptime ROWS = Int32(BLOCK_ROWS)
    var span = ROWS * Int32(tiles_per_block)
    var at, lo, hi = Int32(i), Int32(0), Int32(batch)  # the last b with first(b) <= i is in lo ..< hi
    while hi - lo > 1:
        var mid = (lo + hi) // 2
        if ceildiv(query_start.unsafe_load(mid) * G, span) + mid <= at:
            lo = mid
        else:
            hi = mid
    var begin = query_start.unsafe_load(lo)
    var tiles = ceildiv((query_start.unsafe_load(lo + 1) - begin) * G, ROWS)
    return (Int(lo), Int(at - (ceildiv(begin * G, span) + lo)), Int(tiles))


@always_inline
def prefill_row_tile(j: Int, k: Int, tiles: Int, tiles_per_block: Int) -> Int:
    """The k-th row tile of a sequence's j-th block (-1: none): the j-th heaviest (the last row tile first), then
    with two a block its mirror j, unless that is the same tile or taken by a block before."""
    if j >= ceildiv(tiles, tiles_per_block):
        return -1
    if k == 0:
        return tiles - 1 - j
    return j if j < tiles - 1 - j else -1


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


@always_inline
def _row_at[D: Int](q_begin: Int, row: Int, q_heads: Int, g: Int, group: Int) -> Int:
    """Where block row `row` of KV head g (query token row // group, head g * group + row % group) starts in Q and
    in the output; in 32 bits, as token_offset."""
    var token = _token_of(row, group)
    return Int(((Int32(q_begin) + Int32(token)) * Int32(q_heads) + Int32(g * group + row - token * group)) * Int32(D))


@always_inline
def _stage_queries[D: Int](
    q_sh: SharedTile, q: Ptr[BF16], q_begin: Int, first_row: Int, rows: Int, q_heads: Int, g: Int, group: Int, tid: Int
):
    """Starts copying the block's BLOCK_ROWS query rows into shared memory (one commit group); rows past the
    sequence's copy its last row: finite, and never stored."""
    comptime CHUNKS = D // 8
    comptime ROW = D + 8
    comptime for i in range(BLOCK_ROWS * CHUNKS // PREFILL_THREADS):
        var c = tid + i * PREFILL_THREADS
        var r = c // CHUNKS
        var x = (c % CHUNKS) * 8
        var at = _row_at[D](q_begin, min(first_row + r, rows - 1), q_heads, g, group)
        async_copy[16](
            q.unsafe_offset(at + x).unsafe_address_space_cast[AddressSpace.GLOBAL](),
            q_sh.unsafe_offset(r * ROW + x),
        )
    async_copy_commit_group()


def prefill_shared_bytes[D: Int]() -> Int:
    """The kernel's shared memory: Q's tile, two stages of K's and V's, the cache offsets of two key tiles."""
    return (BLOCK_ROWS + 4 * BLOCK_KEYS) * (D + 8) * size_of[Scalar[BF16]]() + 2 * BLOCK_KEYS * size_of[Int64]()


# at most 255 registers, so that 2 blocks fit in an SM's registers
@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(PREFILL_THREADS)),
                 `nvvm.minctasm`=SIMDLength(2))
def _prefill_attention_gpu[D: Int](
    output: Ptr[BF16], q: Ptr[BF16], k_cache: Ptr[BF16], v_cache: Ptr[BF16], page_table: Ptr[DType.int32],
    context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale_ptr: Ptr[F32], batch: Int32,
    max_pages: Int32, kv_heads: Int32, group: Int32, page_size: Int32, tiles_per_block: Int32,
):
    """Block (g, i): the row tiles prefill_row_tile gives the j-th block of sequence b, one after another, (b, j) =
    prefill_block_tile(i). Blocks start in the order of their index, x fastest: the KV heads side by side (with the
    heads outermost, the heavy tiles of the last heads waited behind the light ones of the first)."""
    var per_block = Int(tiles_per_block)
    var b, j, tiles = prefill_block_tile(query_start, Int(batch), Int(block_idx.y), per_block, Int(group))
    for k in range(per_block):
        var tile = prefill_row_tile(j, k, tiles, per_block)
        if tile < 0:
            return
        if k > 0:
            barrier()  # every warp is done with the previous row tile's Q, K, V and key offsets, which this one stages
        _attend_row_tile[D](output, q, k_cache, v_cache, page_table, context_lens, query_start, scale_ptr,
                            Int(max_pages), Int(kv_heads), Int(group), Int(page_size), Int(block_idx.x), b, tile)


@always_inline
def _attend_row_tile[D: Int](
    output: Ptr[BF16], q: Ptr[BF16], k_cache: Ptr[BF16], v_cache: Ptr[BF16], page_table: Ptr[DType.int32],
    context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale_ptr: Ptr[F32], max_pages: Int,
    kv_heads: Int, group: Int, page_size: Int, g: Int, b: Int, tile: Int,
):
    """Rows tile * BLOCK_ROWS ..< + BLOCK_ROWS of sequence b's (query token, head of KV head g), a row tile it has;
    warp w takes WARP_ROWS of them, as M_TILES m-tiles."""
    comptime KSTEPS = D // 16  # k-steps of S = Q K^T
    comptime DTILES = D // 8  # n-tiles of O
    comptime KTILES = BLOCK_KEYS // 8  # n-tiles of S
    comptime ROW = D + 8  # shared-memory row, padded: the 8 rows an mma reads land in different banks
    comptime R = 2 * M_TILES  # rows per thread: gid and gid + 8 of each m-tile
    var q_begin = Int(query_start.unsafe_load(b))
    var q_len = Int(query_start.unsafe_load(b + 1)) - q_begin
    var n_rows = q_len * group
    var first_row = tile * BLOCK_ROWS
    var tid = Int(thread_idx.x)
    var lane = tid % WARP_SIZE
    var wid = tid // WARP_SIZE
    var gid = lane // 4
    var tig = lane % 4
    var n_ctx = Int(context_lens.unsafe_load(b))
    var offset = n_ctx - q_len  # query token i is at position offset + i
    # scores stay unscaled: p = 2^(s * scale * log2(e) - m * scale * log2(e)), one fma per score
    var scale_log2 = scale_ptr.unsafe_load(0) * LOG2E

    # 16-byte aligned: cp.async's 16-byte copies and ldmatrix's row addresses
    var q_sh = external_memory[Scalar[BF16], address_space=AddressSpace.SHARED, alignment=16]()
    # key tile j's K rows at stage j % 2 (BLOCK_KEYS rows at 2 (j % 2) BLOCK_KEYS), its V rows after them
    var kv_sh = q_sh.unsafe_offset(BLOCK_ROWS * ROW)
    comptime STAGE = 2 * BLOCK_KEYS * ROW
    # the cache offsets of two tiles' keys: tile j's in key_at[j % 2], found during tile j - 2
    var key_at = kv_sh.unsafe_offset(2 * STAGE).unsafe_bitcast[Int64]()
    _stage_queries[D](q_sh, q, q_begin, first_row, n_rows, kv_heads * group, g, group, tid)

    # this thread's rows, m-tile mt's gid and gid + 8 at 2 mt and 2 mt + 1; position -1 past the sequence's queries
    var warp_row = first_row + wid * WARP_ROWS
    var pos = SIMD[DType.int32, R](-1)
    comptime for r in range(R):
        var row = warp_row + (r // 2) * 16 + gid + (r % 2) * 8
        if row < n_rows:
            pos[r] = Int32(offset + _token_of(row, group))
    # the warp's visible keys end after its last row's position (-1: no rows, nothing to compute)
    var warp_last = offset + _token_of(min(warp_row + WARP_ROWS, n_rows) - 1, group) if warp_row < n_rows else -1
    # ldmatrix.x4 of an m-tile's A fragment (Q): lane l gives row l % 8 + 8 (l // 8 % 2), dims 8 (l // 16) on
    var q_lane = q_sh.unsafe_offset((wid * WARP_ROWS + lane % 8 + ((lane // 8) % 2) * 8) * ROW + (lane // 16) * 8)
    # ldmatrix.x4 of two n-tiles' B fragments (K) of a k-step: matrix i is keys 8 (i // 2) ..< + 8 of the pair, dims
    # 8 (i % 2) ..< + 8 of the k-step; lane l gives row l % 8 of matrix l // 8
    var k_lane = ((lane // 16) * 8 + lane % 8) * ROW + ((lane // 8) % 2) * 8

    var o = SIMD[F32, 4 * DTILES * M_TILES](0)
    var m = SIMD[F32, R](Float32.MIN_FINITE)  # MIN_FINITE, not -inf: a fully masked tile keeps 2^(m - m) = 1
    var l = SIMD[F32, R](0)
    # keys up to the block's last visible position
    var key_end = offset + _token_of(min(first_row + BLOCK_ROWS, n_rows) - 1, group) + 1
    var diagonal = prefill_diagonal_start(offset + _token_of(first_row, group))
    var table_row = b * max_pages
    var row_len = kv_heads * D
    var head_at = g * D  # KV head g's elements in a cache row
    _find_tile_keys(key_at, page_table, table_row, 0, key_end, page_size, row_len, tid)
    barrier()
    _stage_tile[D](kv_sh, k_cache, key_at, head_at, tid)
    _stage_tile[D](kv_sh.unsafe_offset(BLOCK_KEYS * ROW), v_cache, key_at, head_at, tid)
    if BLOCK_KEYS < key_end:
        _find_tile_keys(key_at.unsafe_offset(BLOCK_KEYS), page_table, table_row, BLOCK_KEYS, key_end, page_size,
                        row_len, tid)
    comptime for on_diagonal in range(2):  # the tiles before the diagonal, then those on it
        comptime masked = on_diagonal == 1
        for key_start in range(diagonal if masked else 0, key_end if masked else diagonal, BLOCK_KEYS):
            var stage = (key_start // BLOCK_KEYS) % 2
            var k_sh = kv_sh.unsafe_offset(stage * STAGE)
            var v_sh = k_sh.unsafe_offset(BLOCK_KEYS * ROW)
            async_copy_wait_group(0)
            # this tile's K and V (and Q) are in, and the next tile's key offsets; every warp is done with the
            # previous tile, whose stage the next tile takes
            barrier()
            if key_start + BLOCK_KEYS < key_end:
                var next_sh = kv_sh.unsafe_offset((1 - stage) * STAGE)
                var next_at = key_at.unsafe_offset((1 - stage) * BLOCK_KEYS)
                _stage_tile[D](next_sh, k_cache, next_at, head_at, tid)
                _stage_tile[D](next_sh.unsafe_offset(BLOCK_KEYS * ROW), v_cache, next_at, head_at, tid)
                if key_start + 2 * BLOCK_KEYS < key_end:  # over this tile's offsets, read when it was staged
                    _find_tile_keys(key_at.unsafe_offset(stage * BLOCK_KEYS), page_table, table_row,
                                    key_start + 2 * BLOCK_KEYS, key_end, page_size, row_len, tid)
            # a warp whose rows see none of the tile's keys skips it (it still stages tiles and meets the barriers)
            var visible = key_start <= warp_last

            # S = Q K^T, a k-step (16 dims) at a time: m-tile mt's n-tile nt holds keys nt * 8 + tig * 2 + {0, 1} of
            # rows gid (s0 s1) and gid + 8 (s2 s3). A k-step's mmas go over every (n-tile, m-tile) before the next
            # k-step's, so an mma's result is needed 16 mmas later, not at once (as FlashAttention-2's gemm); the
            # k-step's A fragments (Q, an ldmatrix.x4 an m-tile) and B fragments (K, an ldmatrix.x4 two n-tiles:
            # k_lane) are all a warp holds of them
            var s = SIMD[F32, 4 * KTILES * M_TILES](0)
            if visible:
                comptime for ks in range(KSTEPS):
                    var qa = SIMD[BF16, 8 * M_TILES](0)
                    comptime for mt in range(M_TILES):
                        qa = qa.insert[offset = mt * 8](ld_matrix[8](q_lane.unsafe_offset(mt * 16 * ROW + ks * 16)))
                    var kb = SIMD[BF16, 4 * KTILES](0)
                    comptime for np in range(KTILES // 2):
                        var at = k_lane + np * 16 * ROW + ks * 16
                        kb = kb.insert[offset = np * 8](ld_matrix[8](k_sh.unsafe_offset(at)))
                    comptime for nt in range(KTILES):
                        comptime for mt in range(M_TILES):
                            comptime at = (mt * KTILES + nt) * 4
                            var d = SIMD[F32, 4](0)
                            mma(d, qa.slice[8, offset = mt * 8](), kb.slice[4, offset = nt * 4](), s.slice[4, offset=at]())
                            s = s.insert[offset=at](d)
                comptime if masked:  # each row's later keys out
                    comptime for mt in range(M_TILES):
                        comptime for nt in range(KTILES):
                            comptime for i in range(4):
                                if key_start + nt * 8 + tig * 2 + i % 2 > Int(pos[mt * 2 + i // 2]):
                                    s[(mt * KTILES + nt) * 4 + i] = -Float32.MAX
                # the online softmax of each of the thread's rows
                var row_max = SIMD[F32, R](Float32.MIN_FINITE)
                comptime for mt in range(M_TILES):
                    comptime for nt in range(KTILES):
                        comptime for i in range(4):
                            comptime r = mt * 2 + i // 2
                            row_max[r] = max(row_max[r], s[(mt * KTILES + nt) * 4 + i])
                var m_new = m
                comptime for r in range(R):
                    m_new[r] = max(m[r], _row_reduce_max(row_max[r]))
                var keep = exp2((m - m_new) * scale_log2)
                var m_scaled = m_new * scale_log2
                var row_sum = SIMD[F32, R](0)
                comptime for mt in range(M_TILES):
                    comptime for nt in range(KTILES):
                        comptime for i in range(4):
                            comptime r = mt * 2 + i // 2
                            comptime at = (mt * KTILES + nt) * 4 + i
                            var p = exp2(s[at].fma(scale_log2, -m_scaled[r]))
                            s[at] = p
                            row_sum[r] += p
                comptime for r in range(R):
                    l[r] = l[r] * keep[r] + _row_reduce_sum(row_sum[r])
                m = m_new
                comptime for mt in range(M_TILES):
                    comptime for dt in range(DTILES):
                        comptime for i in range(4):
                            o[(mt * DTILES + dt) * 4 + i] *= keep[mt * 2 + i // 2]

            # a block of its own: in the one above, ptxas spilled in the loop (11 local loads and 4 stores a tile)
            if visible:
                # O += P V: P's A fragment for keys 16 kk .. is S's n-tiles 2 kk and 2 kk + 1; V's B fragment holds
                # keys 16 kk + tig * 2 + {0, 1} (b0 b1) and + 8 (b2 b3) of dim dt * 8 + gid. Those of two n-tiles come
                # from one ldmatrix.x4.trans: matrix i is keys 16 kk + 8 (i % 2) ..< + 8, dims 8 (2 dp + i // 2) ..< + 8
                comptime for kk in range(BLOCK_KEYS // 16):
                    var pa = SIMD[BF16, 8 * M_TILES](0)
                    comptime for mt in range(M_TILES):
                        pa = pa.insert[offset = mt * 8](s.slice[8, offset = (mt * KTILES + kk * 2) * 4]().cast[BF16]())
                    var key = kk * 16 + ((lane // 8) % 2) * 8 + lane % 8
                    comptime for dp in range(DTILES // 2):
                        var vf = ld_matrix[8, transpose=True](v_sh.unsafe_offset(key * ROW + (dp * 2 + lane // 16) * 8))
                        comptime for mt in range(M_TILES):
                            comptime for half in range(2):
                                comptime at = (mt * DTILES + dp * 2 + half) * 4
                                var d = SIMD[F32, 4](0)
                                mma(d, pa.slice[8, offset = mt * 8](), vf.slice[4, offset = half * 4](),
                                    o.slice[4, offset=at]())
                                o = o.insert[offset=at](d)

    # O / l, rows gid (o0 o1) and gid + 8 (o2 o3) of each m-tile, dims dt * 8 + tig * 2 + {0, 1}
    var inv_l = 1 / l
    comptime for r in range(R):
        if pos[r] >= 0:
            var at = _row_at[D](q_begin, warp_row + (r // 2) * 16 + gid + (r % 2) * 8, kv_heads * group, g, group)
            comptime for dt in range(DTILES):
                var pair = o.slice[2, offset = ((r // 2) * DTILES + dt) * 4 + (r % 2) * 2]() * inv_l[r]
                output.unsafe_store(at + dt * 8 + tig * 2, pair.cast[BF16]())


def prefill_attention_gpu[pairs: Int](
    ctx: DeviceContext, output: Ptr[BF16], q: Ptr[BF16], k_cache: Ptr[BF16], v_cache: Ptr[BF16],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Ptr[F32],
    tokens: Int, batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
) raises:
    """Enqueues the tensor-core kernel (prefill_supported batches)."""
    var group = q_heads // kv_heads
    var per_block = prefill_tiles_per_block(kv_heads * ceildiv(tokens * group, BLOCK_ROWS),
                                            ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT), pairs)
    var grid = (kv_heads, prefill_blocks(tokens, batch, group, per_block))
    comptime for i in range(2):
        comptime d = 64 << i
        if head_dim == d:
            ctx.enqueue_function[_prefill_attention_gpu[d]](
                output, q, k_cache, v_cache, page_table, context_lens, query_start, scale, Int32(batch),
                Int32(max_pages), Int32(kv_heads), Int32(group), Int32(page_size), Int32(per_block), grid_dim=grid,
                block_dim=PREFILL_THREADS,
                shared_mem_bytes=prefill_shared_bytes[d](),
                func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(prefill_shared_bytes[d]())),
            )
