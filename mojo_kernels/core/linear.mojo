# Linear layers on low-precision weights: y[M, N] = x[M, K] @ dequantize(w)[N, K]^T, float32 arithmetic.
# The weight format is w's dtype:
#   float32, bfloat16     the values themselves (bfloat16 widened with a shift)
#   float8_e4m3fn, int8   times a float32 scale per row and block of `block_k` columns: scales[N, ceil(K / block_k)]
#                         (Qwen's FP8 checkpoints' 128 x 128 blocks become per-row blocks when they are loaded).
#                         FP8 weights arrive as uint8 bits: MAX graphs refuse float8 tensors on CPU.
# FP8 e4m3 widening: the sign to bit 15 and the 7 exponent and mantissa bits to bits 7..13 make a float16 that is
# the e4m3 value times 2^-8, normals and subnormals alike; the 2^8 goes into the scale. Its conversion to float32
# (F16C) is exact and, unlike the same trick on float32 bits, makes no float32 subnormals, which cost a CPU
# microcode assist per instruction (FP8 decode 3x slower on random weights).
# CPU, by the number of rows M:
#   decode (M <= DECODE_ROWS): every weight byte crosses the memory bus once. A tile of NR weight rows is
#     widened in registers and feeds FMAs for MR rows of x at a time; for the next MR rows it is read again
#     from L1, not from memory.
#   prefill: a panel of PANEL weight rows is widened once into a float32 [K, PANEL] buffer (L2), and a
#     PANEL_ROWS x PANEL register tile of y is computed from it for every PANEL_ROWS rows of x.
# GPU: a thread per output element (the model graph dequantizes to bfloat16 and uses MAX's matmul there).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx
from std.collections import Array
from std.math import ceildiv
from std.memory import bitcast

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, load_f32, narrow, Addr, F32, F32_WIDTH, Ptr, GPU_BLOCK, check_same

comptime W = F32_WIDTH
comptime NR = 4
"""Weight rows per decode tile."""
comptime MR = 4 if F32_WIDTH >= 16 else 2
"""Rows of x per decode tile: MR x NR accumulators, NR widened weight vectors and MR x vectors fit the registers."""
comptime DECODE_ROWS = 8
comptime PANEL = 2 * F32_WIDTH
"""Weight rows per prefill panel: two vectors of y per row of x."""
comptime PANEL_ROWS = 6
"""Rows of x per prefill register tile: 12 accumulators, 2 panel vectors and a broadcast (16 AVX2 registers)."""
comptime SERIAL_MACS = 1 << 18
comptime FP8_SCALE = Float32(256)
"""2^8: see the widening above."""


@always_inline
def is_fp8[w_type: DType]() -> Bool:
    return w_type == DType.float8_e4m3fn or w_type == DType.uint8


@always_inline
def is_scaled[w_type: DType]() -> Bool:
    return is_fp8[w_type]() or w_type == DType.int8


@always_inline
def widen[w_type: DType, width: Int](w: Ptr[w_type], i: Int) -> SIMD[F32, width]:
    """`width` weights at w[i] as float32, before their scale."""
    comptime if is_fp8[w_type]():
        var b = w.unsafe_bitcast[UInt8]().unsafe_load[width=width](i).cast[DType.uint16]()
        return bitcast[DType.float16, width](((b & 0x80) << 8) | ((b & 0x7F) << 7)).cast[F32]()
    elif w_type == DType.int8:
        return w.unsafe_load[width=width](i).cast[F32]()
    else:
        return load_f32[w_type, width](w, i)


@always_inline
def block_scale[w_type: DType](scales: Ptr[F32], n: Int, kb: Int, k_blocks: Int) -> Float32:
    comptime if is_fp8[w_type]():
        return scales.unsafe_load(n * k_blocks + kb) * FP8_SCALE
    elif w_type == DType.int8:
        return scales.unsafe_load(n * k_blocks + kb)
    else:
        return 1


