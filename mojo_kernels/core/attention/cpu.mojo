# Paged attention on a CPU (the layout and the computation: common.mojo).
# A work item is a tile of up to QUERY_TILE (LONG_QUERY_TILE) queries of one sequence with all their heads, over one
# split of the keys (decode splits long contexts over the workers and merges the partial softmax states).
# All KV heads of a token are adjacent in the cache, so an item streams through memory. Tiles with many rows per KV head
# stage each key block head by head (transposed, float32) and score it without horizontal sums, BLOCK_ROWS rows of a KV
# head at a time (each staged key / value vector loaded feeds that many FMAs); the others (decode) read the cache
# directly, KEY_GROUP keys at a time (the next group prefetched): the rows of a KV head (up to four) score several keys
# at once and accumulate the group's values in registers (over bfloat16 caches with BF16_DOT both by vdpbf16ps: q and
# the softmax weights rounded to bfloat16, two keys' values interleaved). 8-bit caches (memory/kv_format.mojo) are
# widened in registers; a key's scale multiplies its scores, a value's its weight.
# Over bfloat16 caches with BF16_DOT (utils/types.mojo), staged tiles stage the block in bfloat16 pairs instead and
# score and sum it with vdpbf16ps, twice the work of an FMA per instruction: q and the softmax weights are rounded to
# bfloat16 for it (as llama.cpp's and vLLM's CPU attention round them to the cache's type), the sums stay float32.
# With AMX (Intel's), tiles of AMX_ROWS rows a KV head or more run on AMX tiles instead (cpu_amx.mojo): 28 layers of
# a 512-token Qwen3-0.6B prefill's attention 0.27x the time of the float32 FMAs on an Intel Xeon VM.
from std.math import ceildiv, exp, iota
from std.collections import Array
from std.memory import bitcast
from std.sys import num_logical_cores, size_of
from std.sys.intrinsics import prefetch, PrefetchOptions
from std.utils.index import IndexList

from ...memory.kv_format import kv_head_len, kv_scale
from ...utils.types import list_ptr, dot_bf16, narrow, widen, zero_f32, BF16_DOT, F32, F32_WIDTH, Ptr
from ...utils.parallel import claim_next, fork_join
from ..linear_amx import AMX_BLOCK, AMX_ROWS, configure_tiles, release_tiles, use_amx
from .cpu_amx import amx_head_block, amx_stage_keys, amx_stage_q, amx_state_back, transpose_block, AmxScratch
from .cpu_softmax import register_weights, softmax_block, KEY_BLOCK, MASKED

comptime QUERY_TILE = 32
"""Queries of one sequence that share each loaded key and value row."""
comptime LONG_QUERY_TILE = 64
"""Queries per tile when the batch has LONG_TILES_PER_WORKER such tiles per worker: each key block staged serves
twice the queries (28 layers of a 512-token prefill's attention 0.92x the time, 2,048 tokens 0.92x); with fewer,
the larger tiles balance worse over the workers (100 tokens: 1.11x)."""
comptime LONG_TILES_PER_WORKER = 4
comptime STAGE_MIN_ROWS = 8
"""Rows (query x head) per KV head from which a tile stages its key blocks (transposed, float32)."""
comptime KEY_GROUP = 8
"""Keys read straight from the cache: keys processed together, all KV heads (adjacent in memory)."""
comptime BLOCK_ROWS = 8 if F32_WIDTH >= 16 else 4
"""Rows of a KV head that share each staged key / value vector loaded (_rows_block: 2 x BLOCK_ROWS accumulator
vectors with AVX-512). Qwen3-0.6B's heads, one prompt of 512 (2,048) tokens, float32 cache, Intel Xeon without AMX,
best of 4 alternated runs: 8 rows 5.09 ms (66.2), 4 rows 5.35 (70.7); its AVX2 code, 4 rows 10.0 (135), 2 rows
10.8 (144). _pair_rows too: 8 rows keep 16 vdpbf16ps chains apart, and Zen 5 (two a cycle) needs 12 to stay
busy at Zen 4's 6 cycles' latency. Zen 4's code on the Intel Xeon VM, 512 tokens, 2 alternated runs: 9.26-9.59 ms
against 9.62-9.67 for 4 rows."""
comptime VALUE_WIDTH = 2 * F32_WIDTH
"""Head dimensions of a row accumulated per pass over a staged value block (two registers)."""
comptime PAIR_LANES = 2 * F32_WIDTH
"""bfloat16 values in one operand of dot_bf16."""


@always_inline
def _block_offsets(page_table: Ptr[DType.int32], table_row: Int, j0: Int, n_keys: Int, page_size: Int,
                   row_len: Int) -> Array[Int, KEY_BLOCK]:
    """token_offset of keys j0 .. j0 + n_keys - 1 (one division per block, not two per key)."""
    var offsets = Array[Int, KEY_BLOCK](fill=0)
    var page, slot = j0 // page_size, j0 % page_size
    for jj in range(n_keys):
        offsets[jj] = (Int(page_table.unsafe_load(table_row + page)) * page_size + slot) * row_len
        slot += 1
        if slot == page_size:
            page, slot = page + 1, 0
    return offsets^


@always_inline
def _head_rows[R: Int](kv_rows: Ptr[DType.int64], at: Int) -> IndexList[R]:
    """Rows kv_rows[at .. at + R - 1]: R rows of one KV head."""
    var rows = IndexList[R](fill=0)
    comptime for r in range(R):
        rows[r] = Int(kv_rows.unsafe_load(at + r))
    return rows


