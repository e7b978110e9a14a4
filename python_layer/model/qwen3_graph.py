"""The whole Qwen3 forward as ONE MAX graph on MILI's Mojo ops (bindings/graph.py) and MAX's matmul.

The graph is symbolic in tokens, sequences, pages and logit rows, so one compiled graph per (model config,
dtype, device) serves every step; MAX keeps it in the project-local compile cache. Weights are bound once
when the graph is loaded; the KV caches are buffers the graph updates in place."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import numpy as np
import torch

from bindings import graph as mili, library  # library sets MODULAR_CACHE_DIR before max is imported
from bindings.gpu_options import ENVIRONMENT, GpuOptions
from bindings.ops import kv_bits_dtype, kv_cache_bits
from bindings.reference import kv_head_len, rope_inv_freq

from max._mlir_context import ensure_default_mlir_context
from max.driver import Buffer
from max.experimental.torch import torch_dtype_to_max
from max.dtype import DType
from max.graph import BufferType, Graph, TensorType, TensorValue, Weight, ops

from .attention_metadata import SequenceChunk, build_step_inputs, int32_tensor
from .config import Qwen3Config
from .embedding_table import EmbeddingTable, QuantizedEmbedding
from .quantization import Int4Weight, LinearWeight, QuantizedWeight

if TYPE_CHECKING:
    from max.engine import Model

    from ..memory.kv_cache_manager import PagedKVCache
    from .attention_metadata import AttentionMetadata
    from .qwen3_model import Qwen3CausalLM

_METADATA = ("input_ids", "positions", "query_start", "context_lens", "page_table", "slot_mapping", "logits_indices")


def _named_weights(model: "Qwen3CausalLM") -> Dict[str, LinearWeight | EmbeddingTable]:
    """The model's weights (dense or quantized) by the names the graph gives them."""
    named = {"embed_tokens": model.embed_tokens, "lm_head": model.lm_head, "final_norm": model.final_norm}
    for i, layer in enumerate(model.layers):
        named.update({f"layers.{i}.{name}": tensor for name, tensor in vars(layer).items() if tensor is not None})
    return named


def graph_weights(model: "Qwen3CausalLM") -> Dict[str, torch.Tensor]:
    """The model's weights by the names the graph gives them (the same tensors: nothing is copied here); a
    quantized weight `X` is `X` and `X.scales` (4-bit ones: their packed values, `X.scales`, `X.mins` and, where
    they are codes, `X.supers`; a quantized embedding its values, `X.scales` and, where it has them, `X.mins`)."""
    weights = {}
    for name, tensor in _named_weights(model).items():
        if isinstance(tensor, QuantizedWeight):  # FP8 as its uint8 bits: MAX graphs refuse float8 tensors on CPU
            weights[name] = (
                tensor.weight.view(torch.uint8) if tensor.weight.dtype == torch.float8_e4m3fn else tensor.weight
            )
            weights[name + ".scales"] = tensor.scales
        elif isinstance(tensor, Int4Weight):  # scales and mins as the bytes the kernels take
            weights[name] = tensor.packed
            weights[name + ".scales"], weights[name + ".mins"] = (t.view(torch.uint8) for t in tensor[1:3])
            if tensor.supers is not None:
                weights[name + ".supers"] = tensor.supers
        elif isinstance(tensor, QuantizedEmbedding):
            weights[name], weights[name + ".scales"] = tensor.values, tensor.scales
            if tensor.mins is not None:
                weights[name + ".mins"] = tensor.mins
        else:
            weights[name] = tensor
    return weights


def block_sizes(model: "Qwen3CausalLM") -> Dict[str, int]:
    """The column block of each quantized weight by its graph name (graph_weights'), the graph's constant for it."""
    return {name: w.block_k for name, w in _named_weights(model).items()
            if isinstance(w, (QuantizedWeight, Int4Weight))}


def _one_block(scales: torch.Tensor | TensorValue, tiled: bool) -> bool:
    """Whether a quantized weight's scales ([N, blocks]; tiled: [blocks, N]) have one block of all K columns (whatever
    its block_k)."""
    return int(scales.shape[0 if tiled else 1]) == 1