struct _Weights[w_type: DType](ImplicitlyCopyable):
    """w [N, K] with its scales, and where each of its blocks of columns ends."""

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
    def load[width: Int](self, n: Int, k: Int, scale: Float32) -> SIMD[F32, width]:
        var v = widen[Self.w_type, width](ptr(self.w), n * self.k + k)
        comptime if is_scaled[Self.w_type]():
            return v * scale
        else:
            return v


@always_inline
def _decode_tile[a_type: DType, w_type: DType, rows: Int](
    y: Ptr[a_type], x: Ptr[a_type], wt: _Weights[w_type], m0: Int, n0: Int,
):
    """y[m0 : m0 + rows, n0 : n0 + NR] (rows past N are computed on the last row and not stored)."""
    var K = wt.k
    var acc = Array[SIMD[F32, W], rows * NR](fill=0)
    var tail = Array[Float32, rows * NR](fill=0)
    var n_of = Array[Int, NR](fill=0)
    comptime for j in range(NR):
        n_of[j] = min(n0 + j, wt.n - 1)
    for kb in range(wt.k_blocks):
        var s = Array[Float32, NR](fill=1)
        comptime if is_scaled[w_type]():
            comptime for j in range(NR):
                s[j] = wt.scale(n_of[j], kb)
        var k = kb * wt.block_k
        var end = min(K, k + wt.block_k)
        while k + W <= end:
            var xv = Array[SIMD[F32, W], rows](fill=0)
            comptime for i in range(rows):
                xv[i] = load_f32[a_type, W](x, (m0 + i) * K + k)
            comptime for j in range(NR):
                var wv = wt.load[W](n_of[j], k, s[j])
                comptime for i in range(rows):
                    acc[i * NR + j] = xv[i].fma(wv, acc[i * NR + j])
            k += W
        while k < end:
            comptime for j in range(NR):
                var wv = wt.load[1](n_of[j], k, s[j])[0]
                comptime for i in range(rows):
                    tail[i * NR + j] += load_f32[a_type, 1](x, (m0 + i) * K + k)[0] * wv
            k += 1
    comptime for i in range(rows):
        comptime for j in range(NR):
            if n0 + j < wt.n:
                var v = acc[i * NR + j].reduce_add() + tail[i * NR + j]
                y.unsafe_store((m0 + i) * wt.n + n0 + j, narrow[a_type, 1](SIMD[F32, 1](v)))


def _pack_panel[w_type: DType](panel: Ptr[F32], wt: _Weights[w_type], n0: Int):
    """panel[k * PANEL + c] = dequantized w[n0 + c, k]; 0 for rows past N."""
    var K = wt.k
    for c in range(PANEL):
        var n = n0 + c
        if n >= wt.n:
            for k in range(K):
                panel.unsafe_store(k * PANEL + c, 0)
            continue
        for kb in range(wt.k_blocks):
            var s = wt.scale(n, kb)
            var k = kb * wt.block_k
            var end = min(K, k + wt.block_k)
            while k + W <= end:
                var v = wt.load[W](n, k, s)
                comptime for e in range(W):
                    panel.unsafe_store((k + e) * PANEL + c, v[e])
                k += W
            while k < end:
                panel.unsafe_store(k * PANEL + c, wt.load[1](n, k, s)[0])
                k += 1


