"""MILI's Mojo ops as functions on torch tensors, with exactly the signatures of bindings/reference.py.

Each op is a small MAX graph compiled once per (dtype, device) with symbolic sizes, so a new number of
tokens, sequences or pages never recompiles. Float parameters (eps, theta, scale) travel as 1-element
float32 tensors, not as compile-time parameters: one compiled graph serves every value.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional, Sequence

import torch

from . import library  # sets MODULAR_CACHE_DIR before max is imported
from .reference import rope_inv_freq

from max.driver import Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.experimental.torch import torch_dtype_to_max  # noqa: E402
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops  # noqa: E402

F32, I32 = DType.float32, DType.int32
SAME = None  # in a shape spec: the op's own dtype
ALL_OPS: list["CompiledOp"] = []


class CompiledOp:
    """One custom op in a compiled graph whose inputs are [mutable buffers..., read-only tensors...].

    Value ops (in_place=False) return new tensors that the graph writes into the buffers; in-place ops
    receive the buffers themselves and mutate them."""

    def __init__(self, op_name: str, buffers: Sequence[tuple], tensors: Sequence[tuple], in_place: bool = False) -> None:
        self.op_name, self.buffers, self.tensors, self.in_place = op_name, list(buffers), list(tensors), in_place
        ALL_OPS.append(self)

    def input_types(self, dtype: DType, dev: DeviceRef) -> list:
        types = [BufferType(dtype if d is SAME else d, shape, dev) for d, shape in self.buffers]
        return types + [TensorType(dtype if d is SAME else d, shape, dev) for d, shape in self.tensors]

    def emit(self, dev: DeviceRef, values: Sequence) -> None:
        """Add the op to the graph being built; values are graph inputs matching input_types()."""
        buffers = [v.buffer for v in values[: len(self.buffers)]]
        tensors = [v.tensor for v in values[len(self.buffers):]]
        if self.in_place:
            ops.inplace_custom(self.op_name, dev, [*buffers, *tensors])
            return
        out_types = [TensorType(b.dtype, b.shape, dev) for b in buffers]
        for buffer, result in zip(buffers, ops.custom(self.op_name, dev, tensors, out_types=out_types)):
            buffer[...] = result.tensor

    @lru_cache(maxsize=None)
    def compiled(self, dtype: torch.dtype, device: str):
        dev = DeviceRef.CPU() if device == "cpu" else DeviceRef.GPU(int(device.split(":")[1]))
        name = f"{self.op_name}_{str(dtype).split('.')[-1]}"
        types = self.input_types(torch_dtype_to_max(dtype), dev)
        with Graph(name, input_types=types, kernel_library=library.kernel_library()) as graph:
            self.emit(dev, graph.inputs)
            graph.output()
        return library.session(device).load(graph)

    def __call__(self, *args: torch.Tensor) -> None:
        """args: the buffers then the tensors, contiguous, on one device, the op's dtype first."""
        model = self.compiled(args[0].dtype, library.device_key(args[0].device))
        model.execute(*[Buffer.from_dlpack(a) for a in args])


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32, device=like.device)


