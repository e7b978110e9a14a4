# Activations, float32 arithmetic: silu_and_mul (SwiGLU: x[T, 2I] = [gate | up] -> silu(gate) * up),
# and elementwise silu, gelu (exact: with erf, not the tanh approximation) and relu on [rows, columns].
# CPU: chunks (rows for silu_and_mul) as a ChunkTask for a Runner (utils/parallel.mojo), vectorized. GPU: `foreach`.
from extensibility import register, InputTensor, OutputTensor, foreach
from layout import Coord
from max.gpu.host import DeviceContext
from std.algorithm import vectorize
from std.math import ceildiv, exp
from std.utils.index import IndexList

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, load_f32, narrow, Addr, F32, F32_WIDTH, Ptr, SERIAL_ELEMENTS, SERIAL_TRANSCENDENTAL, check_same

comptime SILU = 0
comptime GELU = 1
comptime RELU = 2
comptime CHUNK = 16384
"""CPU elements per parallel task."""


@always_inline
def _erf[width: Int](v: SIMD[F32, width]) -> SIMD[F32, width]:
    """erf as a rational function x * P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 in float32 beyond), the
    approximation of Eigen / XLA: a few ulps, and several times cheaper than `math.erf`."""
    var x = v.clamp(-4, 4)
    var x2 = x * x
    var p = x2.fma(-2.72614225801306e-10, 2.77068142495902e-08)
    p = x2.fma(p, -2.10102402082508e-06)
    p = x2.fma(p, -5.69250639462346e-05)
    p = x2.fma(p, -7.34990630326855e-04)
    p = x2.fma(p, -2.95459980854025e-03)
    p = x2.fma(p, -1.60960333262415e-02)
    var q = x2.fma(-1.45660718464996e-05, -2.13374055278905e-04)
    q = x2.fma(q, -1.68282697438203e-03)
    q = x2.fma(q, -7.37332916720468e-03)
    q = x2.fma(q, -1.42647390514189e-02)
    return x * p / q


@always_inline
def silu[width: Int](v: SIMD[F32, width]) -> SIMD[F32, width]:
    return v / (1 + exp(-v))


@always_inline
def silu_mul[dtype: DType, width: Int](gate: SIMD[F32, width], up: SIMD[F32, width]) -> SIMD[dtype, width]:
    """silu(gate) * up in dtype, from gate and up rounded to dtype first: silu_and_mul's element from the sums of a
    linear that would have stored them in dtype."""
    var g = narrow[dtype, width](gate).cast[F32]()
    var u = narrow[dtype, width](up).cast[F32]()
    return narrow[dtype, width](silu(g) * u)


@always_inline
def _activation[kind: Int, width: Int](v: SIMD[F32, width]) -> SIMD[F32, width]:
    comptime if kind == SILU:
        return silu(v)
    elif kind == GELU:
        return 0.5 * v * (1 + _erf(v * Float32(0.7071067811865476)))
    else:  # as torch: NaN and -0.0 pass through
        return v.lt(0).select(SIMD[F32, width](0), v)


@always_inline
def _relu_bfloat16_bits[width: Int](bits: SIMD[DType.uint16, width]) -> SIMD[DType.uint16, width]:
    """relu of bfloat16 values given as their bits, without widening: zero where the bits are those of a value
    below zero (sign set, not -0.0 = 0x8000, not a NaN > 0xFF80), as one unsigned comparison. The kernel loads
    and stores the bits as uint16: between bfloat16 loads and stores, LLVM folds the bit casts into a select of
    bfloat16 vectors, which CPUs without AVX512_BF16 (AMD Zen 3, most Intel before Sapphire Rapids) run element by
    element: 9x slower."""
    var below_zero = (bits - 0x8001).le(0xFF80 - 0x8001)
    return below_zero.select(SIMD[DType.uint16, width](0), bits)


struct _ElementwiseChunks[dtype: DType, kind: Int](ChunkTask):
    var y: Addr[Self.dtype]
    var x: Addr[Self.dtype]
    var n: Int

    def __init__(out self, y: Ptr[Self.dtype], x: Ptr[Self.dtype], n: Int):
        self.y, self.x, self.n = addr(y), addr(x), n

    def run(self, c: Int):
        comptime bits_only = Self.kind == RELU and Self.dtype == DType.bfloat16
        var y, x = ptr(self.y), ptr(self.x)
        var start = c * CHUNK

        def body[width: Int](i: Int) {var y, var x, var start}:
            comptime if bits_only:
                var bits = x.unsafe_bitcast[UInt16]().unsafe_load[width=width](start + i)
                y.unsafe_bitcast[UInt16]().unsafe_store(start + i, _relu_bfloat16_bits(bits))
            else:
                var v = load_f32[Self.dtype, width](x, start + i)
                y.unsafe_store(start + i, narrow[Self.dtype, width](_activation[Self.kind, width](v)))

        vectorize[F32_WIDTH * (2 if bits_only else 1)](min(CHUNK, self.n - start), body)


