"""Qwen3's forward op by op in PyTorch on bindings/reference.py: the specification the compiled graph is tested
against (`backend="reference"`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from bindings import reference as ops

from .attention_metadata import AttentionMetadata
from .embedding_table import gather_rows
from .quantization import expert, linear

if TYPE_CHECKING:
    from ..memory.kv_cache_manager import PagedKVCache
    from .qwen3_model import Qwen3CausalLM


class ReferenceQwen3:
    def __init__(self, model: "Qwen3CausalLM") -> None:
        self.model = model

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                 kv_cache: "PagedKVCache", logits_indices: torch.Tensor) -> torch.Tensor:
        m, c = self.model, self.model.config
        num_tokens = input_ids.shape[0]
        q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        hidden = gather_rows(m.embed_tokens, input_ids, m.dtype)
        residual = None
        for i, layer in enumerate(m.layers):
            if residual is None:
                residual, x = hidden, ops.rms_norm(hidden, layer.input_norm, c.rms_norm_eps)
            else:
                x, residual = ops.fused_add_rms_norm(hidden, residual, layer.input_norm, c.rms_norm_eps)
            qkv = linear(x, layer.qkv_proj)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = ops.head_rms_norm(
                q.reshape(num_tokens, c.num_attention_heads, c.head_dim), layer.q_norm, c.rms_norm_eps
            )
            k = ops.head_rms_norm(
                k.reshape(num_tokens, c.num_key_value_heads, c.head_dim), layer.k_norm, c.rms_norm_eps
            )
            q, k = ops.rope(q, k, positions, c.rope_theta, c.rope_scaling)
            v = v.reshape(num_tokens, c.num_key_value_heads, c.head_dim)
            ops.store_kv(k, v, kv_cache.k_caches[i], kv_cache.v_caches[i], attn.slot_mapping)
            o = ops.paged_attention(
                q, kv_cache.k_caches[i], kv_cache.v_caches[i],
                attn.page_table, attn.context_lens, attn.query_start, c.head_dim**-0.5,
            )
            hidden = linear(o.reshape(num_tokens, q_size), layer.o_proj)
            x, residual = ops.fused_add_rms_norm(hidden, residual, layer.post_attention_norm, c.rms_norm_eps)
            if layer.router is None:
                hidden = linear(ops.silu_and_mul(linear(x, layer.gate_up_proj)), layer.down_proj)
            else:
                gate_up, down = layer.experts_gate_up, layer.experts_down
                hidden = ops.moe(x, linear(x, layer.router), c.num_experts_per_tok, c.norm_topk_prob,
                                 lambda h, e, w=gate_up: linear(h, expert(w, e)),
                                 lambda h, e, w=down: linear(h, expert(w, e)))
        hidden, residual = hidden[logits_indices.long()], residual[logits_indices.long()]
        x, _ = ops.fused_add_rms_norm(hidden, residual, m.final_norm, c.rms_norm_eps)
        return linear(x, m.lm_head).float()
