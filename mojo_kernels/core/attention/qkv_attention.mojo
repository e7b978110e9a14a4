# The `mili_qkv_attention` op: Qwen3's attention from the fused projection's output qkv[T, (Hq + 2 Hk) * D], what
# qk_norm_rope_store then mili_paged_attention_flash compute (q normed and rotated; k normed and rotated, and v,
# stored at slot_mapping), in one op. The model graph runs it where the flash kernels are on. A batch of decode
# tokens on a GPU takes the split-KV decode kernel alone, which does qk_norm_rope_store's work itself
# (gpu_decode.mojo): a kernel launch a layer fewer. Other batches, and a CPU, run the two ops' kernels one after the
# other, q in a scratch buffer.
from extensibility import register, InputTensor, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from ...utils.parallel import MojoThreads, Runner
from ...utils.types import list_ptr, ptr, F32, Ptr
from ..qk_norm_rope import check_qk_norm_rope_store, qk_norm_rope_store_cpu, qk_norm_rope_store_gpu
from ...memory.kv_format import is_8bit_kv
from .common import check_attention
from .cpu import attention_cpu
from .gpu_decode import QkvRope, decode_attention_gpu, decode_supported
from .paged_attention import attention_on_gpu


def check_qkv_attention[cache_type: DType](
    tokens: Int, qkv_cols: Int, out_tokens: Int, q_heads: Int, head_dim: Int, kv_heads: Int, cache_head_len: Int,
    k_cache_size: Int, v_cache_size: Int, q_norm_size: Int, k_norm_size: Int, num_positions: Int, inv_freq_size: Int,
    num_slots: Int, batch: Int, page_table_rows: Int, query_start_size: Int,
) raises:
    check_qk_norm_rope_store[cache_type](tokens, qkv_cols, out_tokens, q_heads, head_dim, kv_heads, cache_head_len,
                                         q_norm_size, k_norm_size, num_positions, inv_freq_size, num_slots)
    check_attention[cache_type](batch, q_heads, head_dim, kv_heads, cache_head_len, k_cache_size, v_cache_size,
                                page_table_rows, query_start_size)


def qkv_attention_cpu[dtype: DType, cache_type: DType, R: Runner](
    runner: R, output: Ptr[dtype], k_cache: Ptr[cache_type],
    v_cache: Ptr[cache_type], qkv: Ptr[dtype], q_norm: Ptr[dtype], k_norm: Ptr[dtype], eps: Float32,
    positions: Ptr[DType.int32], inv_freq: Ptr[F32], rope_scale: Float32, slots: Ptr[DType.int32],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Float32,
    tokens: Int, batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
) raises:
    """The two ops' CPU kernels in turn (checked shapes, tokens > 0): qk_norm_rope_store's on `runner`, attention's
    on Mojo's threads."""
    var q = List[Scalar[dtype]](unsafe_uninit_length=tokens * q_heads * head_dim)  # every element written first
    var q_ptr = list_ptr(q)
    qk_norm_rope_store_cpu[dtype, cache_type](runner, q_ptr, k_cache, v_cache, qkv, q_norm, k_norm, positions, inv_freq,
                                              slots, eps, rope_scale, tokens, q_heads, kv_heads, head_dim)
    attention_cpu[dtype, cache_type](output, q_ptr, k_cache, v_cache, page_table, context_lens, query_start, scale,
                                     batch, max_pages, q_heads, kv_heads, head_dim, page_size)
    _ = q^


