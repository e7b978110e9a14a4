# Linear layers on 4-bit weights (MILI's int4 format; Qwen's AWQ and GPTQ-Int4 checkpoints are repacked into it when
# they load), and on 6-bit ones (the LM head under int4 layers, as llama.cpp's 4-bit files keep theirs at Q6_K):
# y[M, N] = x[M, K] @ dequantize(w)[N, K]^T with w[n, k] = q[n, k] * scales[n, kb] + mins[n, kb], q in
# 0..2^bits - 1, kb = k / block_k (block_k a multiple of 128).
# Layout (bindings/reference.pack_int4): each row as runs of RUN = 128 columns: 64 bytes of low nibbles, byte j of
# a run holding column j in its low nibble and column 64 + j in its high nibble; with 6 bits also 32 bytes of high
# bit pairs, byte j holding those of columns j, 32 + j, 64 + j, 96 + j; columns past K are 0. A mask or a shift of
# one vector load gives consecutive weights as bytes, the operand of the int8 dot products. The rows are tiled as
# the decode tile reads them: packed [ceil(N / NR), runs * NR * RUN * bits / 8], a tile's first run (each row's
# nibbles, then each row's pairs), then its second run... (rows past N are 0), so that a worker streams one
# sequential run of memory (the model's batch-1 step 1.04x faster than with [N, K / 2] rows on Zen 4). The bits
# are told by the bytes per tile.
# x is quantized to int8 per row and block of block_k columns as for int8 weights (reference.quantized_x, as
# llama.cpp's q4 formats do with q8): per block, sum_k w x = sx * (s * sum_k q xq + m * sum_k xq), exact int32 sums
# then the scales.
# CPU, by the number of rows M:
#   decode (M <= DECODE_ROWS): each weight byte crosses the memory bus once, prefetched PREFETCH_BYTES ahead. The
#     values (nibbles, or nibbles or'ed with their pairs) are the unsigned operand of AVX512_VNNI's vpdpbusd as
#     they are (64 products per instruction); AVX2's vpmaddubsw + vpmaddwd do 32 (63 * 127 * 2 fits its int16
#     pair sums).
#   prefill: a panel of PANEL weight rows is unpacked once, then computed against every PANEL_ROWS rows of x by
#     linear.mojo's panel tiles: with VNNI as int8 quads q - 2^(bits - 1) (the min takes it back), else as float32
#     weights.
# GPU: none (the model dequantizes 4-bit checkpoints to its activation dtype there).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from std.collections import Array
from std.math import ceildiv
from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.intrinsics import prefetch, PrefetchOptions

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, Addr, F32, Ptr, check_same
from .linear import (
    _QuantizedX, _quantize_x, _data, _tile_rows, _store_tile, _panel_tile, _quad_panel_rows, DECODE_ROWS, DOT_LANES,
    I8_DOT, I8_MADD, NR, PANEL, PANEL_ROWS, PREFETCH_BYTES, SERIAL_MACS,
)

comptime RUN = 128
"""Columns per run of a packed row."""
comptime RUN_BYTES = RUN // 2
"""Bytes of a row's low nibbles per run."""
comptime PAIR_BYTES = RUN // 4
"""Bytes of a 6-bit row's high bit pairs per run."""
comptime S = 4 * DOT_LANES
"""Bytes per dot-product operand."""
comptime Q4_ROWS = 2 if DOT_LANES == 16 else 1
"""Rows of x per decode tile: 2 x NR int32 sums, 2 x NR float32 totals, 4 x vectors and the weights fit AVX-512's 32
registers; AVX2's 16 take one row."""


