# Rotate-half (NeoX) rotary embedding of q[T, Hq, D] and k[T, Hkv, D] at positions[T]:
#   out[i] = x[i] * c - x[i + D/2] * s,  out[i + D/2] = x[i + D/2] * c + x[i] * s
#   with angle = position * inv_freq[i], c = cos(angle) * scale, s = sin(angle) * scale.
# inv_freq[D/2] and scale come from the caller (plain RoPE: scale 1; YaRN: its blended frequencies and
# attention factor; see bindings/reference.py rope_inv_freq), so one kernel serves every RoPE variant.
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx
from std.algorithm import vectorize
from std.math import cos, sin, floor

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, load_f32, narrow, Addr, F32, F32_WIDTH, Ptr, GPU_BLOCK, SERIAL_ELEMENTS, check_same


@always_inline
def _rotate[dtype: DType, width: Int](
    y: Ptr[dtype], x: Ptr[dtype], base: Int, half: Int, c: SIMD[F32, width], s: SIMD[F32, width]
):
    var x1 = load_f32[dtype, width](x, base)
    var x2 = load_f32[dtype, width](x, base + half)
    y.unsafe_store(base, narrow[dtype, width](x1 * c - x2 * s))
    y.unsafe_store(base + half, narrow[dtype, width](x2 * c + x1 * s))


comptime _TWO_PI_HI = Float32(6.2831854820251465)
"""2 pi rounded to float32; _TWO_PI_LO = 2 pi - _TWO_PI_HI."""
comptime _TWO_PI_LO = Float32(-1.7484555314695172e-07)


@always_inline
def _reduced_angle(angle: Float32) -> Float32:
    """angle - 2 pi k in [-pi, pi], to float32 rounding (Cody-Waite with fused multiply-adds): the GPU's sin
    and cos are fast approximations, accurate only near zero (at 2000 radians they were off by 1.5e-2)."""
    var k = floor(angle * Float32(0.15915494309189535) + 0.5)
    return (-k).fma(_TWO_PI_LO, (-k).fma(_TWO_PI_HI, angle))


@always_inline
def rope_cos_sin_gpu(inv_freq: Ptr[F32], i: Int, position: Float32, scale: Float32) -> Tuple[Float32, Float32]:
    """cos(angle) * scale and sin(angle) * scale of pair i at `position` on a GPU, angle = inv_freq[i] * position
    reduced to [-pi, pi] first (_reduced_angle)."""
    var angle = _reduced_angle(inv_freq.unsafe_load(i) * position)
    return cos(angle) * scale, sin(angle) * scale


struct _RopeTokens[dtype: DType](ChunkTask):
    var qo: Addr[Self.dtype]
    var ko: Addr[Self.dtype]
    var q: Addr[Self.dtype]
    var k: Addr[Self.dtype]
    var pos: Addr[DType.int32]
    var inv_freq: Addr[F32]
    var scale: Float32
    var q_heads: Int
    var k_heads: Int
    var head_dim: Int

    def __init__(out self, qo: Ptr[Self.dtype], ko: Ptr[Self.dtype], q: Ptr[Self.dtype], k: Ptr[Self.dtype],
                 pos: Ptr[DType.int32], inv_freq: Ptr[F32], scale: Float32, q_heads: Int, k_heads: Int, head_dim: Int):
        self.qo, self.ko, self.q, self.k, self.pos, self.inv_freq = addr(qo), addr(ko), addr(q), addr(k), addr(pos), addr(inv_freq)
        self.scale, self.q_heads, self.k_heads, self.head_dim = scale, q_heads, k_heads, head_dim

    def run(self, t: Int):
        rope_token[Self.dtype](ptr(self.qo), ptr(self.ko), ptr(self.q), ptr(self.k), t * self.q_heads * self.head_dim,
                               t * self.k_heads * self.head_dim, self.pos.unsafe_load(t).cast[F32](), ptr(self.inv_freq),
                               self.scale, self.q_heads, self.k_heads, self.head_dim)


