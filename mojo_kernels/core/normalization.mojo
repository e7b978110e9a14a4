# RMSNorm family: y = x * rsqrt(mean(x^2) + eps) * w over the last dimension, float32 arithmetic.
#   mili.rms_norm            x[T, H]
#   mili.fused_add_rms_norm  residual_out = x + residual, y = rms_norm(residual_out)
#   mili.head_rms_norm       x[T, heads, D] with w[D]: Qwen3's q/k norm
# CPU: rows as a ChunkTask for a Runner (utils/parallel.mojo), vectorized within a row. GPU: one block per row.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx
from max.gpu.primitives import block
from max.gpu.primitives.grid_controls import wait_on_dependent_grids
from std.algorithm import vectorize
from std.math import rsqrt
from std.sys import size_of

from ..utils.dependent_launch import dependent_launch
from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, load_f32, narrow, Addr, F32, F32_WIDTH, Ptr, GPU_BLOCK, SERIAL_ELEMENTS, aligned_16, check_same


struct _NormRows[dtype: DType, fused: Bool](ChunkTask):
    var y: Addr[Self.dtype]
    var res_out: Addr[Self.dtype]
    var x: Addr[Self.dtype]
    var res: Addr[Self.dtype]
    var w: Addr[Self.dtype]
    var cols: Int
    var eps: Float32

    def __init__(out self, y: Ptr[Self.dtype], res_out: Ptr[Self.dtype], x: Ptr[Self.dtype], res: Ptr[Self.dtype],
                 w: Ptr[Self.dtype], cols: Int, eps: Float32):
        self.y, self.res_out, self.x, self.res, self.w = addr(y), addr(res_out), addr(x), addr(res), addr(w)
        self.cols, self.eps = cols, eps

    def run(self, r: Int):
        var y, res_out, x, res, w = ptr(self.y), ptr(self.res_out), ptr(self.x), ptr(self.res), ptr(self.w)
        var base = r * self.cols
        var src = x
        comptime if Self.fused:
            def add[width: Int](i: Int) {var res_out, var x, var res, var base}:
                var s = load_f32[Self.dtype, width](x, base + i) + load_f32[Self.dtype, width](res, base + i)
                res_out.unsafe_store(base + i, narrow[Self.dtype, width](s))

            vectorize[F32_WIDTH](self.cols, add)
            src = res_out
        rms_norm_row[Self.dtype](y, base, src, base, w, self.cols, self.eps)


@always_inline
def rms_norm_row[dtype: DType](y: Ptr[dtype], y_base: Int, x: Ptr[dtype], x_base: Int, w: Ptr[dtype], cols: Int, eps: Float32):
    """y[y_base : y_base + cols] = rms_norm(x[x_base : x_base + cols]) * w."""
    var acc = SIMD[F32, F32_WIDTH](0)
    var tail = Float32(0)

    def square[width: Int](i: Int) {mut acc, mut tail, var x, var x_base}:
        var v = load_f32[dtype, width](x, x_base + i)
        comptime if width == F32_WIDTH:
            acc += rebind[SIMD[F32, F32_WIDTH]](v * v)
        else:
            tail += (v * v).reduce_add()

    vectorize[F32_WIDTH](cols, square)
    var inv = rsqrt((acc.reduce_add() + tail) / Float32(cols) + eps)

    def scale[width: Int](i: Int) {var y, var y_base, var x, var x_base, var w, var inv}:
        var v = load_f32[dtype, width](x, x_base + i) * inv
        y.unsafe_store(y_base + i, narrow[dtype, width](v * load_f32[dtype, width](w, i)))

    vectorize[F32_WIDTH](cols, scale)


def norm_rows_cpu[dtype: DType, fused: Bool, R: Runner](
    runner: R, y: Ptr[dtype], res_out: Ptr[dtype], x: Ptr[dtype], res: Ptr[dtype], w: Ptr[dtype],
    rows: Int, cols: Int, eps: Float32,
):
    runner.run(_NormRows[dtype, fused](y, res_out, x, res, w, cols, eps), rows, rows * cols <= SERIAL_ELEMENTS)


