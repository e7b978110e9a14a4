# The `mili_paged_attention` op: checks the shapes, then runs the CPU kernel (cpu.mojo) or enqueues the GPU
# kernels (gpu.mojo). The caches may hold another dtype than q and the output (bfloat16 under float32; on a CPU
# int8 or FP8 too: memory/kv_format.mojo). The layout and the computation: common.mojo.
# `mili_paged_attention_flash` is the same op, except that on a GPU a batch of decode tokens (one per sequence)
# goes to the split-KV decode kernel (gpu_decode.mojo) and other bfloat16 batches to the tensor-core
# FlashAttention-2 kernel (gpu_prefill.mojo), where they take the shape. The model graph uses it unless
# GpuOptions.flash_attention is off (bindings/gpu_options.py), whose pdl and prefill_pairs it takes as parameters.
from extensibility import register, InputTensor, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from ...utils.types import F32, Ptr
from ...memory.kv_format import is_8bit_kv
from .common import check_attention
from .cpu import attention_cpu
from .gpu import attention_gpu
from .gpu_decode import decode_attention_gpu, decode_supported
from .gpu_prefill import prefill_attention_gpu, prefill_supported


def _paged_attention[dtype: DType, cache_type: DType, //, target: StaticString, flash: Bool, pdl: Bool, pairs: Int](
    output: OutputTensor[dtype=dtype, rank=3, ...],
    k_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],  # read only; mutable so graphs pass the caches by reference
    v_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
    q: InputTensor[dtype=dtype, rank=3, ...],
    page_table: InputTensor[dtype=DType.int32, rank=2, ...],
    context_lens: InputTensor[dtype=DType.int32, rank=1, ...],
    query_start: InputTensor[dtype=DType.int32, rank=1, ...],
    scale: InputTensor[dtype=DType.float32, rank=1, ...],
    ctx: DeviceContext,
) raises:
    var tokens = q.dim_size[0]()
    var q_heads = q.dim_size[1]()
    var head_dim = q.dim_size[2]()
    var kv_heads = k_cache.dim_size[2]()
    var batch = context_lens.dim_size[0]()
    var max_pages = page_table.dim_size[1]()
    var page_size = k_cache.dim_size[1]()
    check_attention[cache_type](batch, q_heads, head_dim, kv_heads, k_cache.dim_size[3](), k_cache.size(),
                                v_cache.size(), page_table.dim_size[0](), query_start.dim_size[0]())
    if tokens == 0:
        return
    comptime if target == "cpu":
        attention_cpu[dtype, cache_type](
            output.unsafe_ptr(), q.unsafe_ptr(), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), page_table.unsafe_ptr(),
            context_lens.unsafe_ptr(), query_start.unsafe_ptr(), scale.unsafe_ptr().unsafe_load(0), batch, max_pages,
            q_heads, kv_heads, head_dim, page_size,
        )
    elif is_8bit_kv[cache_type]():
        raise Error("paged_attention: 8-bit KV caches are CPU only")
    else:
        attention_on_gpu[flash, pdl, pairs](
            ctx, output.unsafe_ptr(), q.unsafe_ptr(), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), page_table.unsafe_ptr(),
            context_lens.unsafe_ptr(), query_start.unsafe_ptr(), scale.unsafe_ptr(), tokens, batch, max_pages, q_heads,
            kv_heads, head_dim, page_size,
        )


def attention_on_gpu[dtype: DType, cache_type: DType, //, flash: Bool, pdl: Bool, pairs: Int](
    ctx: DeviceContext, output: Ptr[dtype], q: Ptr[dtype], k_cache: Ptr[cache_type], v_cache: Ptr[cache_type],
    page_table: Ptr[DType.int32], context_lens: Ptr[DType.int32], query_start: Ptr[DType.int32], scale: Ptr[F32],
    tokens: Int, batch: Int, max_pages: Int, q_heads: Int, kv_heads: Int, head_dim: Int, page_size: Int,
) raises:
    """Enqueues the op's GPU kernels (checked shapes, tokens > 0)."""
    comptime if flash:
        if decode_supported[cache_type](tokens, batch, head_dim, q_heads // kv_heads):
            decode_attention_gpu[dtype, cache_type, pdl](ctx, output, q, k_cache, v_cache, page_table, context_lens,
                                                    query_start, scale, batch, max_pages, q_heads, kv_heads, head_dim,
                                                    page_size)
            return
        comptime if dtype == DType.bfloat16 and cache_type == DType.bfloat16:
            if prefill_supported[dtype, cache_type](tokens, batch, head_dim):
                prefill_attention_gpu[pairs](
                    ctx, rebind[Ptr[DType.bfloat16]](output), rebind[Ptr[DType.bfloat16]](q),
                    rebind[Ptr[DType.bfloat16]](k_cache), rebind[Ptr[DType.bfloat16]](v_cache), page_table,
                    context_lens, query_start, scale, tokens, batch, max_pages, q_heads, kv_heads, head_dim, page_size,
                )
                return
    attention_gpu[dtype, cache_type](ctx, output, q, k_cache, v_cache, page_table, context_lens, query_start, scale,
                                     tokens, batch, max_pages, q_heads, kv_heads, head_dim, page_size)


@register("mili_paged_attention")
struct PagedAttention:
    @staticmethod
    def execute[dtype: DType, cache_type: DType, //, target: StaticString](
        output: OutputTensor[dtype=dtype, rank=3, ...],
        k_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        v_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        q: InputTensor[dtype=dtype, rank=3, ...],
        page_table: InputTensor[dtype=DType.int32, rank=2, ...],
        context_lens: InputTensor[dtype=DType.int32, rank=1, ...],
        query_start: InputTensor[dtype=DType.int32, rank=1, ...],
        scale: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        _paged_attention[target, False, False, -1](output, k_cache, v_cache, q, page_table, context_lens, query_start, scale, ctx)


@register("mili_paged_attention_flash")
struct PagedAttentionFlash:
    @staticmethod
    def execute[dtype: DType, cache_type: DType, //, target: StaticString, pdl: Bool, prefill_pairs: Int](
        output: OutputTensor[dtype=dtype, rank=3, ...],
        k_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        v_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        q: InputTensor[dtype=dtype, rank=3, ...],
        page_table: InputTensor[dtype=DType.int32, rank=2, ...],
        context_lens: InputTensor[dtype=DType.int32, rank=1, ...],
        query_start: InputTensor[dtype=DType.int32, rank=1, ...],
        scale: InputTensor[dtype=DType.float32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        _paged_attention[target, True, pdl, prefill_pairs](output, k_cache, v_cache, q, page_table, context_lens, query_start, scale, ctx)