def build_graph(config: Qwen3Config, weights: Dict[str, torch.Tensor], dtype: torch.dtype, device_key: str,
                blocks: Optional[Dict[str, int]] = None, kv_cache_dtype: Optional[torch.dtype] = None,
                batch_one: bool = False, options: GpuOptions = GpuOptions()) -> Graph:
    """blocks: each quantized weight's column block by name (block_sizes). batch_one: the graph of a step of one
    token of one sequence (T = B = L = 1, static), its linears W @ x^T through MAX's matmul: see
    GpuOptions.batch1_graph. It takes the weights as a GPU holds them, dense [N, K]. options: the GPU kernels the
    graph's ops launch (bindings/gpu_options.py)."""
    blocks = blocks or {}
    c, dev = config, library.device_ref(device_key)
    kv_dtype = kv_cache_dtype or dtype
    i32 = lambda *dims: TensorType(DType.int32, list(dims), dev)
    cache = BufferType(torch_dtype_to_max(kv_bits_dtype(kv_dtype)),
                       ["pages", "page_size", c.num_key_value_heads, kv_head_len(c.head_dim, kv_dtype)], dev)
    tokens, batch, batch_plus_1, rows = (1, 1, 2, 1) if batch_one else ("T", "B", "B_plus_1", "L")
    inputs = [i32(tokens), i32(tokens), i32(batch_plus_1), i32(batch), i32(batch, "max_pages"), i32(tokens), i32(rows)]
    inputs += [cache] * (2 * c.num_hidden_layers)
    weight_dtype = str(weights["lm_head"].dtype).split(".")[-1]
    name = f"mili_qwen3_{c.num_hidden_layers}x{c.hidden_size}_{str(dtype).split('.')[-1]}_w{weight_dtype}"
    if kv_dtype != dtype:
        name += "_kv" + str(kv_dtype).split(".")[-1]
    if batch_one:
        name += "_batch1"
    with Graph(name, input_types=inputs, kernel_library=library.kernel_library()) as g:
        # on a GPU the weights are already there (torch tensors): without _has_alias MAX expects them on the host
        # and copies them over when it loads the graph
        w = {n: Weight(n, torch_dtype_to_max(t.dtype), list(t.shape), dev, _has_alias=device_key != "cpu")
             for n, t in weights.items()}
        ids, positions, query_start, context_lens, page_table, slots, logits_indices = (v.tensor for v in g.inputs[:7])
        caches = [v.buffer for v in g.inputs[7:]]
        k_caches, v_caches = caches[: c.num_hidden_layers], caches[c.num_hidden_layers :]
        q_size = c.num_attention_heads * c.head_dim
        inv_freq, rope_scale = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
        inv_freq = ops.constant(inv_freq.numpy(), DType.float32, dev)
        no_scales = ops.constant(np.ones((1, 1), np.float32), DType.float32, dev)
        no_supers = lambda rank: ops.constant(np.ones((1,) * rank, np.float16), DType.float16, dev)
        int_constant = lambda value: ops.constant(np.array([value], np.int32), DType.int32, dev)

        def linear(x: TensorValue, name: str, n: int, bias: Optional[TensorValue] = None,
                   swiglu: bool = False) -> TensorValue:
            """x @ w[name]^T, n its output features (which a 4-bit weight's tensors do not tell); swiglu: silu_and_mul
            of it, in the linear's own op for a tiled weight on a CPU (bindings/graph.py linear_tiled)."""
            if batch_one:  # x is [1, K] by its type, so both reshapes move nothing, and no transpose kernel runs
                if name in blocks or len(w[name].shape) != 2:
                    raise ValueError(
                        f"the batch-1 graph takes dense [N, K] weights (as a GPU holds them), not {name}'s "
                        f"{'quantized' if name in blocks else 'tiled'} ones"
                    )
                rows, k = w[name].shape
                y = ops.reshape(ops.matmul(w[name], ops.reshape(x, [k, 1])), [1, rows])
            elif name + ".mins" in w:
                block = int_constant(blocks[name])
                supers = w[name + ".supers"] if name + ".supers" in w else no_supers(4)
                y = mili.linear_int4(x, w[name], w[name + ".scales"], w[name + ".mins"], supers, block, n)
            elif device_key == "cpu":  # MILI's kernel for every weight format
                scales = w.get(name + ".scales", no_scales)
                one_block = name + ".scales" in w and _one_block(scales, len(w[name].shape) == 4)
                block = int_constant(int(x.shape[-1]) if one_block else blocks.get(name, 0))
                if swiglu and bias is None:
                    return mili.linear(x, w[name], scales, block, swiglu=True)
                y = mili.linear(x, w[name], scales, block)
            else:  # weights and activations are both `dtype` on a GPU: MAX's matmul takes the transposed operand
                y = ops.matmul(x, ops.transpose(w[name], 0, 1))
            y = y if bias is None else y + bias
            return mili.silu_and_mul(y) if swiglu else y

        def sparse_mlp(x: TensorValue, p: str) -> TensorValue:
            """qwen3_moe's MLP: the router's logits, then mili.moe on the experts' stacks, a row per expert."""
            gate_up, down = p + "experts_gate_up", p + "experts_down"
            per_expert = lambda name: ops.reshape(w[name], [c.num_experts, -1])
            tiled = len(w[gate_up].shape) > 3
            params = ops.constant(np.array([blocks.get(gate_up, 0), c.num_experts_per_tok, c.norm_topk_prob, tiled,
                                            c.moe_intermediate_size, blocks.get(down, 0)], np.int32), DType.int32, dev)
            logits = linear(x, p + "router", c.num_experts)
            if gate_up + ".mins" in w:
                supers = lambda name: per_expert(name + ".supers") if name + ".supers" in w else no_supers(2)
                return mili.moe_int4(x, logits, *(t for n in (gate_up, down) for t in (
                    *(per_expert(n + s) for s in ("", ".scales", ".mins")), supers(n))), params)
            scales = lambda name: per_expert(name + ".scales") if name + ".scales" in w else no_scales
            return mili.moe(x, logits, per_expert(gate_up), scales(gate_up), per_expert(down), scales(down), params)

        def embed(ids: TensorValue) -> TensorValue:
            """The embedding table's rows of ids in dtype (embedding_table.gather_rows)."""
            if "embed_tokens.scales" not in w:
                rows = ops.gather(w["embed_tokens"], ids, axis=0)
            else:  # gathered as [T, blocks, block]: a gathered [T, K] reshaped so multiplied wrong (MAX 26.7)
                blocks = int(w["embed_tokens.scales"].shape[1])
                table = lambda name, block: ops.gather(ops.reshape(w[name], [c.vocab_size, blocks, block]), ids, 0)
                rows = ops.cast(table("embed_tokens", c.hidden_size // blocks), DType.float32)
                rows = rows * table("embed_tokens.scales", 1)
                if "embed_tokens.mins" in w:
                    rows = rows + table("embed_tokens.mins", 1)
                rows = ops.reshape(rows, [-1, c.hidden_size])
            target = torch_dtype_to_max(dtype)
            return rows if rows.dtype == target else ops.cast(rows, target)

        hidden, residual = embed(ids), None
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            if residual is None:
                residual, x = hidden, mili.rms_norm(hidden, w[p + "input_norm"], c.rms_norm_eps, options)
            else:
                x, residual = mili.fused_add_rms_norm(hidden, residual, w[p + "input_norm"], c.rms_norm_eps, options)
            qkv = linear(x, p + "qkv_proj", q_size + 2 * c.num_key_value_heads * c.head_dim, w.get(p + "qkv_bias"))
            # q/k slices, head norms, RoPE and the KV store in one op, and with the flash kernels attention too: on
            # a GPU a decode step's in one kernel
            norm_rope_store = (qkv, w[p + "q_norm"], w[p + "k_norm"], c.rms_norm_eps, positions, inv_freq, rope_scale,
                               k_caches[i], v_caches[i], slots)
            attention = (page_table, context_lens, query_start, c.head_dim**-0.5)
            if options.runs_qkv_attention:
                o = mili.qkv_attention(*norm_rope_store, *attention, options)
            else:
                q = mili.qk_norm_rope_store(*norm_rope_store)
                if options.flash_attention:
                    o = mili.paged_attention_flash(q, k_caches[i], v_caches[i], *attention, options)
                else:
                    o = mili.paged_attention(q, k_caches[i], v_caches[i], *attention)
            hidden = linear(ops.reshape(o, [-1, q_size]), p + "o_proj", c.hidden_size)
            x, residual = mili.fused_add_rms_norm(hidden, residual, w[p + "post_attention_norm"], c.rms_norm_eps,
                                                  options)
            if p + "router" in w:
                hidden = sparse_mlp(x, p)
            else:
                activated = linear(x, p + "gate_up_proj", 2 * c.intermediate_size, swiglu=True)
                hidden = linear(activated, p + "down_proj", c.hidden_size)
        hidden, residual = ops.gather(hidden, logits_indices, axis=0), ops.gather(residual, logits_indices, axis=0)
        x, _ = mili.fused_add_rms_norm(hidden, residual, w["final_norm"], c.rms_norm_eps, options)
        g.output(ops.cast(linear(x, "lm_head", c.vocab_size), DType.float32))
    return g


def model_graph(
    model: "Qwen3CausalLM", weights: Dict[str, torch.Tensor], device_key: str, batch_one: bool = False
) -> Graph:
    """The graph of `model` (its graph_weights) on device_key (batch_one: its batch-1 graph), with the model's
    GpuOptions: what CompiledQwen3 compiles, and benchmarks/gpu/precompile.py for the GPU suite."""
    return build_graph(model.config, weights, model.dtype, device_key, block_sizes(model), model.kv_cache_dtype,
                       batch_one, model.gpu_options)


BATCH_ONE_TOLERANCE = 0.07
"""How far the batch-1 graph's logits may be from the dynamic graph's, as a share of their largest magnitude. Its
matmuls sum in another order, and in bfloat16 a rounding one ulp apart grows over the layers: on Qwen3-0.6B's shape
with random weights, float32 sums in other orders rounded once to bfloat16 put the logits 1.7-3.5% apart (token 0,
as the check runs it: 1.8%), and one wrong matmul (the middle layer's o_proj, its output rows permuted) 14-20%
(benchmarks/engine/matmul_order_drift.py): 0.07 is 2x from both."""


def check_batch_one_logits(one: torch.Tensor, dynamic: torch.Tensor) -> None:
    """RuntimeError unless the batch-1 graph's logits `one` are within BATCH_ONE_TOLERANCE of the dynamic graph's."""
    one, dynamic = one.float(), dynamic.float()
    worst, scale = float((one - dynamic).abs().max()), float(dynamic.abs().max())
    if not worst <= BATCH_ONE_TOLERANCE * scale:
        raise RuntimeError(f"the batch-1 graph's logits differ from the dynamic graph's by up to {worst:.3g} (of "
                           f"{scale:.3g}) on a one-token step: unset {ENVIRONMENT['batch1_graph']}")


class CompiledQwen3:
    """Qwen3CausalLM.forward as one compiled MAX graph. Loading compiles it (or takes it from MAX's cache) and
    binds the weights; `load_seconds` says how long that took, `vendor_blas` whether its matmuls call cuBLAS (on a GPU
    with the model's GpuOptions.vendor_blas). With a batch-1 graph beside it (`batch_one_model`), the steps of one
    token of one sequence whose logits are asked for run on that one."""

    def __init__(self, model: "Qwen3CausalLM", batch_one_graph: Optional[bool] = None) -> None:
        """batch_one_graph: load the batch-1 graph too (None: on a GPU with the model's GpuOptions.batch1_graph); it
        must give the dynamic graph's logits on a one-token step, else RuntimeError."""
        if model.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"the mojo backend runs float32 or bfloat16, not {model.dtype}: pass dtype='bfloat16' "
                             "or backend='reference'")
        self.config, self.device_key = model.config, library.device_key(model.device)
        if batch_one_graph is None:
            batch_one_graph = self.device_key != "cpu" and model.gpu_options.batch1_graph
        weights = graph_weights(model)
        started = time.perf_counter()
        # MAX 26.7 enters its MLIR context for the main thread only; the server loads models on a worker thread
        with ensure_default_mlir_context():
            self.vendor_blas = self.device_key != "cpu" and model.gpu_options.vendor_blas
            session = library.session(self.device_key, self.vendor_blas)
            self.model = session.load(model_graph(model, weights, self.device_key), weights_registry=weights)
            self.batch_one_model = None
            if batch_one_graph:
                self.batch_one_model = session.load(model_graph(model, weights, self.device_key, batch_one=True),
                                                    weights_registry=weights)
        self._cache_buffers: tuple[Optional["PagedKVCache"], List[Buffer]] = (None, [])
        self._captured: Dict[int, "Model"] = {}  # device graph key -> the loaded graph that captured it
        self._warm_up(model)
        self.load_seconds = time.perf_counter() - started

    def _warm_up(self, model: "Qwen3CausalLM") -> None:
        """One step of token 0 at position 0 into a KV cache of one page of its own, on a CPU under
        library.runtime_timer_slack (the runtime threads a first execute starts get it), and with a batch-1 graph on
        both graphs, whose logits must agree. A GPU without a batch-1 graph runs none."""
        if self.device_key != "cpu" and self.batch_one_model is None:
            return
        kv_cache = model.new_kv_cache(1)
        step = build_step_inputs([SequenceChunk([0], 0, [0])], kv_cache.page_size, model.device)
        inputs = self._buffers(step.input_ids, step.positions, step.attn, int32_tensor([0], model.device))
        caches = _aliasing_buffers(kv_cache)
        with library.runtime_timer_slack() if self.device_key == "cpu" else contextlib.nullcontext():
            dynamic = torch.from_dlpack(self.model.execute(*inputs, *caches)[0])
        if self.batch_one_model is not None:
            check_batch_one_logits(torch.from_dlpack(self.batch_one_model.execute(*inputs, *caches)[0]), dynamic)

    def graph_for(self, inputs: Sequence[Buffer]) -> "Model":
        """The loaded graph that runs a step on `inputs` (the seven, in _METADATA's order): the batch-1 graph for one
        token of one sequence whose logits are asked for, where it is loaded; else the dynamic graph."""
        if self.batch_one_model is not None and tuple(inputs[0].shape) == (1,) and tuple(inputs[6].shape) == (1,):
            return self.batch_one_model
        return self.model

    def _kv_buffers(self, kv_cache: "PagedKVCache") -> List[Buffer]:
        # MAX buffers that alias the cache's torch tensors: made once per cache, then reused every step
        if self._cache_buffers[0] is not kv_cache:
            self._cache_buffers = (kv_cache, _aliasing_buffers(kv_cache))
        return self._cache_buffers[1]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: "AttentionMetadata",
                 kv_cache: "PagedKVCache", logits_indices: torch.Tensor) -> torch.Tensor:
        return torch.from_dlpack(self.execute(self._buffers(input_ids, positions, attn, logits_indices), kv_cache))

    def _buffers(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: "AttentionMetadata",
                 logits_indices: torch.Tensor) -> List[Buffer]:
        """A step's seven int32 inputs, in _METADATA's order, as MAX buffers."""
        metadata = [input_ids, positions, attn.query_start, attn.context_lens, attn.page_table, attn.slot_mapping,
                    logits_indices]
        for name, t in zip(_METADATA, metadata):
            if t.dtype != torch.int32:
                raise TypeError(f"{name} must be int32, got {t.dtype}")
        if self.device_key == "cpu":  # through numpy: a third of from_dlpack's time, seven times a step
            return [Buffer.from_numpy(t.contiguous().numpy()) for t in metadata]
        return [Buffer.from_dlpack(t.contiguous()) for t in metadata]

    def execute(self, inputs: Sequence[Buffer], kv_cache: "PagedKVCache") -> Buffer:
        """The logits of one step from the graph's seven int32 inputs (in _METADATA's order) as MAX buffers."""
        return self.graph_for(inputs).execute(*inputs, *self._kv_buffers(kv_cache))[0]

    def capture(self, key: int, inputs: Sequence[Buffer], kv_cache: "PagedKVCache") -> Buffer:
        """Record the step on `inputs` as device graph `key` (GPU only); returns the logits buffer every replay
        of it writes."""
        graph = self.graph_for(inputs)
        logits = graph.capture(key, *inputs, *self._kv_buffers(kv_cache))[0]
        self._captured[key] = graph
        return logits

    def replay(self, key: int, inputs: Sequence[Buffer], kv_cache: "PagedKVCache") -> None:
        """Run device graph `key` again: `inputs` must be the buffers it was captured with (refreshed in place)."""
        self._captured[key].replay(key, *inputs, *self._kv_buffers(kv_cache))

    def release(self, key: int) -> None:
        """Free the device memory device graph `key` holds."""
        self._captured.pop(key).release_captured_graph(key)


def _aliasing_buffers(kv_cache: "PagedKVCache") -> List[Buffer]:
    """MAX buffers that alias the cache's torch tensors: K of every layer, then V."""
    return [Buffer.from_dlpack(kv_cache_bits(t)) for t in kv_cache.k_caches + kv_cache.v_caches]