def elementwise_cpu[dtype: DType, kind: Int, R: Runner](runner: R, y: Ptr[dtype], x: Ptr[dtype], n: Int):
    var serial = n <= (SERIAL_ELEMENTS if kind == RELU else SERIAL_TRANSCENDENTAL)
    runner.run(_ElementwiseChunks[dtype, kind](y, x, n), ceildiv(n, CHUNK), serial)


struct _SiluAndMulRows[dtype: DType](ChunkTask):
    var y: Addr[Self.dtype]
    var x: Addr[Self.dtype]
    var inter: Int

    def __init__(out self, y: Ptr[Self.dtype], x: Ptr[Self.dtype], inter: Int):
        self.y, self.x, self.inter = addr(y), addr(x), inter

    def run(self, r: Int):
        var y, x, inter = ptr(self.y), ptr(self.x), self.inter
        var src = r * 2 * inter
        var dst = r * inter

        def body[width: Int](i: Int) {var y, var x, var inter, var src, var dst}:
            var gate = load_f32[Self.dtype, width](x, src + i)
            var up = load_f32[Self.dtype, width](x, src + inter + i)
            y.unsafe_store(dst + i, narrow[Self.dtype, width](_activation[SILU, width](gate) * up))

        vectorize[F32_WIDTH](inter, body)


def silu_and_mul_cpu[dtype: DType, R: Runner](runner: R, y: Ptr[dtype], x: Ptr[dtype], rows: Int, inter: Int):
    runner.run(_SiluAndMulRows[dtype](y, x, inter), rows, rows * inter <= SERIAL_TRANSCENDENTAL)


def check_silu_and_mul(x_cols: Int, y_cols: Int) raises:
    check_same["silu_and_mul"](x_cols, 2 * y_cols, "x columns", "2 * output columns")


@register("mili_silu_and_mul")
struct SiluAndMul:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        y: OutputTensor[dtype=dtype, rank=2, ...],
        x: InputTensor[dtype=dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var inter = y.dim_size[1]()
        check_silu_and_mul(x.dim_size[1](), inter)
        comptime if target == "cpu":
            silu_and_mul_cpu[dtype](MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), x.dim_size[0](), inter)
        else:
            def body[width: Int](idx: Coord[...]) {var x, var inter} -> SIMD[dtype, width]:
                var t = Int(idx[0])
                var i = Int(idx[1])
                var gate = x.load[width](IndexList[2](t, i)).cast[F32]()
                var up = x.load[width](IndexList[2](t, i + inter)).cast[F32]()
                return (_activation[SILU, width](gate) * up).cast[dtype]()

            foreach[target=target](body, y, ctx)


def _elementwise[dtype: DType, kind: Int, target: StaticString](
    y: OutputTensor[dtype=dtype, rank=2, ...], x: InputTensor[dtype=dtype, rank=2, ...], ctx: DeviceContext
) raises:
    comptime if target == "cpu":
        elementwise_cpu[dtype, kind](MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), x.size())
    else:
        def body[width: Int](idx: Coord[...]) {var x} -> SIMD[dtype, width]:
            return _activation[kind, width](x.load[width](idx).cast[F32]()).cast[dtype]()

        foreach[target=target](body, y, ctx)


@register("mili_silu")
struct Silu:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        y: OutputTensor[dtype=dtype, rank=2, ...], x: InputTensor[dtype=dtype, rank=2, ...], ctx: DeviceContext
    ) raises:
        _elementwise[dtype, SILU, target](y, x, ctx)


@register("mili_gelu")
struct Gelu:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        y: OutputTensor[dtype=dtype, rank=2, ...], x: InputTensor[dtype=dtype, rank=2, ...], ctx: DeviceContext
    ) raises:
        _elementwise[dtype, GELU, target](y, x, ctx)


@register("mili_relu")
struct Relu:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        y: OutputTensor[dtype=dtype, rank=2, ...], x: InputTensor[dtype=dtype, rank=2, ...], ctx: DeviceContext
    ) raises:
        _elementwise[dtype, RELU, target](y, x, ctx)
