# Linear layers on 4-bit weights (MILI's int4 format; Qwen's AWQ and GPTQ-Int4 checkpoints are repacked into it when
# they load), and on 6-bit ones (the LM head under int4 layers, as llama.cpp's 4-bit files keep theirs at Q6_K):
# y[M, N] = x[M, K] @ dequantize(w)[N, K]^T with w[n, k] = q[n, k] * scales[kb, n] + mins[kb, n], q in
# 0..2^bits - 1, kb = k / block_k (block_k a multiple of GROUP).
# Layout (bindings/reference.pack_int4): tiles of TILE_ROWS = 32 rows, each as groups of GROUP = 8 columns; a group
# holds the 32 rows' 4-byte lanes, byte c of a row's lane its column c in the low nibble and column 4 + c in the high
# one: a mask or a shift of one vector load gives the unsigned quads vpdpbusd multiplies by a broadcast quad of x,
# 16 rows at a time, with nothing to reduce across lanes (the quad panels of linear.mojo, stored at half the bytes).
# 6-bit values add each 16 rows' 32 bytes of high bit pairs per group. Scales and mins are [ceil(N / 32),
# ceil(K / block_k), 32] (reference.tile_int4_scales): a tile's run one after the other as its groups do, and a block's
# scales of 16 rows are one vector. The bits are told by the bytes per tile. One min [1, 1, 1] is one value z for
# every block, its min z * its scale (a zero point's -zero: Q4_0's, Q6_K's, GPTQ's symmetric): half the bytes of
# scales and mins. Scales and mins are float16, or int8 codes (llama.cpp's K-quants: Q4_K's 6-bit scales and mins,
# Q6_K's int8 scales), each block's value its code times its row's float16 multiplier of the super-block of
# ceil(blocks / supers) blocks that holds it: supers [ceil(N / 32), supers, 2, 32], the scales' then the mins'
# (reference.coded_scales). Codes take mins as codes or as one min per scale. The ops take scales and mins as their
# bytes: 32 a tile and block are codes, 64 float16 values, 2 in all one min per scale.
# x is quantized to int8 per row and block of block_k columns as for int8 weights (reference.quantized_x, as
# llama.cpp's q4 formats do with q8): per block, sum_k w x = sx * (s * sum_k q xq + m * sum_k xq), exact int32 sums
# then the scales.
# CPU: every number of rows reads the tiles in place, up to X_ROWS rows of x a pass (linear.row_passes), a tile's groups
# streamed once from memory (prefetched PREFETCH_BYTES ahead) for the first rows of x and from cache for the next, every
# pass asking for a share of the next tile (linear.NextTileShare). With VNNI one row of x keeps two chains of dot
# products per vector of weights (low and high nibbles), else vpdpbusd's latency bounds it.
# AVX2: vpmaddubsw + vpmaddwd, the low and high nibbles' int16 pair sums added before vpmaddwd (2 * 63 * 127 * 2 fits
# int16); a tile as two panels of 16 rows, in one pass for one row of x (two passes would fetch the tile's second
# cache lines while using only its first: at one row, 1.2x on Qwen3-0.6B's layers, 1.4x on its 6-bit LM head).
# AMX (linear_amx.mojo), from AMX_INT4_ROWS rows of x on: each tile dequantized once into a bfloat16 pair panel
# against x rounded to bfloat16 (reference.linear_int4's amx), as the bfloat16 weights' prefill runs: on int8 tiles
# each block's int32 sums took longer to scale than TDPBSUD took to make them.
# GPU: none (the model dequantizes 4-bit checkpoints to its activation dtype there).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from std.collections import Array
from std.math import ceildiv
from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.intrinsics import prefetch, PrefetchOptions
from std.utils.index import IndexList

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, list_ptr, Addr, F16, F32, Ptr, check_same
from .linear import (
    _QuantizedX, _broadcast_quad, _quantized_x, _store_panel_rows, _x_tiles, amx_pair_panels, DOT_LANES, I8_DOT,
    I8_MADD, NextTileShare, PANEL, PREFETCH_BYTES, QUAD_TILE_SUMS, RowPass, SERIAL_MACS, row_passes,
)
from .linear_amx import AMX, AMX_ROWS, amx_padded, use_amx