@always_inline
def _panel_tile[a_type: DType, rows: Int](y: Ptr[a_type], x: Ptr[a_type], panel: Ptr[F32], m0: Int, n0: Int, N: Int, K: Int):
    """y[m0 : m0 + rows, n0 : n0 + PANEL] from a packed panel."""
    var acc = Array[SIMD[F32, W], 2 * rows](fill=0)
    for k in range(K):
        var b0 = panel.unsafe_load[width=W](k * PANEL)
        var b1 = panel.unsafe_load[width=W](k * PANEL + W)
        comptime for i in range(rows):
            var a = SIMD[F32, W](load_f32[a_type, 1](x, (m0 + i) * K + k)[0])
            acc[2 * i] = a.fma(b0, acc[2 * i])
            acc[2 * i + 1] = a.fma(b1, acc[2 * i + 1])
    comptime for i in range(rows):
        var out = (m0 + i) * N + n0
        if n0 + PANEL <= N:
            y.unsafe_store(out, narrow[a_type, W](acc[2 * i]))
            y.unsafe_store(out + W, narrow[a_type, W](acc[2 * i + 1]))
        else:
            for c in range(N - n0):
                var v = acc[2 * i][c] if c < W else acc[2 * i + 1][c - W]
                y.unsafe_store(out + c, narrow[a_type, 1](SIMD[F32, 1](v)))


struct _LinearTiles[a_type: DType, w_type: DType, prefill: Bool](ChunkTask):
    """Item: NR weight rows (decode) or a PANEL of them widened once (prefill), against every row of x."""

    var y: Addr[Self.a_type]
    var x: Addr[Self.a_type]
    var wt: _Weights[Self.w_type]
    var m: Int

    def __init__(out self, y: Ptr[Self.a_type], x: Ptr[Self.a_type], wt: _Weights[Self.w_type], m: Int):
        self.y, self.x, self.wt, self.m = addr(y), addr(x), wt, m

    def run(self, item: Int):
        var y, x = ptr(self.y), ptr(self.x)
        comptime if Self.prefill:
            var buffer = List[Float32](length=self.wt.k * PANEL, fill=0)
            var panel = buffer.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var n0 = item * PANEL
            _pack_panel(panel, self.wt, n0)
            for m0 in range(0, self.m, PANEL_ROWS):
                var rows = min(PANEL_ROWS, self.m - m0)
                comptime for r in range(1, PANEL_ROWS + 1):
                    if rows == r:
                        _panel_tile[Self.a_type, r](y, x, panel, m0, n0, self.wt.n, self.wt.k)
        else:
            for m0 in range(0, self.m, MR):
                var rows = min(MR, self.m - m0)
                comptime for r in range(1, MR + 1):
                    if rows == r:
                        _decode_tile[Self.a_type, Self.w_type, r](y, x, self.wt, m0, item * NR)


def linear_cpu[a_type: DType, w_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], w: Ptr[w_type], scales: Ptr[F32], m: Int, n: Int, k: Int, block_k: Int,
):
    if m == 0 or n == 0:
        return
    var wt = _Weights[w_type](w, scales, n, k, block_k)
    var serial = m * n * k <= SERIAL_MACS
    if m <= DECODE_ROWS:
        runner.run(_LinearTiles[a_type, w_type, False](y, x, wt, m), ceildiv(n, NR), serial)
    else:
        runner.run(_LinearTiles[a_type, w_type, True](y, x, wt, m), ceildiv(n, PANEL), serial)


def _linear_gpu[a_type: DType, w_type: DType](
    y: Ptr[a_type], x: Ptr[a_type], w: Ptr[w_type], scales: Ptr[F32], n: Int32, k: Int32, block_k: Ptr[DType.int32],
):
    var col = Int(block_idx.x) * GPU_BLOCK + Int(thread_idx.x)
    var row = Int(block_idx.y)
    var N, K, bk = Int(n), Int(k), Int(block_k.unsafe_load(0))
    if col >= N:
        return
    var k_blocks = ceildiv(K, bk) if is_scaled[w_type]() else 1
    var acc = Float32(0)
    for i in range(K):
        var v = widen[w_type, 1](w, col * K + i)[0]
        comptime if is_scaled[w_type]():
            v *= block_scale[w_type](scales, col, i // bk, k_blocks)
        acc += x.unsafe_load(row * K + i).cast[F32]() * v
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
            linear_cpu[a_type, w_type](MojoThreads(), y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(), scales.unsafe_ptr(),
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
