# Qwen3's attention inputs in one op, from the fused projection's output qkv[T, (Hq + 2 Hk) * D]:
#   q[T, Hq, D] = rope(head_rms_norm(q part, q_norm))                          the op's output
#   k = rope(head_rms_norm(k part, k_norm)), v                                written into the paged caches
# at slot_mapping[t] (a negative slot is skipped), as three slices, two head_rms_norm, rope and store_kv would do,
# rounded to dtype between the steps as they are; k and v are rounded to the caches' dtype (bfloat16 under float32
# activations, an 8-bit cache: memory/kv_format.mojo) when they are stored. One op instead of seven: each op of a graph costs its own dispatch on a
# CPU and its own kernel launch on a GPU (at one token, a few µs each, more than the work), and its own pass over
# the data.
from extensibility import register, InputTensor, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx, WARP_SIZE
from max.gpu.primitives import warp
from std.math import ceildiv, rsqrt

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..memory.kv_format import is_8bit_kv, kv_head_dim, kv_head_len, store_kv_heads
from ..utils.types import addr, ptr, list_ptr, Addr, F32, Ptr, SERIAL_ELEMENTS, check_same
from .normalization import rms_norm_row
from .rope import rope_cos_sin_gpu, rope_token


struct _QkTokens[dtype: DType, cache_type: DType](ChunkTask):
    var q: Addr[Self.dtype]
    var k_cache: Addr[Self.cache_type]
    var v_cache: Addr[Self.cache_type]
    var qkv: Addr[Self.dtype]
    var q_norm: Addr[Self.dtype]
    var k_norm: Addr[Self.dtype]
    var pos: Addr[DType.int32]
    var inv_freq: Addr[F32]
    var slots: Addr[DType.int32]
    var eps: Float32
    var scale: Float32
    var q_heads: Int
    var k_heads: Int
    var head_dim: Int

    def __init__(out self, q: Ptr[Self.dtype], k_cache: Ptr[Self.cache_type], v_cache: Ptr[Self.cache_type],
                 qkv: Ptr[Self.dtype], q_norm: Ptr[Self.dtype], k_norm: Ptr[Self.dtype], pos: Ptr[DType.int32],
                 inv_freq: Ptr[F32], slots: Ptr[DType.int32], eps: Float32, scale: Float32, q_heads: Int, k_heads: Int,
                 head_dim: Int):
        self.q, self.k_cache, self.v_cache, self.qkv = addr(q), addr(k_cache), addr(v_cache), addr(qkv)
        self.q_norm, self.k_norm, self.pos, self.inv_freq, self.slots = addr(q_norm), addr(k_norm), addr(pos), addr(inv_freq), addr(slots)
        self.eps, self.scale, self.q_heads, self.k_heads, self.head_dim = eps, scale, q_heads, k_heads, head_dim

    def run(self, t: Int):
        var q, qkv = ptr(self.q), ptr(self.qkv)
        var hq, hk, d = self.q_heads, self.k_heads, self.head_dim
        var src = t * (hq + 2 * hk) * d
        var q_base = t * hq * d
        for h in range(hq):
            rms_norm_row[Self.dtype](q, q_base + h * d, qkv, src + h * d, ptr(self.q_norm), d, self.eps)
        var slot = Int(self.slots.unsafe_load(t))
        var stored_k_heads = hk if slot >= 0 else 0
        # k is normed and rotated in dtype, in the cache itself when it holds dtype, else in a row of its own first
        var k_row = List[Scalar[Self.dtype]](length=stored_k_heads * d if Self.cache_type != Self.dtype else 0, fill=0)
        var k, k_base = list_ptr(k_row), 0
        comptime if Self.cache_type == Self.dtype:
            k, k_base = ptr(self.k_cache).unsafe_bitcast[Scalar[Self.dtype]](), max(slot, 0) * hk * d
        for h in range(stored_k_heads):
            rms_norm_row[Self.dtype](k, k_base + h * d, qkv, src + (hq + h) * d, ptr(self.k_norm), d, self.eps)
        rope_token[Self.dtype](q, k, q, k, q_base, k_base, self.pos.unsafe_load(t).cast[F32](), ptr(self.inv_freq),
                               self.scale, hq, stored_k_heads, d)
        if slot < 0:
            return
        var at = slot * hk * kv_head_len[Self.cache_type](d)
        comptime if Self.cache_type != Self.dtype:
            store_kv_heads(ptr(self.k_cache), at, k, 0, hk, d)
        store_kv_heads(ptr(self.v_cache), at, qkv, src + (hq + hk) * d, hk, d)
        _ = k_row^