comptime TILE_ROWS = 32
"""Weight rows per tile."""
comptime GROUP = 8
"""Columns per group of a tile: a lane's 4 bytes, two nibbles each."""
comptime LANE_BYTES = 4 * TILE_ROWS
"""Bytes of a group's nibbles."""
comptime HALF_BYTES = 64
"""Lane bytes of 16 rows, which share 32 bytes of 6-bit high pairs."""
comptime S = 4 * DOT_LANES
"""Bytes per dot-product operand: the lanes of DOT_LANES rows."""
comptime X_ROWS = QUAD_TILE_SUMS // 2 if DOT_LANES == 16 else 3
"""Rows of x per register tile. AVX-512: 24 int32 block sums, 4 weight vectors and 2 broadcasts, the float32 totals in
L1 (LLVM spills them: touched once a block). Each pass unpacks the tile's nibbles again: 12 rows against 6 took Qwen3-
0.6B's four linears, Intel Xeon without AMX, from 5.0-5.1 to 4.4-4.5 ms at 8 rows of x and 15.6-16.0 to 14.9-15.0 at 32
over 12 layers, 12.4 to 12.1 and 31.2 to 30.0 over 28 (beyond the caches; 17.3 at 16 rows either way). AVX2's 16
registers take 3 rows, the totals in registers."""

comptime AMX_INT4_ROWS = 64
"""Rows of x from which the 4-bit linears run on AMX tiles where the CPU has them (reference.AMX_INT4_ROWS), each
call dequantizing every tile once. Qwen3-0.6B's four linears of a layer on an Intel Xeon VM, best of 10, ms, at 16 /
32 / 64 / 128 / 512 rows: the VNNI tiles 0.67 / 1.53 / 3.07 / 6.31 / -; AMX 1.77 / 2.09 / 2.51 / 4.36 / 14.0; on
int8 tiles, x quantized and each block's sums scaled (as before) 1.07 / 1.81 / 2.80 / 5.28 / 18.5."""


@fieldwise_init
struct Int4Scales(ImplicitlyCopyable):
    """How a 4-bit weight holds its scales and mins (see the top): shared_min, one min per scale; coded, int8 codes
    times the multipliers of `supers` super-blocks a row."""

    var shared_min: Bool
    var coded: Bool
    var supers: Int