@always_inline
def rope_token[dtype: DType](
    qo: Ptr[dtype], ko: Ptr[dtype], q: Ptr[dtype], k: Ptr[dtype], q_base: Int, k_base: Int, p: Float32,
    inv_freq: Ptr[F32], scale: Float32, q_heads: Int, k_heads: Int, head_dim: Int,
):
    """One token's q heads at q[q_base:] and k heads at k[k_base:], rotated to position p (in place if qo == q)."""
    var half = head_dim // 2

    def chunk[width: Int](i: Int) {var qo, var ko, var q, var k, var q_base, var k_base, var p, var inv_freq, var scale, var q_heads, var k_heads, var head_dim, var half}:
        var angle = inv_freq.unsafe_load[width=width](i) * p
        var c = cos(angle) * scale
        var s = sin(angle) * scale
        for h in range(q_heads):
            _rotate[dtype, width](qo, q, q_base + h * head_dim + i, half, c, s)
        for h in range(k_heads):
            _rotate[dtype, width](ko, k, k_base + h * head_dim + i, half, c, s)

    vectorize[F32_WIDTH](half, chunk)


def rope_cpu[dtype: DType, R: Runner](
    runner: R, qo: Ptr[dtype], ko: Ptr[dtype], q: Ptr[dtype], k: Ptr[dtype], pos: Ptr[DType.int32], inv_freq: Ptr[F32],
    scale: Float32, tokens: Int, q_heads: Int, k_heads: Int, head_dim: Int,
):
    var task = _RopeTokens[dtype](qo, ko, q, k, pos, inv_freq, scale, q_heads, k_heads, head_dim)
    runner.run(task, tokens, tokens * (q_heads + k_heads) * head_dim <= SERIAL_ELEMENTS)


def _rope_gpu[dtype: DType](
    qo: Ptr[dtype], ko: Ptr[dtype], q: Ptr[dtype], k: Ptr[dtype], pos: Ptr[DType.int32], inv_freq: Ptr[F32],
    scale: Ptr[F32], q_heads: Int32, k_heads: Int32, head_dim: Int32,
):
    var t = Int(block_idx.x)
    var hq, hk, d = Int(q_heads), Int(k_heads), Int(head_dim)
    var half = d // 2
    var p = pos.unsafe_load(t).cast[F32]()
    var sc = scale.unsafe_load(0)
    for j in range(Int(thread_idx.x), (hq + hk) * half, GPU_BLOCK):
        var h = j // half
        var i = j % half
        var c, s = rope_cos_sin_gpu(inv_freq, i, p, sc)
        if h < hq:
            _rotate[dtype, 1](qo, q, (t * hq + h) * d + i, half, c, s)
        else:
            _rotate[dtype, 1](ko, k, (t * hk + h - hq) * d + i, half, c, s)


def check_rope(tokens: Int, head_dim: Int, k_tokens: Int, k_head_dim: Int, num_positions: Int, inv_freq_size: Int) raises:
    check_same["rope"](k_tokens, tokens, "k tokens", "q tokens")
    check_same["rope"](num_positions, tokens, "positions", "q tokens")
    check_same["rope"](k_head_dim, head_dim, "k head_dim", "q head_dim")
    check_same["rope"](inv_freq_size * 2, head_dim, "2 * inv_freq size", "head_dim")


@register("mili_rope")
struct Rope:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        q_out: OutputTensor[dtype=dtype, rank=3, ...],
        k_out: OutputTensor[dtype=dtype, rank=3, ...],
        q: InputTensor[dtype=dtype, rank=3, ...],
        k: InputTensor[dtype=dtype, rank=3, ...],
        positions: InputTensor[dtype=DType.int32, rank=1, ...],
        inv_freq: InputTensor[dtype=DType.float32, rank=1, ...],
        scale: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var tokens = q.dim_size[0]()
        var head_dim = q.dim_size[2]()
        check_rope(tokens, head_dim, k.dim_size[0](), k.dim_size[2](), positions.dim_size[0](), inv_freq.dim_size[0]())
        if tokens == 0:
            return
        comptime if target == "cpu":
            rope_cpu[dtype](MojoThreads(ctx), q_out.unsafe_ptr(), k_out.unsafe_ptr(), q.unsafe_ptr(), k.unsafe_ptr(), positions.unsafe_ptr(),
                             inv_freq.unsafe_ptr(), scale.unsafe_ptr().unsafe_load(0), tokens, q.dim_size[1](),
                             k.dim_size[1](), head_dim)
        else:
            ctx.enqueue_function[_rope_gpu[dtype]](
                q_out.unsafe_ptr(), k_out.unsafe_ptr(), q.unsafe_ptr(), k.unsafe_ptr(), positions.unsafe_ptr(),
                inv_freq.unsafe_ptr(), scale.unsafe_ptr(), Int32(q.dim_size[1]()), Int32(k.dim_size[1]()),
                Int32(head_dim), grid_dim=tokens, block_dim=GPU_BLOCK,
            )