def _norm_rows_gpu[dtype: DType, fused: Bool, width: Int](
    y: Ptr[dtype], res_out: Ptr[dtype], x: Ptr[dtype], res: Ptr[dtype], w: Ptr[dtype],
    cols: Int32, eps: Ptr[F32],
):
    """Block r: row r, `width` elements a load (16 bytes where the row allows: a 1,024-wide bfloat16 row is one load
    a thread a pass). With one element a load, 8 a thread a pass, a row took 5.9 us on an H200. Waits for the kernel
    before it (utils/dependent_launch.mojo)."""
    wait_on_dependent_grids()
    comptime ALIGN = width * size_of[dtype]()
    var n = Int(cols)
    var base = Int(block_idx.x) * n
    var first = Int(thread_idx.x) * width
    var epsilon = eps.unsafe_load(0)
    var src = x
    var s = Float32(0)
    for i in range(first, n, GPU_BLOCK * width):
        var v = x.unsafe_load[width=width, alignment=ALIGN](base + i).cast[F32]()
        comptime if fused:
            var rounded = (v + res.unsafe_load[width=width, alignment=ALIGN](base + i).cast[F32]()).cast[dtype]()
            res_out.unsafe_store[alignment=ALIGN](base + i, rounded)
            v = rounded.cast[F32]()
        s += (v * v).reduce_add()
    comptime if fused:
        src = res_out  # each thread re-reads only what it wrote: no barrier needed
    var total = block.sum[block_size=GPU_BLOCK, broadcast=True](s)
    var inv = rsqrt(total / Float32(n) + epsilon)
    for i in range(first, n, GPU_BLOCK * width):
        var v = src.unsafe_load[width=width, alignment=ALIGN](base + i).cast[F32]() * inv
        var scaled = v * w.unsafe_load[width=width, alignment=ALIGN](i).cast[F32]()
        y.unsafe_store[alignment=ALIGN](base + i, scaled.cast[dtype]())


def check_norm[what: StaticString](weight_size: Int, cols: Int, cols_name: StaticString, residual_size: Int, x_size: Int) raises:
    check_same[what](weight_size, cols, "weight size", cols_name)
    check_same[what](residual_size, x_size, "residual size", "x size")


def _norm_rows[dtype: DType, fused: Bool, target: StaticString, pdl: Bool](
    y: Ptr[dtype], res_out: Ptr[dtype], x: Ptr[dtype], res: Ptr[dtype], w: Ptr[dtype],
    rows: Int, cols: Int, eps: Ptr[F32], ctx: DeviceContext,
) raises:
    if rows == 0:
        return
    comptime if target == "cpu":
        norm_rows_cpu[dtype, fused](MojoThreads(ctx), y, res_out, x, res, w, rows, cols, eps.unsafe_load(0))
    else:
        comptime VEC = 16 // size_of[dtype]()
        if cols % VEC == 0 and aligned_16(y, res_out, x, res, w):
            ctx.enqueue_function[_norm_rows_gpu[dtype, fused, VEC]](
                y, res_out, x, res, w, Int32(cols), eps, grid_dim=rows, block_dim=GPU_BLOCK,
                attributes=dependent_launch[pdl](),
            )
        else:
            ctx.enqueue_function[_norm_rows_gpu[dtype, fused, 1]](
                y, res_out, x, res, w, Int32(cols), eps, grid_dim=rows, block_dim=GPU_BLOCK,
                attributes=dependent_launch[pdl](),
            )


@register("mili_rms_norm")
struct RmsNorm:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString, pdl: Bool](
        y: OutputTensor[dtype=dtype, rank=2, ...],
        x: InputTensor[dtype=dtype, rank=2, ...],
        weight: InputTensor[dtype=dtype, rank=1, ...],
        eps: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var cols = x.dim_size[1]()
        check_norm["rms_norm"](weight.dim_size[0](), cols, "hidden size", x.size(), x.size())
        var xp = x.unsafe_ptr()
        _norm_rows[dtype, False, target, pdl](y.unsafe_ptr(), y.unsafe_ptr(), xp, xp, weight.unsafe_ptr(),
                                         x.dim_size[0](), cols, eps.unsafe_ptr(), ctx)


@register("mili_fused_add_rms_norm")
struct FusedAddRmsNorm:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString, pdl: Bool](
        y: OutputTensor[dtype=dtype, rank=2, ...],
        residual_out: OutputTensor[dtype=dtype, rank=2, ...],
        x: InputTensor[dtype=dtype, rank=2, ...],
        residual: InputTensor[dtype=dtype, rank=2, ...],
        weight: InputTensor[dtype=dtype, rank=1, ...],
        eps: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var cols = x.dim_size[1]()
        check_norm["fused_add_rms_norm"](weight.dim_size[0](), cols, "hidden size", residual.size(), x.size())
        _norm_rows[dtype, True, target, pdl](y.unsafe_ptr(), residual_out.unsafe_ptr(), x.unsafe_ptr(), residual.unsafe_ptr(),
                                        weight.unsafe_ptr(), x.dim_size[0](), cols, eps.unsafe_ptr(), ctx)


@register("mili_head_rms_norm")
struct HeadRmsNorm:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString, pdl: Bool](
        y: OutputTensor[dtype=dtype, rank=3, ...],
        x: InputTensor[dtype=dtype, rank=3, ...],
        weight: InputTensor[dtype=dtype, rank=1, ...],
        eps: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var head_dim = x.dim_size[2]()
        check_norm["head_rms_norm"](weight.dim_size[0](), head_dim, "head_dim", x.size(), x.size())
        var xp = x.unsafe_ptr()
        _norm_rows[dtype, False, target, pdl](y.unsafe_ptr(), y.unsafe_ptr(), xp, xp, weight.unsafe_ptr(),
                                         x.dim_size[0]() * x.dim_size[1](), head_dim, eps.unsafe_ptr(), ctx)
