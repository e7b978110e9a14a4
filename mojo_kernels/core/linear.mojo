# Linear layers on low-precision weights: y[M, N] = x[M, K] @ dequantize(w)[N, K]^T, float32 accumulation.
# The weight format is w's dtype:
#   float32, bfloat16     the values themselves
#   float8_e4m3fn, int8   times a float32 scale per row and block of `block_k` columns: scales[N, ceil(K / block_k)]
#                         (Qwen's FP8 checkpoints' 128 x 128 blocks become per-row blocks when they are loaded).
#                         FP8 weights arrive as uint8 bits: MAX graphs refuse float8 tensors on CPU.
# What x is multiplied by the weights, as llama.cpp does for its bf16 and q8_0 formats (reference.effective_x):
#   float32, FP8 weights  x itself
#   bfloat16 weights      x rounded to bfloat16: products of two bfloat16 are exact in float32, and AVX512_BF16's
#                         vdpbf16ps does 32 of them per instruction
#   int8 weights          x quantized to int8 per row and block (scale = the block's largest |x| / 127): AVX512_VNNI's
#                         vpdpbusd does 64 int8 products per instruction, summed exactly in int32; AVX2's
#                         vpmaddubsw + vpmaddwd 32 (as llama.cpp's q8_0 on AVX2)
# Without those instructions the same numbers are computed with float32 FMAs / int32 multiplies.
# FP8 weights are widened as utils/types.widen does: to their value times 2^-8 (FP8_SCALE goes into the scale).
# CPU, by the number of rows M:
#   decode (M <= DECODE_ROWS; bfloat16 weights BF16_DECODE_ROWS): every weight byte crosses the memory bus once,
#     prefetched PREFETCH_BYTES ahead (all formats but float32). A tile of NR weight rows is widened in registers
#     (or fed to the dot-product instructions as it is) for MR rows of x at a time; for the next MR rows it is read
#     again from L1, not from memory. int8 on AVX2: a tile of one weight row for every row of x, and only below
#     I8_MADD_PANEL_ROWS rows where a quad panel fits L1.
#   prefill: a panel of PANEL weight rows is widened once into a float32 [K, PANEL] buffer (L2), and a
#     PANEL_ROWS x PANEL register tile of y is computed from it for every PANEL_ROWS rows of x. With BF16_DOT (AMD's
#     AVX512_BF16: utils/types.mojo), bfloat16 weights are packed in pairs instead ([K / 2, PANEL] pairs) for
#     vdpbf16ps: twice the FMAs' work. With AVX512_VNNI or AVX2, int8 weights in quads ([K / 4, PANEL] quads, with
#     their scales per block) for vpdpbusd (vpmaddubsw + vpmaddwd) against x quantized per block (block_k a multiple
#     of 4; else the float32 panels).
#   AMX (linear_amx.mojo), from AMX_ROWS rows of x on: bfloat16 weights' pair panels against x as AMX tiles; tiled
#     int8 weights' quad panels in place, block by block (block_k a multiple of 64).
# Tiled weights (mili_linear_tiled, CPU only; float32, bfloat16 and int8): w as [N / R, K / C, R, C], R =
#   tile_rows, C = tile_k columns: each R rows as C-column runs of each row in turn (bindings/reference.tile_weight
#   makes them).
#   float32: R = F32_TILE_ROWS, C = 1: panels read in place at every M, the first pass over the rows of x streaming
#     them from memory (one row of x: as two streams, the halves of K), the others from L2.
#   bfloat16: R = NR rows, C = TILE_BYTES of a row: the rows of a decode tile lie in memory in the order
#     the tile reads them, so a worker streams one sequential run of memory instead of NR rows at once (the model's
#     linears at batch 1: bfloat16 ~1.1x faster on the AVX2 VM, whose prefetchers keep fewer streams going than the
#     tile has rows; 1.17x on the Zen 5 VM).
#   int8: R = I8_TILE_ROWS, C = 4: the quad panels themselves, read in place at every M (no decode tiles, nothing
#     packed; block_k a multiple of 4), the scales [K / block_k, N] (a tile's scales of a block are one vector run:
#     [N, K / block_k] took a gather per block, or a transposed copy per tile, a one-row pass's tenth on Zen 3). The
#     quad panel tile does 12 vpdpbusd per 8 loads where the decode tile does 8 per 6 loads and 4 sign flips and
#     converts its block sums per weight row: linears of Qwen3-0.6B's shape at 16-32 rows of x took 0.4x the time of
#     the decode tiles on a Zen 4, at one row the same. On AVX2 (Zen 3, 2 threads) too: see I8_TILED. A tile's
#     first pass over the rows of x streams it from memory, the others read it from L2, and all of them ask for a
#     share of the next tile (NextTileShare).
# GPU: a thread per output element (the model graph dequantizes to bfloat16 and uses MAX's matmul there).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx
from std.collections import Array
from std.math import ceildiv
from std.memory import bitcast, unsafe_memset_zero
from std.sys import CompilationTarget, llvm_intrinsic, size_of
from std.sys.intrinsics import prefetch, PrefetchOptions

from .activations import silu_and_mul_cpu, silu_mul
from .linear_amx import (
    AMX, AMX_BLOCK, AMX_ROWS, amx_block, amx_granted, amx_k, amx_padded, amx_rows, configure_tiles, release_tiles,
    use_amx, x_tile_at,
)
from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import (
    addr, ptr, list_ptr, dot_bf16, largest_abs, load_f32, BF16_DOT, narrow, round_even, widen, is_fp8, Addr, F32, F32_WIDTH, FP8_SCALE, Ptr, GPU_BLOCK, check_same,
)

comptime W = F32_WIDTH
comptime NR = 4
"""Weight rows per decode tile."""
comptime MR = 4 if F32_WIDTH >= 16 else 2
"""Rows of x per decode tile: MR x NR accumulators, NR widened weight vectors and MR x vectors fit the registers."""
comptime DECODE_ROWS = 32
"""Rows of x up to which the decode tiles beat unpacking panels once (the weights not read in place as quad panels):
a decode tile rereads its weight rows from L1 for every row of x, a panel costs a pass over the weights that few rows
do not repay. Decode steps of Qwen3-0.6B's shape on a 2-core Zen 4, against a threshold of 8: at 16 rows 107 against
173 ms in bfloat16, at 32 190 / 251 (int8 and int4 then had decode tiles too: 99 / 157 and 100 / 158 at 16 rows; at
64 their panels won, 304 / 373 and 316 / 384)."""
comptime BF16_DECODE_ROWS = 64 if BF16_DOT else DECODE_ROWS
"""DECODE_ROWS for bfloat16 weights not stored as pair panels (MoE experts): with vdpbf16ps the decode tiles beat the
pair panels packed per call up to 64 rows of x. Zen 4, tiled weights, 40 / 64 rows, GFLOP/s on 2 cores, panels ->
tiles: [1536, 2048] (a Qwen3-30B-A3B expert's gate_up, whose blocks are a few dozen rows in a prefill) 118-154 ->
254-275 / 166-179 -> 259-270, [2048, 768] 212-248 -> 242-254 / 248-282 -> 251-272, [4096, 1024] 221-251 -> 247-296 /
249-276 -> 251-289, [1024, 3072] 202-241 -> 224-274 / 204-264 -> 217-241 (from 96 rows the panels win that one)."""
comptime I8_ROW_TILE = 8
"""Rows of x per int8 decode tile without VNNI (one weight row at a time: an accumulator per row of x)."""
comptime PANEL = 2 * F32_WIDTH
"""Weight rows per prefill panel: two vectors of y per row of x."""
comptime PANEL_ROWS = 12 if F32_WIDTH >= 16 else 6
"""Rows of x per prefill register tile: 2 accumulators a row, 2 panel vectors and a broadcast (AVX2's 16 registers
take 6 rows, AVX-512's 32 take 12: Qwen3-0.6B's four linears at 512 rows, float32, Intel Xeon without AMX, 0.91x
torch.matmul's speed with 6 rows, 0.95x with 12)."""
comptime F32_TILE_ROWS = 32
"""Rows of a tiled float32 weight: panels [N / 32, K, 32], each k's 32 values in turn (reference.tile_weight), read in
place at every M by the panel tiles (AVX2: as two panels): nothing widened or packed per call."""
comptime F32_TILED = F32_WIDTH >= 16
"""Whether float32 weights are best tiled on this CPU (the model loader asks): with AVX-512. Qwen3-0.6B's four linears
on an Intel Xeon without AMX, [N, K] -> panels: at 512 rows 0.95x -> 1.03x torch.matmul's speed (each panel packed per
call -> read in place); 28 layers of them (1.4 GB) at 1 / 8 / 32 rows of x 65-68 -> 64-68, 104-108 -> 81-90 and
172-175 -> 129-131 ms."""
comptime PAIR_PANEL_ROWS = 12
"""Rows of x per pair-panel register tile (AVX-512 only): 24 accumulators, 2 panel vectors and a broadcast."""
comptime PAIR_TILE_ROWS = 32
"""Rows of a bfloat16 weight stored as pair panels ([N / 32, K / 2, 32, 2]: each 32 rows' column pairs in turn, the
words AMX tiles and vdpbf16ps read; reference.tile_weight(w, pairs=True)), read in place at every batch size
(linear_pair_panels; without AMX the first pass over a panel streams it, QUAD_PREFETCH_BYTES ahead, and each pass of
several asks for a share of the next panel: row_passes). On AVX-512 only (PANEL is 32 there); the model loader stores
them where the CPU has AMX or BF16_DOT. Zen 4's code on an Intel Xeon VM, Qwen3-0.6B's shape, against the decode
tiles and panels packed per call, 2 alternated rounds: a 512-token prefill 2.53-2.55 against 2.53-2.79 s (bfloat16
activations 2.40-2.45 against 2.59-2.72), decode steps at 1 / 8 / 16 rows 52.6-53.5 / 85-88 / 138-147 against 53-56 /
98-105 / 172-175 ms."""
comptime AMX_STORED_PANELS = 4
"""Stored pair panels per work item on AMX tiles: a tile configuration and a buffer serve them all."""
comptime AMX_CHUNK_STEPS = 8
"""Tile rows of x and of the weights per chunk of K on AMX tiles (256 bfloat16 columns: 16 KiB of a pair panel).
Single-threaded at 512 rows on an Intel Xeon VM, Qwen3-0.6B's down projection took 2.54 ms in chunks of 8, 2.96 of
16, 3.06 of 32 and 3.84 unchunked; its qkv projection 3.05, 3.83, 3.41 and 3.34. int8 quad panels go in chunks of
as many steps (512 columns, 16 KiB too): its four linears at 512 rows, bfloat16 x, took 11.2-11.7 ms unchunked and
8.7-9.5 chunked in blocks of 128 columns, 6.7-7.1 and 5.8-6.4 with a scale per row (W8A8)."""
comptime AMX_CHUNK_ROWS = 64
"""Rows of x up to which K goes in one chunk: few blocks of rows reuse a panel's chunk little, and the weights stream
from memory best in one pass (Qwen3-0.6B's four linears at 32 rows: 1.17-1.30 ms against 1.34-1.40 in chunks)."""
comptime AMX_INT8_ROWS = 24
"""Rows of x from which the int8 linears run on AMX tiles: below, the VNNI quad panels are as fast (the engine's decode
step of Qwen3-0.6B in int8 on an Intel Xeon VM, 200 keys, ms, at 16 / 24 / 32 rows: VNNI 62-66 / 77-83 / 101-102,
AMX 63-67 / 75-76 / 88-93)."""
comptime SERIAL_MACS = 1 << 18
comptime PARALLEL_X_ROWS = 128
"""Rows of x from which the AMX linears round or quantize it on every thread (fewer: the threads' hand-off costs
more than the work)."""
comptime I8_DOT = CompilationTarget._has_feature["avx512vnni"]()
comptime I8_MADD = CompilationTarget._has_feature["avx2"]()
comptime I8_QUADS = I8_DOT or I8_MADD
"""Whether int8 weights are multiplied as quad panels past DECODE_ROWS rows of x (AVX2: from I8_MADD_PANEL_ROWS where
a panel fits L1; tiled weights at every M): a quad of x against 4 bytes of each weight row, by vpdpbusd or vpmaddubsw
+ vpmaddwd."""
comptime I8_TILED = I8_QUADS
"""Whether int8 weights are best tiled on this CPU (the model loader asks, bindings/eager): with VNNI or AVX2. On Zen
3 (2 threads), Qwen3-0.6B's 112 linears and LM head at 1 / 8 / 16 / 32 rows of x took 0.92-1.0 / 1.14 / 1.25 / 1.18x
the time untiled; the model, old / new processes alternated twice (`mili bench peers --mili-weight-dtypes int8`):
batch 1 29.0, 31.2 / 33.0, 30.7 tok/s, batch 8 84.1, 97.7 / 115, 111, batch 16 106, 114 / 136, 133, batch 32 128, 124
/ 142, 129, prefill the same."""
comptime I8_TILED_EXPERTS = I8_DOT
"""Whether MoE experts' int8 weights are best tiled on this CPU (the model loader asks): with VNNI. On AVX2 (Zen 3,
Qwen3-30B-A3B's shape, 4 layers, old / new processes alternated) tiled experts decoded a token at 0.93x the speed
(batch 1 40.4, 38.1, 42.6, 39.7 against 42.5, 42.9, 41.1, 46.6 tok/s), prefilled at 1.06x, batch 8 the same: each
expert's few rows of x stream its weights, and one user's batch 1 is the MoE models' case."""
comptime I8_MADD_PANEL_ROWS = 16
"""AVX2 without VNNI: rows of x from which untiled int8 weights are packed into quad panels per call where a panel
(PANEL x K bytes) fits L1 (32 KiB): Zen 3, 2 threads, against the decode tiles at 16 / 24 / 32 rows: 1.15 / 1.27 /
1.37x the GMAC/s at K 1,024, 1.03 / 1.16 / 1.22x at K 2,048; at K 3,072 the panels lost up to 24 rows (0.87x at 16)."""
comptime L1_BYTES = 32768
"""A core's L1 data cache on the CPUs with AVX2 but no VNNI (Zen 2 and 3, Intel before Ice Lake: 32 KiB)."""
comptime I8_OFFSET = Int32(128) if I8_DOT else Int32(0)
"""What vpdpbusd adds to each weight (see _dot_i8); the other paths multiply the weights as they are."""
comptime DOT_LANES = F32_WIDTH
"""float32 / int32 lanes of a dot-product accumulator: 2 bfloat16 or 4 int8 products per lane and step."""
comptime I8_X_MAX = Float32(127)
comptime I8_ROWS = 2
"""Rows of x per int8 decode tile with VNNI: an int32 block sum and a float32 total per pair, 2 x NR x 2 vectors."""
comptime QUAD_TILE_SUMS = 24 if DOT_LANES == 16 else 8
"""int32 block sums per int8 quad-panel register tile. AVX-512: 12 rows of x by a panel's 2 vectors, with 2 panel
vectors and a broadcast; LLVM keeps the float32 totals, touched once a block, in L1. Qwen3-0.6B's four linears, 28
layers (beyond the caches), Intel Xeon without AMX, best of 5 against 6 rows a pass: 33.2-33.7 against 35.5-37.1 ms
at 32 rows of x, 22.7-25.4 against 23.4-23.9 at 16; at 8 rows 20.5-20.7 either way (bound by the memory bus, in one
pass, 6 + 2 or 4 + 4). AVX2's 16 registers take 8 (a linear of Qwen3-0.6B's MLP shape on one Zen 3 core, GMAC/s: 12
sums 52, 6 sums 62, 8 sums 66)."""
comptime TILE_BYTES = 64
"""Bytes of each weight row per step of a tiled float32 / bfloat16 weight's stream: a cache line."""
comptime I8_TILE_ROWS = 32
"""Rows of a tiled int8 weight's quad panels: PANEL on AVX-512, two panels on AVX2."""
comptime PREFETCH_BYTES = 4096
"""How far ahead the decode tiles prefetch each weight row: the hardware prefetchers alone left the bfloat16 / int8
LM head at half the memory bandwidth. With the weights on huge pages, 4 KiB ahead streamed the model's linears in
0.96x (bfloat16) the time of 16 KiB, int8 the same (benchmarks/RESULTS.md). float32 weights are not prefetched:
their NR rows of a tile lie next to each other, and the hardware prefetchers alone streamed them in 0.97x the time."""