@always_inline
def _pair_sums[n: Int](acc: Array[SIMD[F32, F32_WIDTH], n]) -> SIMD[F32, F32_WIDTH]:
    """Adds neighbouring lanes of the n vectors until one vector holds n groups of F32_WIDTH // n lanes, group i
    summing to acc[i].reduce_add() (n a power of two, at most F32_WIDTH)."""
    comptime if n == 1:
        return acc[0]
    else:
        var half = Array[SIMD[F32, F32_WIDTH], n // 2](fill=0)
        comptime for i in range(n // 2):
            var pair = acc[2 * i].join(acc[2 * i + 1]).deinterleave()
            half[i] = rebind[SIMD[F32, F32_WIDTH]](pair[0] + pair[1])
        return _pair_sums[n // 2](half)


@always_inline
def _group_sums[n: Int, w: Int](v: SIMD[F32, w]) -> SIMD[F32, n]:
    """The sums of v's n groups of w // n adjacent lanes."""
    comptime if w == n:
        return rebind[SIMD[F32, n]](v)
    else:
        var halves = v.deinterleave()
        return _group_sums[n, w // 2](rebind[SIMD[F32, w // 2]](halves[0] + halves[1]))


@always_inline
def _decode_pairs[cache_type: DType](head_dim: Int) -> Bool:
    """Whether keys and values read straight from a bfloat16 cache are multiplied with vdpbf16ps (32 products an
    instruction, nothing widened): the keys against q rounded to bfloat16 pairs (_to_pairs; the staged tiles round q
    so too), the values of two keys interleaved against their softmax weights rounded to a bfloat16 pair. 32
    sequences of 200 keys, Qwen3-0.6B's heads, 2 threads of a Zen 4, fastest of 5 alternated runs: 1.01 ms a layer
    with the scores' pairs against 1.31 with FMAs; medians of 4 alternated runs with the values' pairs too 1.24
    against 1.40 (one sequence of 2,000 keys 0.42 against 0.50)."""
    comptime if BF16_DOT and cache_type == DType.bfloat16:
        return head_dim % PAIR_LANES == 0
    else:
        return False


@always_inline
def _score_tile[dtype: DType, R: Int, K: Int](
    buf: Ptr[F32], rows: IndexList[R], cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK], head_off: Int, jj: Int,
    j0: Int, s_off: Int, last_off: Int, head_dim: Int,
):
    """Scores of block keys jj .. jj + K - 1 for R rows of one KV head (head_off: its place in a cache row),
    MASKED past a row's last visible key. R x K accumulators: each key vector loaded feeds R FMAs (or vdpbf16ps,
    _decode_pairs), each q vector K, and the R x K horizontal sums share one tree of adds."""
    comptime W = F32_WIDTH
    var acc = Array[SIMD[F32, W], R * K](fill=0)
    var vec_end = head_dim - head_dim % W
    if _decode_pairs[dtype](head_dim):
        var words, keys = buf.unsafe_bitcast[UInt32](), cache.unsafe_bitcast[BFloat16]()
        for x in range(0, head_dim, PAIR_LANES):
            var qv = Array[SIMD[DType.bfloat16, PAIR_LANES], R](fill=0)
            comptime for r in range(R):
                qv[r] = bitcast[DType.bfloat16, PAIR_LANES](words.unsafe_load[width=W](rows[r] * head_dim + x // 2))
            comptime for k in range(K):
                var kv = keys.unsafe_load[width=PAIR_LANES](offsets.unsafe_get(jj + k) + head_off + x)
                comptime for r in range(R):
                    acc[r * K + k] = dot_bf16(acc[r * K + k], qv[r], kv)
    else:
        for x in range(0, vec_end, W):
            var qv = Array[SIMD[F32, W], R](fill=0)
            comptime for r in range(R):
                qv[r] = buf.unsafe_load[width=W](rows[r] * head_dim + x)
            comptime for k in range(K):
                var kv = widen[dtype, W](cache, offsets.unsafe_get(jj + k) + head_off + x)
                comptime for r in range(R):
                    acc[r * K + k] = qv[r].fma(kv, acc[r * K + k])
    var sums = _group_sums[R * K, W](_pair_sums[R * K](acc))
    var keys = iota[F32, K](Float32(j0 + jj))
    comptime for r in range(R):
        var s = sums.slice[K, offset=r * K]()
        for x in range(vec_end, head_dim):
            var qx = buf.unsafe_load(rows[r] * head_dim + x)
            comptime for k in range(K):
                s[k] += qx * widen[dtype, 1](cache, offsets.unsafe_get(jj + k) + head_off + x)
        comptime for k in range(K):
            s[k] *= kv_scale(cache, offsets.unsafe_get(jj + k) + head_off, head_dim)
        var visible = keys.le(SIMD[F32, K](buf.unsafe_load(last_off + rows[r])))
        buf.unsafe_store(s_off + rows[r] * KEY_BLOCK + jj, visible.select(s, SIMD[F32, K](MASKED)))


@always_inline
def _value_tile[dtype: DType, R: Int, C: Int, W: Int](
    buf: Ptr[F32], rows: IndexList[R], cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK], head_off: Int, x: Int,
    jj_begin: Int, jj_end: Int, s_off: Int, acc_off: Int, head_dim: Int,
):
    """acc[:, x : x + C * W] += sum over block keys jj_begin .. jj_end - 1 of p[:, key] * V[key] for R rows of one
    KV head: the R x C accumulator vectors stay in registers while the keys' values stream by. With _decode_pairs
    the weights are bfloat16 pairs of adjacent keys (jj_begin even, a pair past jj_end weighs 0) and two keys'
    values, interleaved in registers, feed each vdpbf16ps."""
    var acc = Array[SIMD[F32, W], R * C](fill=0)
    comptime for r in range(R):
        comptime for c in range(C):
            acc[r * C + c] = buf.unsafe_load[width=W](acc_off + rows[r] * head_dim + x + c * W)
    comptime if W == F32_WIDTH:
        if _decode_pairs[dtype](head_dim):
            var words, values = buf.unsafe_bitcast[UInt32](), cache.unsafe_bitcast[BFloat16]()
            for jj in range(jj_begin, jj_end, 2):
                var p = Array[SIMD[DType.bfloat16, PAIR_LANES], R](fill=0)
                comptime for r in range(R):
                    p[r] = bitcast[DType.bfloat16, PAIR_LANES](
                        SIMD[DType.uint32, W](words.unsafe_load(s_off + rows[r] * KEY_BLOCK + jj // 2)))
                var first = offsets.unsafe_get(jj) + head_off + x
                var second = offsets.unsafe_get(jj + 1 if jj + 1 < jj_end else jj) + head_off + x  # weight 0
                comptime for c in range(C):
                    var pairs = rebind[SIMD[DType.bfloat16, PAIR_LANES]](values.unsafe_load[width=W](
                        first + c * W).interleave(values.unsafe_load[width=W](second + c * W)))
                    comptime for r in range(R):
                        acc[r * C + c] = rebind[SIMD[F32, W]](dot_bf16(rebind[SIMD[F32, F32_WIDTH]](acc[r * C + c]),
                                                                       p[r], pairs))
            _store_acc(buf, rows, acc, acc_off, x, head_dim)
            return
    for jj in range(jj_begin, jj_end):
        var at = offsets.unsafe_get(jj) + head_off + x
        var v_scale = kv_scale(cache, offsets.unsafe_get(jj) + head_off, head_dim)
        var p = Array[SIMD[F32, W], R](fill=0)
        comptime for r in range(R):
            p[r] = SIMD[F32, W](buf.unsafe_load(s_off + rows[r] * KEY_BLOCK + jj) * v_scale)
        comptime for c in range(C):
            var v = widen[dtype, W](cache, at + c * W)
            comptime for r in range(R):
                acc[r * C + c] = v.fma(p[r], acc[r * C + c])
    _store_acc(buf, rows, acc, acc_off, x, head_dim)


@always_inline
def _store_acc[R: Int, C: Int, W: Int](buf: Ptr[F32], rows: IndexList[R], acc: Array[SIMD[F32, W], R * C], acc_off: Int,
                                      x: Int, head_dim: Int):
    comptime for r in range(R):
        comptime for c in range(C):
            buf.unsafe_store(acc_off + rows[r] * head_dim + x + c * W, acc[r * C + c])


@always_inline
def _direct_rows[dtype: DType, R: Int, scores: Bool](
    buf: Ptr[F32], rows: IndexList[R], cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK], head_off: Int, j0: Int,
    jj_begin: Int, jj_end: Int, s_off: Int, acc_off: Int, last_off: Int, head_dim: Int,
):
    """Block keys jj_begin .. jj_end - 1 read straight from the cache for R rows of a KV head. scores: their
    scores; else the value step with their weights (0 for keys a row does not see)."""
    comptime W = F32_WIDTH
    comptime TILE = 8 // R  # keys scored, or accumulator vectors held, per row: 8 registers in all
    comptime if scores:
        comptime K = min(TILE, W // R, KEY_GROUP)
        var jj = jj_begin
        while jj + K <= jj_end:
            _score_tile[dtype, R, K](buf, rows, cache, offsets, head_off, jj, j0, s_off, last_off, head_dim)
            jj += K
        while jj < jj_end:
            _score_tile[dtype, R, 1](buf, rows, cache, offsets, head_off, jj, j0, s_off, last_off, head_dim)
            jj += 1
    else:
        var x = 0
        while x + TILE * W <= head_dim:
            _value_tile[dtype, R, TILE, W](buf, rows, cache, offsets, head_off, x, jj_begin, jj_end, s_off, acc_off, head_dim)
            x += TILE * W
        while x + W <= head_dim:
            _value_tile[dtype, R, 1, W](buf, rows, cache, offsets, head_off, x, jj_begin, jj_end, s_off, acc_off, head_dim)
            x += W
        while x < head_dim:
            _value_tile[dtype, R, 1, 1](buf, rows, cache, offsets, head_off, x, jj_begin, jj_end, s_off, acc_off, head_dim)
            x += 1


@always_inline
def _prefetch_head[dtype: DType](cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK], jj_begin: Int, jj_end: Int,
                                 head_off: Int, head_dim: Int):
    """Asks for one KV head's slice of the cache rows of block keys jj_begin .. jj_end - 1, ahead of their use."""
    comptime LINE = 64 // size_of[dtype]()
    var lines = ceildiv(head_dim, LINE)
    for jj in range(jj_begin, jj_end):
        var row = cache.unsafe_offset(offsets.unsafe_get(jj) + head_off)
        for line in range(lines):
            prefetch[PrefetchOptions().for_read().medium_locality()](row.unsafe_offset(line * LINE))


@always_inline
def _direct_block[dtype: DType, scores: Bool](
    buf: Ptr[F32], kv_rows: Ptr[DType.int64], per_head: Int, group_rows: Int, kv_heads: Int, cache: Ptr[dtype],
    offsets: Array[Int, KEY_BLOCK], j0: Int, n_keys: Int, s_off: Int, acc_off: Int, last_off: Int, head_dim: Int,
    next_cache: Ptr[dtype], next_offsets: Array[Int, KEY_BLOCK], next_keys: Int,
):
    """_direct_rows for the block's keys, KEY_GROUP keys (all their KV heads: a stretch of adjacent memory) at a
    time, the rows of each KV head up to four at a time; kv_rows[g * per_head + k] is the k-th row of KV head g.
    The hardware prefetchers do not follow this key-major, head-by-head order: the next group is prefetched,
    one head's slice before each head's work, and the block's last group prefetches the first of the next pass
    (next_cache at next_offsets: the values after the keys, the next block's keys after the values). (One
    burst per group and nothing across passes: decode out of cache took 1.4-1.5x as long.)"""
    for jj in range(0, n_keys, KEY_GROUP):
        var jj_end = min(jj + KEY_GROUP, n_keys)
        for g in range(kv_heads):
            var at, head_off = g * per_head, g * kv_head_len[dtype](head_dim)
            if jj_end < n_keys:
                _prefetch_head(cache, offsets, jj_end, min(jj_end + KEY_GROUP, n_keys), head_off, head_dim)
            else:
                _prefetch_head(next_cache, next_offsets, 0, min(KEY_GROUP, next_keys), head_off, head_dim)
            var k = 0
            while k < group_rows:
                if k + 4 <= group_rows:
                    _direct_rows[dtype, 4, scores](buf, _head_rows[4](kv_rows, at + k), cache, offsets, head_off, j0,
                                                   jj, jj_end, s_off, acc_off, last_off, head_dim)
                    k += 4
                elif k + 2 <= group_rows:
                    _direct_rows[dtype, 2, scores](buf, _head_rows[2](kv_rows, at + k), cache, offsets, head_off, j0,
                                                   jj, jj_end, s_off, acc_off, last_off, head_dim)
                    k += 2
                else:
                    _direct_rows[dtype, 1, scores](buf, _head_rows[1](kv_rows, at + k), cache, offsets, head_off, j0,
                                                   jj, jj_end, s_off, acc_off, last_off, head_dim)
                    k += 1


@always_inline
def _rescale(acc: Ptr[F32], acc_off: Int, keep: Float32, n: Int):
    var i = 0
    while i + F32_WIDTH <= n:
        acc.unsafe_store(acc_off + i, acc.unsafe_load[width=F32_WIDTH](acc_off + i) * keep)
        i += F32_WIDTH
    while i < n:
        acc.unsafe_store(acc_off + i, acc.unsafe_load(acc_off + i) * keep)
        i += 1


@always_inline
def _copy_row[dtype: DType](dst: Ptr[F32], dst_off: Int, src: Ptr[dtype], src_off: Int, n: Int, scale: Float32 = 1):
    """dst[dst_off + i] = src[src_off + i] * scale as float32, vectorized (a scalar bfloat16 cast costs ~1 ns)."""
    var i = 0
    while i + F32_WIDTH <= n:
        dst.unsafe_store(dst_off + i, widen[dtype, F32_WIDTH](src, src_off + i) * scale)
        i += F32_WIDTH
    while i < n:
        dst.unsafe_store(dst_off + i, widen[dtype, 1](src, src_off + i) * scale)
        i += 1


@always_inline
def _write_row[dtype: DType](dst: Ptr[dtype], dst_off: Int, src: Ptr[F32], src_off: Int, n: Int, scale: Float32):
    """dst[dst_off + i] = src[src_off + i] * scale in dst's dtype, vectorized: a row of the attention output."""
    var i = 0
    while i + F32_WIDTH <= n:
        dst.unsafe_store(dst_off + i, narrow[dtype, F32_WIDTH](src.unsafe_load[width=F32_WIDTH](src_off + i) * scale))
        i += F32_WIDTH
    while i < n:
        dst.unsafe_store(dst_off + i, narrow[dtype, 1](src.unsafe_load(src_off + i) * scale))
        i += 1


@always_inline
def _stage_head[dtype: DType](
    buf: Ptr[F32], kt: Int, vb: Int, k_cache: Ptr[dtype], v_cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK],
    n_keys: Int, head_off: Int, head_dim: Int,
):
    """One KV head's slice of a key block staged in float32, times the rows' scales, zeros past n_keys: K transposed
    at kt ([head_dim, KEY_BLOCK]), F32_WIDTH keys by F32_WIDTH dimensions transposed in registers, V at vb
    ([KEY_BLOCK, head_dim]). Each head is staged just before its rows use it, where the last one was (in L1). Staging
    the whole block first with a store per key element was a fifth of the attention's time (perf): Qwen3-0.6B's
    heads, one prompt of 512 (2,048) tokens, Intel Xeon without AMX, best of 4 alternated runs, 7.48 -> 5.52 ms (96.1
    -> 71.6); its AVX2 code 13.9 -> 12.0 (188 -> 159)."""
    comptime W = F32_WIDTH
    var vec_end = head_dim - head_dim % W
    for j0 in range(0, KEY_BLOCK, W):
        var keys = min(W, max(0, n_keys - j0))
        for x in range(0, vec_end, W):
            var rows = Array[SIMD[F32, W], W](fill=0)
            comptime for j in range(W):
                if j < keys:
                    var at = offsets.unsafe_get(j0 + j) + head_off
                    rows[j] = widen[dtype, W](k_cache, at + x) * kv_scale(k_cache, at, head_dim)
            var columns = transpose_block(rows)
            comptime for d in range(W):
                buf.unsafe_store(kt + (x + d) * KEY_BLOCK + j0, columns[d])
        for x in range(vec_end, head_dim):
            for j in range(W):
                var value = Float32(0)
                if j < keys:
                    var at = offsets.unsafe_get(j0 + j) + head_off
                    value = widen[dtype, 1](k_cache, at + x)[0] * kv_scale(k_cache, at, head_dim)
                buf.unsafe_store(kt + x * KEY_BLOCK + j0 + j, value)
    for jj in range(KEY_BLOCK):
        if jj < n_keys:
            var at = offsets.unsafe_get(jj) + head_off
            _copy_row[dtype](buf, vb + jj * head_dim, v_cache, at, head_dim, kv_scale(v_cache, at, head_dim))
        else:
            zero_f32(buf, vb + jj * head_dim, head_dim)


@always_inline
def _block_scores(buf: Ptr[F32], q_off: Int, kt_off: Int, head_dim: Int) -> SIMD[F32, KEY_BLOCK]:
    """q . K[j] for the block's staged, transposed keys: no horizontal sums."""
    var acc = SIMD[F32, KEY_BLOCK](0)  # a wide vector: the compiler splits it into native registers
    for x in range(head_dim):
        acc += buf.unsafe_load[width=KEY_BLOCK](kt_off + x * KEY_BLOCK) * buf.unsafe_load(q_off + x)
    return acc


@always_inline
def _block_values(buf: Ptr[F32], acc_off: Int, keep: Float32, p_off: Int, vb_off: Int, head_dim: Int):
    """acc = acc * keep + sum_j p[j] * V[j] over the staged block, one register-held slice of acc at a time."""
    var x = 0
    while x + F32_WIDTH <= head_dim:
        var a = buf.unsafe_load[width=F32_WIDTH](acc_off + x) * keep
        for j in range(KEY_BLOCK):
            a += buf.unsafe_load[width=F32_WIDTH](vb_off + j * head_dim + x) * buf.unsafe_load(p_off + j)
        buf.unsafe_store(acc_off + x, a)
        x += F32_WIDTH
    while x < head_dim:
        var a = buf.unsafe_load(acc_off + x) * keep
        for j in range(KEY_BLOCK):
            a += buf.unsafe_load(vb_off + j * head_dim + x) * buf.unsafe_load(p_off + j)
        buf.unsafe_store(acc_off + x, a)
        x += 1


@always_inline
def _rows_block[R: Int](buf: Ptr[F32], rows: IndexList[R], j0: Int, n_keys: Int, kt_off: Int, vb_off: Int, s_off: Int,
                        acc_off: Int, m_off: Int, l_off: Int, last_off: Int, head_dim: Int):
    """One staged key block for R rows that share a KV head: every key or value vector loaded feeds R FMAs (one row
    at a time, each load feeds one). head_dim must be a multiple of VALUE_WIDTH."""
    var scores = Array[SIMD[F32, KEY_BLOCK], R](fill=0)
    for x in range(head_dim):
        var k = buf.unsafe_load[width=KEY_BLOCK](kt_off + x * KEY_BLOCK)
        comptime for r in range(R):
            scores[r] += k * buf.unsafe_load(rows[r] * head_dim + x)
    var keep = Array[Float32, R](fill=1)
    comptime for r in range(R):
        var p, kept = register_weights(scores[r], j0, n_keys, Int(buf.unsafe_load(last_off + rows[r])), buf,
                                       m_off + rows[r], l_off + rows[r])
        buf.unsafe_store(s_off + rows[r] * KEY_BLOCK, p)
        keep[r] = kept
    for x in range(0, head_dim, VALUE_WIDTH):
        var acc = Array[SIMD[F32, VALUE_WIDTH], R](fill=0)
        comptime for r in range(R):
            acc[r] = buf.unsafe_load[width=VALUE_WIDTH](acc_off + rows[r] * head_dim + x) * keep[r]
        for j in range(KEY_BLOCK):
            var v = buf.unsafe_load[width=VALUE_WIDTH](vb_off + j * head_dim + x)
            comptime for r in range(R):
                acc[r] += v * buf.unsafe_load(s_off + rows[r] * KEY_BLOCK + j)
        comptime for r in range(R):
            buf.unsafe_store(acc_off + rows[r] * head_dim + x, acc[r])


@always_inline
def _to_pairs(buf: Ptr[F32], off: Int, n: Int):
    """buf[off : off + n] rounded to bfloat16 in place, as n / 2 words of pairs from off on (n a multiple of
    PAIR_LANES)."""
    var words = buf.unsafe_bitcast[UInt32]()
    for x in range(0, n, PAIR_LANES):  # each chunk is read before the words land on it or before it
        var rounded = narrow[DType.bfloat16, PAIR_LANES](buf.unsafe_load[width=PAIR_LANES](off + x))
        words.unsafe_store(off + x // 2, bitcast[DType.uint32, F32_WIDTH](rounded))


@always_inline
def _stage_pairs[dtype: DType](
    words: Ptr[DType.uint32], k_cache: Ptr[dtype], v_cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK], n_keys: Int,
    kv_heads: Int, head_dim: Int, kt_off: Int, vb_off: Int,
):
    """The block of a bfloat16 cache staged for dot_bf16, per KV head g: K at kt_off + g * head_dim * KEY_BLOCK as
    [head_dim / 2, KEY_BLOCK] words, each a key's pair of adjacent dimensions, transposed in registers (with a store
    per word, Zen 4's code on an Intel Xeon took 1.1x the time over 512 and 2,048 keys); V as _stage_value_pairs.
    Zeros for keys past n_keys."""
    comptime W = F32_WIDTH
    var k_words = k_cache.unsafe_bitcast[UInt32]()
    for g in range(kv_heads):
        var kt = kt_off + g * head_dim * KEY_BLOCK
        for j0 in range(0, KEY_BLOCK, W):
            var keys = min(W, max(0, n_keys - j0))
            for d2 in range(0, head_dim // 2, W):  # W keys by W pairs, transposed in registers
                var rows = Array[SIMD[DType.uint32, W], W](fill=0)
                comptime for j in range(W):
                    if j < keys:
                        rows[j] = k_words.unsafe_load[width=W]((offsets.unsafe_get(j0 + j) + g * head_dim) // 2 + d2)
                var columns = transpose_block(rows)
                comptime for d in range(W):
                    words.unsafe_store(kt + (d2 + d) * KEY_BLOCK + j0, columns[d])
    _stage_value_pairs(words, v_cache, offsets, n_keys, kv_heads, head_dim, vb_off)


@always_inline
def _stage_value_pairs[dtype: DType](
    words: Ptr[DType.uint32], v_cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK], n_keys: Int, kv_heads: Int,
    head_dim: Int, vb_off: Int,
):
    """The block's values of a bfloat16 cache staged in pairs, per KV head g at vb_off + g * KEY_BLOCK * head_dim as
    [KEY_BLOCK / 2, head_dim] words, each a dimension's pair of adjacent keys (AMX's layout of weights too). Zeros
    for keys past n_keys."""
    var v_bits = v_cache.unsafe_bitcast[UInt16]()
    for jp in range(KEY_BLOCK // 2):
        var j = 2 * jp
        for g in range(kv_heads):
            var vb = vb_off + g * KEY_BLOCK * head_dim + jp * head_dim
            for x in range(0, head_dim, F32_WIDTH):
                var v0, v1 = SIMD[DType.uint16, F32_WIDTH](0), SIMD[DType.uint16, F32_WIDTH](0)
                if j < n_keys:
                    v0 = v_bits.unsafe_load[width=F32_WIDTH](offsets.unsafe_get(j) + g * head_dim + x)
                if j + 1 < n_keys:
                    v1 = v_bits.unsafe_load[width=F32_WIDTH](offsets.unsafe_get(j + 1) + g * head_dim + x)
                words.unsafe_store(vb + x, bitcast[DType.uint32, F32_WIDTH](v0.interleave(v1)))


@always_inline
def _pair_rows[R: Int](buf: Ptr[F32], rows: IndexList[R], j0: Int, n_keys: Int, kt: Int, vb: Int, s_off: Int,
                       acc_off: Int, m_off: Int, l_off: Int, last_off: Int, head_dim: Int):
    """_rows_block over a block staged in pairs (_stage_pairs) for R rows of a KV head, each row's q held as
    pairs at its start: each staged vector loaded feeds R vdpbf16ps. head_dim must be a multiple of VALUE_WIDTH."""
    comptime KV = KEY_BLOCK // F32_WIDTH
    var words = buf.unsafe_bitcast[UInt32]()
    var scores = Array[SIMD[F32, F32_WIDTH], R * KV](fill=0)
    for d2 in range(head_dim // 2):
        var k = Array[SIMD[DType.bfloat16, PAIR_LANES], KV](fill=0)
        comptime for v in range(KV):
            k[v] = bitcast[DType.bfloat16, PAIR_LANES](words.unsafe_load[width=F32_WIDTH](kt + d2 * KEY_BLOCK + v * F32_WIDTH))
        comptime for r in range(R):
            var q = bitcast[DType.bfloat16, PAIR_LANES](SIMD[DType.uint32, F32_WIDTH](words.unsafe_load(rows[r] * head_dim + d2)))
            comptime for v in range(KV):
                scores[r * KV + v] = dot_bf16(scores[r * KV + v], q, k[v])
    var keep = Array[Float32, R](fill=1)
    comptime for r in range(R):
        var row = SIMD[F32, KEY_BLOCK](0)
        comptime for v in range(KV):
            row = row.insert[offset=v * F32_WIDTH](scores[r * KV + v])
        var p, kept = register_weights(row, j0, n_keys, Int(buf.unsafe_load(last_off + rows[r])), buf,
                                       m_off + rows[r], l_off + rows[r])
        var pairs = narrow[DType.bfloat16, KEY_BLOCK](p)  # the value step's weights, as _to_pairs leaves them
        words.unsafe_store(s_off + rows[r] * KEY_BLOCK, bitcast[DType.uint32, KEY_BLOCK // 2](pairs))
        keep[r] = kept
    for x in range(0, head_dim, VALUE_WIDTH):
        var acc = Array[SIMD[F32, F32_WIDTH], 2 * R](fill=0)
        comptime for r in range(R):
            comptime for c in range(2):
                acc[2 * r + c] = buf.unsafe_load[width=F32_WIDTH](acc_off + rows[r] * head_dim + x + c * F32_WIDTH) * keep[r]
        for jp in range(KEY_BLOCK // 2):
            var v0 = bitcast[DType.bfloat16, PAIR_LANES](words.unsafe_load[width=F32_WIDTH](vb + jp * head_dim + x))
            var v1 = bitcast[DType.bfloat16, PAIR_LANES](words.unsafe_load[width=F32_WIDTH](vb + jp * head_dim + x + F32_WIDTH))
            comptime for r in range(R):
                var p = bitcast[DType.bfloat16, PAIR_LANES](SIMD[DType.uint32, F32_WIDTH](
                    words.unsafe_load(s_off + rows[r] * KEY_BLOCK + jp)))
                acc[2 * r] = dot_bf16(acc[2 * r], p, v0)
                acc[2 * r + 1] = dot_bf16(acc[2 * r + 1], p, v1)
        comptime for r in range(R):
            comptime for c in range(2):
                buf.unsafe_store(acc_off + rows[r] * head_dim + x + c * F32_WIDTH, acc[2 * r + c])


@always_inline
def _merge_splits[dtype: DType](
    output: Ptr[dtype], dst: Int, partial: Ptr[F32], first: Int, stride: Int, acc_at: Int, m_at: Int, l_at: Int,
    splits: Int, n: Int,
):
    """Writes output[dst ..< dst + n] from the partial softmax states of one row's splits of the keys: split s keeps
    its unnormalized accumulator at partial[first + s * stride + acc_at:], its running max at
    partial[first + s * stride + m_at] and its sum at partial[first + s * stride + l_at]. Split 0's accumulator is
    overwritten."""
    var m = Float32.MIN
    for s in range(splits):
        m = max(m, partial.unsafe_load(first + s * stride + m_at))
    # one exp per split, not per element: the splits' accumulators are summed into split 0's (scratch)
    var total = Float32(0)
    for s in range(splits):
        var at = first + s * stride
        var weight = exp(partial.unsafe_load(at + m_at) - m)
        total += partial.unsafe_load(at + l_at) * weight
        for x in range(n):
            var scaled = partial.unsafe_load(at + acc_at + x) * weight
            if s > 0:
                scaled += partial.unsafe_load(first + acc_at + x)
            partial.unsafe_store(first + acc_at + x, scaled)
    for x in range(n):
        output.unsafe_store(dst + x, (partial.unsafe_load(first + acc_at + x) / total).cast[dtype]())


def attention_cpu[dtype: DType, cache_type: DType](
    output: Ptr[dtype], q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], page_table: Ptr[DType.int32],
    context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Float32,
    batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
) raises:
    """Work item: a tile of up to QUERY_TILE (or LONG_QUERY_TILE) queries of one sequence, all heads (rows = query x head), over
    one split of its keys. All heads of a key are adjacent in the cache, so an item streams through memory.
    When there are fewer tiles than twice the workers (decode of a few sequences), the keys are split, about 2 items a
    worker of a key block or more, and partial softmax states merged. The workers claim items in turn, so one that
    starts late takes fewer. Qwen3-0.6B's batch-1 decode over ~240 keys in the model graph, int8 weights, Intel Xeon VM,
    2 cores: 70 µs a layer in 4 splits, against 100 as one item on one worker when splits were 4 key blocks or more
    (and handed out round-robin); over ~100 keys 40 µs in 3 splits against 48 as one item."""
    var group = q_heads // kv_heads
    var head_len = kv_head_len[cache_type](head_dim)
    var row_len = kv_heads * head_len  # one token's K (or V) for all heads
    var tiles = List[Int]()  # (sequence, first query) of every tile, flattened
    var max_context = 0
    var max_tile = 1  # queries in the largest tile: sizes the per-row buffers (decode needs one query's worth)
    var workers = num_logical_cores()
    var query_tile = QUERY_TILE
    if Int(query_start.unsafe_load(batch)) - Int(query_start.unsafe_load(0)) >= LONG_TILES_PER_WORKER * LONG_QUERY_TILE * workers:
        query_tile = LONG_QUERY_TILE
    for b in range(batch):
        var q_len = Int(query_start.unsafe_load(b + 1)) - Int(query_start.unsafe_load(b))
        var context = Int(context_lens.unsafe_load(b))
        if q_len > context:
            raise Error("paged_attention: sequence ", b, " has ", q_len, " queries but a context of only ", context, " tokens")
        max_context = max(max_context, context)
        max_tile = max(max_tile, min(q_len, query_tile))
        for i in range(0, q_len, query_tile):
            tiles.append(b)
            tiles.append(i)
    var num_tiles = len(tiles) // 2
    var splits = 1
    if num_tiles < 2 * workers:
        splits = max(1, min(ceildiv(2 * workers, num_tiles), max_context // KEY_BLOCK))
    var num_items = num_tiles * splits
    workers = min(workers, num_items)
    var rows = max_tile * q_heads
    var state_len = rows * (head_dim + 2)  # a split's partial result: acc [rows, D], m [rows], l [rows]
    var partial = List[Float32](length=num_items * state_len if splits > 1 else 0, fill=0)
    var claimed = List[Int64](length=8, fill=0)  # items handed out so far
    var claim_at = Int(claimed.unsafe_ptr())
    var tile_ptr = tiles.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    var part_ptr = list_ptr(partial)
    var amx = False  # staged tiles of AMX_ROWS rows a KV head or more score and sum on AMX tiles (cpu_amx.mojo)
    comptime if cache_type == DType.bfloat16:
        amx = head_dim % AMX_BLOCK == 0 and use_amx[DType.bfloat16](max_tile * group, 0)

    def worker(w: Int) {var output, var q, var k_cache, var v_cache, var page_table, var context_lens, var query_start,
                        var scale, var max_pages, var q_heads, var head_dim, var page_size, var group, var row_len, var max_tile,
                        var tile_ptr, var part_ptr, var num_items, var rows, var splits, var state_len,
                        var query_tile, var head_len, var amx, var claim_at}:
        # per row: scaled q [D], accumulator [D], running max, running sum, last visible key, scores [KEY_BLOCK];
        # then the key block staged: K transposed per head [Hkv, D, KEY_BLOCK], V per head [Hkv, KEY_BLOCK, D] (in
        # float32 one head at a time, in the first head's place)
        var kv_heads = row_len // head_len
        var stage_len = kv_heads * head_dim * KEY_BLOCK if max_tile * group >= STAGE_MIN_ROWS else 0  # decode: none
        var per_head = max_tile * group  # rows per KV head in the largest tile
        var plain_len = rows * (2 * head_dim + 3 + KEY_BLOCK) + 2 * stage_len
        var scratch = AmxScratch(kv_heads, per_head, head_dim, plain_len)
        var buffers = List[Float32](length=scratch.end if amx else plain_len, fill=0)
        var buf = list_ptr(buffers)
        # the k-th row of KV head g: query k // group, query head g * group + k % group (a table: divisions
        # cost in the key loops)
        var kv_row_list = List[Int64](length=kv_heads * per_head, fill=0)
        var kv_rows = list_ptr(kv_row_list)
        for g in range(kv_heads):
            for k in range(per_head):
                kv_rows.unsafe_store(g * per_head + k, Int64((k // group) * q_heads + g * group + k % group))
        var acc_off, m_off = rows * head_dim, 2 * rows * head_dim
        var l_off, last_off, s_off = m_off + rows, m_off + 2 * rows, m_off + 3 * rows
        var kt_off = s_off + rows * KEY_BLOCK
        var vb_off = kt_off + stage_len
        if amx:
            configure_tiles()
        while True:  # items claimed in turn: a worker that starts late, or has cheaper tiles, takes fewer
            var item = claim_next(claim_at)
            if item >= num_items:
                break
            var tile = item // splits
            var split = item % splits
            var b = tile_ptr.unsafe_load(2 * tile)
            var first = tile_ptr.unsafe_load(2 * tile + 1)
            var q_begin = Int(query_start.unsafe_load(b))
            var q_len = Int(query_start.unsafe_load(b + 1)) - q_begin
            var context = Int(context_lens.unsafe_load(b))
            var n_queries = min(query_tile, q_len - first)
            var n_rows = n_queries * q_heads
            var n_visible = context - q_len + first + n_queries  # keys seen by the tile's last query
            var per_split = ceildiv(ceildiv(n_visible, splits), KEY_BLOCK) * KEY_BLOCK
            var k_begin = min(split * per_split, n_visible)
            var k_end = min(k_begin + per_split, n_visible)
            for r in range(n_rows):
                var src = ((q_begin + first + r // q_heads) * q_heads + r % q_heads) * head_dim
                _copy_row[dtype](buf, r * head_dim, q, src, head_dim, scale)
                zero_f32(buf, acc_off + r * head_dim, head_dim)
                buf.unsafe_store(m_off + r, MASKED)
                buf.unsafe_store(l_off + r, 0)
                buf.unsafe_store(last_off + r, Float32(context - q_len + first + r // q_heads))
            if n_queries * group >= STAGE_MIN_ROWS and amx and n_queries * group >= AMX_ROWS:
                var group_rows = n_queries * group
                amx_stage_q(buf, scratch, kv_rows, per_head, group_rows, kv_heads, head_dim, last_off)
                for j0 in range(k_begin, k_end, KEY_BLOCK):
                    var n_keys = min(KEY_BLOCK, k_end - j0)
                    var offsets = _block_offsets(page_table, b * max_pages, j0, n_keys, page_size, row_len)
                    amx_stage_keys(buf, kt_off, k_cache, offsets, n_keys, kv_heads, head_dim)
                    _stage_value_pairs(buf.unsafe_bitcast[UInt32](), v_cache, offsets, n_keys, kv_heads, head_dim, vb_off)
                    for g in range(kv_heads):
                        amx_head_block(buf, scratch, g, group_rows, j0, n_keys, kt_off + g * KEY_BLOCK * head_dim // 2,
                                       vb_off + g * KEY_BLOCK * head_dim, head_dim)
                amx_state_back(buf, scratch, kv_rows, per_head, group_rows, kv_heads, head_dim, acc_off, m_off, l_off)
            elif n_queries * group >= STAGE_MIN_ROWS:  # enough rows per head to pay for staging the keys
                var pairs = False
                comptime if BF16_DOT and cache_type == DType.bfloat16:
                    pairs = head_dim % VALUE_WIDTH == 0
                if pairs:
                    for r in range(n_rows):
                        _to_pairs(buf, r * head_dim, head_dim)
                for j0 in range(k_begin, k_end, KEY_BLOCK):
                    var n_keys = min(KEY_BLOCK, k_end - j0)
                    var offsets = _block_offsets(page_table, b * max_pages, j0, n_keys, page_size, row_len)
                    var group_rows = n_queries * group
                    if pairs:
                        _stage_pairs(buf.unsafe_bitcast[UInt32](), k_cache, v_cache, offsets, n_keys, kv_heads, head_dim,
                                     kt_off, vb_off)
                        for g in range(kv_heads):
                            var kt, vb = kt_off + g * head_dim * KEY_BLOCK, vb_off + g * KEY_BLOCK * head_dim
                            var at = g * per_head
                            var k = 0
                            while k + BLOCK_ROWS <= group_rows:
                                _pair_rows(buf, _head_rows[BLOCK_ROWS](kv_rows, at + k), j0, n_keys, kt, vb, s_off,
                                           acc_off, m_off, l_off, last_off, head_dim)
                                k += BLOCK_ROWS
                            for kk in range(k, group_rows):
                                _pair_rows(buf, _head_rows[1](kv_rows, at + kk), j0, n_keys, kt, vb, s_off, acc_off,
                                           m_off, l_off, last_off, head_dim)
                        continue
                    for g in range(kv_heads):  # each head staged where the last one was: it stays in L1
                        _stage_head[cache_type](buf, kt_off, vb_off, k_cache, v_cache, offsets, n_keys, g * head_len,
                                                head_dim)
                        var at = g * per_head
                        var k = 0
                        if head_dim % VALUE_WIDTH == 0:
                            while k + BLOCK_ROWS <= group_rows:
                                _rows_block(buf, _head_rows[BLOCK_ROWS](kv_rows, at + k), j0, n_keys, kt_off, vb_off,
                                            s_off, acc_off, m_off, l_off, last_off, head_dim)
                                k += BLOCK_ROWS
                        while k < group_rows:
                            var r = Int(kv_rows.unsafe_load(at + k))
                            k += 1
                            var last = Int(buf.unsafe_load(last_off + r))
                            if j0 > last:  # no visible key in this block
                                continue
                            var p, keep = register_weights(_block_scores(buf, r * head_dim, kt_off, head_dim), j0,
                                                           n_keys, last, buf, m_off + r, l_off + r)
                            buf.unsafe_store(s_off + r * KEY_BLOCK, p)
                            _block_values(buf, acc_off + r * head_dim, keep, s_off + r * KEY_BLOCK, vb_off, head_dim)
            else:
                var group_rows = n_queries * group
                if _decode_pairs[cache_type](head_dim):
                    for r in range(n_rows):
                        _to_pairs(buf, r * head_dim, head_dim)
                var next_offsets = _block_offsets(page_table, b * max_pages, k_begin, min(KEY_BLOCK, k_end - k_begin),
                                                  page_size, row_len)
                for j0 in range(k_begin, k_end, KEY_BLOCK):
                    var n_keys = min(KEY_BLOCK, k_end - j0)
                    var next_keys = max(0, min(KEY_BLOCK, k_end - j0 - KEY_BLOCK))
                    var offsets = next_offsets^
                    next_offsets = _block_offsets(page_table, b * max_pages, j0 + KEY_BLOCK, next_keys, page_size, row_len)
                    _direct_block[cache_type, True](buf, kv_rows, per_head, group_rows, kv_heads, k_cache, offsets, j0, n_keys,
                                               s_off, acc_off, last_off, head_dim, v_cache, offsets, n_keys)
                    for r in range(n_rows):
                        if Float32(j0) <= buf.unsafe_load(last_off + r):
                            var keep = softmax_block(buf, s_off + r * KEY_BLOCK, n_keys, m_off + r, l_off + r)
                            _rescale(buf, acc_off + r * head_dim, keep, head_dim)
                        else:  # no visible key in this block: weights 0
                            for jj in range(n_keys):
                                buf.unsafe_store(s_off + r * KEY_BLOCK + jj, 0)
                        if _decode_pairs[cache_type](head_dim):  # the value step's weights as pairs of keys
                            if n_keys % 2 == 1:
                                buf.unsafe_store(s_off + r * KEY_BLOCK + n_keys, 0)
                            _to_pairs(buf, s_off + r * KEY_BLOCK, KEY_BLOCK)
                    _direct_block[cache_type, False](buf, kv_rows, per_head, group_rows, kv_heads, v_cache, offsets, j0, n_keys,
                                                s_off, acc_off, last_off, head_dim, k_cache, next_offsets, next_keys)
            if splits == 1:
                for r in range(n_rows):
                    var inv = 1 / buf.unsafe_load(l_off + r)
                    var dst = ((q_begin + first + r // q_heads) * q_heads + r % q_heads) * head_dim
                    _write_row[dtype](output, dst, buf, acc_off + r * head_dim, head_dim, inv)
            else:
                var part = item * state_len
                for r in range(n_rows):
                    for x in range(head_dim):
                        part_ptr.unsafe_store(part + r * head_dim + x, buf.unsafe_load(acc_off + r * head_dim + x))
                    part_ptr.unsafe_store(part + rows * head_dim + r, buf.unsafe_load(m_off + r))
                    part_ptr.unsafe_store(part + rows * head_dim + rows + r, buf.unsafe_load(l_off + r))
        if amx:
            release_tiles()
        _ = buffers^  # keep the buffers alive until here: only their pointers are used above
        _ = kv_row_list^

    fork_join(worker, workers)
    if splits > 1:
        for tile in range(num_tiles):
            var b = tile_ptr.unsafe_load(2 * tile)
            var first = tile_ptr.unsafe_load(2 * tile + 1)
            var q_begin = Int(query_start.unsafe_load(b))
            var n_queries = min(query_tile, Int(query_start.unsafe_load(b + 1)) - q_begin - first)
            for r in range(n_queries * q_heads):
                var dst = ((q_begin + first + r // q_heads) * q_heads + r % q_heads) * head_dim
                _merge_splits(output, dst, part_ptr, tile * splits * state_len, state_len, r * head_dim,
                              rows * head_dim + r, rows * head_dim + rows + r, splits, head_dim)
    _ = tiles^
    _ = partial^
    _ = claimed^
