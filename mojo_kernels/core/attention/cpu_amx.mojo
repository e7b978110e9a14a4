# Prefill attention on AMX tiles (core/linear_amx.mojo) over a bfloat16 cache, for a tile's rows of each KV head,
# 32 at a time, and a block of 32 keys:
# - the scores come transposed, keys x rows: the block's key rows (copied from the cache, no transposition) against
#   the rows' q staged once per tile as dimension pairs (q rounded to bfloat16, as the vdpbf16ps path does);
# - so the online softmax runs down the keys with a row in each lane: no horizontal sums, one exp per 16 rows for
#   the rescale factor;
# - the weights, rounded to bfloat16, are turned into rows of key pairs (a 16 x 16 word transposition in registers)
#   and summed against the block's values staged in key pairs (cpu.mojo's _stage_value_pairs) into the rows'
#   float32 accumulators, loaded into the tiles and stored back; a row's running max moves only by more than
#   MAX_SLACK, so the accumulators are seldom rescaled.
from std.math import exp, iota
from std.memory import bitcast

from ..linear_amx import AMX_BLOCK, AMX_ROWS, amx_k, amx_load, amx_rows, amx_steps, amx_store, amx_zero
from ...utils.types import narrow, zero_f32, F32, F32_WIDTH, Ptr
from .cpu_softmax import KEY_BLOCK, MASKED

comptime BF16 = DType.bfloat16
comptime WORDS = SIMD[DType.uint32, F32_WIDTH]
comptime MAX_SLACK = Float32(8)
"""A row's running max m stays while its block maxima exceed it by at most this: its weights exp(s - m) reach e^8
at most (float32 holds them and their sums), and its accumulator, rescaled only when m moves, is seldom touched
outside the tiles."""


struct AmxScratch(ImplicitlyCopyable):
    """Where a worker keeps, in its float32 buffer from `at` on: q per KV head as dimension pairs [kv_heads,
    head_dim / 2, padded] words (padded: amx_rows(per_head) rows); each row's running max, sum and last visible
    key [kv_heads, padded]; its accumulator [kv_heads, padded, head_dim]; a block's scores [32 keys, 32 rows],
    weights as key pairs [32 rows, 16] words, and its rows' rescale factors [32]."""

    var padded: Int
    var qt: Int
    var m: Int
    var l: Int
    var last: Int
    var acc: Int
    var s: Int
    var p: Int
    var keep: Int
    var end: Int

    def __init__(out self, kv_heads: Int, per_head: Int, head_dim: Int, at: Int):
        self.padded = amx_rows(per_head)
        var state = kv_heads * self.padded
        self.qt = at
        self.m = self.qt + state * head_dim // 2
        self.l = self.m + state
        self.last = self.l + state
        self.acc = self.last + state
        self.s = self.acc + state * head_dim
        self.p = self.s + AMX_BLOCK * AMX_BLOCK
        self.keep = self.p + AMX_BLOCK * AMX_BLOCK // 2
        self.end = self.keep + AMX_BLOCK


@always_inline
def transpose_block[dtype: DType](
    rows: Array[SIMD[dtype, F32_WIDTH], F32_WIDTH]
) -> Array[SIMD[dtype, F32_WIDTH], F32_WIDTH]:
    """A F32_WIDTH x F32_WIDTH block transposed in registers: log2(F32_WIDTH) rounds, each interleaving row i with row
    i + F32_WIDTH / 2 (a round rotates the bits of an element's flat index by one)."""
    comptime HALF = F32_WIDTH // 2
    comptime ROUNDS = 4 if F32_WIDTH == 16 else (3 if F32_WIDTH == 8 else 2)
    var a = rows.copy()
    comptime for _ in range(ROUNDS):
        var b = Array[SIMD[dtype, F32_WIDTH], F32_WIDTH](fill=0)
        comptime for i in range(HALF):
            var z = a[i].interleave(a[i + HALF])
            b[2 * i] = z.slice[F32_WIDTH, offset=0]()
            b[2 * i + 1] = z.slice[F32_WIDTH, offset=F32_WIDTH]()
        a = b^
    return a^


@always_inline
def _pair_words(buf: Ptr[F32], at: Int) -> WORDS:
    """buf[at : at + 2 * F32_WIDTH] rounded to bfloat16, as F32_WIDTH words of adjacent pairs."""
    return bitcast[DType.uint32, F32_WIDTH](narrow[BF16, 2 * F32_WIDTH](buf.unsafe_load[width=2 * F32_WIDTH](at)))