struct _Int4Tiles[bits: Int](ImplicitlyCopyable):
    """w packed in tiles of TILE_ROWS rows, with its scales and mins [ceil(N / TILE_ROWS), ceil(K / block_k),
    TILE_ROWS] as bytes: float16 values, or int8 codes times supers, and mins as one min per scale (see the top)."""

    comptime group_bytes = TILE_ROWS * Self.bits
    """Bytes of a tile's group: its nibbles, then (6 bits) its high pairs."""

    var w: Addr[DType.uint8]
    var scales: Addr[DType.uint8]
    var mins: Addr[DType.uint8]
    var supers: Addr[F16]
    var n: Int
    var k: Int
    var groups: Int
    var block_k: Int
    var k_blocks: Int
    var form: Int4Scales
    var min_per_scale: Float32
    var super_blocks: Int

    def __init__(out self, w: Ptr[DType.uint8], scales: Ptr[DType.uint8], mins: Ptr[DType.uint8], supers: Ptr[F16],
                 n: Int, k: Int, block_k: Int, form: Int4Scales):
        comptime assert Self.bits == 4 or Self.bits == 6, "packed weights have 4 or 6 bits"
        self.w, self.scales, self.mins, self.supers = addr(w), addr(scales), addr(mins), addr(supers)
        self.n, self.k = n, k
        self.groups = ceildiv(k, GROUP)
        self.block_k = block_k
        self.k_blocks = ceildiv(k, block_k)
        self.form = form
        self.min_per_scale = mins.unsafe_bitcast[Float16]().unsafe_load(0).cast[F32]() if form.shared_min else 0
        self.super_blocks = ceildiv(self.k_blocks, form.supers) if form.coded else 1

    @always_inline
    def block_scales[width: Int](self, block: Int, sup: Int, r: Int) -> SIMD[F32, width]:
        """The scales of `width` rows from row r of the block at `block` (block_at), whose multipliers are at `sup`
        (super_at)."""
        if self.form.coded:
            return self._decoded[width](self.scales, block + r, sup + r)
        return ptr(self.scales).unsafe_bitcast[Float16]().unsafe_load[width=width](block + r).cast[F32]()

    @always_inline
    def block_mins[width: Int](self, s: SIMD[F32, width], block: Int, sup: Int, r: Int) -> SIMD[F32, width]:
        """The mins of the same rows (block_scales'), whose scales are s."""
        if self.form.shared_min:
            return s * self.min_per_scale
        if self.form.coded:
            return self._decoded[width](self.mins, block + r, sup + TILE_ROWS + r)
        return ptr(self.mins).unsafe_bitcast[Float16]().unsafe_load[width=width](block + r).cast[F32]()

    @always_inline
    def _decoded[width: Int](self, codes: Addr[DType.uint8], at: Int, super_at: Int) -> SIMD[F32, width]:
        var c = ptr(codes).unsafe_bitcast[Int8]().unsafe_load[width=width](at).cast[F32]()
        return c * ptr(self.supers).unsafe_load[width=width](super_at).cast[F32]()

    @always_inline
    def super_at(self, tile: Int, kb: Int) -> Int:
        """Where the multipliers of a tile's block kb start (its scales', then TILE_ROWS on its mins')."""
        return (tile * self.form.supers + kb // self.super_blocks) * 2 * TILE_ROWS

    @always_inline
    def prefetch_block(self, tile: Int, kb: Int):
        """Asks for the scales and mins of a tile's block kb: a line each (a tile's multipliers, 128 bytes a
        super-block of 8 or 16 blocks, stream in with it)."""
        comptime ahead = PrefetchOptions().for_read().medium_locality()
        var at = self.block_at(tile, kb) * (1 if self.form.coded else 2)
        prefetch[ahead](ptr(self.scales).unsafe_offset(at))
        if not self.form.shared_min:
            prefetch[ahead](ptr(self.mins).unsafe_offset(at))

    @always_inline
    def padded_k(self) -> Int:
        return self.groups * GROUP

    @always_inline
    def tile_bytes(self) -> Int:
        return self.groups * Self.group_bytes

    @always_inline
    def group_at(self, tile: Int, g: Int) -> Int:
        return (tile * self.groups + g) * Self.group_bytes

    @always_inline
    def block_at(self, tile: Int, kb: Int) -> Int:
        """Where the scales and mins of a tile's block kb start."""
        return (tile * self.k_blocks + kb) * TILE_ROWS

    @always_inline
    def values[v: Int](self, at: Int) -> Tuple[SIMD[DType.uint8, S], SIMD[DType.uint8, S]]:
        """The quads of columns 0-3 and 4-7 of the group at `at`, rows v * DOT_LANES ... of its tile."""
        var b = ptr(self.w).unsafe_load[width=S](at + v * S)
        var lo, hi = b & 15, b >> 4
        comptime if Self.bits == 6:
            # lane byte b of a half has its pairs in byte b % 32 of the half's pairs, nibble b / 32
            comptime half, offset = v * S // HALF_BYTES, v * S % HALF_BYTES
            comptime pairs_at = LANE_BYTES + half * HALF_BYTES // 2
            var e: SIMD[DType.uint8, S]
            comptime if S == HALF_BYTES:
                var pairs = ptr(self.w).unsafe_load[width=HALF_BYTES // 2](at + pairs_at)
                e = rebind[SIMD[DType.uint8, S]]((pairs & 15).join(pairs >> 4))
            else:
                var pairs = ptr(self.w).unsafe_load[width=S](at + pairs_at + offset % (HALF_BYTES // 2))
                e = (pairs & 15) if offset < HALF_BYTES // 2 else (pairs >> 4)
            lo |= (e & 3) << 4
            hi |= (e & 12) << 2
        return lo, hi


@always_inline
def _dot_u4(
    acc: SIMD[DType.int32, DOT_LANES], w: SIMD[DType.uint8, S], x: SIMD[DType.int8, S]
) -> SIMD[DType.int32, DOT_LANES]:
    """acc plus the products w * x (w in 0..63) summed in fours."""
    comptime if I8_DOT and DOT_LANES == 16:
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.512", SIMD[DType.int32, DOT_LANES]](
            acc, w, bitcast[DType.uint8, S](x)
        )
    elif I8_MADD and DOT_LANES == 8:
        var pairs = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 2 * DOT_LANES]](w, x)
        return acc + llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, DOT_LANES]](
            pairs, SIMD[DType.int16, 2 * DOT_LANES](1)
        )
    else:
        var total = acc
        comptime for c in range(4):
            total += _lane_products[c](w, x)
        return total