struct _Int4Weights[bits: Int](ImplicitlyCopyable):
    """w packed in tiles of NR rows (see the top), with its scales and mins [N, ceil(K / block_k)]."""

    comptime run_bytes = RUN * Self.bits // 8
    """Bytes of a row per run."""
    comptime min_offset = Float32(1 << (Self.bits - 1))
    """What the VNNI quad panels take off each q (a signed byte, as vpdpbusd's offsetting in _dot_i8 needs)."""

    var w: Addr[DType.uint8]
    var scales: Addr[F32]
    var mins: Addr[F32]
    var n: Int
    var k: Int
    var runs: Int
    var block_k: Int
    var k_blocks: Int

    def __init__(out self, w: Ptr[DType.uint8], scales: Ptr[F32], mins: Ptr[F32], n: Int, k: Int, block_k: Int):
        comptime assert Self.bits == 4 or Self.bits == 6, "packed weights have 4 or 6 bits"
        self.w, self.scales, self.mins, self.n, self.k = addr(w), addr(scales), addr(mins), n, k
        self.runs = ceildiv(k, RUN)
        self.block_k = block_k
        self.k_blocks = ceildiv(k, block_k)

    @always_inline
    def padded_k(self) -> Int:
        return self.runs * RUN

    @always_inline
    def _tile_run(self, n: Int, k: Int) -> Int:
        return (n - n % NR) * self.runs * Self.run_bytes + (k // RUN) * (NR * Self.run_bytes)

    @always_inline
    def at(self, n: Int, k: Int) -> Int:
        """The first nibble byte of row n's run holding column k (k a multiple of RUN)."""
        return self._tile_run(n, k) + (n % NR) * RUN_BYTES

    @always_inline
    def pairs_at(self, n: Int, k: Int) -> Int:
        """The first high-pair byte of row n's run holding column k (6 bits)."""
        return self._tile_run(n, k) + NR * RUN_BYTES + (n % NR) * PAIR_BYTES

    @always_inline
    def values[width: Int, part: Int](self, b: SIMD[DType.uint8, width], n: Int, k: Int) -> Tuple[
        SIMD[DType.uint8, width], SIMD[DType.uint8, width]
    ]:
        """Row n's values of columns k + part * width ..., and of the same + 64, from their nibble bytes b (width 32
        or 64, k a multiple of RUN)."""
        var lo, hi = b & 15, b >> 4
        comptime if Self.bits == 6:
            var pairs = ptr(self.w).unsafe_load[width=PAIR_BYTES](self.pairs_at(n, k))
            lo |= _high_pairs[width, 2 * part](pairs)
            hi |= _high_pairs[width, 4 + 2 * part](pairs)
        return lo, hi

    @always_inline
    def scale(self, n: Int, kb: Int) -> Float32:
        return ptr(self.scales).unsafe_load(n * self.k_blocks + kb)

    @always_inline
    def min(self, n: Int, kb: Int) -> Float32:
        return ptr(self.mins).unsafe_load(n * self.k_blocks + kb)


@always_inline
def _high_pairs[width: Int, shift: Int](pairs: SIMD[DType.uint8, PAIR_BYTES]) -> SIMD[DType.uint8, width]:
    """Bits 4-5 of `width` consecutive 6-bit values whose pairs sit at `shift` of `pairs` (width 64: the first 32 at
    shift, the next 32 at shift + 2)."""
    comptime if width == 2 * PAIR_BYTES:
        return rebind[SIMD[DType.uint8, width]](((pairs >> UInt8(shift)).join(pairs >> UInt8(shift + 2)) & 3) << 4)
    else:
        comptime assert width == PAIR_BYTES, "32 or 64 values at a time"
        return rebind[SIMD[DType.uint8, width]](((pairs >> UInt8(shift)) & 3) << 4)


@always_inline
def _dot_u4(
    acc: SIMD[DType.int32, DOT_LANES], w: SIMD[DType.uint8, S], x: SIMD[DType.int8, S]
) -> SIMD[DType.int32, DOT_LANES]:
    """acc plus the products w * x (w in 0..63) summed in fours (in any grouping: the lanes are summed at the end)."""
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
            comptime at = c * DOT_LANES
            total += w.slice[DOT_LANES, offset=at]().cast[DType.int32]() * x.slice[DOT_LANES, offset=at]().cast[DType.int32]()
        return total


@always_inline
def _decode_tile_q4[a_type: DType, bits: Int, rows: Int, cols: Int, fetch: Bool](
    y: Ptr[a_type], xq: _QuantizedX, wt: _Int4Weights[bits], m0: Int, n0: Int,
):
    """y[m0 : m0 + rows, n0 : n0 + cols] from x quantized to int8 (rows padded_k apart); `fetch`: the tile is read
    from memory (its first rows of x), not from L1."""
    var w, q = ptr(wt.w), ptr(xq.q)
    var stride = wt.padded_k()
    var acc = Array[SIMD[F32, DOT_LANES], rows * cols](fill=0)
    var tail = Array[Float32, rows * cols](fill=0)
    var n_of = _tile_rows[cols](wt.n, n0)
    for kb in range(wt.k_blocks):
        var dots = Array[SIMD[DType.int32, DOT_LANES], rows * cols](fill=0)
        var k = kb * wt.block_k
        var end = min(k + wt.block_k, stride)
        while k < end:
            comptime for part in range(RUN_BYTES // S):
                var kx = k + part * S
                var x_low = Array[SIMD[DType.int8, S], rows](fill=0)
                var x_high = Array[SIMD[DType.int8, S], rows](fill=0)
                comptime for i in range(rows):
                    x_low[i] = q.unsafe_load[width=S]((m0 + i) * stride + kx)
                    x_high[i] = q.unsafe_load[width=S]((m0 + i) * stride + kx + RUN_BYTES)
                comptime for j in range(cols):
                    var at = wt.at(n_of[j], k) + part * S
                    comptime if fetch and part == 0:
                        prefetch[PrefetchOptions().for_read().medium_locality()](w.unsafe_offset(at + PREFETCH_BYTES))
                        comptime if bits == 6:
                            prefetch[PrefetchOptions().for_read().medium_locality()](
                                w.unsafe_offset(wt.pairs_at(n_of[j], k) + PREFETCH_BYTES)
                            )
                    var lo, hi = wt.values[S, part](w.unsafe_load[width=S](at), n_of[j], k)
                    comptime for i in range(rows):
                        dots[i * cols + j] = _dot_u4(_dot_u4(dots[i * cols + j], lo, x_low[i]), hi, x_high[i])
            k += RUN
        comptime for i in range(rows):
            var sx = xq.scale(m0 + i, kb)
            var x_sum = sx * Float32(xq.sum(m0 + i, kb))
            comptime for j in range(cols):
                acc[i * cols + j] = dots[i * cols + j].cast[F32]().fma(sx * wt.scale(n_of[j], kb), acc[i * cols + j])
                tail[i * cols + j] += x_sum * wt.min(n_of[j], kb)
    _store_tile[a_type, rows, cols, DOT_LANES](y, acc, tail, m0, n0, wt.n)


def _pack_q4_quad_panel[bits: Int](
    panel: Ptr[DType.uint32], panel_scales: Ptr[F32], panel_mins: Ptr[F32], wt: _Int4Weights[bits], n0: Int
):
    """panel[kq * PANEL + c] = q - min_offset of row n0 + c, columns 4kq .. 4kq + 3, as an int8 quad (linear.mojo's
    quad panels); its scale and min + min_offset * scale per block; 0 past the last row."""
    comptime WORDS = RUN_BYTES // 4
    var w = ptr(wt.w)
    var filled = min(PANEL, wt.n - n0)
    for c in range(filled):
        var n = n0 + c
        for kb in range(wt.k_blocks):
            var s = wt.scale(n, kb)
            panel_scales.unsafe_store(kb * PANEL + c, s)
            panel_mins.unsafe_store(kb * PANEL + c, wt.min(n, kb) + wt.min_offset * s)
        for r in range(wt.runs):
            var q_lo, q_hi = wt.values[RUN_BYTES, 0](w.unsafe_load[width=RUN_BYTES](wt.at(n, r * RUN)), n, r * RUN)
            comptime offset = UInt8(1 << (bits - 1))
            var lo = bitcast[DType.uint32, WORDS](q_lo - offset)  # wraps to q - offset's byte
            var hi = bitcast[DType.uint32, WORDS](q_hi - offset)
            comptime for e in range(WORDS):
                panel.unsafe_store((r * 2 * WORDS + e) * PANEL + c, lo[e])
                panel.unsafe_store((r * 2 * WORDS + WORDS + e) * PANEL + c, hi[e])
    for c in range(filled, PANEL):
        for kb in range(wt.k_blocks):
            panel_scales.unsafe_store(kb * PANEL + c, 0)
            panel_mins.unsafe_store(kb * PANEL + c, 0)


def _pack_q4_panel[bits: Int](panel: Ptr[F32], wt: _Int4Weights[bits], n0: Int):
    """panel[k * PANEL + c] = w[n0 + c, k] dequantized (k < K); 0 past the last row."""
    var w = ptr(wt.w)
    for c in range(PANEL):
        var n = n0 + c
        for k in range(wt.k):
            var v = Float32(0)
            if n < wt.n:
                var run, j = k - k % RUN, k % RUN
                var byte = w.unsafe_load(wt.at(n, run) + j % RUN_BYTES)
                var q = (byte >> 4) if j >= RUN_BYTES else (byte & 15)
                comptime if bits == 6:
                    var pairs = w.unsafe_load(wt.pairs_at(n, run) + j % PAIR_BYTES)
                    q |= ((pairs >> UInt8(2 * (j // PAIR_BYTES))) & 3) << 4
                var kb = k // wt.block_k
                v = Float32(q).fma(wt.scale(n, kb), wt.min(n, kb))
            panel.unsafe_store(k * PANEL + c, v)


struct _Int4DecodeTiles[a_type: DType, bits: Int](ChunkTask):
    """Item: NR weight rows against every row of x."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var wt: _Int4Weights[Self.bits]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], xq: _QuantizedX, wt: _Int4Weights[Self.bits], m: Int):
        self.y, self.xq, self.wt, self.m = addr(y), xq, wt, m

    def run(self, item: Int):
        var n0 = item * NR
        for m0 in range(0, self.m, Q4_ROWS):
            var rows = min(Q4_ROWS, self.m - m0)
            comptime for r in range(1, Q4_ROWS + 1):
                if rows == r:
                    if m0 == 0:
                        _decode_tile_q4[Self.a_type, Self.bits, r, NR, True](ptr(self.y), self.xq, self.wt, m0, n0)
                    else:
                        _decode_tile_q4[Self.a_type, Self.bits, r, NR, False](ptr(self.y), self.xq, self.wt, m0, n0)


struct _Int4QuadPanelTiles[a_type: DType, bits: Int](ChunkTask):
    """Item: a PANEL of weight rows unpacked into int8 quads, against every row of x quantized to int8 (VNNI)."""

    var y: Addr[Self.a_type]
    var xq: _QuantizedX
    var wt: _Int4Weights[Self.bits]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], xq: _QuantizedX, wt: _Int4Weights[Self.bits], m: Int):
        self.y, self.xq, self.wt, self.m = addr(y), xq, wt, m

    def run(self, item: Int):
        var buffer = List[UInt32](length=self.wt.padded_k() // 4 * PANEL, fill=0)
        var scale_buffer = List[Float32](length=self.wt.k_blocks * PANEL, fill=0)
        var min_buffer = List[Float32](length=self.wt.k_blocks * PANEL, fill=0)
        var panel, panel_scales, panel_mins = _data(buffer), _data(scale_buffer), _data(min_buffer)
        var n0 = item * PANEL
        _pack_q4_quad_panel(panel, panel_scales, panel_mins, self.wt, n0)
        _quad_panel_rows[biased=True](ptr(self.y), self.xq, panel, panel_scales, self.m, n0, self.wt.n,
                                      self.wt.padded_k(), self.wt.block_k, panel_mins)


struct _Int4PanelTiles[a_type: DType, bits: Int](ChunkTask):
    """Item: a PANEL of weight rows dequantized once into float32, against every row of the effective x."""

    var y: Addr[Self.a_type]
    var x: Addr[F32]
    var wt: _Int4Weights[Self.bits]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], x: Ptr[F32], wt: _Int4Weights[Self.bits], m: Int):
        self.y, self.x, self.wt, self.m = addr(y), addr(x), wt, m

    def run(self, item: Int):
        var buffer = List[Float32](length=self.wt.k * PANEL, fill=0)
        var panel = _data(buffer)
        var n0 = item * PANEL
        _pack_q4_panel(panel, self.wt, n0)
        for m0 in range(0, self.m, PANEL_ROWS):
            var rows = min(PANEL_ROWS, self.m - m0)
            comptime for r in range(1, PANEL_ROWS + 1):
                if rows == r:
                    _panel_tile[Self.a_type, F32, r](ptr(self.y), ptr(self.x), panel, m0, n0, self.wt.n, self.wt.k)


def linear_int4_cpu[a_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[DType.uint8], scales: Ptr[F32], mins: Ptr[F32], m: Int, n: Int,
    k: Int, block_k: Int, bits: Int,
):
    """bits: 4 or 6 (check_linear_int4's)."""
    if bits == 6:
        _linear_packed[a_type, 6](runner, y, x, _Int4Weights[6](w, scales, mins, n, k, block_k), m)
    else:
        _linear_packed[a_type, 4](runner, y, x, _Int4Weights[4](w, scales, mins, n, k, block_k), m)


def _linear_packed[a_type: DType, bits: Int, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], wt: _Int4Weights[bits], m: Int
):
    var n, k, block_k = wt.n, wt.k, wt.block_k
    if m == 0 or n == 0:
        return
    var serial = m * n * k <= SERIAL_MACS
    var decode = m <= DECODE_ROWS
    var q = List[Int8]()
    var q_scales = List[Float32](length=m * wt.k_blocks, fill=0)
    var q_sums = List[Int32](length=m * wt.k_blocks, fill=0)
    var effective = List[Float32]()
    var quantized = decode or I8_DOT  # x as int8, its rows padded to whole runs with zeros; else dequantized
    if quantized:
        q.resize(m * wt.padded_k() + 4, 0)
    else:
        effective.resize(m * k, 0)
    var xq = _QuantizedX(_data(q), _data(q_scales), _data(q_sums), wt.k_blocks)
    if quantized:
        _quantize_x[a_type, False](x, xq, m, k, block_k, wt.padded_k(), _data(effective))
    else:
        _quantize_x[a_type, True](x, xq, m, k, block_k, k, _data(effective))
    if decode:
        runner.run(_Int4DecodeTiles[a_type, bits](y, xq, wt, m), ceildiv(n, NR), serial)
    elif I8_DOT:
        runner.run(_Int4QuadPanelTiles[a_type, bits](y, xq, wt, m), ceildiv(n, PANEL), serial)
    else:
        runner.run(_Int4PanelTiles[a_type, bits](y, _data(effective), wt, m), ceildiv(n, PANEL), serial)
    _ = q^
    _ = q_scales^
    _ = q_sums^
    _ = effective^


def packed_tile_bytes(k: Int, bits: Int) -> Int:
    """Bytes per tile of NR rows of K columns of `bits`-bit values."""
    return ceildiv(k, RUN) * NR * RUN * bits // 8


def tile_bits(k: Int, tile_bytes: Int) -> Int:
    """The bits (4 or 6) of a tile of `tile_bytes` bytes over K columns; 0 when neither."""
    for bits in range(4, 7, 2):
        if tile_bytes == packed_tile_bytes(k, bits):
            return bits
    return 0


def check_linear_int4(m: Int, k: Int, n: Int, tiles: Int, tile_bytes: Int, y_m: Int, y_n: Int, scale_cols: Int,
                      min_rows: Int, min_cols: Int, block_k: Int) raises -> Int:
    """n: the scales' rows. Returns the weight's bits."""
    check_same["linear_int4"](tiles, ceildiv(n, NR), "the weight's tiles", "ceil(scale rows / 4)")
    var bits = tile_bits(k, tile_bytes)
    if bits == 0:
        check_same["linear_int4"](tile_bytes, packed_tile_bytes(k, 4),
                                  "the weight's bytes per tile", "256 (4 bits) or 384 (6 bits) per 128 columns of x "
                                  "(bindings.reference.pack_int4)")
    check_same["linear_int4"](y_m, m, "output rows", "x rows")
    check_same["linear_int4"](y_n, n, "output columns", "scale rows")
    if block_k <= 0 or block_k % RUN != 0:
        raise Error("linear_int4: block_k must be a positive multiple of ", RUN, ", got ", block_k)
    check_same["linear_int4"](min_rows, n, "min rows", "scale rows")
    check_same["linear_int4"](scale_cols, ceildiv(k, block_k), "scale columns", "ceil(in_features / block_k)")
    check_same["linear_int4"](min_cols, ceildiv(k, block_k), "min columns", "ceil(in_features / block_k)")
    return bits


@register("mili_linear_int4")
struct LinearInt4:
    @staticmethod
    def execute[a_type: DType, //, target: StaticString](
        y: OutputTensor[dtype=a_type, rank=2, ...],
        x: InputTensor[dtype=a_type, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        scales: InputTensor[dtype=DType.float32, rank=2, ...],
        mins: InputTensor[dtype=DType.float32, rank=2, ...],
        block_k: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime if target == "cpu":
            var m, k, bk = x.dim_size[0](), x.dim_size[1](), Int(block_k.unsafe_ptr().unsafe_load(0))
            var n = scales.dim_size[0]()
            var bits = check_linear_int4(m, k, n, w.dim_size[0](), w.dim_size[1](), y.dim_size[0](), y.dim_size[1](),
                                         scales.dim_size[1](), mins.dim_size[0](), mins.dim_size[1](), bk)
            linear_int4_cpu[a_type](MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(),
                                    scales.unsafe_ptr(), mins.unsafe_ptr(), m, n, k, bk, bits)
        else:
            raise Error("linear_int4: 4-bit weights are a CPU format: on a GPU the model dequantizes them when it loads")
