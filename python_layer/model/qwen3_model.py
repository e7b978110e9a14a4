"""Qwen3 over ragged batches with a paged KV cache: the weights, and one `forward` that runs them either as one
compiled MAX graph on the Mojo kernels (qwen3_graph.py) or op by op in PyTorch (reference_forward.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import torch

from bindings import library
from bindings.gpu_options import GpuOptions
from bindings.ops import KV_CACHE_RULE, kv_cache_supported
from bindings.reference import AMX_COLUMNS, can_tile, tile_columns, tile_scales, tile_weight

from ..memory.huge_pages import on_huge_pages, zeros_on_huge_pages
from ..memory.kv_cache_manager import DEFAULT_PAGE_SIZE, PagedKVCache
from .attention_metadata import AttentionMetadata
from .config import Qwen3Config
from .embedding_table import EmbeddingTable
from .quantization import (
    Int4Weight, LinearWeight, QuantizedWeight, convert, dense, lm_head_dtype, parse_weight_dtype, stack_experts,
)
# imports MAX here, on the importing (main) thread: MAX enters its MLIR context there
from .qwen3_graph import CompiledQwen3
from .reference_forward import ReferenceQwen3
from .weight_loader import WeightLoader

# "mojo": the whole forward as one compiled MAX graph on the Mojo kernels (qwen3_graph.py);
# "reference": the same forward op by op in PyTorch (bindings/reference.py), the specification tests compare with.
BACKENDS = {"mojo": CompiledQwen3, "reference": ReferenceQwen3}
DEFAULT_BACKEND = "mojo"


def _tiles_int8(weight: QuantizedWeight, experts: bool) -> bool:
    if not (weight.weight.dtype == torch.int8 and can_tile(weight.weight)
            and weight.block_k % tile_columns(torch.int8) == 0):
        return False
    kernels = library.eager_cpu_module()  # only then: it digests the kernels' sources, and may build them
    return kernels.int8_experts_tiled() if experts else kernels.int8_tiled()


def _pair_panels(weight: torch.Tensor) -> bool:
    """Whether the Mojo kernels read this bfloat16 weight fastest as pair panels, at every batch size: on AMX tiles or
    by vdpbf16ps (K whole tile rows; linear.mojo's PAIR_TILE_ROWS)."""
    return (can_tile(weight, pairs=True) and weight.shape[1] % AMX_COLUMNS == 0
            and library.eager_cpu_module().bf16_pair_panels())


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not available: choose one of {', '.join(BACKENDS)}")
    return backend


def resolve_weight_dtype(weight_dtype: str, config: Qwen3Config, dtype: torch.dtype, device: torch.device) -> str:
    """The linear layers' weight format. "auto": an FP8 checkpoint's FP8, an AWQ / GPTQ checkpoint's int4, a W8A8
    one's int8, a GGUF file's int4 or int8 where it has such tensors, else the activation dtype. On a GPU the weights
    are dense in the activation dtype (FP8 / int8 / 4-bit checkpoints are dequantized when they load)."""
    weight_dtype = parse_weight_dtype(weight_dtype)
    if device.type != "cpu":
        return str(dtype).split(".")[-1]
    if weight_dtype != "auto":
        return weight_dtype
    if config.fp8_block_size:
        return "fp8"
    if config.int4_checkpoint:
        return "int4"
    if config.gguf_weight_dtype in ("int4", "int8"):
        return config.gguf_weight_dtype
    return "int8" if config.w8a8 else str(dtype).split(".")[-1]


KV_CACHE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8,
                   "fp8": torch.float8_e4m3fn}


def resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's dtype. "auto": bfloat16 on a CPU (the 16-bit cache of vLLM's and llama.cpp's defaults), else
    the activations' dtype. A CPU may keep bfloat16 K/V under float32 activations: attention reads half the bytes
    (0.5-0.8x its time); they are rounded when stored. A CPU may also
    keep int8 K/V (a scale per token and head) or FP8 e4m3 ones (no scale) under either: a quarter (a half) of the
    bytes again (mojo_kernels/memory/kv_format.mojo)."""
    if kv_cache_dtype == "auto":
        return torch.bfloat16 if device.type == "cpu" else dtype
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of auto, {', '.join(KV_CACHE_DTYPES)}")
    cache = KV_CACHE_DTYPES[kv_cache_dtype]
    if not kv_cache_supported(dtype, cache, device.type == "cpu") or (cache != dtype and device.type != "cpu"):
        raise ValueError(
            f"a {kv_cache_dtype} KV cache under {str(dtype).split('.')[-1]} activations on {device.type} is "
            f"not supported: {KV_CACHE_RULE}; a model keeps another dtype than its activations' on a CPU only"
        )
    return cache


class Forward(Protocol):
    """What both backends implement: one step of a ragged batch -> float32 logits of the rows asked for."""

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                 kv_cache: PagedKVCache, logits_indices: torch.Tensor) -> torch.Tensor: ...


@dataclass
class DecoderLayerWeights:
    input_norm: torch.Tensor
    qkv_proj: LinearWeight  # [(Hq + 2 Hkv) * D, hidden]: q, k, v projections stacked
    qkv_bias: Optional[torch.Tensor]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: LinearWeight
    post_attention_norm: torch.Tensor
    gate_up_proj: Optional[LinearWeight]  # [2 * intermediate, hidden]: gate then up, for silu_and_mul
    down_proj: Optional[LinearWeight]
    # a sparse MLP instead (qwen3_moe): the router [experts, hidden] in the activations' dtype, and the experts'
    # gate_up / down stacked along a first dimension of experts (quantization.stack_experts)
    router: Optional[torch.Tensor] = None
    experts_gate_up: Optional[LinearWeight] = None
    experts_down: Optional[LinearWeight] = None


class Qwen3CausalLM:
    """Qwen3 causal LM. `forward` runs one step of a ragged batch and returns logits only where asked."""

    def __init__(
        self,
        config: Qwen3Config,
        weight_loader: WeightLoader,
        device: str = "cpu",
        backend: str = DEFAULT_BACKEND,
        weight_dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        gpu_options: GpuOptions = GpuOptions(),
    ) -> None:
        self.config = config
        self.gpu_options = gpu_options
        self.device = torch.device(device)
        self.dtype = weight_loader.dtype
        self.backend = check_backend(backend)
        self.model_path = weight_loader.model_path
        self.weight_dtype = resolve_weight_dtype(weight_dtype, config, self.dtype, self.device)
        # the checkpoint's own formats on a CPU: a 4-bit checkpoint's layers it leaves unquantized, or holds in a form
        # int4 cannot (8 bits, small groups, desc_act's order), keep dense weights, and a GGUF file's each its own
        self._as_stored = parse_weight_dtype(weight_dtype) == "auto" and self.device.type == "cpu" and (
            self.weight_dtype == "int4" or config.gguf_weight_dtype is not None)
        self.kv_cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, self.dtype, self.device)
        if config.num_experts and self.device.type != "cpu" and self.backend == "mojo":
            raise ValueError("qwen3_moe checkpoints run on a CPU so far: MILI's mixture-of-experts kernels have no GPU "
                             "path yet (pass device='cpu', or backend='reference' to run it in PyTorch)")
        if not weight_loader.weights:
            weight_loader.load_from_safetensors()
        # only gathered from: on a CPU in the least memory that gives its rows exactly
        self.embed_tokens: EmbeddingTable = weight_loader.get_embedding() if self.device.type == "cpu" else (
            weight_loader.get_weight("model.embed_tokens.weight"))
        self.lm_head = self._linear(weight_loader, "lm_head.weight", weight_dtype=self._lm_head_dtype())
        self.final_norm = weight_loader.get_weight("model.norm.weight")
        self.layers = []
        for i in range(config.num_hidden_layers):
            self.layers.append(self._layer_weights(weight_loader, i))
            weight_loader.release(f"model.layers.{i}.")  # converted: the checkpoint's copies can go
        weight_loader.release()
        self.forward_fn: Forward = BACKENDS[backend](self)

    def _lm_head_dtype(self) -> str:
        # Qwen's FP8 and RedHatAI's W8A8 checkpoints leave the LM head unquantized (bfloat16): kept so
        if (self.config.fp8_block_size and self.weight_dtype == "fp8") or (
                self.config.w8a8 and self.weight_dtype == "int8"):
            return "bfloat16"
        return lm_head_dtype(self.weight_dtype)

    def _linear(self, loader: WeightLoader, *names: str, weight_dtype: Optional[str] = None) -> LinearWeight:
        return self._placed(self._tiled(self._formatted(loader, *names, weight_dtype=weight_dtype), panels=True))

    def _experts(self, loader: WeightLoader, gate_up: Sequence[str], down: Sequence[str]) -> tuple:
        """The experts' gate_up and down weights (names with `{e}`), each stacked along a first dimension; tiled
        when both can be (mili_moe reads both in one layout)."""
        stacks = []
        for names in (gate_up, down):
            stacks.append([self._formatted(loader, *(n.format(e=e) for n in names))
                           for e in range(self.config.num_experts)])
        tile = all(self._tileable(s[0], experts=True) for s in stacks)
        # stacked straight into the memory _placed would copy them to
        empty = zeros_on_huge_pages if self._cpu_kernels else None
        return tuple(stack_experts([self._tiled(w) if tile else w for w in s], empty) for s in stacks)

    @property
    def _cpu_kernels(self) -> bool:
        """Whether the Mojo CPU kernels read the weights (in their layouts, from huge pages)."""
        return self.backend == "mojo" and self.device.type == "cpu"

    def _formatted(self, loader: WeightLoader, *names: str, weight_dtype: Optional[str] = None) -> LinearWeight:
        weight_dtype = weight_dtype or self.weight_dtype
        weight = loader.get_linears(names, packed=self._as_stored or weight_dtype in ("int4", "int6"))
        if self._as_stored:
            return weight if isinstance(weight, (Int4Weight, QuantizedWeight)) else dense(weight, self.dtype)
        return convert(weight, weight_dtype, self.dtype)

    def _tileable(self, weight: LinearWeight, experts: bool = False) -> bool:
        """Whether the Mojo kernels read weight (an MoE expert's: experts) in an order of their own
        (bindings/reference.tile_weight): bfloat16 (batch-1 decode 1.1-1.3x faster), int8 where the CPU multiplies
        its quads (linear.mojo's I8_TILED, I8_TILED_EXPERTS), float32 dense linears as panels with AVX-512
        (F32_TILED: prefill linears 1.07x faster)."""
        if not self._cpu_kernels:
            return False
        if isinstance(weight, QuantizedWeight):
            return _tiles_int8(weight, experts)
        if not (isinstance(weight, torch.Tensor) and can_tile(weight)):
            return False
        if weight.dtype == torch.float32:
            return not experts and library.eager_cpu_module().float32_tiled()
        return weight.dtype == torch.bfloat16

    def _tiled(self, weight: LinearWeight, panels: bool = False) -> LinearWeight:
        """weight in the order the Mojo decode kernel reads it, where it has one (else weight itself); panels: a
        bfloat16 weight as pair panels where the kernels read those fastest (_pair_panels; the MoE op reads its
        experts' tiles only)."""
        if not self._tileable(weight):
            return weight
        if isinstance(weight, QuantizedWeight):
            return weight._replace(weight=tile_weight(weight.weight), scales=tile_scales(weight.scales))
        return tile_weight(weight, pairs=panels and _pair_panels(weight))

    def _placed(self, weight: LinearWeight) -> LinearWeight:
        if not self._cpu_kernels:
            return weight
        # the decode kernels stream the weights fastest from huge pages (memory/huge_pages.py)
        if isinstance(weight, QuantizedWeight):
            return weight._replace(weight=on_huge_pages(weight.weight))
        if isinstance(weight, Int4Weight):
            return weight._replace(packed=on_huge_pages(weight.packed))
        return on_huge_pages(weight)

    def _layer_weights(self, loader: WeightLoader, i: int) -> DecoderLayerWeights:
        w = loader.get_weight
        lin = lambda *names: self._linear(loader, *names)
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        bias = None
        if self.config.attention_bias:
            bias = torch.cat([w(attn + f"{n}_proj.bias") for n in "qkv"])
        return DecoderLayerWeights(
            input_norm=w(p + "input_layernorm.weight"),
            qkv_proj=lin(*(attn + f"{n}_proj.weight" for n in "qkv")),
            qkv_bias=bias,
            q_norm=w(attn + "q_norm.weight"),
            k_norm=w(attn + "k_norm.weight"),
            o_proj=lin(attn + "o_proj.weight"),
            post_attention_norm=w(p + "post_attention_layernorm.weight"),
            **(self._sparse_mlp(loader, i) if self.config.is_sparse(i) else dict(
                gate_up_proj=lin(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                down_proj=lin(p + "mlp.down_proj.weight"),
            )),
        )

    def _sparse_mlp(self, loader: WeightLoader, i: int) -> dict:
        experts = f"model.layers.{i}.mlp.experts.{{e}}."
        gate_up, down = self._experts(loader, (experts + "gate_proj.weight", experts + "up_proj.weight"),
                                      (experts + "down_proj.weight",))
        router = loader.get_weight(f"model.layers.{i}.mlp.gate.weight").to(self.dtype)
        return dict(gate_up_proj=None, down_proj=None, router=router, experts_gate_up=gate_up, experts_down=down)

    def decode_weights(self) -> list[LinearWeight]:
        """The LM head and every weight of every layer: what a decode step reads (the embedding table, only gathered
        from, is not among them)."""
        return [self.lm_head, *(w for layer in self.layers for w in vars(layer).values() if w is not None)]

    def new_kv_cache(self, num_pages: int, page_size: int = DEFAULT_PAGE_SIZE) -> PagedKVCache:
        return PagedKVCache.for_model(self.config, num_pages, page_size, dtype=self.kv_cache_dtype, device=self.device)

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
        return self.forward_fn(input_ids, positions, attn, kv_cache, logits_indices)