def _c(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _i32(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.int32:
        raise TypeError(f"integer tensors (positions, page tables, lengths, offsets, slots) must be int32, got {t.dtype}")
    return _c(t)


# ---- normalization ----------------------------------------------------------------------------------------

_RMS_NORM = CompiledOp("mili_rms_norm", [(SAME, ["T", "H"])], [(SAME, ["T", "H"]), (SAME, ["H"]), (F32, [1])])
_FUSED_ADD_RMS_NORM = CompiledOp(
    "mili_fused_add_rms_norm", [(SAME, ["T", "H"]), (SAME, ["T", "H"])],
    [(SAME, ["T", "H"]), (SAME, ["T", "H"]), (SAME, ["H"]), (F32, [1])],
)
_HEAD_RMS_NORM = CompiledOp("mili_head_rms_norm", [(SAME, ["T", "N", "D"])], [(SAME, ["T", "N", "D"]), (SAME, ["D"]), (F32, [1])])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x2 = _c(x).reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _RMS_NORM(y, x2, _c(weight), _scalar(eps, x))
    return y.view(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x2, r2 = _c(x).reshape(-1, x.shape[-1]), _c(residual).reshape(-1, x.shape[-1])
    y, residual_out = torch.empty_like(x2), torch.empty_like(x2)
    _FUSED_ADD_RMS_NORM(y, residual_out, x2, r2, _c(weight), _scalar(eps, x))
    return y.view(x.shape), residual_out.view(x.shape)


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    y = torch.empty_like(x)
    _HEAD_RMS_NORM(y, _c(x), _c(weight), _scalar(eps, x))
    return y


# ---- rotary embedding ---------------------------------------------------------------------------------------

_ROPE = CompiledOp(
    "mili_rope", [(SAME, ["T", "Hq", "D"]), (SAME, ["T", "Hk", "D"])],
    [(SAME, ["T", "Hq", "D"]), (SAME, ["T", "Hk", "D"]), (I32, ["T"]), (F32, ["half_D"]), (F32, [1])],
)


@lru_cache(maxsize=64)
def _rope_tables(head_dim: int, theta: float, scaling: Optional[tuple], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq, scale = rope_inv_freq(head_dim, theta, dict(scaling) if scaling else None)
    return inv_freq.to(device), torch.tensor([scale], dtype=torch.float32, device=device)


def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float,
         rope_scaling: Optional[dict] = None) -> tuple[torch.Tensor, torch.Tensor]:
    scaling = tuple(sorted(rope_scaling.items())) if rope_scaling else None
    inv_freq, scale = _rope_tables(q.shape[-1], float(theta), scaling, q.device)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _ROPE(q_out, k_out, _c(q), _c(k), _i32(positions), inv_freq, scale)
    return q_out, k_out


# ---- activations ------------------------------------------------------------------------------------------

_SILU_AND_MUL = CompiledOp("mili_silu_and_mul", [(SAME, ["T", "I"])], [(SAME, ["T", "two_I"])])
_ELEMENTWISE = {name: CompiledOp(f"mili_{name}", [(SAME, ["N"])], [(SAME, ["N"])]) for name in ("silu", "gelu", "relu")}


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension [gate | up], got {tuple(x.shape)}")
    x2 = _c(x).reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape[0], x2.shape[1] // 2, dtype=x.dtype, device=x.device)
    _SILU_AND_MUL(y, x2)
    return y.view(*x.shape[:-1], x.shape[-1] // 2)


def _elementwise(name: str, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _ELEMENTWISE[name](y.view(-1), _c(x).view(-1))
    return y


def silu(x: torch.Tensor) -> torch.Tensor:
    return _elementwise("silu", x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return _elementwise("gelu", x)


def relu(x: torch.Tensor) -> torch.Tensor:
    return _elementwise("relu", x)


# ---- KV cache -----------------------------------------------------------------------------------------------

_STORE_KV = CompiledOp(
    "mili_store_kv", [(SAME, ["P", "S", "Hk", "D"]), (SAME, ["P", "S", "Hk", "D"])],
    [(SAME, ["T", "Hk", "D"]), (SAME, ["T", "Hk", "D"]), (I32, ["T"])], in_place=True,
)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("store_kv writes the caches in place: they must be contiguous")
    capacity = k_cache.shape[0] * k_cache.shape[1]
    if slot_mapping.numel() and int(slot_mapping.max()) >= capacity:
        raise IndexError(f"store_kv: slot {int(slot_mapping.max())} is outside the cache ({capacity} slots)")
    _STORE_KV(k_cache, v_cache, _c(k.to(k_cache.dtype)), _c(v.to(v_cache.dtype)), _i32(slot_mapping))


# ---- attention ----------------------------------------------------------------------------------------------

_PAGED_ATTENTION = CompiledOp(
    "mili_paged_attention", [(SAME, ["T", "Hq", "D"])],
    [(SAME, ["T", "Hq", "D"]), (SAME, ["P", "S", "Hk", "D"]), (SAME, ["P", "S", "Hk", "D"]), (I32, ["B", "max_pages"]),
     (I32, ["B"]), (I32, ["B_plus_1"]), (F32, [1])],
)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                    context_lens: torch.Tensor, query_start: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _PAGED_ATTENTION(out, _c(q), _c(k_cache), _c(v_cache), _i32(page_table), _i32(context_lens), _i32(query_start),
                     _scalar(scale, q))
    return out