def qk_norm_rope_store_cpu[dtype: DType, cache_type: DType, R: Runner](
    runner: R, q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], qkv: Ptr[dtype], q_norm: Ptr[dtype],
    k_norm: Ptr[dtype], pos: Ptr[DType.int32], inv_freq: Ptr[F32], slots: Ptr[DType.int32], eps: Float32, scale: Float32,
    tokens: Int, q_heads: Int, k_heads: Int, head_dim: Int,
):
    var task = _QkTokens[dtype, cache_type](q, k_cache, v_cache, qkv, q_norm, k_norm, pos, inv_freq, slots, eps, scale,
                                            q_heads, k_heads, head_dim)
    runner.run(task, tokens, tokens * (q_heads + 2 * k_heads) * head_dim <= SERIAL_ELEMENTS)


comptime QK_WARPS = 4
"""Heads per block of the GPU kernel, a warp each."""


def _qk_norm_rope_store_gpu[dtype: DType, cache_type: DType](
    q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], qkv: Ptr[dtype], q_norm: Ptr[dtype], k_norm: Ptr[dtype],
    pos: Ptr[DType.int32], inv_freq: Ptr[F32], slots: Ptr[DType.int32], eps: Ptr[F32], scale: Ptr[F32],
    q_heads: Int32, k_heads: Int32, head_dim: Int32,
):
    """Block (t, y): heads y * QK_WARPS ..< (y + 1) * QK_WARPS of token t's q, k and v heads in turn, a warp each. A
    q or k head is normed (its sum of squares summed over the warp), then rotated, each lane taking the pairs
    (i, i + D/2) for i = lane, lane + 32, ...; a v head is copied into the cache."""
    var t = Int(block_idx.x)
    var h = Int(block_idx.y) * QK_WARPS + Int(thread_idx.x) // WARP_SIZE
    var lane = Int(thread_idx.x) % WARP_SIZE
    var hq, hk, d = Int(q_heads), Int(k_heads), Int(head_dim)
    var slot = Int(slots.unsafe_load(t))
    # whole warps leave: past the last head, or a padding token's k and v (not stored)
    if h >= hq + 2 * hk or (h >= hq and slot < 0):
        return
    var x = (t * (hq + 2 * hk) + h) * d  # head h's row in qkv
    if h >= hq + hk:
        var y = (slot * hk + h - hq - hk) * d
        for i in range(lane, d, WARP_SIZE):
            v_cache.unsafe_store(y + i, qkv.unsafe_load(x + i).cast[cache_type]())
        return
    var squares = Float32(0)
    for i in range(lane, d, WARP_SIZE):
        var v = qkv.unsafe_load(x + i).cast[F32]()
        squares += v * v
    var inv = rsqrt(warp.sum(squares) / Float32(d) + eps.unsafe_load(0))
    var is_q = h < hq
    var w = q_norm if is_q else k_norm
    var y = (t * hq + h) * d if is_q else (slot * hk + h - hq) * d
    var p = pos.unsafe_load(t).cast[F32]()
    var sc = scale.unsafe_load(0)
    var half = d // 2
    for i in range(lane, half, WARP_SIZE):  # each value rounded to dtype after the norm, as head_rms_norm stores it
        var x1 = (qkv.unsafe_load(x + i).cast[F32]() * inv * w.unsafe_load(i).cast[F32]()).cast[dtype]().cast[F32]()
        var x2 = (qkv.unsafe_load(x + i + half).cast[F32]() * inv * w.unsafe_load(i + half).cast[F32]()).cast[dtype]().cast[F32]()
        var c, s = rope_cos_sin_gpu(inv_freq, i, p, sc)
        var y1, y2 = (x1 * c - x2 * s).cast[dtype](), (x2 * c + x1 * s).cast[dtype]()
        if is_q:
            q.unsafe_store(y + i, y1)
            q.unsafe_store(y + i + half, y2)
        else:
            k_cache.unsafe_store(y + i, y1.cast[cache_type]())
            k_cache.unsafe_store(y + i + half, y2.cast[cache_type]())