def _qkv_attention_gpu[dtype: DType, cache_type: DType, pdl: Bool, pairs: Int](
    ctx: DeviceContext, output: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], qkv: Ptr[dtype],
    rope: QkvRope[dtype], page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32],
    scale: Ptr[F32], tokens: Int, batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int,
    page_size: Int,
) raises:
    """Enqueues the op's GPU kernels (checked shapes, tokens > 0)."""
    if decode_supported[cache_type](tokens, batch, head_dim, q_heads // kv_heads, from_qkv=True):
        decode_attention_gpu[dtype, cache_type, pdl, from_qkv=True](
            ctx, output, qkv, k_cache, v_cache, page_table, context_lens, query_start, scale, batch, max_pages,
            q_heads, kv_heads, head_dim, page_size, rope,
        )
        return
    var q = ctx.enqueue_create_buffer[dtype](tokens * q_heads * head_dim)
    var q_ptr = q.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    qk_norm_rope_store_gpu[dtype, cache_type](
        ctx, q_ptr, k_cache, v_cache, qkv, ptr(rope.q_norm), ptr(rope.k_norm), ptr(rope.positions),
        ptr(rope.inv_freq), ptr(rope.slots), ptr(rope.eps), ptr(rope.rope_scale), tokens, q_heads, kv_heads, head_dim,
    )
    attention_on_gpu[True, pdl, pairs](ctx, output, q_ptr, k_cache, v_cache, page_table, context_lens, query_start, scale, tokens,
                           batch, max_pages, q_heads, kv_heads, head_dim, page_size)
    _ = q^  # freed in stream order, after the kernels that use it


@register("mili_qkv_attention")
struct QkvAttention:
    @staticmethod
    def execute[dtype: DType, cache_type: DType, //, target: StaticString, pdl: Bool, prefill_pairs: Int](
        output: OutputTensor[dtype=dtype, rank=3, ...],
        k_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        v_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        qkv: InputTensor[dtype=dtype, rank=2, ...],
        q_norm: InputTensor[dtype=dtype, rank=1, ...],
        k_norm: InputTensor[dtype=dtype, rank=1, ...],
        eps: InputTensor[dtype=DType.float32, rank=1, ...],
        positions: InputTensor[dtype=DType.int32, rank=1, ...],
        inv_freq: InputTensor[dtype=DType.float32, rank=1, ...],
        rope_scale: InputTensor[dtype=DType.float32, rank=1, ...],
        slot_mapping: InputTensor[dtype=DType.int32, rank=1, ...],
        page_table: InputTensor[dtype=DType.int32, rank=2, ...],
        context_lens: InputTensor[dtype=DType.int32, rank=1, ...],
        query_start: InputTensor[dtype=DType.int32, rank=1, ...],
        scale: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var tokens, q_heads, head_dim = qkv.dim_size[0](), output.dim_size[1](), output.dim_size[2]()
        var kv_heads, page_size = k_cache.dim_size[2](), k_cache.dim_size[1]()
        var batch, max_pages = context_lens.dim_size[0](), page_table.dim_size[1]()
        check_qkv_attention[cache_type](tokens, qkv.dim_size[1](), output.dim_size[0](), q_heads, head_dim, kv_heads,
                                        k_cache.dim_size[3](), k_cache.size(), v_cache.size(), q_norm.dim_size[0](),
                                        k_norm.dim_size[0](), positions.dim_size[0](), inv_freq.dim_size[0](),
                                        slot_mapping.dim_size[0](), batch, page_table.dim_size[0](),
                                        query_start.dim_size[0]())
        if tokens == 0:
            return
        comptime if target == "cpu":
            qkv_attention_cpu[dtype, cache_type](
                MojoThreads(ctx), output.unsafe_ptr(), k_cache.unsafe_ptr(),
                v_cache.unsafe_ptr(), qkv.unsafe_ptr(), q_norm.unsafe_ptr(), k_norm.unsafe_ptr(),
                eps.unsafe_ptr().unsafe_load(0), positions.unsafe_ptr(), inv_freq.unsafe_ptr(),
                rope_scale.unsafe_ptr().unsafe_load(0), slot_mapping.unsafe_ptr(), page_table.unsafe_ptr(),
                context_lens.unsafe_ptr(), query_start.unsafe_ptr(), scale.unsafe_ptr().unsafe_load(0), tokens, batch,
                max_pages, q_heads, kv_heads, head_dim, page_size,
            )
        elif is_8bit_kv[cache_type]():
            raise Error("qkv_attention: 8-bit KV caches are CPU only")
        else:
            _qkv_attention_gpu[dtype, cache_type, pdl, prefill_pairs](
                ctx, output.unsafe_ptr(), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), qkv.unsafe_ptr(),
                QkvRope[dtype](q_norm.unsafe_ptr(), k_norm.unsafe_ptr(), eps.unsafe_ptr(), positions.unsafe_ptr(),
                               inv_freq.unsafe_ptr(), rope_scale.unsafe_ptr(), slot_mapping.unsafe_ptr()),
                page_table.unsafe_ptr(), context_lens.unsafe_ptr(), query_start.unsafe_ptr(), scale.unsafe_ptr(), tokens,
                batch, max_pages, q_heads, kv_heads, head_dim, page_size,
            )
