# Activations, float32 arithmetic: silu_and_mul (SwiGLU: x[T, 2I] = [gate | up] -> silu(gate) * up),
# and elementwise silu, gelu (exact, erf) and relu on flat tensors. `foreach` vectorizes and
# parallelizes them on CPU and launches them on GPU.
from extensibility import register, InputTensor, OutputTensor, foreach
from layout import Coord
from max.gpu.host import DeviceContext
from std.math import erf, exp, sqrt
from std.utils.index import IndexList

from ..utils.types import F32, check_same


@register("mili_silu_and_mul")
struct SiluAndMul:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=y.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var inter = y.dim_size[1]()
        check_same["silu_and_mul"](x.dim_size[1](), 2 * inter, "x columns", "2 * output columns")

        def body[width: Int](idx: Coord[...]) {var x, var inter} -> SIMD[x.dtype, width]:
            var t = Int(idx[0])
            var i = Int(idx[1])
            var gate = x.load[width](IndexList[2](t, i)).cast[F32]()
            var up = x.load[width](IndexList[2](t, i + inter)).cast[F32]()
            return (gate / (1 + exp(-gate)) * up).cast[x.dtype]()

        foreach[target=target](body, y, ctx)


@register("mili_silu")
struct Silu:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[rank=1, ...], x: InputTensor[dtype=y.dtype, rank=1, ...], ctx: DeviceContext
    ) raises:
        def body[width: Int](idx: Coord[...]) {var x} -> SIMD[x.dtype, width]:
            var v = x.load[width](idx).cast[F32]()
            return (v / (1 + exp(-v))).cast[x.dtype]()

        foreach[target=target](body, y, ctx)


@register("mili_gelu")
struct Gelu:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[rank=1, ...], x: InputTensor[dtype=y.dtype, rank=1, ...], ctx: DeviceContext
    ) raises:
        def body[width: Int](idx: Coord[...]) {var x} -> SIMD[x.dtype, width]:
            var v = x.load[width](idx).cast[F32]()
            return (0.5 * v * (1 + erf(v * Float32(0.7071067811865476)))).cast[x.dtype]()

        foreach[target=target](body, y, ctx)


@register("mili_relu")
struct Relu:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[rank=1, ...], x: InputTensor[dtype=y.dtype, rank=1, ...], ctx: DeviceContext
    ) raises:
        def body[width: Int](idx: Coord[...]) {var x} -> SIMD[x.dtype, width]:
            var v = x.load[width](idx)
            return max(v, SIMD[x.dtype, width](0))

        foreach[target=target](body, y, ctx)
