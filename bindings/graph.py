"""MILI's Mojo ops as MAX graph nodes, for building the model graph: the signatures of bindings/reference.py
on graph values. Float parameters may be Python floats (baked into the graph as constants) or 1-element
float32 tensor values (one compiled graph for every value). The KV caches are buffer values, updated and
read in place. The ops that launch a decode step's GPU kernels take the GpuOptions the graph is built with
(bindings/gpu_options.py) as compile-time parameters."""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from . import library  # noqa: F401  (sets MODULAR_CACHE_DIR before max is imported)
from .gpu_options import GpuOptions
from .reference import rope_inv_freq

from max.dtype import DType
from max.graph import BufferValue, DimLike, TensorType, TensorValue, ops

Scalar = Union[float, TensorValue]


def _f32(value: Scalar, like: TensorValue) -> TensorValue:
    if isinstance(value, TensorValue):
        return value
    return ops.constant(np.array([value], dtype=np.float32), DType.float32, like.device)


def _custom(name: str, like: TensorValue, args: list, out_shapes: list,
            parameters: Optional[dict] = None) -> list[TensorValue]:
    out_types = [TensorType(like.dtype, shape, like.device) for shape in out_shapes]
    return [r.tensor for r in ops.custom(name, like.device, args, out_types=out_types, parameters=parameters)]


def _launch(options: GpuOptions) -> dict:
    return {"pdl": options.pdl}


def rms_norm(x: TensorValue, weight: TensorValue, eps: Scalar, options: GpuOptions = GpuOptions()) -> TensorValue:
    return _custom("mili_rms_norm", x, [x, weight, _f32(eps, x)], [x.shape], _launch(options))[0]


def fused_add_rms_norm(x: TensorValue, residual: TensorValue, weight: TensorValue, eps: Scalar,
                       options: GpuOptions = GpuOptions()) -> tuple[TensorValue, TensorValue]:
    normed, residual_out = _custom("mili_fused_add_rms_norm", x, [x, residual, weight, _f32(eps, x)],
                                   [x.shape, x.shape], _launch(options))
    return normed, residual_out


def head_rms_norm(
    x: TensorValue, weight: TensorValue, eps: Scalar, options: GpuOptions = GpuOptions()
) -> TensorValue:
    return _custom("mili_head_rms_norm", x, [x, weight, _f32(eps, x)], [x.shape], _launch(options))[0]


def rope_with_table(q: TensorValue, k: TensorValue, positions: TensorValue, inv_freq: TensorValue,
                    scale: Scalar) -> tuple[TensorValue, TensorValue]:
    """RoPE with precomputed inverse frequencies [head_dim / 2] and cos/sin scale (see reference.rope_inv_freq)."""
    q_out, k_out = _custom("mili_rope", q, [q, k, positions, inv_freq, _f32(scale, q)], [q.shape, k.shape])
    return q_out, k_out


def rope(q: TensorValue, k: TensorValue, positions: TensorValue, theta: float,
         rope_scaling: Optional[dict] = None) -> tuple[TensorValue, TensorValue]:
    inv_freq, scale = rope_inv_freq(int(q.shape[-1]), theta, rope_scaling)
    table = ops.constant(inv_freq.numpy(), DType.float32, q.device)
    return rope_with_table(q, k, positions, table, scale)