def qk_norm_rope_store_gpu[dtype: DType, cache_type: DType](
    ctx: DeviceContext, q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], qkv: Ptr[dtype],
    q_norm: Ptr[dtype], k_norm: Ptr[dtype], pos: Ptr[DType.int32], inv_freq: Ptr[F32], slots: Ptr[DType.int32],
    eps: Ptr[F32], scale: Ptr[F32], tokens: Int, q_heads: Int, k_heads: Int, head_dim: Int,
) raises:
    ctx.enqueue_function[_qk_norm_rope_store_gpu[dtype, cache_type]](
        q, k_cache, v_cache, qkv, q_norm, k_norm, pos, inv_freq, slots, eps, scale, Int32(q_heads), Int32(k_heads),
        Int32(head_dim), grid_dim=(tokens, ceildiv(q_heads + 2 * k_heads, QK_WARPS)), block_dim=QK_WARPS * WARP_SIZE,
    )


def check_qk_norm_rope_store[cache_type: DType](
    tokens: Int, qkv_cols: Int, q_tokens: Int, q_heads: Int, head_dim: Int, k_heads: Int, cache_head_len: Int,
    q_norm_size: Int, k_norm_size: Int, num_positions: Int, inv_freq_size: Int, num_slots: Int,
) raises:
    comptime what = "qk_norm_rope_store"
    check_same[what](q_tokens, tokens, "q tokens", "qkv tokens")
    check_same[what](kv_head_dim[cache_type](cache_head_len), head_dim, "cache head_dim", "q head_dim")
    check_same[what](qkv_cols, (q_heads + 2 * k_heads) * head_dim, "qkv columns", "(q heads + 2 * cache heads) * head_dim")
    check_same[what](q_norm_size, head_dim, "q_norm size", "head_dim")
    check_same[what](k_norm_size, head_dim, "k_norm size", "head_dim")
    check_same[what](num_positions, tokens, "positions", "tokens")
    check_same[what](inv_freq_size * 2, head_dim, "2 * inv_freq size", "head_dim")
    check_same[what](num_slots, tokens, "slot_mapping size", "tokens")


@register("mili_qk_norm_rope_store")
struct QkNormRopeStore:
    @staticmethod
    def execute[dtype: DType, cache_type: DType, //, target: StaticString](
        q: OutputTensor[dtype=dtype, rank=3, ...],
        k_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        v_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        qkv: InputTensor[dtype=dtype, rank=2, ...],
        q_norm: InputTensor[dtype=dtype, rank=1, ...],
        k_norm: InputTensor[dtype=dtype, rank=1, ...],
        eps: InputTensor[dtype=DType.float32, rank=1, ...],
        positions: InputTensor[dtype=DType.int32, rank=1, ...],
        inv_freq: InputTensor[dtype=DType.float32, rank=1, ...],
        scale: InputTensor[dtype=DType.float32, rank=1, ...],
        slot_mapping: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var tokens, q_heads, head_dim, k_heads = qkv.dim_size[0](), q.dim_size[1](), q.dim_size[2](), k_cache.dim_size[2]()
        check_qk_norm_rope_store[cache_type](tokens, qkv.dim_size[1](), q.dim_size[0](), q_heads, head_dim, k_heads,
                                             k_cache.dim_size[3](), q_norm.dim_size[0](), k_norm.dim_size[0](),
                                 positions.dim_size[0](), inv_freq.dim_size[0](), slot_mapping.dim_size[0]())
        if tokens == 0:
            return
        comptime if target == "cpu":
            qk_norm_rope_store_cpu[dtype, cache_type](
                MojoThreads(ctx), q.unsafe_ptr(), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), qkv.unsafe_ptr(),
                q_norm.unsafe_ptr(), k_norm.unsafe_ptr(), positions.unsafe_ptr(), inv_freq.unsafe_ptr(),
                slot_mapping.unsafe_ptr(), eps.unsafe_ptr().unsafe_load(0), scale.unsafe_ptr().unsafe_load(0), tokens,
                q_heads, k_heads, head_dim,
            )
        elif is_8bit_kv[cache_type]():
            raise Error("qk_norm_rope_store: 8-bit KV caches are CPU only")
        else:
            qk_norm_rope_store_gpu[dtype, cache_type](
                ctx, q.unsafe_ptr(), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), qkv.unsafe_ptr(), q_norm.unsafe_ptr(),
                k_norm.unsafe_ptr(), positions.unsafe_ptr(), inv_freq.unsafe_ptr(), slot_mapping.unsafe_ptr(),
                eps.unsafe_ptr(), scale.unsafe_ptr(), tokens, q_heads, k_heads, head_dim,
            )