def amx_stage_q(buf: Ptr[F32], sc: AmxScratch, kv_rows: Ptr[DType.int64], per_head: Int, group_rows: Int,
                kv_heads: Int, head_dim: Int, last_off: Int):
    """The tile's rows of each KV head (row r's scaled float32 q at buf[r * head_dim], its last visible key at
    buf[last_off + r]) into the scratch: q as dimension pairs, zero columns past group_rows; running max MASKED,
    sum 0, accumulator 0, and last visible key (-1 past group_rows: they see none)."""
    var words = buf.unsafe_bitcast[UInt32]()
    for g in range(kv_heads):
        var qt = sc.qt + g * head_dim // 2 * sc.padded
        for k0 in range(0, amx_rows(group_rows), F32_WIDTH):
            for d0 in range(0, head_dim, 2 * F32_WIDTH):
                var rows = Array[WORDS, F32_WIDTH](fill=0)
                comptime for i in range(F32_WIDTH):
                    if k0 + i < group_rows:
                        rows[i] = _pair_words(buf, Int(kv_rows.unsafe_load(g * per_head + k0 + i)) * head_dim + d0)
                var cols = transpose_block(rows)
                comptime for i in range(F32_WIDTH):
                    words.unsafe_store(qt + (d0 // 2 + i) * sc.padded + k0, cols[i])
        for k in range(sc.padded):
            var at = g * sc.padded + k
            var last = Float32(-1)
            if k < group_rows:
                last = buf.unsafe_load(last_off + Int(kv_rows.unsafe_load(g * per_head + k)))
            buf.unsafe_store(sc.m + at, MASKED)
            buf.unsafe_store(sc.l + at, 0)
            buf.unsafe_store(sc.last + at, last)
            zero_f32(buf, sc.acc + at * head_dim, head_dim)


def amx_stage_keys[dtype: DType](
    buf: Ptr[F32], kt_off: Int, k_cache: Ptr[dtype], offsets: Array[Int, KEY_BLOCK], n_keys: Int, kv_heads: Int,
    head_dim: Int,
):
    """The block's key rows, per KV head g at kt_off + g * KEY_BLOCK * head_dim / 2 words as [KEY_BLOCK, head_dim]
    bfloat16 (zeros past n_keys), the cache's bits as they are (a bfloat16 cache: cpu.mojo runs no other here)."""
    var keys = buf.unsafe_bitcast[UInt16]()
    var cache = k_cache.unsafe_bitcast[UInt16]()
    comptime LANES = 2 * F32_WIDTH
    for g in range(kv_heads):
        var kt = 2 * kt_off + g * KEY_BLOCK * head_dim
        for jj in range(KEY_BLOCK):
            for x in range(0, head_dim, LANES):
                var v = SIMD[DType.uint16, LANES](0)
                if jj < n_keys:
                    v = cache.unsafe_load[width=LANES](offsets.unsafe_get(jj) + g * head_dim + x)
                keys.unsafe_store(kt + jj * head_dim + x, v)


def amx_state_back(buf: Ptr[F32], sc: AmxScratch, kv_rows: Ptr[DType.int64], per_head: Int, group_rows: Int,
                   kv_heads: Int, head_dim: Int, acc_off: Int, m_off: Int, l_off: Int):
    """The running max, sum and accumulator of the tile's rows back where cpu.mojo's worker keeps them."""
    for g in range(kv_heads):
        for k in range(group_rows):
            var row = Int(kv_rows.unsafe_load(g * per_head + k))
            var at = g * sc.padded + k
            buf.unsafe_store(m_off + row, buf.unsafe_load(sc.m + at))
            buf.unsafe_store(l_off + row, buf.unsafe_load(sc.l + at))
            for x in range(0, head_dim, F32_WIDTH):
                buf.unsafe_store(acc_off + row * head_dim + x, buf.unsafe_load[width=F32_WIDTH](sc.acc + at * head_dim + x))


@always_inline
def _softmax_lanes(buf: Ptr[F32], sc: AmxScratch, state: Int, col: Int, j0: Int, n_keys: Int) -> Bool:
    """The online softmax of the block's scores for F32_WIDTH rows (column col of the [keys, rows] scores, their
    state at `state`): scores of keys a row does not see (past its last, past n_keys) weigh 0. Leaves the weights
    in place of the scores and the rows' rescale factors at keep[col]; returns whether one is not 1. A block that
    every row sees whole (all but the causal diagonal's) skips the masks; the scores are read, never rewritten
    before the weights (a masked store read back stalls the load: Qwen3-0.6B's heads, one prompt of 512 (2,048)
    tokens, Intel Xeon VM, alternated runs in graph, 1.93 -> 1.78 ms a layer (21.7 -> 19.7))."""
    comptime W = F32_WIDTH
    var m_old = buf.unsafe_load[width=W](sc.m + state)
    var last = buf.unsafe_load[width=W](sc.last + state)
    var maxima = Array[SIMD[F32, W], 4](fill=SIMD[F32, W](MASKED))
    var whole = n_keys == KEY_BLOCK and last.reduce_min() >= Float32(j0 + KEY_BLOCK - 1)
    if whole:
        comptime for jj in range(KEY_BLOCK):
            maxima[jj % 4] = max(maxima[jj % 4], buf.unsafe_load[width=W](sc.s + jj * AMX_BLOCK + col))
    else:
        for jj in range(n_keys):
            var s = buf.unsafe_load[width=W](sc.s + jj * AMX_BLOCK + col)
            maxima[jj % 4] = max(maxima[jj % 4], last.ge(Float32(j0 + jj)).select(s, SIMD[F32, W](MASKED)))
    var block_max = max(max(maxima[0], maxima[1]), max(maxima[2], maxima[3]))
    var m_new = block_max.gt(m_old + MAX_SLACK).select(block_max, m_old)
    var totals = Array[SIMD[F32, W], 2](fill=0)
    if whole:
        comptime for jj in range(KEY_BLOCK):
            var at = sc.s + jj * AMX_BLOCK + col
            var p = exp(buf.unsafe_load[width=W](at) - m_new)
            buf.unsafe_store(at, p)
            totals[jj % 2] += p
    else:
        for jj in range(KEY_BLOCK):
            var at = sc.s + jj * AMX_BLOCK + col
            var p = SIMD[F32, W](0)
            if jj < n_keys:
                p = last.ge(Float32(j0 + jj)).select(exp(buf.unsafe_load[width=W](at) - m_new), SIMD[F32, W](0))
            buf.unsafe_store(at, p)
            totals[jj % 2] += p
    var keep = exp(m_old - m_new)
    buf.unsafe_store(sc.m + state, m_new)
    buf.unsafe_store(sc.l + state, buf.unsafe_load[width=W](sc.l + state) * keep + totals[0] + totals[1])
    buf.unsafe_store(sc.keep + col, keep)
    return m_new.ne(m_old).reduce_or()


def amx_head_block(
    buf: Ptr[F32], sc: AmxScratch, g: Int, group_rows: Int, j0: Int, n_keys: Int, kt: Int, vb: Int, head_dim: Int,
):
    """One staged key block (key rows at kt: amx_stage_keys; value pairs at vb) for the rows of KV head g (staged
    by amx_stage_q), 32 at a time. head_dim: a multiple of 32."""
    comptime assert KEY_BLOCK == AMX_BLOCK, "a staged block is one amx_steps block of keys"
    var words = buf.unsafe_bitcast[UInt32]()
    var keys = buf.unsafe_offset(kt).unsafe_bitcast[BFloat16]()
    var weights = buf.unsafe_offset(sc.p).unsafe_bitcast[BFloat16]()
    for r0 in range(0, group_rows, AMX_BLOCK):
        var state = g * sc.padded + r0
        if Float32(j0) > buf.unsafe_load(sc.last + state + min(AMX_BLOCK, group_rows - r0) - 1):
            continue  # the block's keys are all past its rows' last visible ones (causal)
        amx_zero()
        amx_steps[BF16, BF16](keys, amx_k[BF16](), 2 * head_dim, AMX_ROWS * head_dim,
                              words.unsafe_offset(sc.qt + g * head_dim // 2 * sc.padded + r0), sc.padded,
                              head_dim // amx_k[BF16]())
        amx_store(buf.unsafe_offset(sc.s))
        var rescale = False
        for col in range(0, AMX_BLOCK, F32_WIDTH):
            rescale |= _softmax_lanes(buf, sc, state + col, col, j0, n_keys)
            for kp0 in range(0, KEY_BLOCK // 2, F32_WIDTH):  # weights [keys, rows] -> rows of key pairs
                var pairs = Array[WORDS, F32_WIDTH](fill=0)
                comptime for i in range(F32_WIDTH):
                    var at = sc.s + 2 * (kp0 + i) * AMX_BLOCK + col
                    var even = narrow[BF16, F32_WIDTH](buf.unsafe_load[width=F32_WIDTH](at))
                    var odd = narrow[BF16, F32_WIDTH](buf.unsafe_load[width=F32_WIDTH](at + AMX_BLOCK))
                    pairs[i] = bitcast[DType.uint32, F32_WIDTH](even.interleave(odd))
                var rows = transpose_block(pairs)
                comptime for i in range(F32_WIDTH):
                    words.unsafe_store(sc.p + (col + i) * (KEY_BLOCK // 2) + kp0, rows[i])
        var acc = sc.acc + state * head_dim
        if rescale:
            for i in range(AMX_BLOCK):
                var keep = buf.unsafe_load(sc.keep + i)
                for x in range(0, head_dim, F32_WIDTH):
                    var at = acc + i * head_dim + x
                    buf.unsafe_store(at, buf.unsafe_load[width=F32_WIDTH](at) * keep)
        for d0 in range(0, head_dim, AMX_BLOCK):
            amx_load(buf.unsafe_offset(acc + d0), head_dim)
            amx_steps[BF16, BF16](weights, 0, 2 * KEY_BLOCK, AMX_ROWS * KEY_BLOCK, words.unsafe_offset(vb + d0),
                                  head_dim, 1)
            amx_store(buf.unsafe_offset(acc + d0), head_dim)