def silu_and_mul(x: TensorValue) -> TensorValue:
    return _custom("mili_silu_and_mul", x, [x], [[x.shape[0], x.shape[1] // 2]])[0]


def _elementwise(name: str, x: TensorValue) -> TensorValue:
    if x.rank == 2:  # the model's activations: no reshape ops around the kernel
        return _custom(name, x, [x], [x.shape])[0]
    rows = ops.reshape(x, [1, -1])
    return ops.reshape(_custom(name, rows, [rows], [rows.shape])[0], x.shape)


def silu(x: TensorValue) -> TensorValue:
    return _elementwise("mili_silu", x)


def gelu(x: TensorValue) -> TensorValue:
    return _elementwise("mili_gelu", x)


def relu(x: TensorValue) -> TensorValue:
    return _elementwise("mili_relu", x)


def linear(x: TensorValue, weight: TensorValue, scales: TensorValue, block_k: Union[int, TensorValue],
           swiglu: bool = False) -> TensorValue:
    """x [M, K] @ dequantize(weight)[N, K]^T (reference.linear); scales are read for float8_e4m3fn / int8 weights only.
    A 4-d weight is tiled (reference.tile_weight, CPU only). swiglu: silu_and_mul of the product (gate's rows, then
    up's), in the same op where the weight is tiled."""
    if not isinstance(block_k, TensorValue):
        block_k = ops.constant(np.array([block_k], dtype=np.int32), DType.int32, x.device)
    if weight.rank == 4:
        return linear_tiled(x, weight, scales, block_k, swiglu)
    y = _custom("mili_linear", x, [x, weight, scales, block_k], [[x.shape[0], weight.shape[0]]])[0]
    return silu_and_mul(y) if swiglu else y


def linear_int4(x: TensorValue, packed: TensorValue, scales: TensorValue, mins: TensorValue, supers: TensorValue,
                block_k: TensorValue, n: DimLike) -> TensorValue:
    """x [M, K] @ dequantize_int4(packed, scales, mins, block_k, n, K, supers)^T (reference.linear_int4; scales and
    mins tiled by reference.tile_int4_scales, as their bytes; supers a [1, 1, 1, 1] placeholder unless the scales are
    codes), on a CPU."""
    return _custom("mili_linear_int4", x, [x, packed, scales, mins, supers, block_k], [[x.shape[0], n]])[0]


def moe(x: TensorValue, logits: TensorValue, gate_up: TensorValue, gate_up_scales: TensorValue, down: TensorValue,
        down_scales: TensorValue, params: TensorValue) -> TensorValue:
    """reference.moe on experts in the linear kernels' formats, each expert's weights (and scales) a row of gate_up /
    down [E, ...] (dense weights: scales a [1, 1] placeholder); params int32 [block_k, top_k, normalize, tiled, I,
    down's block_k] (mojo_kernels/core/moe.mojo), on a CPU."""
    return _custom("mili_moe", x, [x, logits, gate_up, gate_up_scales, down, down_scales, params], [x.shape])[0]


def moe_int4(x: TensorValue, logits: TensorValue, gate_up: TensorValue, gate_up_scales: TensorValue,
             gate_up_mins: TensorValue, gate_up_supers: TensorValue, down: TensorValue, down_scales: TensorValue,
             down_mins: TensorValue, down_supers: TensorValue, params: TensorValue) -> TensorValue:
    """moe on experts in the 4-bit format (reference.pack_int4's bytes, scales and mins as bytes, multipliers, a row
    per expert; multipliers a [1, 1] placeholder unless the scales are codes)."""
    args = [x, logits, gate_up, gate_up_scales, gate_up_mins, gate_up_supers, down, down_scales, down_mins,
            down_supers, params]
    return _custom("mili_moe_int4", x, args, [x.shape])[0]


def linear_tiled(x: TensorValue, tiles: TensorValue, scales: TensorValue, block_k: TensorValue,
                 swiglu: bool = False) -> TensorValue:
    """x [M, K] @ dequantize(reference.untile_weight(tiles))^T: tiles [N / R, K / C, R, C], float32, bfloat16 or
    int8 (with scales [K / block_k, N]: reference.tile_scales), on a CPU. swiglu: silu_and_mul of it [M, N / 2], which
    the op tells by its output's half width."""
    n = tiles.shape[0] * tiles.shape[2]
    return _custom("mili_linear_tiled", x, [x, tiles, scales, block_k], [[x.shape[0], n // 2 if swiglu else n]])[0]


def linear_tiled_swiglu(x: TensorValue, tiles: TensorValue, scales: TensorValue, block_k: TensorValue) -> TensorValue:
    """linear_tiled(..., swiglu=True): bindings.ops' op of its own."""
    return linear_tiled(x, tiles, scales, block_k, swiglu=True)


def store_kv(
    k: TensorValue, v: TensorValue, k_cache: BufferValue, v_cache: BufferValue, slot_mapping: TensorValue
) -> None:
    ops.inplace_custom("mili_store_kv", k.device, [k_cache, v_cache, k, v, slot_mapping])


def qk_norm_rope_store(qkv: TensorValue, q_norm: TensorValue, k_norm: TensorValue, eps: Scalar, positions: TensorValue,
                       inv_freq: TensorValue, scale: Scalar, k_cache: BufferValue, v_cache: BufferValue,
                       slot_mapping: TensorValue) -> TensorValue:
    kv_heads, head_dim = k_cache.shape[2], q_norm.shape[0]  # an int8 cache's heads end in their scales
    out_type = TensorType(qkv.dtype, [qkv.shape[0], qkv.shape[1] // head_dim - 2 * kv_heads, head_dim], qkv.device)
    args = [k_cache, v_cache, qkv, q_norm, k_norm, _f32(eps, qkv), positions, inv_freq, _f32(scale, qkv), slot_mapping]
    return ops.inplace_custom("mili_qk_norm_rope_store", qkv.device, args, out_types=[out_type])[0].tensor


def qkv_attention(qkv: TensorValue, q_norm: TensorValue, k_norm: TensorValue, eps: Scalar, positions: TensorValue,
                  inv_freq: TensorValue, rope_scale: Scalar, k_cache: BufferValue, v_cache: BufferValue,
                  slot_mapping: TensorValue, page_table: TensorValue, context_lens: TensorValue,
                  query_start: TensorValue, scale: Scalar, options: GpuOptions = GpuOptions()) -> TensorValue:
    """qk_norm_rope_store then paged_attention_flash in one op: on a GPU, a decode batch in one kernel."""
    kv_heads, head_dim = k_cache.shape[2], q_norm.shape[0]  # an int8 cache's heads end in their scales
    out_type = TensorType(qkv.dtype, [qkv.shape[0], qkv.shape[1] // head_dim - 2 * kv_heads, head_dim], qkv.device)
    args = [k_cache, v_cache, qkv, q_norm, k_norm, _f32(eps, qkv), positions, inv_freq, _f32(rope_scale, qkv),
            slot_mapping, page_table, context_lens, query_start, _f32(scale, qkv)]
    return ops.inplace_custom("mili_qkv_attention", qkv.device, args, out_types=[out_type],
                              parameters=options.kernel_parameters())[0].tensor


def paged_attention(q: TensorValue, k_cache: BufferValue, v_cache: BufferValue, page_table: TensorValue,
                    context_lens: TensorValue, query_start: TensorValue, scale: Scalar) -> TensorValue:
    """On a GPU, the plain kernels (a block per query token and head); paged_attention_flash takes the split-KV decode
    and FlashAttention-2 kernels. On a CPU both run the same kernel."""
    return _paged_attention("mili_paged_attention", q, k_cache, v_cache, page_table, context_lens, query_start, scale,
                            None)


def paged_attention_flash(q: TensorValue, k_cache: BufferValue, v_cache: BufferValue, page_table: TensorValue,
                          context_lens: TensorValue, query_start: TensorValue, scale: Scalar,
                          options: GpuOptions = GpuOptions()) -> TensorValue:
    return _paged_attention("mili_paged_attention_flash", q, k_cache, v_cache, page_table, context_lens, query_start,
                            scale, options.kernel_parameters())


def _paged_attention(name: str, q: TensorValue, k_cache: BufferValue, v_cache: BufferValue, page_table: TensorValue,
                     context_lens: TensorValue, query_start: TensorValue, scale: Scalar,
                     parameters: Optional[dict]) -> TensorValue:
    out_type = TensorType(q.dtype, q.shape, q.device)
    args = [k_cache, v_cache, q, page_table, context_lens, query_start, _f32(scale, q)]
    return ops.inplace_custom(name, q.device, args, out_types=[out_type], parameters=parameters)[0].tensor