comptime QUAD_PREFETCH_BYTES = 16384
"""How far ahead a quad panel tile (and a stored float32 panel's first pass) prefetches a stored panel: it reads 128
bytes a step (a weight row's decode tile 32), and at one row of x, Qwen3-30B-A3B's expert linears streamed in 0.97x
the decode tiles' time at 16 KiB, 1.2x at 4 KiB and 1.3x at 32 KiB (Zen 3)."""


@always_inline
def is_scaled[w_type: DType]() -> Bool:
    return is_fp8[w_type]() or w_type == DType.int8


@always_inline
def tile_k[w_type: DType]() -> Int:
    """Columns of a tiled weight's row per run: TILE_BYTES of them, int8 a quad, float32 one (panels)."""
    comptime if w_type == DType.float32:
        return 1
    return 4 if w_type == DType.int8 else TILE_BYTES // size_of[w_type]()


@always_inline
def tile_rows[w_type: DType]() -> Int:
    """Rows of a tiled weight's tile."""
    comptime if w_type == DType.float32:
        return F32_TILE_ROWS
    return I8_TILE_ROWS if w_type == DType.int8 else NR


@always_inline
def block_scale[w_type: DType](scales: Ptr[F32], n: Int, kb: Int, k_blocks: Int) -> Float32:
    comptime if is_fp8[w_type]():
        return scales.unsafe_load(n * k_blocks + kb) * FP8_SCALE
    elif w_type == DType.int8:
        return scales.unsafe_load(n * k_blocks + kb)
    else:
        return 1


struct _Weights[w_type: DType, tiled: Bool](ImplicitlyCopyable):
    """w [N, K] (tiled: see the top) with its scales, and where each of its blocks of columns ends."""

    var w: Addr[Self.w_type]
    var scales: Addr[F32]
    var n: Int
    var k: Int
    var block_k: Int
    var k_blocks: Int

    def __init__(out self, w: Ptr[Self.w_type], scales: Ptr[F32], n: Int, k: Int, block_k: Int):
        self.w, self.scales, self.n, self.k = addr(w), addr(scales), n, k
        # unscaled formats: one block of all K columns
        self.block_k = block_k if is_scaled[Self.w_type]() else max(k, 1)
        self.k_blocks = ceildiv(k, self.block_k)

    @always_inline
    def scale(self, n: Int, kb: Int) -> Float32:
        return block_scale[Self.w_type](ptr(self.scales), n, kb, self.k_blocks)

    @always_inline
    def at(self, n: Int, k: Int) -> Int:
        """The index of w[n, k]; `tile_k[w_type]()` columns from k on follow it when k is a multiple of them."""
        comptime if Self.tiled:
            comptime tk, tr = tile_k[Self.w_type](), tile_rows[Self.w_type]()
            return (n - n % tr) * self.k + (k - k % tk) * tr + (n % tr) * tk + k % tk
        else:
            return n * self.k + k

    @always_inline
    def prefetch(self, n: Int, k: Int):
        """Asks for w[n, k] PREFETCH_BYTES ahead (the rows of the next tiles); nothing for float32 weights."""
        comptime if Self.w_type == DType.float32:
            return
        var at = ptr(self.w).unsafe_bitcast[UInt8]().unsafe_offset(self.at(n, k) * size_of[Self.w_type]() + PREFETCH_BYTES)
        prefetch[PrefetchOptions().for_read().medium_locality()](at)

    @always_inline
    def prefetch_rows(self, n0: Int, part: Int, parts: Int):
        """Asks for the part-th of `parts` slices of the PANEL rows from n0 on (adjacent in memory in either layout):
        a worker's next panel fetched while it computes this one, a slice per row tile."""
        var size = size_of[Self.w_type]()
        var total = max(0, min(PANEL, self.n - n0)) * self.k * size
        var chunk = ceildiv(ceildiv(total, parts), 64) * 64
        var first = ptr(self.w).unsafe_bitcast[UInt8]().unsafe_offset(min(n0, self.n) * self.k * size)
        for offset in range(part * chunk, min(total, part * chunk + chunk), 64):
            prefetch[PrefetchOptions().for_read().medium_locality()](first.unsafe_offset(offset))

    @always_inline
    def load[width: Int](self, n: Int, k: Int, scale: Float32) -> SIMD[F32, width]:
        var v = widen[Self.w_type, width](ptr(self.w), self.at(n, k))
        comptime if is_scaled[Self.w_type]():
            return v * scale
        else:
            return v


struct _QuantizedX(ImplicitlyCopyable):
    """x [M, K] as int8 per row and block of columns: x ~ q * scale; sum: the block's sum of q. The scales and sums
    of a block are together ([k_blocks, rows]): an epilogue's rows load theirs as a run, not a gather."""

    var q: Addr[DType.int8]
    var scales: Addr[F32]
    var sums: Addr[DType.int32]
    var k_blocks: Int
    var rows: Int

    def __init__(out self, q: Ptr[DType.int8], scales: Ptr[F32], sums: Ptr[DType.int32], k_blocks: Int, rows: Int):
        self.q, self.scales, self.sums, self.k_blocks, self.rows = addr(q), addr(scales), addr(sums), k_blocks, rows

    @always_inline
    def scale(self, m: Int, kb: Int) -> Float32:
        return ptr(self.scales).unsafe_load(kb * self.rows + m)

    @always_inline
    def sum(self, m: Int, kb: Int) -> Int32:
        return ptr(self.sums).unsafe_load(kb * self.rows + m)


def _quantize_x[a_type: DType, dequantized: Bool](x: Ptr[a_type], xq: _QuantizedX, m: Int, k: Int, block_k: Int,
                                                   stride: Int, dst: Ptr[F32]):
    """x quantized per row and block: q = round(x * (127 / largest |x|)), scale = largest |x| / 127. Into xq, or
    when `dequantized` as q * scale into dst (the effective x of the float32 panels); rows `stride` apart there."""
    var q = ptr(xq.q)
    for r in range(m):
        for kb in range(xq.k_blocks):
            var start = r * k + kb * block_k
            var out = r * stride + kb * block_k
            var count = min(block_k, k - kb * block_k)
            var largest = largest_abs(x, start, count)
            var inv = I8_X_MAX / largest if largest > 0 else Float32(0)
            var scale = largest / I8_X_MAX
            var total = SIMD[DType.int32, W](0)
            var sum = Int32(0)
            var i = 0
            while i + W <= count:
                var v = round_even(load_f32[a_type, W](x, start + i) * inv)
                comptime if dequantized:
                    dst.unsafe_store(out + i, v * scale)
                else:
                    q.unsafe_store(out + i, v.cast[DType.int8]())
                    total += v.cast[DType.int32]()
                i += W
            for t in range(i, count):
                var v = round_even[1](load_f32[a_type, 1](x, start + t) * inv)
                comptime if dequantized:
                    dst.unsafe_store(out + t, v * scale)
                else:
                    q.unsafe_store(out + t, v.cast[DType.int8]())
                    sum += v.cast[DType.int32]()[0]
            comptime if not dequantized:
                ptr(xq.scales).unsafe_store(kb * xq.rows + r, scale)
                ptr(xq.sums).unsafe_store(kb * xq.rows + r, total.reduce_add() + sum)


def _round_x[a_type: DType, to: DType](x: Ptr[a_type], dst: Ptr[to], count: Int):
    """dst = x rounded to bfloat16 (to: bfloat16 for the dot products, float32 for the panels)."""
    var i = 0
    while i + W <= count:
        dst.unsafe_store(i, narrow[DType.bfloat16, W](load_f32[a_type, W](x, i)).cast[to]())
        i += W
    for t in range(i, count):
        dst.unsafe_store(t, narrow[DType.bfloat16, 1](load_f32[a_type, 1](x, t)).cast[to]())


struct _RoundRows[a_type: DType](ChunkTask):
    """Item: AMX_ROWS rows of x [m, k] rounded to bfloat16 (_round_x)."""

    var x: Addr[Self.a_type]
    var dst: Addr[DType.bfloat16]
    var m: Int
    var k: Int

    def __init__(out self, x: Ptr[Self.a_type], dst: Ptr[DType.bfloat16], m: Int, k: Int):
        self.x, self.dst, self.m, self.k = addr(x), addr(dst), m, k

    def run(self, item: Int):
        var r0 = item * AMX_ROWS
        var count = (min(r0 + AMX_ROWS, self.m) - r0) * self.k
        _round_x(ptr(self.x).unsafe_offset(r0 * self.k), ptr(self.dst).unsafe_offset(r0 * self.k), count)


def _bf16_x[a_type: DType, R: Runner](runner: R, x: Ptr[a_type], m: Int, k: Int, mut rounded: List[BFloat16]) -> Ptr[
    DType.bfloat16
]:
    """x [m, k] as bfloat16 for the dot products of pairs: x itself when it is bfloat16, else rounded into `rounded`
    (the caller keeps it alive), on every thread from PARALLEL_X_ROWS rows."""
    comptime if a_type == DType.bfloat16:
        return rebind[Ptr[DType.bfloat16]](x)
    else:
        rounded = List[BFloat16](unsafe_uninit_length=m * k)
        runner.run(_RoundRows(x, list_ptr(rounded), m, k), ceildiv(m, AMX_ROWS), m < PARALLEL_X_ROWS)
        return list_ptr(rounded)


@always_inline
def _tile_rows[cols: Int](n: Int, n0: Int) -> Array[Int, cols]:
    """The weight rows of the tile at n0; rows past N repeat the last one (computed, not stored)."""
    var n_of = Array[Int, cols](fill=0)
    comptime for j in range(cols):
        n_of[j] = min(n0 + j, n - 1)
    return n_of^


@always_inline
def _store_tile[a_type: DType, rows: Int, cols: Int, lanes: Int](
    y: Ptr[a_type], acc: Array[SIMD[F32, lanes], rows * cols], tail: Array[Float32, rows * cols], m0: Int, n0: Int, N: Int,
):
    comptime for i in range(rows):
        comptime for j in range(cols):
            if n0 + j < N:
                var v = acc[i * cols + j].reduce_add() + tail[i * cols + j]
                y.unsafe_store((m0 + i) * N + n0 + j, narrow[a_type, 1](v))


