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


class CompiledOp:
    """One custom op in a compiled graph whose inputs are [mutable buffers..., read-only tensors...].

    Value ops (in_place=False) return new tensors that the graph writes into the buffers; in-place ops
    receive the buffers themselves and mutate them."""

    def __init__(self, op_name: str, buffers: Sequence[tuple], tensors: Sequence[tuple], in_place: bool = False) -> None:
        self.op_name, self.buffers, self.tensors, self.in_place = op_name, list(buffers), list(tensors), in_place

    @lru_cache(maxsize=None)
    def compiled(self, dtype: torch.dtype, device: str):
        dt = torch_dtype_to_max(dtype)
        dev = DeviceRef.CPU() if device == "cpu" else DeviceRef.GPU(int(device.split(":")[1]))
        types = [BufferType(dt if d is SAME else d, shape, dev) for d, shape in self.buffers]
        types += [TensorType(dt if d is SAME else d, shape, dev) for d, shape in self.tensors]
        name = f"{self.op_name.replace('.', '_')}_{str(dtype).split('.')[-1]}"
        with Graph(name, input_types=types, kernel_library=library.kernel_library()) as graph:
            buffers = [v.buffer for v in graph.inputs[: len(self.buffers)]]
            tensors = [v.tensor for v in graph.inputs[len(self.buffers):]]
            if self.in_place:
                ops.inplace_custom(self.op_name, dev, [*buffers, *tensors])
            else:
                out_types = [TensorType(b.dtype, b.shape, dev) for b in buffers]
                for buffer, result in zip(buffers, ops.custom(self.op_name, dev, tensors, out_types=out_types)):
                    buffer[...] = result.tensor
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