@always_inline
def _dot_u4_pair(
    acc: SIMD[DType.int32, DOT_LANES], lo: SIMD[DType.uint8, S], a0: SIMD[DType.int8, S], hi: SIMD[DType.uint8, S],
    a1: SIMD[DType.int8, S],
) -> SIMD[DType.int32, DOT_LANES]:
    """acc plus the products lo * a0 and hi * a1 summed in fours. AVX2 adds the two vpmaddubsw results before one
    vpmaddwd: each pair sum is at most 63 * 127 * 2, so two fit int16."""
    comptime if I8_MADD and not I8_DOT and DOT_LANES == 8:
        var pairs = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 2 * DOT_LANES]](lo, a0)
        pairs += llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 2 * DOT_LANES]](hi, a1)
        return acc + llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, DOT_LANES]](
            pairs, SIMD[DType.int16, 2 * DOT_LANES](1)
        )
    else:
        return _dot_u4(_dot_u4(acc, lo, a0), hi, a1)


@always_inline
def _lane_products[c: Int](w: SIMD[DType.uint8, S], x: SIMD[DType.int8, S]) -> SIMD[DType.int32, DOT_LANES]:
    """Byte c of each lane of w times byte c of the same lane of x."""
    var product = SIMD[DType.int32, DOT_LANES](0)
    comptime for lane in range(DOT_LANES):
        product[lane] = Int32(w[4 * lane + c]) * Int32(x[4 * lane + c])
    return product