@always_inline
def _decode_tile[a_type: DType, w_type: DType, tiled: Bool, rows: Int, cols: Int, fetch: Bool](
    y: Ptr[a_type], x: Ptr[a_type], wt: _Weights[w_type, tiled], m0: Int, n0: Int,
):
    """y[m0 : m0 + rows, n0 : n0 + cols], float32 FMAs on widened weights (float32 and FP8 weights); `fetch`: the tile
    is read from memory (its first rows of x), not from L1."""
    var K = wt.k
    var acc = Array[SIMD[F32, W], rows * cols](fill=0)
    var tail = Array[Float32, rows * cols](fill=0)
    var n_of = _tile_rows[cols](wt.n, n0)
    for kb in range(wt.k_blocks):
        var s = Array[Float32, cols](fill=1)
        comptime if is_scaled[w_type]():
            comptime for j in range(cols):
                s[j] = wt.scale(n_of[j], kb)
        var k = kb * wt.block_k
        var end = min(K, k + wt.block_k)
        while k + W <= end:
            var xv = Array[SIMD[F32, W], rows](fill=0)
            comptime for i in range(rows):
                xv[i] = load_f32[a_type, W](x, (m0 + i) * K + k)
            comptime for j in range(cols):
                comptime if fetch:
                    wt.prefetch(n_of[j], k)
                var wv = wt.load[W](n_of[j], k, s[j])
                comptime for i in range(rows):
                    acc[i * cols + j] = xv[i].fma(wv, acc[i * cols + j])
            k += W
        while k < end:
            comptime for j in range(cols):
                var wv = wt.load[1](n_of[j], k, s[j])[0]
                comptime for i in range(rows):
                    tail[i * cols + j] += load_f32[a_type, 1](x, (m0 + i) * K + k)[0] * wv
            k += 1
    _store_tile[a_type, rows, cols, W](y, acc, tail, m0, n0, wt.n)


@always_inline
def _dot_i8(
    acc: SIMD[DType.int32, DOT_LANES], w: SIMD[DType.int8, 4 * DOT_LANES], x: SIMD[DType.int8, 4 * DOT_LANES],
) -> SIMD[DType.int32, DOT_LANES]:
    """acc plus the products (w + I8_OFFSET) * x, summed in fours. vpdpbusd multiplies unsigned by signed bytes, so
    the weights are offset by 128 (a flip of the sign bit) and 128 * sum(x) is taken off per block. vpmaddubsw
    does too but saturates its int16 pair sums, so it takes |w| (at most 128) times x with w's sign (|x| <= 127):
    pair sums stay within 2 * 128 * 127."""
    comptime if I8_DOT and DOT_LANES == 16:
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.512", SIMD[DType.int32, DOT_LANES]](
            acc, bitcast[DType.uint8, 4 * DOT_LANES](w ^ -128), bitcast[DType.uint8, 4 * DOT_LANES](x)
        )
    elif I8_MADD and DOT_LANES == 8:
        var magnitudes = bitcast[DType.uint8, 4 * DOT_LANES](abs(w))
        var signed_x = llvm_intrinsic["llvm.x86.avx2.psign.b", SIMD[DType.int8, 4 * DOT_LANES]](x, w)
        var pairs = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 2 * DOT_LANES]](magnitudes, signed_x)
        return acc + llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, DOT_LANES]](
            pairs, SIMD[DType.int16, 2 * DOT_LANES](1)
        )
    else:  # lane l sums products 4l .. 4l + 3, as vpdpbusd (a quad panel's lane is a column)
        var products = w.cast[DType.int32]() * x.cast[DType.int32]()
        var halves = products.deinterleave()
        var pairs = (halves[0] + halves[1]).deinterleave()
        return acc + rebind[SIMD[DType.int32, DOT_LANES]](pairs[0] + pairs[1])


