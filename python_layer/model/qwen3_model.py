"""Qwen3 forward over ragged batches with a paged KV cache: one MAX graph on the Mojo kernels, or the PyTorch reference."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from bindings import reference

from ..memory.kv_cache_manager import PagedKVCache
from .config import Qwen3Config
from .qwen3_graph import CompiledQwen3  # imports MAX here, on the importing (main) thread: MAX enters its MLIR context there
from .weight_loader import WeightLoader, parse_dtype

# "mojo": the whole forward as one compiled MAX graph on the Mojo kernels (qwen3_graph.py);
# "reference": the same forward op by op in PyTorch (bindings/reference.py), the specification tests compare with.
BACKENDS = ("mojo", "reference")
DEFAULT_BACKEND = "mojo"


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not available: choose one of {', '.join(BACKENDS)}")
    return backend


@dataclass
class AttentionMetadata:
    """Where the tokens of one step sit: B sequences, T tokens in all (all int32)."""

    query_start: torch.Tensor  # [B + 1] offsets of each sequence's new tokens in the flat batch
    context_lens: torch.Tensor  # [B] tokens in the cache after this step (cached prefix + new tokens)
    page_table: torch.Tensor  # [B, max_pages] page ids of each sequence
    slot_mapping: torch.Tensor  # [T] cache slot (page * page_size + offset) of each new token


@dataclass
class DecoderLayerWeights:
    input_norm: torch.Tensor
    qkv_proj: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]: q, k, v projections stacked
    qkv_bias: Optional[torch.Tensor]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_up_proj: torch.Tensor  # [2 * intermediate, hidden]: gate then up, for silu_and_mul
    down_proj: torch.Tensor


class Qwen3Model:
    """Qwen3 causal LM. `forward` runs one step of a ragged batch and returns logits only where asked."""

    def __init__(self, config: Qwen3Config, weight_loader: WeightLoader, device: str = "cpu", backend: str = DEFAULT_BACKEND) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = weight_loader.dtype
        self.backend = check_backend(backend)
        self.model_path = weight_loader.model_path
        if not weight_loader.weights:
            weight_loader.load_from_safetensors()
        w = weight_loader.get_weight
        self.embed_tokens = w("model.embed_tokens.weight")
        self.lm_head = w("lm_head.weight")
        self.final_norm = w("model.norm.weight")
        self.layers = [self._layer_weights(w, i) for i in range(config.num_hidden_layers)]
        self.scale = config.head_dim**-0.5
        self._engine = None
        self.compiled = None
        if backend == "mojo":
            self.compiled = CompiledQwen3(self)

    def _layer_weights(self, w, i: int) -> DecoderLayerWeights:
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        bias = None
        if self.config.attention_bias:
            bias = torch.cat([w(attn + f"{n}_proj.bias") for n in "qkv"])
        return DecoderLayerWeights(
            input_norm=w(p + "input_layernorm.weight"),
            qkv_proj=torch.cat([w(attn + f"{n}_proj.weight") for n in "qkv"]),
            qkv_bias=bias,
            q_norm=w(attn + "q_norm.weight"),
            k_norm=w(attn + "k_norm.weight"),
            o_proj=w(attn + "o_proj.weight"),
            post_attention_norm=w(p + "post_attention_layernorm.weight"),
            gate_up_proj=torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
            down_proj=w(p + "mlp.down_proj.weight"),
        )

    @classmethod
    def from_pretrained(
        cls, model_path: str | os.PathLike, device: str = "cpu", dtype: str | torch.dtype = "auto", backend: str = DEFAULT_BACKEND
    ) -> "Qwen3Model":
        from .hub import resolve_model_dir

        model_dir = resolve_model_dir(model_path)
        config = Qwen3Config.from_pretrained(model_dir)
        loader = WeightLoader(model_dir, config, device=device, dtype=parse_dtype(dtype, device))
        return cls(config, loader, device=device, backend=backend)

    def new_kv_cache(self, num_pages: int, page_size: int = 16) -> PagedKVCache:
        return PagedKVCache.for_model(self.config, num_pages, page_size, dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_cache: PagedKVCache,
        logits_indices: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """input_ids/positions [T] -> logits [len(logits_indices), vocab] (all T rows when None), float32.
        Writes the new tokens' K/V into kv_cache at attn.slot_mapping."""
        if logits_indices is None:
            logits_indices = torch.arange(input_ids.shape[0], dtype=torch.int32, device=input_ids.device)
        if self.compiled is not None:
            return self.compiled(input_ids, positions, attn, kv_cache, logits_indices)
        c, ops = self.config, reference
        num_tokens = input_ids.shape[0]
        q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        hidden = self.embed_tokens[input_ids.long()]
        residual = None
        for i, layer in enumerate(self.layers):
            if residual is None:
                residual, x = hidden, ops.rms_norm(hidden, layer.input_norm, c.rms_norm_eps)
            else:
                x, residual = ops.fused_add_rms_norm(hidden, residual, layer.input_norm, c.rms_norm_eps)
            qkv = torch.nn.functional.linear(x, layer.qkv_proj, layer.qkv_bias)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = ops.head_rms_norm(q.reshape(num_tokens, c.num_attention_heads, c.head_dim), layer.q_norm, c.rms_norm_eps)
            k = ops.head_rms_norm(k.reshape(num_tokens, c.num_key_value_heads, c.head_dim), layer.k_norm, c.rms_norm_eps)
            q, k = ops.rope(q, k, positions, c.rope_theta, c.rope_scaling)
            v = v.reshape(num_tokens, c.num_key_value_heads, c.head_dim)
            ops.store_kv(k, v, kv_cache.k_caches[i], kv_cache.v_caches[i], attn.slot_mapping)
            o = ops.paged_attention(
                q, kv_cache.k_caches[i], kv_cache.v_caches[i],
                attn.page_table, attn.context_lens, attn.query_start, self.scale,
            )
            hidden = o.reshape(num_tokens, q_size) @ layer.o_proj.T
            x, residual = ops.fused_add_rms_norm(hidden, residual, layer.post_attention_norm, c.rms_norm_eps)
            hidden = ops.silu_and_mul(x @ layer.gate_up_proj.T) @ layer.down_proj.T
        hidden, residual = hidden[logits_indices.long()], residual[logits_indices.long()]
        x, _ = ops.fused_add_rms_norm(hidden, residual, self.final_norm, c.rms_norm_eps)
        return (x @ self.lm_head.T).float()

    def generate(self, prompt: str, max_tokens: int = 128, temperature: float = 1.0, top_p: float = 0.95, top_k: int = 50) -> str:
        """Text continuation of a prompt (the design documents' one-call API)."""
        from ..inference.inference_engine import InferenceEngine
        from ..inference.sampling_params import SamplingParams

        if self._engine is None:
            self._engine = InferenceEngine(self)
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens)
        return self._engine.generate([prompt], params)[0].text