@always_inline
def _tile[a_type: DType, bits: Int, rows: Int, panel: Int, panels: Int, fetch: Bool](
    y: Ptr[a_type], xq: _QuantizedX, wt: _Int4Tiles[bits], tile: Int, m0: Int,
    share: NextTileShare = NextTileShare(0, 0, 1),
):
    """y[m0 : m0 + rows, the tile's PANEL columns from the panel-th, `panels` of them]; `fetch`: the first rows of x,
    which stream the tile from memory; `share`: the next tile's lines this pass asks for (bytes from the tile's)."""
    comptime chains = 2 if rows == 1 and I8_DOT else 1  # vpdpbusd's latency, else one chain a vector
    comptime vectors = 2 * panels
    var w, q = ptr(wt.w), ptr(xq.q).unsafe_bitcast[UInt8]()
    var stride = wt.padded_k()
    # the scales and mins as far ahead as the weights' prefetches: a block's are a line each
    var blocks_ahead = ceildiv(PREFETCH_BYTES, wt.block_k // GROUP * _Int4Tiles[bits].group_bytes)
    var acc = Array[SIMD[F32, DOT_LANES], vectors * rows](fill=0)
    var next, tile_start = share, w.unsafe_offset(wt.group_at(tile, 0))
    var block_groups = wt.block_k // GROUP
    var sup, left = wt.super_at(tile, 0), wt.super_blocks  # the block's multipliers, blocks left under them
    for kb in range(wt.k_blocks):
        var block = wt.block_at(tile, kb)
        comptime if fetch:
            wt.prefetch_block(tile, kb + blocks_ahead)
        var dots = Array[SIMD[DType.int32, DOT_LANES], vectors * chains * rows](fill=0)
        for g in range(kb * block_groups, min(wt.groups, (kb + 1) * block_groups)):
            var at = wt.group_at(tile, g)
            comptime if fetch:
                comptime for line in range(0, _Int4Tiles[bits].group_bytes, 64):
                    prefetch[PrefetchOptions().for_read().medium_locality()](w.unsafe_offset(at + line + PREFETCH_BYTES))
            next.step(tile_start)
            var lo = Array[SIMD[DType.uint8, S], vectors](fill=0)
            var hi = Array[SIMD[DType.uint8, S], vectors](fill=0)
            comptime for v in range(vectors):
                lo[v], hi[v] = wt.values[2 * panel + v](at)
            comptime for i in range(rows):
                var at_x = (m0 + i) * stride + g * GROUP
                var a0 = _broadcast_quad(q, at_x)
                var a1 = _broadcast_quad(q, at_x + 4)
                comptime for v in range(vectors):
                    comptime d = (i * vectors + v) * chains
                    comptime if chains == 2:
                        dots[d] = _dot_u4(dots[d], lo[v], a0)
                        dots[d + 1] = _dot_u4(dots[d + 1], hi[v], a1)
                    else:
                        dots[d] = _dot_u4_pair(dots[d], lo[v], a0, hi[v], a1)
        comptime for v in range(vectors):
            comptime r = panel * PANEL + v * DOT_LANES
            var s = wt.block_scales[DOT_LANES](block, sup, r)
            var mn = wt.block_mins[DOT_LANES](s, block, sup, r)
            comptime for i in range(rows):
                comptime d = (i * vectors + v) * chains
                var dot = dots[d]
                comptime if chains == 2:
                    dot += dots[d + 1]
                var sx = xq.scale(m0 + i, kb)
                acc[i * vectors + v] = dot.cast[F32]().fma(s * sx, acc[i * vectors + v])
                acc[i * vectors + v] = mn.fma(sx * Float32(xq.sum(m0 + i, kb)), acc[i * vectors + v])
        left -= 1
        if left == 0:
            sup, left = sup + 2 * TILE_ROWS, wt.super_blocks
    comptime for p in range(panels):
        var part = Array[SIMD[F32, DOT_LANES], 2 * rows](fill=0)
        comptime for i in range(rows):
            part[2 * i] = acc[i * vectors + 2 * p]
            part[2 * i + 1] = acc[i * vectors + 2 * p + 1]
        _store_panel_rows[a_type, rows, DOT_LANES](y, part, m0, tile * TILE_ROWS + (panel + p) * PANEL, wt.n)


struct _Int4TileRows[a_type: DType, bits: Int](ChunkTask):
    """Item: a tile of weight rows against every row of x quantized to int8."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var wt: _Int4Tiles[Self.bits]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], xq: _QuantizedX, wt: _Int4Tiles[Self.bits], m: Int):
        self.y, self.xq, self.wt, self.m = addr(y), xq, wt, m

    def run(self, item: Int):
        if self.m == 1:  # the whole tile in one pass: the stream from memory reads every byte it fetches
            _tile[Self.a_type, Self.bits, 1, 0, TILE_ROWS // PANEL, True](ptr(self.y), self.xq, self.wt, item, 0)
        else:  # the passes of the first panel ask for the next tile in shares (linear.NextTileShare)
            var next_tile = self.wt.tile_bytes() if item + 1 < ceildiv(self.wt.n, TILE_ROWS) else 0
            comptime for panel in range(TILE_ROWS // PANEL):
                var tile = _Int4PanelPass[Self.a_type, Self.bits, panel](ptr(self.y), self.xq, self.wt, item)
                row_passes[X_ROWS](tile, self.m, panel == 0, next_tile if panel == 0 else 0)


struct _Int4PanelPass[a_type: DType, bits: Int, panel: Int](RowPass):
    """A tile's panel-th PANEL columns against a pass over the rows of x (_tile)."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var wt: _Int4Tiles[Self.bits]
    var tile: Int

    def __init__(out self, y: Ptr[Self.a_type], xq: _QuantizedX, wt: _Int4Tiles[Self.bits], tile: Int):
        self.y, self.xq, self.wt, self.tile = addr(y), xq, wt, tile

    def rows_pass[rows: Int, fetch: Bool](self, m0: Int, share: NextTileShare):
        _tile[Self.a_type, Self.bits, rows, Self.panel, 1, fetch](ptr(self.y), self.xq, self.wt, self.tile, m0, share)


struct _AmxInt4Tiles[a_type: DType, bits: Int](ChunkTask):
    """Item: a tile of weight rows dequantized into a bfloat16 pair panel, against every row of x rounded to bfloat16,
    on AMX tiles (linear.amx_pair_panels). xb: x as tiles (x_tile_at), rows padded to a multiple of AMX_BLOCK, zeros
    past K to kp."""

    var y: Addr[Self.a_type]
    var xb: Addr[DType.bfloat16]
    var wt: _Int4Tiles[Self.bits]
    var m: Int
    var kp: Int

    def __init__(out self, y: Ptr[Self.a_type], xb: Ptr[DType.bfloat16], wt: _Int4Tiles[Self.bits], m: Int, kp: Int):
        self.y, self.xb, self.wt, self.m, self.kp = addr(y), addr(xb), wt, m, kp

    def run(self, item: Int):
        comptime assert TILE_ROWS == PANEL and S == 4 * AMX_ROWS, "a tile is one pair panel, 16 rows a vector"
        var buffer = List[UInt32](length=self.kp // 2 * TILE_ROWS, fill=0)  # pairs past the groups stay 0
        var panel = list_ptr(buffer)
        var block_groups = self.wt.block_k // GROUP
        for kb in range(self.wt.k_blocks):
            var block, sup = self.wt.block_at(item, kb), self.wt.super_at(item, kb)
            var s2 = Array[SIMD[F32, 2 * AMX_ROWS], 2](fill=0)  # each 16 rows' scales and mins, lane 2r + j row r's
            var m2 = Array[SIMD[F32, 2 * AMX_ROWS], 2](fill=0)
            comptime for v in range(2):
                var s = self.wt.block_scales[AMX_ROWS](block, sup, v * AMX_ROWS)
                var mn = self.wt.block_mins[AMX_ROWS](s, block, sup, v * AMX_ROWS)
                s2[v], m2[v] = s.interleave(s), mn.interleave(mn)
            for g in range(kb * block_groups, min(self.wt.groups, (kb + 1) * block_groups)):
                var at = self.wt.group_at(item, g)
                comptime for v in range(2):
                    var lo, hi = self.wt.values[v](at)
                    comptime for h in range(2):
                        # byte 4r + c of a quad vector: column 4h + c of row r; as words, columns 4h + 2p + j of row r
                        var pairs = bitcast[DType.uint16, 2 * AMX_ROWS](lo if h == 0 else hi).deinterleave()
                        comptime for p in range(2):
                            var q = bitcast[DType.uint8, 2 * AMX_ROWS](pairs[p]).cast[F32]()
                            var w = q.fma(s2[v], m2[v]).cast[DType.bfloat16]()
                            panel.unsafe_store((4 * g + 2 * h + p) * TILE_ROWS + v * AMX_ROWS,
                                               bitcast[DType.uint32, AMX_ROWS](w))
        amx_pair_panels[Self.a_type, False](ptr(self.y), ptr(self.xb), panel, panel, 1, self.m, self.kp,
                                            item * TILE_ROWS, self.wt.n)
        _ = buffer^


def linear_int4_cpu[a_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[DType.uint8], scales: Ptr[DType.uint8], mins: Ptr[DType.uint8],
    supers: Ptr[F16], m: Int, n: Int, k: Int, block_k: Int, bits: Int, form: Int4Scales,
):
    """bits: 4 or 6 (check_linear_int4's); scales and mins as bytes, held as form says (int4_scales')."""
    if bits == 6:
        _linear_tiles[a_type, 6](runner, y, x, _Int4Tiles[6](w, scales, mins, supers, n, k, block_k, form), m)
    else:
        _linear_tiles[a_type, 4](runner, y, x, _Int4Tiles[4](w, scales, mins, supers, n, k, block_k, form), m)


def _linear_tiles[a_type: DType, bits: Int, R: Runner](runner: R, y: Ptr[a_type], x: Ptr[a_type], wt: _Int4Tiles[bits],
                                                      m: Int):
    if m == 0 or wt.n == 0:
        return
    var serial = m * wt.n * wt.k <= SERIAL_MACS
    if m >= AMX_INT4_ROWS and use_amx[DType.bfloat16](m, wt.block_k):
        comptime if AMX:  # AVX2 builds have no AMX and tiles of other shapes: not instantiated there
            var kp = amx_padded[DType.bfloat16](wt.padded_k())
            var xb = _x_tiles(runner, x, m, wt.k, kp)
            runner.run(_AmxInt4Tiles[a_type, bits](y, list_ptr(xb), wt, m, kp), ceildiv(wt.n, TILE_ROWS), serial)
            _ = xb^
    else:
        var q = List[Int8]()
        var q_scales = List[Float32]()
        var q_sums = List[Int32]()
        var xq = _quantized_x(runner, x, m, m, wt.k, wt.block_k, wt.padded_k(), q, q_scales, q_sums)  # rows to whole groups
        runner.run(_Int4TileRows[a_type, bits](y, xq, wt, m), ceildiv(wt.n, TILE_ROWS), serial)
        _ = q^
        _ = q_scales^
        _ = q_sums^


def packed_tile_bytes(k: Int, bits: Int) -> Int:
    """Bytes per tile of TILE_ROWS rows of K columns of `bits`-bit values."""
    return ceildiv(k, GROUP) * TILE_ROWS * bits


def tile_bits(k: Int, tile_bytes: Int) -> Int:
    """The bits (4 or 6) of a tile of `tile_bytes` bytes over K columns; 0 when neither."""
    for bits in range(4, 7, 2):
        if tile_bytes == packed_tile_bytes(k, bits):
            return bits
    return 0


def check_linear_int4(m: Int, k: Int, n: Int, tiles: Int, tile_bytes: Int, y_m: Int, scale_shape: IndexList[3],
                      min_shape: IndexList[3], block_k: Int) raises -> Int:
    """n: the output's columns; scales and mins as bytes (see the top). Returns the weight's bits."""
    check_same["linear_int4"](tiles, ceildiv(n, TILE_ROWS), "the weight's tiles", "ceil(output columns / 32)")
    var bits = tile_bits(k, tile_bytes)
    if bits == 0:
        check_same["linear_int4"](tile_bytes, packed_tile_bytes(k, 4),
                                  "the weight's bytes per tile", "128 (4 bits) or 192 (6 bits) per 8 columns of x "
                                  "(bindings.reference.pack_int4)")
    check_same["linear_int4"](y_m, m, "output rows", "x rows")
    if block_k <= 0 or block_k % GROUP != 0:
        raise Error("linear_int4: block_k must be a positive multiple of ", GROUP, ", got ", block_k)
    check_same["linear_int4"](scale_shape[0], tiles, "scale tiles", "the weight's tiles")
    check_same["linear_int4"](scale_shape[1], ceildiv(k, block_k), "scale blocks", "ceil(in_features / block_k)")
    if scale_shape[2] != TILE_ROWS and scale_shape[2] != 2 * TILE_ROWS:
        raise Error("linear_int4: a tile's scales of a block are 32 int8 codes or 32 float16 values (32 or 64 bytes), "
                    "got ", scale_shape[2], " bytes")
    if min_shape[0] * min_shape[1] * min_shape[2] != 2:  # else one float16 min per scale
        check_same["linear_int4"](min_shape[0], tiles, "min tiles", "the weight's tiles")
        check_same["linear_int4"](min_shape[1], scale_shape[1], "min blocks", "scale blocks")
        if min_shape[2] != TILE_ROWS and min_shape[2] != 2 * TILE_ROWS:
            raise Error("linear_int4: a tile's mins of a block are 32 int8 codes or 32 float16 values (32 or 64 "
                        "bytes), or all the mins one float16 min per scale (2 bytes), got ", min_shape[2], " bytes")
    return bits


def int4_scales[op: StaticString](scale_bytes: Int, min_bytes: Int, mins_size: Int, supers_size: Int, tiles: Int,
                                  k_blocks: Int) raises -> Int4Scales:
    """The form of a weight of `tiles` tiles and k_blocks blocks from the bytes of its scales and mins per tile and
    block (32: int8 codes, 64: float16 values), the bytes of all its mins (2: one float16 min per scale) and the
    elements of its multipliers (a placeholder, unread, unless its scales are codes)."""
    var coded, shared_min = scale_bytes == TILE_ROWS, mins_size == 2
    if coded and not shared_min and min_bytes != TILE_ROWS:
        raise Error(op, ": int8 scale codes take int8 min codes or one float16 min per scale, not float16 mins")
    if not coded and not shared_min and min_bytes != 2 * TILE_ROWS:
        raise Error(op, ": float16 scales take float16 mins, not int8 codes")
    if not coded:
        return Int4Scales(shared_min, False, 0)
    var supers = supers_size // (tiles * 2 * TILE_ROWS)
    if supers < 1 or supers > k_blocks or supers * tiles * 2 * TILE_ROWS != supers_size:
        raise Error(op, ": the multipliers of int8 scale codes are [ceil(N / 32), super-blocks (1 to ", k_blocks,
                    "), 2, 32] float16 (bindings.reference.coded_scales), got ", supers_size, " values for ", tiles,
                    " tiles")
    return Int4Scales(shared_min, True, supers)


@register("mili_linear_int4")
struct LinearInt4:
    @staticmethod
    def execute[a_type: DType, //, target: StaticString](
        y: OutputTensor[dtype=a_type, rank=2, ...],
        x: InputTensor[dtype=a_type, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        scales: InputTensor[dtype=DType.uint8, rank=3, ...],
        mins: InputTensor[dtype=DType.uint8, rank=3, ...],
        supers: InputTensor[dtype=DType.float16, rank=4, ...],
        block_k: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime if target == "cpu":
            var m, k, bk = x.dim_size[0](), x.dim_size[1](), Int(block_k.unsafe_ptr().unsafe_load(0))
            var n = y.dim_size[1]()
            var bits = check_linear_int4(m, k, n, w.dim_size[0](), w.dim_size[1](), y.dim_size[0](),
                                         scales.shape(), mins.shape(), bk)
            var form = int4_scales["linear_int4"](scales.dim_size[2](), mins.dim_size[2](), mins.size(),
                                                  supers.size(), w.dim_size[0](), ceildiv(k, bk))
            linear_int4_cpu[a_type](MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(),
                                    scales.unsafe_ptr(), mins.unsafe_ptr(), supers.unsafe_ptr(), m, n, k, bk, bits,
                                    form)
        else:
            raise Error("linear_int4: 4-bit weights are a CPU format: on a GPU the model dequantizes them when it loads")