@always_inline
def _decode_tile_bf16[a_type: DType, w_type: DType, tiled: Bool, rows: Int, cols: Int](
    y: Ptr[a_type], xb: Ptr[DType.bfloat16], wt: _Weights[w_type, tiled], m0: Int, n0: Int,
):
    """y[m0 : m0 + rows, n0 : n0 + cols] from x rounded to bfloat16: pairs of exact products."""
    comptime S = 2 * DOT_LANES
    var K = wt.k
    var w = ptr(wt.w).unsafe_bitcast[BFloat16]()
    var acc = Array[SIMD[F32, DOT_LANES], rows * cols](fill=0)
    var tail = Array[Float32, rows * cols](fill=0)
    var n_of = _tile_rows[cols](wt.n, n0)
    # tiled: a cache line of each row per step, prefetched once
    comptime step = tile_k[w_type]() if tiled else S
    var k = 0
    while k + step <= K:
        comptime for part in range(step // S):
            var kp = k + part * S
            var xv = Array[SIMD[DType.bfloat16, S], rows](fill=0)
            comptime for i in range(rows):
                xv[i] = xb.unsafe_load[width=S]((m0 + i) * K + kp)
            comptime for j in range(cols):
                comptime if part == 0:
                    wt.prefetch(n_of[j], k)
                var wv = w.unsafe_load[width=S](wt.at(n_of[j], kp))
                comptime for i in range(rows):
                    acc[i * cols + j] = dot_bf16(acc[i * cols + j], xv[i], wv)
        k += step
    while k < K:
        comptime for j in range(cols):
            var wv = load_f32[DType.bfloat16, 1](w, wt.at(n_of[j], k))[0]
            comptime for i in range(rows):
                tail[i * cols + j] += load_f32[DType.bfloat16, 1](xb, (m0 + i) * K + k)[0] * wv
        k += 1
    _store_tile[a_type, rows, cols, DOT_LANES](y, acc, tail, m0, n0, wt.n)


@always_inline
def _decode_tile_i8[a_type: DType, w_type: DType, tiled: Bool, rows: Int, cols: Int, fetch: Bool](
    y: Ptr[a_type], xq: _QuantizedX, wt: _Weights[w_type, tiled], m0: Int, n0: Int,
):
    """y[m0 : m0 + rows, n0 : n0 + cols] from x quantized to int8: exact int32 sums per block, then both scales;
    `fetch`: the tile is read from memory (its first rows of x), not from L1."""
    comptime S = 4 * DOT_LANES
    var K = wt.k
    var w, q = ptr(wt.w).unsafe_bitcast[Int8](), ptr(xq.q)
    var acc = Array[SIMD[F32, DOT_LANES], rows * cols](fill=0)
    var tail = Array[Float32, rows * cols](fill=0)
    var n_of = _tile_rows[cols](wt.n, n0)
    for kb in range(wt.k_blocks):
        var k = kb * wt.block_k
        var end = min(K, k + wt.block_k)
        var dots = Array[SIMD[DType.int32, DOT_LANES], rows * cols](fill=0)
        var rest = Array[Int32, rows * cols](fill=0)
        while k + S <= end:
            var xv = Array[SIMD[DType.int8, S], rows](fill=0)
            comptime for i in range(rows):
                xv[i] = q.unsafe_load[width=S]((m0 + i) * K + k)
            comptime for j in range(cols):
                comptime if fetch:
                    wt.prefetch(n_of[j], k)
                var wv = w.unsafe_load[width=S](wt.at(n_of[j], k))
                comptime for i in range(rows):
                    dots[i * cols + j] = _dot_i8(dots[i * cols + j], wv, xv[i])
            k += S
        while k < end:
            comptime for j in range(cols):
                var wv = Int32(w.unsafe_load(wt.at(n_of[j], k))) + I8_OFFSET
                comptime for i in range(rows):
                    rest[i * cols + j] += wv * Int32(q.unsafe_load((m0 + i) * K + k))
            k += 1
        comptime for i in range(rows):
            var sx = xq.scale(m0 + i, kb)
            var offset = I8_OFFSET * xq.sum(m0 + i, kb)
            comptime for j in range(cols):
                var s = sx * wt.scale(n_of[j], kb)
                acc[i * cols + j] = dots[i * cols + j].cast[F32]().fma(s, acc[i * cols + j])
                tail[i * cols + j] += Float32(rest[i * cols + j] - offset) * s
    _store_tile[a_type, rows, cols, DOT_LANES](y, acc, tail, m0, n0, wt.n)


def _pack_panel[w_type: DType, tiled: Bool](panel: Ptr[F32], wt: _Weights[w_type, tiled], n0: Int):
    """panel[k * PANEL + c] = dequantized w[n0 + c, k]; 0 for rows past N. NR rows at a time, transposed in registers
    (tiled weights: N is a multiple of NR, block_k of the runs)."""
    var K = wt.k
    var filled = min(PANEL, wt.n - n0)
    var rows = filled - filled % NR
    for c in range(0, rows, NR):
        var n = n0 + c
        for kb in range(wt.k_blocks):
            var s = SIMD[F32, NR](wt.scale(n, kb), wt.scale(n + 1, kb), wt.scale(n + 2, kb), wt.scale(n + 3, kb))
            var k = kb * wt.block_k
            var end = min(K, k + wt.block_k)
            while k + W <= end:
                _store_columns[F32, W](panel, k * PANEL + c, wt.load[W](n, k, s[0]), wt.load[W](n + 1, k, s[1]),
                                       wt.load[W](n + 2, k, s[2]), wt.load[W](n + 3, k, s[3]))
                k += W
            for kk in range(k, end):
                comptime for r in range(NR):
                    panel.unsafe_store(kk * PANEL + c + r, wt.load[1](n + r, kk, s[r])[0])
    for c in range(rows, PANEL):
        var n = n0 + c
        for k in range(K):
            var v = Float32(0)
            if c < filled:
                v = wt.load[1](n, k, wt.scale(n, k // wt.block_k))[0]
            panel.unsafe_store(k * PANEL + c, v)


@always_inline
def _ask_ahead[p_type: DType, //, count: Int](panel: Ptr[p_type], at: Int):
    """Asks for the `count` values of a stored panel from `at` on, QUAD_PREFETCH_BYTES ahead."""
    comptime size = size_of[p_type]()
    var ahead = panel.unsafe_bitcast[UInt8]().unsafe_offset(size * at + QUAD_PREFETCH_BYTES)
    comptime for line in range(0, size * count, 64):
        prefetch[PrefetchOptions().for_read().medium_locality()](ahead.unsafe_offset(line))


@always_inline
def _panel_tile[a_type: DType, x_type: DType, rows: Int, stride: Int = PANEL, fetch: Bool = False](
    y: Ptr[a_type], x: Ptr[x_type], panel: Ptr[F32], m0: Int, n0: Int, N: Int, K: Int,
    share: NextTileShare = NextTileShare(0, 0, 1),
):
    """y[m0 : m0 + rows, n0 : n0 + PANEL] from a panel (`stride`: its values' per k, within a wider one); `fetch`:
    the panel is read from memory, asked for QUAD_PREFETCH_BYTES ahead; `share`: the next tile's lines this pass asks
    for (bytes from `panel`)."""
    var next = share
    var acc = Array[SIMD[F32, W], 2 * rows](fill=0)
    for k in range(K):
        comptime if fetch:
            _ask_ahead[stride](panel, k * stride)
        next.step(panel.unsafe_bitcast[UInt8]())
        var b0 = panel.unsafe_load[width=W](k * stride)
        var b1 = panel.unsafe_load[width=W](k * stride + W)
        comptime for i in range(rows):
            var a = SIMD[F32, W](load_f32[x_type, 1](x, (m0 + i) * K + k)[0])
            acc[2 * i] = a.fma(b0, acc[2 * i])
            acc[2 * i + 1] = a.fma(b1, acc[2 * i + 1])
    _store_panel_rows[a_type, rows, W](y, acc, m0, n0, N)


@always_inline
def _panel_row[a_type: DType, x_type: DType, stride: Int](
    y: Ptr[a_type], x: Ptr[x_type], panel: Ptr[F32], n0: Int, N: Int, K: Int,
):
    """y[0, n0 : n0 + PANEL] from a panel read from memory as two streams, its two halves of K side by side."""
    var half = K // 2
    var acc = Array[SIMD[F32, W], 4](fill=0)
    for k in range(half):
        comptime for part in range(2):
            var at = (k + part * half) * stride
            _ask_ahead[stride](panel, at)
            var a = SIMD[F32, W](load_f32[x_type, 1](x, k + part * half)[0])
            acc[2 * part] = a.fma(panel.unsafe_load[width=W](at), acc[2 * part])
            acc[2 * part + 1] = a.fma(panel.unsafe_load[width=W](at + W), acc[2 * part + 1])
    for k in range(2 * half, K):
        var a = SIMD[F32, W](load_f32[x_type, 1](x, k)[0])
        acc[0] = a.fma(panel.unsafe_load[width=W](k * stride), acc[0])
        acc[1] = a.fma(panel.unsafe_load[width=W](k * stride + W), acc[1])
    var sums = Array[SIMD[F32, W], 2](fill=0)
    sums[0], sums[1] = acc[0] + acc[2], acc[1] + acc[3]
    _store_panel_rows[a_type, 1, W](y, sums, 0, n0, N)


@always_inline
def _store_panel_rows[a_type: DType, rows: Int, lanes: Int](
    y: Ptr[a_type], acc: Array[SIMD[F32, lanes], 2 * rows], m0: Int, n0: Int, N: Int,
):
    """y[m0 + i, n0 : n0 + 2 * lanes] = acc[2i], acc[2i + 1], up to column N."""
    comptime for i in range(rows):
        var out = (m0 + i) * N + n0
        if n0 + 2 * lanes <= N:
            y.unsafe_store(out, narrow[a_type, lanes](acc[2 * i]))
            y.unsafe_store(out + lanes, narrow[a_type, lanes](acc[2 * i + 1]))
        else:
            for c in range(N - n0):
                var v = acc[2 * i][c] if c < lanes else acc[2 * i + 1][c - lanes]
                y.unsafe_store(out + c, narrow[a_type, 1](v))


@always_inline
def _store_columns[dtype: DType, n: Int](
    panel: Ptr[dtype], at: Int, r0: SIMD[dtype, n], r1: SIMD[dtype, n], r2: SIMD[dtype, n], r3: SIMD[dtype, n],
):
    """panel[at + e * PANEL : + 4] = r0[e], r1[e], r2[e], r3[e]: NR weight rows' 32-bit words transposed in registers
    into the panel's columns, one 16-byte store per word (not four scattered ones)."""
    comptime assert NR == 4 and size_of[dtype]() == 4, "four rows of 32-bit words"
    var low, high = r0.interleave(r1), r2.interleave(r3)
    var quads = bitcast[dtype, 4 * n](bitcast[DType.uint64, n](low).interleave(bitcast[DType.uint64, n](high)))
    comptime for e in range(n):
        panel.unsafe_store(at + e * PANEL, quads.slice[4, offset=4 * e]())


@always_inline
def _pack_run[w_type: DType, tiled: Bool](panel: Ptr[DType.uint32], wt: _Weights[w_type, tiled], n: Int, k: Int, c: Int):
    """The TILE_BYTES of row n from column k on (a tiled weight's run), loaded as one vector of 32-bit words
    (bfloat16 pairs, int8 quads) into panel column c, from the panel row of column k on."""
    var words = _run_words(wt, n, k)
    var first = k * size_of[w_type]() // 4
    comptime for e in range(TILE_BYTES // 4):
        panel.unsafe_store((first + e) * PANEL + c, words[e])


@always_inline
def _run_words[w_type: DType, tiled: Bool](wt: _Weights[w_type, tiled], n: Int, k: Int) -> SIMD[DType.uint32, TILE_BYTES // 4]:
    var bytes = ptr(wt.w).unsafe_bitcast[UInt8]().unsafe_load[width=TILE_BYTES](wt.at(n, k) * size_of[w_type]())
    return bitcast[DType.uint32, TILE_BYTES // 4](bytes)


def _pack_pair_panel[w_type: DType, tiled: Bool](panel: Ptr[DType.uint32], wt: _Weights[w_type, tiled], n0: Int):
    """panel[kp * PANEL + c] = the bfloat16 pair w[n0 + c, 2kp : 2kp + 2] (vdpbf16ps's layout); 0 past the last
    row or column."""
    var K = wt.k
    comptime if tiled:  # each run of a tile's row as one vector of pairs, in the order they lie in memory
        var filled = min(PANEL, wt.n - n0)  # a multiple of NR: tiled weights have N a multiple of it
        for c in range(0, filled, NR):
            var n = n0 + c
            for k0 in range(0, K, tile_k[w_type]()):
                _store_columns[DType.uint32, TILE_BYTES // 4](panel, k0 // 2 * PANEL + c, _run_words(wt, n, k0), _run_words(wt, n + 1, k0),
                               _run_words(wt, n + 2, k0), _run_words(wt, n + 3, k0))
        for kp in range(K // 2):
            for c in range(filled, PANEL):
                panel.unsafe_store(kp * PANEL + c, 0)
        return
    var w = ptr(wt.w).unsafe_bitcast[UInt16]()
    for c in range(PANEL):
        var n = n0 + c
        for kp in range(ceildiv(K, 2)):
            var pair = UInt32(0)
            if n < wt.n:
                pair = UInt32(w.unsafe_load(wt.at(n, 2 * kp)))
                if 2 * kp + 1 < K:
                    pair |= UInt32(w.unsafe_load(wt.at(n, 2 * kp + 1))) << 16
            panel.unsafe_store(kp * PANEL + c, pair)


@always_inline
def _pair_panel_tile[a_type: DType, rows: Int, fetch: Bool](
    y: Ptr[a_type], xb: Ptr[DType.bfloat16], panel: Ptr[DType.uint32], m0: Int, n0: Int, N: Int, K: Int,
    share: NextTileShare,
):
    """y[m0 : m0 + rows, n0 : n0 + PANEL] from a pair panel (fetch, share: _pair_panel_sums')."""
    _store_panel_rows[a_type, rows, DOT_LANES](y, _pair_panel_sums[rows, fetch](xb, panel, m0, K, share), m0, n0, N)


def _pair_panel_swiglu_tile[a_type: DType, rows: Int, fetch: Bool](
    y: Ptr[a_type], xb: Ptr[DType.bfloat16], gate: Ptr[DType.uint32], up: Ptr[DType.uint32], m0: Int, n0: Int, N: Int,
    K: Int, share: NextTileShare,
):
    """y[m0 : m0 + rows, n0 : n0 + PANEL] = silu_mul of the sums of a gate and an up pair panel (share: of the next
    panel after each)."""
    var g = _pair_panel_sums[rows, fetch](xb, gate, m0, K, share)
    var u = _pair_panel_sums[rows, fetch](xb, up, m0, K, share)
    comptime for j in range(2 * rows):
        g[j] = silu_mul[a_type, DOT_LANES](g[j], u[j]).cast[F32]()  # exact: _store_panel_rows rounds it to itself
    _store_panel_rows[a_type, rows, DOT_LANES](y, g, m0, n0, N)


@always_inline
def _pair_panel_sums[rows: Int, fetch: Bool](
    xb: Ptr[DType.bfloat16], panel: Ptr[DType.uint32], m0: Int, K: Int, share: NextTileShare,
) -> Array[SIMD[F32, DOT_LANES], 2 * rows]:
    """Rows m0 .. m0 + rows - 1 of x times a pair panel: each step a pair of x broadcast against 2 x 16 pairs;
    fetch: a stored panel streamed from memory, asked for QUAD_PREFETCH_BYTES ahead (into the next panel); share:
    the next panel's lines this pass asks for (bytes from `panel`)."""
    comptime assert PANEL == 2 * DOT_LANES, "pair panels are two dot-product accumulators wide"
    var next = share
    var acc = Array[SIMD[F32, DOT_LANES], 2 * rows](fill=0)
    for kp in range(ceildiv(K, 2)):
        comptime if fetch:
            _ask_ahead[PANEL](panel, kp * PANEL)
        next.step(panel.unsafe_bitcast[UInt8]())
        var b0 = bitcast[DType.bfloat16, 2 * DOT_LANES](panel.unsafe_load[width=DOT_LANES](kp * PANEL))
        var b1 = bitcast[DType.bfloat16, 2 * DOT_LANES](panel.unsafe_load[width=DOT_LANES](kp * PANEL + DOT_LANES))
        comptime for i in range(rows):
            var pair: UInt32
            if 2 * kp + 1 < K:
                pair = bitcast[DType.uint32, 1](xb.unsafe_load[width=2]((m0 + i) * K + 2 * kp))[0]
            else:  # the last column of an odd K: its pair's weight is 0, so is x's
                pair = UInt32(xb.unsafe_bitcast[UInt16]().unsafe_load((m0 + i) * K + 2 * kp))
            var a = bitcast[DType.bfloat16, 2 * DOT_LANES](SIMD[DType.uint32, DOT_LANES](pair))
            acc[2 * i] = dot_bf16(acc[2 * i], a, b0)
            acc[2 * i + 1] = dot_bf16(acc[2 * i + 1], a, b1)
    return acc^


def _pack_quad_panel[w_type: DType, tiled: Bool](panel: Ptr[DType.uint32], panel_scales: Ptr[F32], wt: _Weights[w_type, tiled],
                                                n0: Int):
    """panel[kq * PANEL + c] = the int8 quad w[n0 + c, 4kq : 4kq + 4] (vpdpbusd's layout), bytes past the last column
    -I8_OFFSET (0 once _dot_i8 offsets them: whatever x holds there adds nothing); panel_scales[kb * PANEL + c] = the
    weight scale of row n0 + c and block kb, 0 past the last row (its quads, left as they are, add nothing). Each
    64-byte run of a row is loaded as one vector of 16 quads."""
    comptime RUN = TILE_BYTES // size_of[w_type]()
    var K = wt.k
    var w = ptr(wt.w).unsafe_bitcast[Int8]()
    var filled = min(PANEL, wt.n - n0)
    for c in range(filled):
        var n = n0 + c
        for kb in range(wt.k_blocks):
            panel_scales.unsafe_store(kb * PANEL + c, wt.scale(n, kb))
        var k = 0
        while k + RUN <= K:  # whole runs of the row, then its last quads
            _pack_run(panel, wt, n, k, c)
            k += RUN
        for kq in range(k // 4, ceildiv(K, 4)):
            var quad = SIMD[DType.int8, 4](Int8(-I8_OFFSET))
            comptime for e in range(4):
                if 4 * kq + e < K:
                    quad[e] = w.unsafe_load(wt.at(n, 4 * kq + e))
            panel.unsafe_store(kq * PANEL + c, bitcast[DType.uint32, 1](quad)[0])
    for c in range(filled, PANEL):
        for kb in range(wt.k_blocks):
            panel_scales.unsafe_store(kb * PANEL + c, 0)


@always_inline
def _broadcast_quad(q: Ptr[DType.uint8], at: Int) -> SIMD[DType.int8, 4 * DOT_LANES]:
    """The 4 bytes of x at q[at] in every lane: one vpbroadcastd from memory (a wider load split in registers costs
    AVX2 a move to the vector unit and a broadcast per quad)."""
    var quad = bitcast[DType.uint32, 1](q.unsafe_load[width=4](at))[0]
    return bitcast[DType.int8, 4 * DOT_LANES](SIMD[DType.uint32, DOT_LANES](quad))


struct NextTileShare(ImplicitlyCopyable):
    """The share of the next weight tile that one of a tile's passes over the rows of x asks for, a line a step (at
    most one line a step: two or more passes). Each pass after the first computes from cache and leaves the memory
    idle: spread over all of them, the next tile streams in behind the compute instead of before it."""

    var at: Int
    var end: Int

    def __init__(out self, tile_bytes: Int, pass_index: Int, passes: Int):
        """tile_bytes: a tile's bytes, the next one's offset (0: no next tile)."""
        var span = ceildiv(tile_bytes, passes * 64) * 64
        self.at = tile_bytes + pass_index * span
        self.end = tile_bytes + min((pass_index + 1) * span, tile_bytes) if passes > 1 else 0

    @always_inline
    def step(mut self, base: Ptr[DType.uint8]):
        if self.at < self.end:
            prefetch[PrefetchOptions().for_read().medium_locality()](base.unsafe_offset(self.at))
            self.at += 64


@always_inline
def _quad_panel_tile[a_type: DType, rows: Int, stride: Int = PANEL, fetch: Bool = False, panels: Int = 1](
    y: Ptr[a_type], xq: _QuantizedX, panel: Ptr[DType.uint32], panel_scales: Ptr[F32], scale_stride: Int, m0: Int,
    n0: Int, N: Int, K: Int, block_k: Int, share: NextTileShare = NextTileShare(0, 0, 1),
):
    """y[m0 : m0 + rows, n0 : n0 + panels * PANEL] from `panels` quad panels side by side: each step a quad of x
    broadcast against 2 x 16 quads a panel, exact int32 sums per block, then both scales. K: the rows' stride in xq;
    `stride`: the panels' (within a wider one); block kb's scales of the panels' rows at panel_scales + kb *
    scale_stride; `fetch`: the panels are read from memory, asked for QUAD_PREFETCH_BYTES ahead; `share`: the next
    tile's lines this pass asks for (bytes from `panel`)."""
    comptime assert PANEL == 2 * DOT_LANES, "quad panels are two dot-product accumulators wide"
    comptime vectors = 2 * panels
    var q = ptr(xq.q).unsafe_bitcast[UInt8]()
    var next = share
    var acc = Array[SIMD[F32, DOT_LANES], vectors * rows](fill=0)
    for kb in range(xq.k_blocks):
        var dots = Array[SIMD[DType.int32, DOT_LANES], vectors * rows](fill=0)
        for kq in range(kb * block_k // 4, ceildiv(min(K, kb * block_k + block_k), 4)):
            comptime if fetch:
                _ask_ahead[PANEL * panels](panel, kq * stride)
            next.step(panel.unsafe_bitcast[UInt8]())
            var b = Array[SIMD[DType.int8, 4 * DOT_LANES], vectors](fill=0)
            comptime for v in range(vectors):
                var quads = panel.unsafe_load[width=DOT_LANES](kq * stride + v * DOT_LANES)
                b[v] = bitcast[DType.int8, 4 * DOT_LANES](quads)
            comptime for i in range(rows):
                var a = _broadcast_quad(q, (m0 + i) * K + 4 * kq)
                comptime for v in range(vectors):
                    dots[vectors * i + v] = _dot_i8(dots[vectors * i + v], b[v], a)
        comptime for v in range(vectors):
            var s = panel_scales.unsafe_load[width=DOT_LANES](kb * scale_stride + v * DOT_LANES)
            comptime for i in range(rows):
                var sx = xq.scale(m0 + i, kb)
                var offset = SIMD[DType.int32, DOT_LANES](I8_OFFSET * xq.sum(m0 + i, kb))
                acc[vectors * i + v] = (dots[vectors * i + v] - offset).cast[F32]().fma(s * sx, acc[vectors * i + v])
    comptime for p in range(panels):
        var part = Array[SIMD[F32, DOT_LANES], 2 * rows](fill=0)
        comptime for i in range(rows):
            part[2 * i] = acc[vectors * i + 2 * p]
            part[2 * i + 1] = acc[vectors * i + 2 * p + 1]
        _store_panel_rows[a_type, rows, DOT_LANES](y, part, m0, n0 + p * PANEL, N)


trait RowPass(ImplicitlyCopyable):
    """A weight tile against one pass over the rows of x (row_passes)."""

    def rows_pass[rows: Int, fetch: Bool](self, m0: Int, share: NextTileShare):
        """y for rows m0 : m0 + rows of x; `fetch`: this pass streams the tile from memory; `share`: the next tile's
        lines it asks for."""
        ...


def row_passes[T: RowPass, //, most_rows: Int](tile: T, m: Int, fetch: Bool, next_tile: Int = 0):
    """tile against m rows of x in as few passes as take at most most_rows rows each, their rows as even as can be
    (16 rows as 8 + 8, not 12 + 4: Qwen3-0.6B's four linears, 28 layers, Intel Xeon without AMX, best of 5 alternated
    runs, int4 16.0-16.2 against 17.6-18.5 ms, int8 22.1-23.9 against 22.8-29.0; at 32-64 rows 1.02-1.04x). fetch:
    the first pass streams the tile from memory; next_tile: the bytes from the tile to the next one (0: none), which
    the passes ask for in shares (NextTileShare)."""
    var pass_rows = ceildiv(m, ceildiv(m, most_rows))
    var passes = ceildiv(m, pass_rows)
    for m0 in range(0, m, pass_rows):
        var rows = min(pass_rows, m - m0)
        var share = NextTileShare(next_tile, m0 // pass_rows, passes)
        comptime for r in range(1, most_rows + 1):
            if rows == r:
                if fetch and m0 == 0:
                    tile.rows_pass[r, True](m0, share)
                else:
                    tile.rows_pass[r, False](m0, share)


struct _QuadPanelPass[a_type: DType, stride: Int, panels: Int](RowPass):
    """`panels` quad panels side by side against a pass over the rows of x (_quad_panel_tile)."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var panel: Addr[DType.uint32]
    var panel_scales: Addr[F32]
    var scale_stride: Int
    var n0: Int
    var N: Int
    var K: Int
    var block_k: Int

    def __init__(
        out self, y: Ptr[Self.a_type], xq: _QuantizedX, panel: Ptr[DType.uint32], panel_scales: Ptr[F32],
        scale_stride: Int, n0: Int, N: Int, K: Int, block_k: Int,
    ):
        self.y, self.xq, self.panel, self.panel_scales = addr(y), xq, addr(panel), addr(panel_scales)
        self.scale_stride, self.n0, self.N, self.K, self.block_k = scale_stride, n0, N, K, block_k

    def rows_pass[rows: Int, fetch: Bool](self, m0: Int, share: NextTileShare):
        _quad_panel_tile[Self.a_type, rows, Self.stride, fetch, Self.panels](
            ptr(self.y), self.xq, ptr(self.panel), ptr(self.panel_scales), self.scale_stride, m0, self.n0, self.N,
            self.K, self.block_k, share,
        )


struct _DecodeTiles[a_type: DType, w_type: DType, tiled: Bool](ChunkTask):
    """Item: NR weight rows against every row of x, as the weight format reads x (x, xb or xq)."""

    var y: Addr[Self.a_type]
    var x: Addr[Self.a_type]
    var xb: Addr[DType.bfloat16]
    var xq: _QuantizedX
    var wt: _Weights[Self.w_type, Self.tiled]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], x: Ptr[Self.a_type], xb: Ptr[DType.bfloat16], xq: _QuantizedX,
                 wt: _Weights[Self.w_type, Self.tiled], m: Int):
        self.y, self.x, self.xb, self.xq, self.wt, self.m = addr(y), addr(x), addr(xb), xq, wt, m

    def run(self, item: Int):
        # int8 without VNNI (AVX2): one weight row at a time for every row of x streams faster (1.3x at one row,
        # 1.15x at eight, measured); float32 / bfloat16 weights NR rows at a time (1.2x at one row)
        comptime int8 = Self.w_type == DType.int8
        comptime row_by_row = int8 and not I8_DOT
        comptime cols = 1 if row_by_row else NR
        comptime step = I8_ROW_TILE if row_by_row else (I8_ROWS if int8 else MR)
        var n0 = item * NR
        for c in range(0, min(NR, self.wt.n - n0), cols):
            for m0 in range(0, self.m, step):
                var rows = min(step, self.m - m0)
                comptime for r in range(1, step + 1):
                    if rows == r:
                        if m0 == 0:
                            self._tile[r, cols, True](m0, n0 + c)
                        else:
                            self._tile[r, cols, False](m0, n0 + c)

    @always_inline
    def _tile[rows: Int, cols: Int, first: Bool](self, m0: Int, n0: Int):
        """`first`: the first rows of x, which read the tile from memory; the next rows read it from L1, where
        prefetching widened weights again cost float32 ones 1.1-1.25x at eight rows, when they were still prefetched
        (bfloat16 ones lost 5% without it)."""
        comptime if Self.w_type == DType.bfloat16:
            _decode_tile_bf16[Self.a_type, Self.w_type, Self.tiled, rows, cols](ptr(self.y), ptr(self.xb), self.wt, m0, n0)
        elif Self.w_type == DType.int8:
            _decode_tile_i8[Self.a_type, Self.w_type, Self.tiled, rows, cols, first](ptr(self.y), self.xq, self.wt, m0, n0)
        else:
            _decode_tile[Self.a_type, Self.w_type, Self.tiled, rows, cols, first](ptr(self.y), ptr(self.x), self.wt, m0, n0)


struct _PanelTiles[a_type: DType, x_type: DType, w_type: DType, tiled: Bool, stored: Bool = False](ChunkTask):
    """Item: a PANEL of weight rows, widened once, against every row of x (stored: F32_TILE_ROWS rows of a float32
    weight's panels, read in place)."""

    var y: Addr[Self.a_type]
    var x: Addr[Self.x_type]
    var wt: _Weights[Self.w_type, Self.tiled]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], x: Ptr[Self.x_type], wt: _Weights[Self.w_type, Self.tiled], m: Int):
        self.y, self.x, self.wt, self.m = addr(y), addr(x), wt, m

    def run(self, item: Int):
        comptime if Self.stored:
            self._stored(item)
            return
        var buffer = List[Float32](unsafe_uninit_length=self.wt.k * PANEL)  # _pack_panel writes all of it
        var panel = list_ptr(buffer)
        var n0 = item * PANEL
        _pack_panel(panel, self.wt, n0)
        for m0 in range(0, self.m, PANEL_ROWS):
            self.wt.prefetch_rows(n0 + PANEL, m0 // PANEL_ROWS, ceildiv(self.m, PANEL_ROWS))
            var rows = min(PANEL_ROWS, self.m - m0)
            comptime for r in range(1, PANEL_ROWS + 1):
                if rows == r:
                    _panel_tile[Self.a_type, Self.x_type, r](ptr(self.y), ptr(self.x), panel, m0, n0, self.wt.n, self.wt.k)

    def _stored(self, item: Int):
        """The first pass over the rows of x streams the panels from memory, the others read them from L2 and ask
        for shares of the next tile (NextTileShare)."""
        comptime assert Self.w_type == DType.float32 and Self.tiled, "stored panels are tiled float32 weights"
        var n0, K = item * F32_TILE_ROWS, self.wt.k
        var panel = ptr(self.wt.w).unsafe_bitcast[Float32]().unsafe_offset(n0 * K)
        if self.m == 1:
            comptime for half in range(0, F32_TILE_ROWS, PANEL):
                _panel_row[Self.a_type, Self.x_type, F32_TILE_ROWS](
                    ptr(self.y), ptr(self.x), panel.unsafe_offset(half), n0 + half, self.wt.n, K)
            return
        var next_tile = F32_TILE_ROWS * K * size_of[F32]() if n0 + F32_TILE_ROWS < self.wt.n else 0
        comptime for half in range(0, F32_TILE_ROWS, PANEL):  # the first half's pass streams both
            var tile = _PanelPass[Self.a_type, Self.x_type](ptr(self.y), ptr(self.x), panel.unsafe_offset(half),
                                                            n0 + half, self.wt.n, K)
            row_passes[PANEL_ROWS](tile, self.m, half == 0, next_tile if half == 0 else 0)


struct _PanelPass[a_type: DType, x_type: DType](RowPass):
    """PANEL columns of a stored float32 panel of F32_TILE_ROWS against a pass over the rows of x (_panel_tile)."""

    var y: Addr[Self.a_type]
    var x: Addr[Self.x_type]
    var panel: Addr[F32]
    var n0: Int
    var N: Int
    var K: Int

    def __init__(out self, y: Ptr[Self.a_type], x: Ptr[Self.x_type], panel: Ptr[F32], n0: Int, N: Int, K: Int):
        self.y, self.x, self.panel, self.n0, self.N, self.K = addr(y), addr(x), addr(panel), n0, N, K

    def rows_pass[rows: Int, fetch: Bool](self, m0: Int, share: NextTileShare):
        _panel_tile[Self.a_type, Self.x_type, rows, F32_TILE_ROWS, fetch](
            ptr(self.y), ptr(self.x), ptr(self.panel), m0, self.n0, self.N, self.K, share)


struct _PairPanelTiles[a_type: DType, w_type: DType, tiled: Bool, stored: Bool = False, swiglu: Bool = False](
    ChunkTask
):
    """Item: a PANEL of bfloat16 weight rows packed in pairs (stored: the weight is pair panels, read in place),
    against every row of x rounded to bfloat16. swiglu (stored only): a PANEL of y = silu_and_mul of the product, from
    a panel of the first half of the weight's rows (gate) and the same one of the second (up)."""

    var y: Addr[Self.a_type]
    var xb: Addr[DType.bfloat16]
    var wt: _Weights[Self.w_type, Self.tiled]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], xb: Ptr[DType.bfloat16], wt: _Weights[Self.w_type, Self.tiled], m: Int):
        self.y, self.xb, self.wt, self.m = addr(y), addr(xb), wt, m

    def run(self, item: Int):
        var n0 = item * PANEL
        comptime if Self.stored:
            var n = self.wt.n // 2 if Self.swiglu else self.wt.n  # y's columns
            var first = _stored_panel(self.wt, n0)
            var up = _stored_panel(self.wt, n + n0) if Self.swiglu else first
            var tile = _PairPanelPass[Self.a_type, Self.swiglu](ptr(self.y), ptr(self.xb), first, up, n0, n, self.wt.k)
            var next_panel = ceildiv(self.wt.k, 2) * PANEL * size_of[UInt32]() if n0 + PANEL < n else 0
            row_passes[PAIR_PANEL_ROWS](tile, self.m, True, next_panel)
        else:
            comptime assert not Self.swiglu, "swiglu reads the weight's panels in place"
            # _pack_pair_panel writes all of it
            var buffer = List[UInt32](unsafe_uninit_length=ceildiv(self.wt.k, 2) * PANEL)
            var panel = list_ptr(buffer)
            _pack_pair_panel(panel, self.wt, n0)
            var tile = _PairPanelPass[Self.a_type, False](ptr(self.y), ptr(self.xb), panel, panel, n0, self.wt.n,
                                                          self.wt.k)
            var passes = ceildiv(self.m, PAIR_PANEL_ROWS)
            for m0 in range(0, self.m, PAIR_PANEL_ROWS):
                self.wt.prefetch_rows(n0 + PANEL, m0 // PAIR_PANEL_ROWS, passes)  # the next panel's rows, to pack
                var rows = min(PAIR_PANEL_ROWS, self.m - m0)
                comptime for r in range(1, PAIR_PANEL_ROWS + 1):
                    if rows == r:
                        tile.rows_pass[r, False](m0, NextTileShare(0, 0, 1))
            _ = buffer^


struct _PairPanelPass[a_type: DType, swiglu: Bool](RowPass):
    """A pair panel against a pass over the rows of x (_pair_panel_tile); swiglu: a gate panel and its up panel
    (_pair_panel_swiglu_tile)."""

    var y: Addr[Self.a_type]
    var xb: Addr[DType.bfloat16]
    var panel: Addr[DType.uint32]
    var up: Addr[DType.uint32]
    var n0: Int
    var N: Int
    var K: Int

    def __init__(out self, y: Ptr[Self.a_type], xb: Ptr[DType.bfloat16], panel: Ptr[DType.uint32],
                 up: Ptr[DType.uint32], n0: Int, N: Int, K: Int):
        self.y, self.xb, self.panel, self.up = addr(y), addr(xb), addr(panel), addr(up)
        self.n0, self.N, self.K = n0, N, K

    def rows_pass[rows: Int, fetch: Bool](self, m0: Int, share: NextTileShare):
        comptime if Self.swiglu:
            _pair_panel_swiglu_tile[Self.a_type, rows, fetch](ptr(self.y), ptr(self.xb), ptr(self.panel), ptr(self.up),
                                                              m0, self.n0, self.N, self.K, share)
        else:
            _pair_panel_tile[Self.a_type, rows, fetch](ptr(self.y), ptr(self.xb), ptr(self.panel), m0, self.n0, self.N,
                                                       self.K, share)


struct _AmxPanelTiles[a_type: DType, w_type: DType, tiled: Bool, stored: Bool = False, swiglu: Bool = False](
    ChunkTask
):
    """Item: a PANEL of bfloat16 weight rows packed in pairs (stored: AMX_STORED_PANELS pair panels of the weight,
    read in place, K = kp), against every row of x rounded to bfloat16, on AMX tiles (amx_pair_panels). xb: x as
    tiles (x_tile_at), its rows padded to a multiple of AMX_BLOCK, its columns with zeros to kp, a multiple of amx_k.
    swiglu (stored only): y is silu_and_mul of the product, an item half as many panels of the first half of the
    weight's rows (gate) and the same ones of the second (up): as many sums in flight as a plain item."""

    var y: Addr[Self.a_type]
    var xb: Addr[DType.bfloat16]
    var wt: _Weights[Self.w_type, Self.tiled]
    var m: Int
    var kp: Int

    def __init__(out self, y: Ptr[Self.a_type], xb: Ptr[DType.bfloat16], wt: _Weights[Self.w_type, Self.tiled], m: Int,
                 kp: Int):
        self.y, self.xb, self.wt, self.m, self.kp = addr(y), addr(xb), wt, m, kp

    def run(self, item: Int):
        comptime assert Self.stored or not Self.swiglu, "swiglu reads the weight's panels in place"
        comptime per_item = (AMX_STORED_PANELS // (2 if Self.swiglu else 1)) if Self.stored else 1
        var n = self.wt.n // 2 if Self.swiglu else self.wt.n  # y's columns
        var n_first = item * per_item * PANEL
        var panels = min(per_item, ceildiv(n - n_first, PANEL))
        comptime if Self.stored:
            var first = _stored_panel(self.wt, n_first)
            var up = _stored_panel(self.wt, n + n_first) if Self.swiglu else first
            amx_pair_panels[Self.a_type, True, Self.swiglu](ptr(self.y), ptr(self.xb), first, up, panels, self.m,
                                                            self.kp, n_first, n)
        else:
            var buffer = List[UInt32](length=self.kp // 2 * PANEL, fill=0)  # pairs past K stay 0
            _pack_pair_panel(list_ptr(buffer), self.wt, n_first)
            amx_pair_panels[Self.a_type, False](ptr(self.y), ptr(self.xb), list_ptr(buffer), list_ptr(buffer), 1,
                                                self.m, self.kp, n_first, n)
            _ = buffer^


def amx_pair_panels[a_type: DType, stored: Bool, swiglu: Bool = False](
    y: Ptr[a_type], xb: Ptr[DType.bfloat16], panels: Ptr[DType.uint32], up_panels: Ptr[DType.uint32], count: Int,
    m: Int, kp: Int, n_first: Int, N: Int,
):
    """y[:m, n_first : n_first + count * PANEL] (up to column N) from `count` pair panels one after the other (kp / 2 *
    PANEL words each) against x as AMX tiles (x_tile_at, rows padded to a multiple of AMX_BLOCK, zeros past K to kp);
    stored: the panels stream from memory (asked for ahead on their first pass). The columns go in chunks of
    AMX_CHUNK_STEPS tile rows, each chunk over every panel and block of rows, the sums kept in float32 between
    chunks: a panel's chunk stays in L1 for all the blocks of rows and x's in L2 for all the panels (x whole, 1-3 MiB
    at 512 rows, was read from L3 for every panel). swiglu: y is silu(gate) * up, gate the products of `panels` and
    up those of as many `up_panels`, combined block by block as the last chunk ends (silu_mul)."""
    comptime assert PANEL == AMX_BLOCK, "a panel is two tiles of weights"
    comptime tile = AMX_ROWS * amx_k[DType.bfloat16]()
    comptime halves = 2 if swiglu else 1
    var rows = amx_rows(m)
    var sums_buffer = List[Float32](unsafe_uninit_length=halves * count * rows * PANEL)
    var steps = kp // amx_k[DType.bfloat16]()
    configure_tiles()
    var chunk = AMX_CHUNK_STEPS if m > AMX_CHUNK_ROWS else steps
    for s0 in range(0, steps, chunk):
        var count_steps, first, last = min(chunk, steps - s0), s0 == 0, s0 + chunk >= steps
        for p in range(count):
            var n0 = n_first + p * PANEL
            comptime for h in range(halves):
                var panel = (panels if h == 0 else up_panels).unsafe_offset((p * kp // 2 + s0 * AMX_ROWS) * PANEL)
                var sums = list_ptr(sums_buffer).unsafe_offset((h * count + p) * rows * PANEL)
                for m0 in range(0, m, AMX_BLOCK):
                    var block = sums.unsafe_offset(m0 * PANEL)
                    amx_block(m - m0, block, first, xb.unsafe_offset(m0 * kp + s0 * tile), kp, panel, count_steps,
                              stored and m0 == 0, panel, False)
                    if last and h == halves - 1:  # the gate's block is this one without swiglu
                        var gate = list_ptr(sums_buffer).unsafe_offset((p * rows + m0) * PANEL)
                        _store_block[swiglu=swiglu](y, gate, block, m0, min(AMX_BLOCK, m - m0), n0, N)
    release_tiles()


@always_inline
def _stored_panel[w_type: DType, tiled: Bool](wt: _Weights[w_type, tiled], n0: Int) -> Ptr[DType.uint32]:
    """The words of the pair panel of rows n0 .. n0 + PANEL - 1 of a weight stored as pair panels."""
    return ptr(wt.w).unsafe_bitcast[UInt32]().unsafe_offset(n0 * (wt.k // 2))


@always_inline
def _store_block[a_type: DType, swiglu: Bool = False](
    y: Ptr[a_type], block: Ptr[F32], up: Ptr[F32], m0: Int, rows: Int, n0: Int, N: Int,
):
    """y[m0 : m0 + rows, n0 : n0 + PANEL] = block [rows, PANEL] of sums, up to column N; swiglu: silu_mul of them
    (gate's) and of up's block (read only then)."""
    for i in range(rows):
        var out = (m0 + i) * N + n0
        if n0 + PANEL <= N:
            comptime for h in range(0, PANEL, W):
                y.unsafe_store(out + h, _block_value[a_type, W, swiglu](block, up, i * PANEL + h))
        else:
            for c in range(N - n0):
                y.unsafe_store(out + c, _block_value[a_type, 1, swiglu](block, up, i * PANEL + c))


@always_inline
def _block_value[a_type: DType, width: Int, swiglu: Bool](
    block: Ptr[F32], up: Ptr[F32], at: Int,
) -> SIMD[a_type, width]:
    comptime if swiglu:
        return silu_mul[a_type, width](block.unsafe_load[width=width](at), up.unsafe_load[width=width](at))
    else:
        return narrow[a_type, width](block.unsafe_load[width=width](at))


struct _QuadPanelTiles[a_type: DType, w_type: DType, tiled: Bool](ChunkTask):
    """Item: a PANEL of int8 weight rows packed in quads, against every row of x quantized to int8."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var wt: _Weights[Self.w_type, Self.tiled]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], xq: _QuantizedX, wt: _Weights[Self.w_type, Self.tiled], m: Int):
        self.y, self.xq, self.wt, self.m = addr(y), xq, wt, m

    def run(self, item: Int):
        var buffer = List[UInt32](length=ceildiv(self.wt.k, 4) * PANEL, fill=0)
        var scale_buffer = List[Float32](length=self.wt.k_blocks * PANEL, fill=0)
        var panel, panel_scales = list_ptr(buffer), list_ptr(scale_buffer)
        var n0 = item * PANEL
        _pack_quad_panel(panel, panel_scales, self.wt, n0)
        var tile = _QuadPanelPass[Self.a_type, PANEL, 1](
            ptr(self.y), self.xq, panel, panel_scales, PANEL, n0, self.wt.n, self.wt.k, self.wt.block_k)
        row_passes[QUAD_TILE_SUMS // 2](tile, self.m, False)
        _ = buffer^
        _ = scale_buffer^


struct _QuantizeRows[a_type: DType](ChunkTask):
    """Item: AMX_ROWS rows of x [m, k] quantized into xq (_quantize_x), rows `stride` apart, zeros past column k;
    as_tiles: the rows' 64 columns a step as AMX tiles (x_tile_at), zeros past row m."""

    var x: Addr[Self.a_type]
    var xq: _QuantizedX
    var m: Int
    var k: Int
    var block_k: Int
    var stride: Int
    var as_tiles: Bool

    def __init__(out self, x: Ptr[Self.a_type], xq: _QuantizedX, m: Int, k: Int, block_k: Int, stride: Int,
                 as_tiles: Bool):
        self.x, self.xq, self.m, self.k, self.block_k, self.stride = addr(x), xq, m, k, block_k, stride
        self.as_tiles = as_tiles

    def run(self, item: Int):
        var r0 = item * AMX_ROWS
        var rows, blocks = min(AMX_ROWS, self.m - r0), self.xq.k_blocks
        var out = ptr(self.xq.q).unsafe_offset(r0 * self.stride)
        var staged = List[Int8](length=AMX_ROWS * self.stride if self.as_tiles else 0, fill=0)
        var q = list_ptr(staged) if self.as_tiles else out
        var xq = _QuantizedX(q, ptr(self.xq.scales).unsafe_offset(r0), ptr(self.xq.sums).unsafe_offset(r0), blocks,
                             self.xq.rows)
        var unused = List[Float32]()
        _quantize_x[Self.a_type, False](ptr(self.x).unsafe_offset(r0 * self.k), xq, rows, self.k, self.block_k,
                                        self.stride, list_ptr(unused))
        if self.as_tiles:
            comptime cols = amx_k[DType.int8]()
            for r in range(AMX_ROWS):
                for c in range(0, self.stride, cols):
                    out.unsafe_store(x_tile_at[DType.int8](r, c, self.stride),
                                     q.unsafe_load[width=cols](r * self.stride + c))
            return
        for r in range(rows):
            for c in range(self.k, self.stride):
                q.unsafe_store(r * self.stride + c, 0)


def _quantized_x[a_type: DType, R: Runner](
    runner: R, x: Ptr[a_type], m: Int, rows: Int, k: Int, block_k: Int, stride: Int, mut q: List[Int8],
    mut scales: List[Float32], mut sums: List[Int32], as_tiles: Bool = False,
) -> _QuantizedX:
    """x [m, k] quantized per row and block of block_k columns into q (`rows` >= m rows `stride` apart, zeros past k
    and m), scales and sums (the caller keeps them alive); AMX_ROWS rows a work item."""
    q = List[Int8](unsafe_uninit_length=rows * stride + 8)  # a quad or an 8-column group read past the last row
    unsafe_memset_zero(list_ptr(q).unsafe_offset(m * stride), len(q) - m * stride)
    var k_blocks = ceildiv(k, block_k)
    scales = List[Float32](unsafe_uninit_length=m * k_blocks)
    sums = List[Int32](unsafe_uninit_length=m * k_blocks)
    var xq = _QuantizedX(list_ptr(q), list_ptr(scales), list_ptr(sums), k_blocks, m)
    runner.run(_QuantizeRows(x, xq, m, k, block_k, stride, as_tiles), ceildiv(m, AMX_ROWS), m < PARALLEL_X_ROWS)
    return xq


@always_inline
def _add_block_dots(
    acc: Ptr[F32], dots: Ptr[DType.int32], xq: _QuantizedX, m0: Int, rows: Int, kb: Int, scales: Ptr[F32],
):
    """acc[i] += sx * dots[i] * scales for the `rows` rows of a block of y (PANEL columns; rows PANEL apart) from x's
    row m0 on: block kb's int32 sums, scales its PANEL columns'. The first block (kb 0) sets acc: no zeroing first."""
    for i in range(rows):
        var sx = xq.scale(m0 + i, kb)
        comptime for h in range(0, PANEL, W):
            var at = i * PANEL + h
            var dot, scale = dots.unsafe_load[width=W](at).cast[F32](), scales.unsafe_load[width=W](h) * sx
            acc.unsafe_store(at, dot * scale if kb == 0 else dot.fma(scale, acc.unsafe_load[width=W](at)))


struct _AmxQuadPanels[a_type: DType, w_type: DType, tiled: Bool, swiglu: Bool = False](ChunkTask):
    """Item: AMX_STORED_PANELS tiles of I8_TILE_ROWS rows of a tiled int8 weight (a tile configuration and the buffers
    serve them all), their quad panels read in place, against every row of x quantized to int8, on AMX tiles
    (linear_amx.mojo): exact int32 sums per block of block_k columns (a multiple of 64), then both scales. xq: as AMX
    tiles (x_tile_at, kp columns: a multiple of 64, zeros past K), its rows padded to a multiple of AMX_BLOCK.
    swiglu: y is silu_and_mul of the product, an item half as many tiles of the first half of the weight's rows
    (gate), each with the same tile of the second (up)."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var wt: _Weights[Self.w_type, Self.tiled]
    var m: Int
    var kp: Int

    def __init__(out self, y: Ptr[Self.a_type], xq: _QuantizedX, wt: _Weights[Self.w_type, Self.tiled], m: Int, kp: Int):
        self.y, self.xq, self.wt, self.m, self.kp = addr(y), xq, wt, m, kp

    def run(self, item: Int):
        comptime assert I8_TILE_ROWS == AMX_BLOCK, "a tile of int8 weights is two tiles of quads"
        comptime per_item = AMX_STORED_PANELS // (2 if Self.swiglu else 1)
        var n = self.wt.n // 2 if Self.swiglu else self.wt.n  # y's columns
        var first = item * per_item
        var rows = amx_rows(self.m)
        var dot_buffer = List[Int32](unsafe_uninit_length=rows * PANEL)
        var acc_buffer = List[Float32](unsafe_uninit_length=(2 if Self.swiglu else 1) * rows * PANEL)
        var acc, up = list_ptr(acc_buffer), list_ptr(acc_buffer).unsafe_offset(rows * PANEL if Self.swiglu else 0)
        # the quads of the last columns, past the last whole step, with zeros after them: a step's tile is 16 rows
        var tail_buffer = List[UInt32](length=AMX_ROWS * I8_TILE_ROWS if self.wt.k % amx_k[DType.int8]() else 0,
                                       fill=0)
        configure_tiles()
        for t in range(first, min(first + per_item, n // I8_TILE_ROWS)):
            var n0 = t * I8_TILE_ROWS
            self._tile(n0, list_ptr(dot_buffer), acc, list_ptr(tail_buffer))
            comptime if Self.swiglu:
                self._tile(n + n0, list_ptr(dot_buffer), up, list_ptr(tail_buffer))
            for m0 in range(0, self.m, AMX_BLOCK):
                var block_rows = min(AMX_BLOCK, self.m - m0)
                _store_block[swiglu=Self.swiglu](ptr(self.y), acc.unsafe_offset(m0 * PANEL),
                                                 up.unsafe_offset(m0 * PANEL), m0, block_rows, n0, n)
        release_tiles()

    def _tile(self, n0: Int, dots_all: Ptr[DType.int32], acc_all: Ptr[F32], tail: Ptr[DType.uint32]):
        """acc_all [rows, PANEL] = the float32 sums of y[:, n0 : n0 + I8_TILE_ROWS]."""
        comptime step = amx_k[DType.int8]()
        comptime tile = AMX_ROWS * step
        var K, kp, N = self.wt.k, self.kp, self.wt.n
        var panel = ptr(self.wt.w).unsafe_bitcast[UInt32]().unsafe_offset(n0 * (K // 4))
        var whole = K // step
        for i in range((K - whole * step) // 4 * I8_TILE_ROWS):
            tail.unsafe_store(i, panel.unsafe_load(whole * step // 4 * I8_TILE_ROWS + i))
        var scales, q = ptr(self.wt.scales).unsafe_offset(n0), ptr(self.xq.q)
        var steps, block_steps = ceildiv(K, step), self.wt.block_k // step
        var chunk = AMX_CHUNK_STEPS if self.m > AMX_CHUNK_ROWS else steps
        for s0 in range(0, steps, chunk):  # a chunk of the panel stays in L1 for every block of rows
            var s1 = min(steps, s0 + chunk)
            for m0 in range(0, self.m, AMX_BLOCK):
                var x = q.unsafe_offset(m0 * kp)
                var dots, acc = dots_all.unsafe_offset(m0 * PANEL), acc_all.unsafe_offset(m0 * PANEL)
                var s = s0
                while s < s1:  # the chunk's share of each block it meets: int32 sums, scaled where a block ends
                    var kb = s // block_steps
                    var e = min(s1, (kb + 1) * block_steps)
                    var xs, ws = x.unsafe_offset(s * tile), panel.unsafe_offset(s * step // 4 * I8_TILE_ROWS)
                    # the weights' first pass (m0 == 0) streams them from memory
                    amx_block(self.m - m0, dots, s == kb * block_steps, xs, kp, ws, min(e, whole) - s, m0 == 0, tail,
                              e > whole)
                    if e == (kb + 1) * block_steps or e == steps:
                        _add_block_dots(acc, dots, self.xq, m0, min(AMX_BLOCK, self.m - m0), kb,
                                        scales.unsafe_offset(kb * N))
                    s = e


struct _StoredQuadPanels[a_type: DType, w_type: DType, tiled: Bool](ChunkTask):
    """Item: I8_TILE_ROWS rows of a tiled int8 weight, its quad panels read in place, against every row of x
    quantized to int8."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var wt: _Weights[Self.w_type, Self.tiled]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], xq: _QuantizedX, wt: _Weights[Self.w_type, Self.tiled], m: Int):
        self.y, self.xq, self.wt, self.m = addr(y), xq, wt, m

    def run(self, item: Int):
        comptime assert I8_TILE_ROWS % PANEL == 0, "a tile is whole quad panels"
        var n0 = item * I8_TILE_ROWS
        var panel = ptr(self.wt.w).unsafe_bitcast[UInt32]().unsafe_offset(n0 * (self.wt.k // 4))
        var scales, N = ptr(self.wt.scales).unsafe_offset(n0), self.wt.n
        comptime panels = I8_TILE_ROWS // PANEL
        if self.m <= QUAD_TILE_SUMS // (2 * panels):
            # the whole tile in one pass (AVX2: two panels, a pass each would stream every cache line of the tile from
            # memory while using half of them: 64 MB of int8 weights at one row of x, 0.77x the speed on Zen 3)
            if n0 + I8_TILE_ROWS < N:  # the next tile's scales, a run a block apart from the weights' stream
                for kb in range(self.wt.k_blocks):
                    comptime for at in range(0, I8_TILE_ROWS, 64 // size_of[F32]()):
                        prefetch[PrefetchOptions().for_read().medium_locality()](
                            scales.unsafe_offset(kb * N + I8_TILE_ROWS + at))
            var tile = _QuadPanelPass[Self.a_type, I8_TILE_ROWS, panels](
                ptr(self.y), self.xq, panel, scales, N, n0, N, self.wt.k, self.wt.block_k)
            row_passes[QUAD_TILE_SUMS // (2 * panels)](tile, self.m, True)
            return
        var next_tile = I8_TILE_ROWS * self.wt.k if n0 + I8_TILE_ROWS < N else 0
        comptime for half in range(0, I8_TILE_ROWS, PANEL):
            var tile = _QuadPanelPass[Self.a_type, I8_TILE_ROWS, 1](
                ptr(self.y), self.xq, panel.unsafe_offset(half), scales.unsafe_offset(half), N, n0 + half, N,
                self.wt.k, self.wt.block_k)
            row_passes[QUAD_TILE_SUMS // 2](tile, self.m, True, next_tile if half == 0 else 0)


def _int8_on_amx(m: Int, block_k: Int) -> Bool:
    """Whether a tiled int8 weight's linear over m rows of x runs on AMX tiles (_amx_int8)."""
    return m >= AMX_INT8_ROWS and use_amx[DType.int8](m, block_k)


def _amx_int8[a_type: DType, w_type: DType, R: Runner, tiled: Bool, //, swiglu: Bool = False](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], wt: _Weights[w_type, tiled], m: Int, serial: Bool,
):
    """A tiled int8 weight's linear on AMX tiles (_AmxQuadPanels; swiglu: silu_and_mul of it, y [m, n / 2])."""
    var q = List[Int8]()
    var q_scales = List[Float32]()
    var q_sums = List[Int32]()
    var kp = amx_padded[DType.int8](wt.k)
    var xq = _quantized_x(runner, x, m, amx_rows(m), wt.k, wt.block_k, kp, q, q_scales, q_sums, as_tiles=True)
    comptime halves = 2 if swiglu else 1
    runner.run(_AmxQuadPanels[a_type, w_type, tiled, swiglu](y, xq, wt, m, kp),
               ceildiv(wt.n // I8_TILE_ROWS // halves, AMX_STORED_PANELS // halves), serial)
    _ = q^
    _ = q_scales^
    _ = q_sums^


def linear_cpu[a_type: DType, w_type: DType, R: Runner, tiled: Bool = False](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[w_type], scales: Ptr[F32], m: Int, n: Int, k: Int, block_k: Int,
):
    comptime assert not (tiled and is_fp8[w_type]()), "tiled weights are float32, bfloat16 or int8"
    if m == 0 or n == 0:
        return
    var wt = _Weights[w_type, tiled](w, scales, n, k, block_k)
    var serial = m * n * k <= SERIAL_MACS
    comptime if tiled and w_type == DType.float32:
        runner.run(_PanelTiles[a_type, a_type, w_type, tiled, stored=True](y, x, wt, m), n // F32_TILE_ROWS, serial)
    elif tiled and w_type == DType.int8:
        if _int8_on_amx(m, wt.block_k):
            _amx_int8(runner, y, x, wt, m, serial)
        else:
            var q = List[Int8]()
            var q_scales = List[Float32]()
            var q_sums = List[Int32]()
            var xq = _quantized_x(runner, x, m, m, wt.k, wt.block_k, wt.k, q, q_scales, q_sums)
            runner.run(_StoredQuadPanels[a_type, w_type, tiled](y, xq, wt, m), n // I8_TILE_ROWS, serial)
            _ = q^
            _ = q_scales^
            _ = q_sums^
    else:
        _linear_cpu_rows[a_type, w_type, R, tiled](runner, y, x, wt, m, serial)


struct _XTiles[a_type: DType](ChunkTask):
    """Item: a tile's 16 rows of x rounded to bfloat16 into AMX tiles (x_tile_at), zeros past row m and column k."""

    var x: Addr[Self.a_type]
    var tiles: Addr[DType.bfloat16]
    var m: Int
    var k: Int
    var kp: Int

    def __init__(out self, x: Ptr[Self.a_type], tiles: Ptr[DType.bfloat16], m: Int, k: Int, kp: Int):
        self.x, self.tiles, self.m, self.k, self.kp = addr(x), addr(tiles), m, k, kp

    def run(self, item: Int):
        comptime cols = amx_k[DType.bfloat16]()
        for r in range(item * AMX_ROWS, (item + 1) * AMX_ROWS):
            for c in range(0, self.kp, cols):
                var dst = ptr(self.tiles).unsafe_offset(x_tile_at[DType.bfloat16](r, c, self.kp))
                var filled = 0 if r >= self.m else max(0, min(cols, self.k - c))
                _round_x(ptr(self.x).unsafe_offset(r * self.k + c), dst, filled)
                for t in range(filled, cols):
                    dst.unsafe_store(t, 0)


def _x_tiles[a_type: DType, R: Runner](runner: R, x: Ptr[a_type], m: Int, k: Int, kp: Int) -> List[BFloat16]:
    """x rounded to bfloat16 as AMX tiles (x_tile_at): its rows padded to whole blocks, its columns with zeros to kp."""
    var tiles = List[BFloat16](unsafe_uninit_length=amx_rows(m) * kp)
    runner.run(_XTiles(x, list_ptr(tiles), m, k, kp), amx_rows(m) // AMX_ROWS, m < PARALLEL_X_ROWS)
    return tiles^


def linear_pair_panels[a_type: DType, R: Runner, swiglu: Bool = False](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[DType.bfloat16], scales: Ptr[F32], m: Int, n: Int, k: Int,
):
    """y [m, n] = x [m, k] @ w^T for a bfloat16 weight stored as pair panels (PAIR_TILE_ROWS; n a multiple of it,
    k even), read in place: on AMX tiles at every m where the CPU has them and k is a multiple of their 32 columns
    (one row of x streams the weights as the decode tiles do; 8 or 16 rows cost little more), else by dot products
    of pairs (vdpbf16ps where the CPU has it). swiglu: y [m, n / 2] = silu_and_mul of the product (n / 2 a multiple
    of PANEL), each panel of y from a gate panel and its up panel, stored once combined."""
    comptime assert PANEL == PAIR_TILE_ROWS, "pair panels are an AVX-512 layout (check_linear_tiled refuses them)"
    if m == 0 or n == 0:
        return
    var wt = _Weights[DType.bfloat16, False](w, scales, n, k, k)
    var serial = m * n * k <= SERIAL_MACS
    var panels = n // PANEL // (2 if swiglu else 1)  # y's
    var rounded: List[BFloat16]
    if k % amx_k[DType.bfloat16]() == 0 and amx_granted():
        rounded = _x_tiles(runner, x, m, k, k)
        runner.run(_AmxPanelTiles[a_type, DType.bfloat16, False, True, swiglu](y, list_ptr(rounded), wt, m, k),
                   ceildiv(panels, AMX_STORED_PANELS // (2 if swiglu else 1)), serial)
    else:
        rounded = List[BFloat16]()
        var xb = _bf16_x(runner, x, m, k, rounded)
        runner.run(_PairPanelTiles[a_type, DType.bfloat16, False, True, swiglu](y, xb, wt, m), panels, serial)
    _ = rounded^


def linear_tiled_cpu[a_type: DType, w_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[w_type], scales: Ptr[F32], m: Int, n: Int, k: Int, block_k: Int,
    tile_rows_given: Int,
):
    """linear_cpu over a tiled weight (check_linear_tiled): bfloat16 pair panels or the tiles of tile_rows."""
    comptime if w_type == DType.bfloat16 and PANEL == PAIR_TILE_ROWS:
        if tile_rows_given == PAIR_TILE_ROWS:
            linear_pair_panels(runner, y, x, rebind[Ptr[DType.bfloat16]](w), scales, m, n, k)
            return
    linear_cpu[a_type, w_type, R, tiled=True](runner, y, x, w, scales, m, n, k, block_k)


def linear_tiled_swiglu_cpu[a_type: DType, w_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[w_type], scales: Ptr[F32], m: Int, n: Int, k: Int, block_k: Int,
    tile_rows_given: Int,
):
    """y [m, n / 2] = silu_and_mul(x @ w^T) for a tiled weight of n rows, gate's then up's: linear_tiled_cpu then
    silu_and_mul_cpu. bfloat16 pair panels (linear_pair_panels) and int8 tiles on AMX (_amx_int8) apply silu_and_mul
    as they store the sums, so the [m, n] product never goes to memory; the other layouts compute it first."""
    if m == 0 or n == 0:
        return
    comptime if w_type == DType.bfloat16 and PANEL == PAIR_TILE_ROWS:
        if tile_rows_given == PAIR_TILE_ROWS and (n // 2) % PANEL == 0:
            linear_pair_panels[swiglu=True](runner, y, x, rebind[Ptr[DType.bfloat16]](w), scales, m, n, k)
            return
    elif w_type == DType.int8:
        if _int8_on_amx(m, block_k) and (n // 2) % I8_TILE_ROWS == 0:
            var wt = _Weights[w_type, True](w, scales, n, k, block_k)
            _amx_int8[swiglu=True](runner, y, x, wt, m, m * n * k <= SERIAL_MACS)
            return
    var product = List[Scalar[a_type]](unsafe_uninit_length=m * n)
    linear_tiled_cpu[a_type, w_type](runner, list_ptr(product), x, w, scales, m, n, k, block_k, tile_rows_given)
    silu_and_mul_cpu[a_type](runner, y, list_ptr(product), m, n // 2)
    _ = product^


def linear_tiled_op[a_type: DType, w_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[w_type], scales: Ptr[F32], m: Int, n: Int, k: Int, y_n: Int,
    block_k: Int, tile_rows_given: Int,
):
    """mili_linear_tiled (check_linear_tiled passed): y [m, n] = x @ w^T, or, where y has half of the weight's n rows
    as its columns, y = silu_and_mul(x @ w^T)."""
    if y_n == n:
        linear_tiled_cpu[a_type, w_type](runner, y, x, w, scales, m, n, k, block_k, tile_rows_given)
    else:
        linear_tiled_swiglu_cpu[a_type, w_type](runner, y, x, w, scales, m, n, k, block_k, tile_rows_given)


def _linear_cpu_rows[a_type: DType, w_type: DType, R: Runner, tiled: Bool](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], wt: _Weights[w_type, tiled], m: Int, serial: Bool,
):
    """The decode tiles or the panels packed per call (every format and layout but tiled int8)."""
    var n, k = wt.n, wt.k
    var decode = m <= (BF16_DECODE_ROWS if w_type == DType.bfloat16 else DECODE_ROWS)
    # int8 prefill with VNNI or AVX2: quads of x against quads of a panel (which must not straddle a block)
    var quads = False
    comptime if w_type == DType.int8 and I8_QUADS:
        quads = wt.block_k % 4 == 0
        comptime if not I8_DOT:
            decode = decode and not (quads and m >= I8_MADD_PANEL_ROWS and PANEL * k <= L1_BYTES)
    # the effective x (see the top): bfloat16 weights read x rounded, int8 weights x quantized
    var rounded = List[BFloat16]()
    var xb = list_ptr(rounded)
    var q = List[Int8]()
    var q_scales = List[Float32]()
    var q_sums = List[Int32]()
    var effective = List[Float32]()
    var amx = False  # bfloat16 prefill on AMX tiles
    var kp = amx_padded[DType.bfloat16](k)
    var xq = _QuantizedX(list_ptr(q), list_ptr(q_scales), list_ptr(q_sums), wt.k_blocks, m)
    comptime if w_type == DType.int8:
        if decode or quads:
            xq = _quantized_x(runner, x, m, m, wt.k, wt.block_k, wt.k, q, q_scales, q_sums)
        else:
            effective.resize(m * k, 0)
            _quantize_x[a_type, True](x, xq, m, k, wt.block_k, k, list_ptr(effective))
    elif w_type == DType.bfloat16:
        amx = use_amx[DType.bfloat16](m, wt.block_k)
        if amx:
            rounded = _x_tiles(runner, x, m, k, kp)
            xb = list_ptr(rounded)
        elif decode or BF16_DOT:
            xb = _bf16_x(runner, x, m, k, rounded)
        else:
            effective = List[Float32](unsafe_uninit_length=m * k)
            _round_x(x, list_ptr(effective), m * k)
    if amx:
        comptime if AMX:  # AVX2 builds have no AMX and panels of 16 rows: not instantiated there
            runner.run(_AmxPanelTiles[a_type, w_type, tiled](y, xb, wt, m, kp), ceildiv(n, PANEL), serial)
    elif decode:
        runner.run(_DecodeTiles[a_type, w_type, tiled](y, x, xb, xq, wt, m), ceildiv(n, NR), serial)
    else:
        comptime if w_type == DType.bfloat16 and BF16_DOT:
            runner.run(_PairPanelTiles[a_type, w_type, tiled](y, xb, wt, m), ceildiv(n, PANEL), serial)
        elif w_type == DType.int8 and I8_QUADS:
            if quads:
                runner.run(_QuadPanelTiles[a_type, w_type, tiled](y, xq, wt, m), ceildiv(n, PANEL), serial)
            else:
                runner.run(_PanelTiles[a_type, F32, w_type, tiled](y, list_ptr(effective), wt, m), ceildiv(n, PANEL), serial)
        else:
            if len(effective) > 0:
                var xf = list_ptr(effective)
                runner.run(_PanelTiles[a_type, F32, w_type, tiled](y, xf, wt, m), ceildiv(n, PANEL), serial)
            else:
                runner.run(_PanelTiles[a_type, a_type, w_type, tiled](y, x, wt, m), ceildiv(n, PANEL), serial)
    _ = rounded^
    _ = q^
    _ = q_scales^
    _ = q_sums^
    _ = effective^


def _linear_gpu[a_type: DType, w_type: DType](
    y: Ptr[a_type], x: Ptr[a_type], w: Ptr[w_type], scales: Ptr[F32], n: Int32, k: Int32, block_k: Ptr[DType.int32],
):
    var col = Int(block_idx.x) * GPU_BLOCK + Int(thread_idx.x)
    var row = Int(block_idx.y)
    var N, K = Int(n), Int(k)
    if col >= N:
        return
    var bk = Int(block_k.unsafe_load(0)) if is_scaled[w_type]() else max(K, 1)
    var k_blocks = ceildiv(K, bk)
    var acc = Float32(0)
    for kb in range(k_blocks):
        var start, end = kb * bk, min(K, kb * bk + bk)
        var inv, sx = Float32(1), Float32(1)
        comptime if w_type == DType.int8:  # the effective x: quantized per block
            var largest = Float32(0)
            for i in range(start, end):
                largest = max(largest, abs(x.unsafe_load(row * K + i).cast[F32]()))
            inv = I8_X_MAX / largest if largest > 0 else Float32(0)
            sx = largest / I8_X_MAX
        var part = Float32(0)
        for i in range(start, end):
            var xv = x.unsafe_load(row * K + i).cast[F32]()
            comptime if w_type == DType.bfloat16:
                xv = narrow[DType.bfloat16, 1](xv)[0].cast[F32]()
            elif w_type == DType.int8:
                xv = round_even[1](xv * inv)[0]
            part += xv * widen[w_type, 1](w, col * K + i)[0]
        comptime if is_scaled[w_type]():
            part *= sx * block_scale[w_type](scales, col, kb, k_blocks)
        acc += part
    y.unsafe_store(row * N + col, acc.cast[a_type]())


def _check_shapes[w_type: DType](m: Int, k: Int, n: Int, w_k: Int, y_m: Int, y_n: Int, scale_rows: Int) raises:
    check_same["linear"](w_k, k, "weight's in_features", "x's last dimension")
    check_same["linear"](y_m, m, "output rows", "x rows")
    check_same["linear"](y_n, n, "output columns", "weight's out_features")
    comptime if is_scaled[w_type]():
        check_same["linear"](scale_rows, n, "scale rows", "weight's out_features")


def check_linear[w_type: DType](m: Int, k: Int, n: Int, w_k: Int, y_m: Int, y_n: Int, scale_rows: Int, scale_cols: Int,
                                block_k: Int) raises:
    _check_shapes[w_type](m, k, n, w_k, y_m, y_n, scale_rows)
    comptime if is_scaled[w_type]():
        if block_k <= 0:
            raise Error("linear: block_k must be positive, got ", block_k)
        check_same["linear"](scale_cols, ceildiv(k, block_k), "scale columns", "ceil(in_features / block_k)")


@register("mili_linear")
struct Linear:
    @staticmethod
    def execute[a_type: DType, w_type: DType, //, target: StaticString](
        y: OutputTensor[dtype=a_type, rank=2, ...],
        x: InputTensor[dtype=a_type, rank=2, ...],
        w: InputTensor[dtype=w_type, rank=2, ...],
        scales: InputTensor[dtype=DType.float32, rank=2, ...],
        block_k: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var m, k, n = x.dim_size[0](), x.dim_size[1](), w.dim_size[0]()
        comptime if target == "cpu":
            var bk = Int(block_k.unsafe_ptr().unsafe_load(0))
            check_linear[w_type](m, k, n, w.dim_size[1](), y.dim_size[0](), y.dim_size[1](), scales.dim_size[0](),
                                 scales.dim_size[1](), bk)
            linear_cpu[a_type, w_type](MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(), scales.unsafe_ptr(),
                                       m, n, k, bk)
        else:
            # block_k lives on the device: its agreement with the scales' width is checked by the callers
            _check_shapes[w_type](m, k, n, w.dim_size[1](), y.dim_size[0](), y.dim_size[1](), scales.dim_size[0]())
            if m == 0 or n == 0:
                return
            ctx.enqueue_function[_linear_gpu[a_type, w_type]](
                y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(), scales.unsafe_ptr(), Int32(n), Int32(k), block_k.unsafe_ptr(),
                grid_dim=(ceildiv(n, GPU_BLOCK), m), block_dim=GPU_BLOCK,
            )


def check_linear_tiled[w_type: DType](m: Int, k: Int, tiles_n: Int, tiles_k: Int, rows: Int, cols: Int, y_m: Int,
                                      y_n: Int, scale_rows: Int, scale_cols: Int, block_k: Int) raises:
    comptime if is_fp8[w_type]():
        raise Error("linear_tiled: tiled weights are float32, bfloat16 or int8, not FP8: pass the [N, K] weight")
    comptime tr, tk = tile_rows[w_type](), tile_k[w_type]()
    if y_n > 0 and 2 * y_n == tiles_n * rows:  # silu_and_mul of the product: y has half its columns
        return check_linear_tiled[w_type](m, k, tiles_n, tiles_k, rows, cols, y_m, 2 * y_n, scale_rows, scale_cols,
                                          block_k)
    var pairs = w_type == DType.bfloat16 and rows == PAIR_TILE_ROWS and cols == 2
    if pairs and PANEL != PAIR_TILE_ROWS:
        raise Error("linear_tiled: bfloat16 pair panels need AVX-512: pass the [N, K] weight or tiles of [", tr, ", ",
                    tk, "]")
    if not pairs and (rows != tr or cols != tk):
        raise Error("linear_tiled: ", w_type, " weights must be tiled [N / ", tr, ", K / ", tk, ", ", tr, ", ", tk,
                    "]", " or pair panels [N / 32, K / 2, 32, 2]" if w_type == DType.bfloat16 else "",
                    ", got tiles of [", rows, ", ", cols, "] (bindings.reference.tile_weight makes them)")
    comptime if w_type == DType.int8:  # a block's scales of a tile are one run: [K / block_k, N]
        var n, blocks = tiles_n * rows, ceildiv(k, max(block_k, 1))
        check_linear[w_type](m, k, n, tiles_k * cols, y_m, y_n, n, blocks, block_k)
        check_same["linear_tiled"](scale_rows, blocks, "scale rows", "ceil(in_features / block_k) (int8 tiles' "
                                   "scales are [K / block_k, N]: bindings.reference.tile_scales)")
        check_same["linear_tiled"](scale_cols, n, "scale columns", "out_features (int8 tiles' scales are [K / "
                                   "block_k, N]: bindings.reference.tile_scales)")
    else:
        check_linear[w_type](m, k, tiles_n * rows, tiles_k * cols, y_m, y_n, scale_rows, scale_cols, block_k)
    comptime if is_scaled[w_type]():
        if block_k % tile_k[w_type]() != 0:
            raise Error("linear_tiled: block_k (", block_k, ") must be a multiple of the tiles' ", tile_k[w_type](),
                        " columns: pass the [N, K] weight")


@register("mili_linear_tiled")
struct LinearTiled:
    @staticmethod
    def execute[a_type: DType, w_type: DType, //, target: StaticString](
        y: OutputTensor[dtype=a_type, rank=2, ...],
        x: InputTensor[dtype=a_type, rank=2, ...],
        w: InputTensor[dtype=w_type, rank=4, ...],
        scales: InputTensor[dtype=DType.float32, rank=2, ...],
        block_k: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime if target == "cpu":
            var m, k, bk = x.dim_size[0](), x.dim_size[1](), Int(block_k.unsafe_ptr().unsafe_load(0))
            check_linear_tiled[w_type](m, k, w.dim_size[0](), w.dim_size[1](), w.dim_size[2](), w.dim_size[3](),
                                       y.dim_size[0](), y.dim_size[1](), scales.dim_size[0](), scales.dim_size[1](), bk)
            linear_tiled_op[a_type, w_type](MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(),
                                            scales.unsafe_ptr(), m, w.dim_size[0]() * w.dim_size[2](), k,
                                            y.dim_size[1](), bk, w.dim_size[2]())
        else:
            raise Error("linear_tiled: tiled weights are a CPU layout: on a GPU, mili_linear takes the [N, K] weight")
