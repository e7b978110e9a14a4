"""MILI's Mojo ops as functions on torch tensors, with exactly the signatures of bindings/reference.py.

On CPU, float32 and bfloat16 tensors go straight to the Mojo kernels through a Python extension module
(bindings/eager/eager_cpu.mojo), on torch's OpenMP threads: a call costs about a microsecond more than the kernel.
Otherwise (GPU, other dtypes, or EAGER_CPU = False) each op is a small MAX graph (built with bindings/graph.py)
compiled once per (dtype, device) with symbolic sizes, so a new number of tokens, sequences or pages never
recompiles; each execution costs tens of microseconds. Float parameters (eps, theta, scale) travel as 1-element
float32 tensors, not as compile-time constants: one graph serves every value. GPU calls build their graphs with
GPU_OPTIONS.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Callable, Optional, Sequence

import torch

from . import graph, library  # library sets MODULAR_CACHE_DIR before max is imported
from .gpu_options import GpuOptions
from .reference import TILED_DTYPES, kv_head_dim, rope_inv_freq

from max.driver import Buffer
from max.dtype import DType
from max.experimental.torch import max_dtype_to_torch, torch_dtype_to_max
from max.graph import BufferType, DeviceRef, Graph, Module, TensorType, ops

F16, F32, I32 = DType.float16, DType.float32, DType.int32
SAME = None  # in a spec: the op's own dtype
ALL_OPS: list["CompiledOp"] = []
EAGER_CPU = True
"""CPU calls use the Mojo extension module; False sends them through MAX graphs like GPU calls (tests do both)."""
EAGER_DTYPES = (torch.float32, torch.bfloat16)
GPU_OPTIONS = GpuOptions()
"""The options GPU calls' graphs are built with (the measured defaults; tests and the kernel benchmark set others)."""
_OPENMP = library.openmp_entry_points()
"""The eager kernels' first argument: they run on torch's OpenMP threads (mojo_kernels/utils/parallel.mojo)."""


def T(dtype, *dims: str | int) -> tuple:
    """A read-only tensor input of the graph function."""
    return ("tensor", dtype, list(dims))


def B(dtype, *dims: str | int) -> tuple:
    """A buffer input (a KV cache) that the graph function reads or updates in place."""
    return ("buffer", dtype, list(dims))


class CompiledOp:
    """A bindings.graph function compiled into its own graph, whose inputs are [output buffers..., the
    function's arguments...]: the function's results are written into the output buffers."""

    def __init__(self, fn: Callable, outputs: Sequence[tuple], inputs: Sequence[tuple], variant: str = "") -> None:
        """variant: appended to the names of its graphs and eager kernels, for ops with one twin per input dtype."""
        self.fn, self.outputs, self.inputs, self.variant = fn, list(outputs), list(inputs), variant
        self._specs: dict = {}
        self._eager_kernels: dict = {}
        self._compiled: dict = {}
        self.takes_options = "options" in inspect.signature(fn).parameters
        self.takes_n = "n" in inspect.signature(fn).parameters  # the output's columns, which no input's shape gives
        ALL_OPS.append(self)

    def input_types(self, dtype: DType, dev: DeviceRef) -> list:
        resolve = lambda d: dtype if d is SAME else d
        types = [BufferType(resolve(d), dims, dev) for _, d, dims in self.outputs]
        return types + [
            (BufferType if kind == "buffer" else TensorType)(resolve(d), dims, dev) for kind, d, dims in self.inputs
        ]

    def emit(self, values: Sequence, repeat: int = 1, chain: Optional[dict[int, int]] = None,
             options: GpuOptions = GpuOptions()) -> None:
        """Add the op to the graph being built; values are graph inputs matching input_types(). For kernel
        benchmarks, `repeat` applies it several times, result chain[i] feeding argument i of the next one."""
        n = len(self.outputs)
        args = [v.buffer if kind == "buffer" else v.tensor for v, (kind, _, _) in zip(values[n:], self.inputs)]
        extra = {"options": options} if self.takes_options else {}
        if self.takes_n:
            extra["n"] = values[0].buffer.shape[-1]
        for _ in range(repeat):
            results = self.fn(*args, **extra)
            results = [] if results is None else list(results) if isinstance(results, tuple) else [results]
            for arg, result in (chain or {}).items():
                args[arg] = results[result]
        for value, result in zip(values[:n], results, strict=True):
            value.buffer[...] = ops.rebind(result, value.buffer.shape)  # e.g. "two_I // 2" is the buffer's "I"

    def graph(self, dtype: torch.dtype, device: str, repeat: int = 1, chain: Optional[dict[int, int]] = None,
              options: GpuOptions = GpuOptions(), module: Optional[Module] = None) -> Graph:
        """module: build the graph into it (load_together), else into one of its own."""
        dev = library.device_ref(device)
        name = f"mili_{self.fn.__name__}_{str(dtype).split('.')[-1]}{self.variant}" + (
            f"_x{repeat}" if repeat > 1 else ""
        )
        with Graph(name, input_types=self.input_types(torch_dtype_to_max(dtype), dev),
                   kernel_library=library.kernel_library(), module=module) as g:
            self.emit(g.inputs, repeat, chain, options)
            g.output()
        return g

    def compiled(self, dtype: torch.dtype, device: str, options: GpuOptions = GpuOptions()):
        """The op's graph loaded on `device`, compiled once per dtype, device and options."""
        key = (dtype, device, options)
        if key not in self._compiled:
            self._compiled[key] = library.session(device).load(self.graph(dtype, device, options=options))
        return self._compiled[key]

    @staticmethod
    def load_together(chosen: Sequence["CompiledOp"], dtype: torch.dtype, device: str,
                      options: GpuOptions = GpuOptions()) -> None:
        """Compile the graphs of `chosen` in one MAX module and keep each as its op's compiled graph. Each compile
        costs MAX's JIT of its kernels ~30 s on a 2-core Zen 3, whatever the graph holds (a graph of one add too): the
        op tests' 39 bfloat16 graphs took 133 s together, 732 s one by one on both cores."""
        module = Module()
        graphs = [op.graph(dtype, device, options=options, module=module) for op in chosen]
        loaded = library.session(device).load_all(module, custom_extensions=[library.package_path()])
        for op, g in zip(chosen, graphs, strict=True):
            op._compiled[(dtype, device, options)] = loaded[g.name]

    def _spec(self, dtype: torch.dtype) -> tuple:
        """(rank, dtype) of every argument when the op's dtype is `dtype`."""
        if dtype not in self._specs:
            self._specs[dtype] = tuple((len(dims), dtype if d is SAME else max_dtype_to_torch(d))
                                       for _, d, dims in self.outputs + self.inputs)
        return self._specs[dtype]

    def eager_kernel(self, dtype: torch.dtype, on_cpu: bool) -> Optional[Callable]:
        """The extension module's kernel for calls whose first tensor has this dtype and device, or None when
        such calls run MAX graphs. The module is built on first use (CPU calls only)."""
        if not (on_cpu and EAGER_CPU):
            return None
        kernel = self._eager_kernels.get(dtype)
        if kernel is None and dtype in EAGER_DTYPES:
            name = f"{self.fn.__name__}_{str(dtype).split('.')[-1]}{self.variant}"
            kernel = self._eager_kernels[dtype] = getattr(library.eager_cpu_module(), name)
        return kernel

    def __call__(self, *args: torch.Tensor) -> None:
        """args: the output buffers then the function's arguments, contiguous, on one device; the first
        one has the op's dtype. The kernels trust ranks, dtypes and devices: they are checked here."""
        dtype, on_cpu = args[0].dtype, args[0].is_cpu
        spec = self._spec(dtype)
        flat = _flatten(args, spec, on_cpu)
        if flat is None:
            want = ", ".join(f"{r}-d {d}" for r, d in spec)
            got = ", ".join(f"{a.dim()}-d {a.dtype} on {a.device}" for a in args)
            raise ValueError(f"{self.fn.__name__}: needs ({want}) tensors on one device, got ({got})")
        kernel = self.eager_kernel(dtype, on_cpu)
        if kernel is not None:  # raises ValueError, as MAX does
            kernel(_OPENMP, *flat)
        else:  # (MAX checks that GPU tensors are on its InferenceSession's GPU)
            self.compiled(dtype, library.device_key(args[0].device), GPU_OPTIONS).execute(
                *[Buffer.from_dlpack(a) for a in args]
            )


def _flatten(args: Sequence[torch.Tensor], spec: tuple, on_cpu: bool) -> Optional[list[int]]:
    """[address, sizes..., address, sizes...] of the tensors (the eager kernels' arguments), or None when
    one does not match its (rank, dtype) or is not on the CPU when the first one is (or the reverse)."""
    if len(args) != len(spec):
        return None
    flat = []
    for a, (rank, dtype) in zip(args, spec):
        if a.dim() != rank or a.dtype != dtype or a.is_cpu != on_cpu:
            return None
        flat.append(a.data_ptr())
        flat.extend(a.shape)
    return flat


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    return _scalar_on(float(value), like.device)


@lru_cache(maxsize=256)
def _scalar_on(value: float, device: torch.device) -> torch.Tensor:
    """A 1-element float32 tensor, made once per value (creating one costs several µs; the ops only read it)."""
    return torch.tensor([value], dtype=torch.float32, device=device)


def _c(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _i32(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.int32:
        raise TypeError(
            f"integer tensors (positions, page tables, lengths, offsets, slots) must be int32, got {t.dtype}"
        )
    return _c(t)


# ---- normalization ----------------------------------------------------------------------------------------

_RMS_NORM = CompiledOp(graph.rms_norm, [T(SAME, "T", "H")], [T(SAME, "T", "H"), T(SAME, "H"), T(F32, 1)])
_FUSED_ADD_RMS_NORM = CompiledOp(graph.fused_add_rms_norm, [T(SAME, "T", "H"), T(SAME, "T", "H")],
                                 [T(SAME, "T", "H"), T(SAME, "T", "H"), T(SAME, "H"), T(F32, 1)])
_HEAD_RMS_NORM = CompiledOp(
    graph.head_rms_norm, [T(SAME, "T", "N", "D")], [T(SAME, "T", "N", "D"), T(SAME, "D"), T(F32, 1)]
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x2 = _c(x).reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _RMS_NORM(y, x2, _c(weight), _scalar(eps, x))
    return y.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    x2, r2 = _c(x).reshape(-1, x.shape[-1]), _c(residual).reshape(-1, x.shape[-1])
    y, residual_out = torch.empty_like(x2), torch.empty_like(x2)
    _FUSED_ADD_RMS_NORM(y, residual_out, x2, r2, _c(weight), _scalar(eps, x))
    return y.view(x.shape), residual_out.view(x.shape)


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    y = torch.empty_like(x)
    _HEAD_RMS_NORM(y, _c(x), _c(weight), _scalar(eps, x))
    return y


# ---- rotary embedding ---------------------------------------------------------------------------------------

_ROPE = CompiledOp(graph.rope_with_table, [T(SAME, "T", "Hq", "D"), T(SAME, "T", "Hk", "D")],
                   [T(SAME, "T", "Hq", "D"), T(SAME, "T", "Hk", "D"), T(I32, "T"), T(F32, "half_D"), T(F32, 1)])


@lru_cache(maxsize=64)
def _rope_tables(
    head_dim: int, theta: float, scaling: Optional[tuple], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
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

_SILU_AND_MUL = CompiledOp(graph.silu_and_mul, [T(SAME, "T", "I")], [T(SAME, "T", "two_I")])
_ELEMENTWISE = {name: CompiledOp(getattr(graph, name), [T(SAME, "T", "C")], [T(SAME, "T", "C")])
                for name in ("silu", "gelu", "relu")}


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension [gate | up], got {tuple(x.shape)}")
    x2 = _c(x).view(-1, x.shape[-1]) if x.dim() != 2 else _c(x)
    rows, inter = x2.shape[0], x2.shape[1] // 2
    y = x2.new_empty((rows, inter))
    kernel = _SILU_AND_MUL.eager_kernel(x.dtype, x.is_cpu)
    if kernel is not None:  # y is made here to fit x2: nothing for __call__ to check
        kernel(_OPENMP, y.data_ptr(), rows, inter, x2.data_ptr(), rows, 2 * inter)
    else:
        _SILU_AND_MUL(y, x2)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], inter)


def _elementwise(op: CompiledOp, x: torch.Tensor) -> torch.Tensor:
    x = _c(x)
    y = torch.empty_like(x)
    kernel = op.eager_kernel(x.dtype, x.is_cpu)
    if kernel is not None:  # y is x's twin: nothing for __call__ to check (its checks cost more than the kernel)
        n = x.numel()
        kernel(_OPENMP, y.data_ptr(), 1, n, x.data_ptr(), 1, n)
    else:
        op(y.view(1, -1), x.view(1, -1))
    return y


def silu(x: torch.Tensor) -> torch.Tensor:
    return _elementwise(_ELEMENTWISE["silu"], x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return _elementwise(_ELEMENTWISE["gelu"], x)


def relu(x: torch.Tensor) -> torch.Tensor:
    return _elementwise(_ELEMENTWISE["relu"], x)


# ---- KV cache -----------------------------------------------------------------------------------------------

KV_DTYPES = (SAME, DType.bfloat16, DType.int8, DType.uint8)
"""The caches' dtype: the activations' own, bfloat16 under float32 activations (half the bytes attention reads), or
on a CPU int8 or FP8 (as uint8 bits: MAX graphs refuse float8 tensors on CPU) under either."""
_EIGHT_BIT_KV = {torch.int8: DType.int8, torch.float8_e4m3fn: DType.uint8}


def _cache(kv) -> tuple:
    return B(kv, "P", "S", "Hk", "D_scale" if kv == DType.int8 else "D")  # int8: head_dim + KV_SCALE_BYTES


def _kv_variant(kv) -> str:
    return "" if kv is SAME else "_kv_" + str(kv).split(".")[-1]


KV_CACHE_RULE = ("the caches hold the activations' dtype, bfloat16 under float32 activations, or on a CPU int8 or "
                 "float8_e4m3fn")
"""kv_cache_supported in words, for error messages."""


def kv_cache_supported(activations: torch.dtype, cache: torch.dtype, on_cpu: bool = True) -> bool:
    """Whether the kernels take caches of `cache` under `activations` (KV_DTYPES)."""
    return (cache == activations or (activations == torch.float32 and cache == torch.bfloat16)
            or (on_cpu and activations in EAGER_DTYPES and cache in _EIGHT_BIT_KV))


def _with_caches(ops: dict, like: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> "CompiledOp":
    """The op's twin for caches of this dtype under activations like `like`."""
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"the K and V caches must have one dtype, got {k_cache.dtype} and {v_cache.dtype}")
    if not kv_cache_supported(like.dtype, k_cache.dtype, like.is_cpu):
        raise ValueError(f"{k_cache.dtype} caches under {like.dtype} activations on {like.device.type} are not "
                         f"supported: {KV_CACHE_RULE}")
    if k_cache.dtype == like.dtype:
        return ops[SAME]
    return ops[_EIGHT_BIT_KV.get(k_cache.dtype, DType.bfloat16)]


def kv_bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels take a cache of `dtype` as: FP8 as its uint8 bits."""
    return torch.uint8 if dtype == torch.float8_e4m3fn else dtype


def kv_cache_bits(cache: torch.Tensor) -> torch.Tensor:
    """A cache as the kernels take it (kv_bits_dtype), the same memory."""
    return cache.view(kv_bits_dtype(cache.dtype))


def _check_cache_writes(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """The kernels write the caches in place at these slots: they must be contiguous and hold every slot."""
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"{op} writes the caches in place: they must be contiguous")
    capacity = k_cache.shape[0] * k_cache.shape[1]
    if slot_mapping.numel() and int(slot_mapping.max()) >= capacity:
        raise IndexError(f"{op}: slot {int(slot_mapping.max())} is outside the cache ({capacity} slots)")


_STORE_KV = {kv: CompiledOp(
    graph.store_kv, [], [T(SAME, "T", "Hk", "D"), T(SAME, "T", "Hk", "D"), _cache(kv), _cache(kv), T(I32, "T")],
    variant=_kv_variant(kv),
) for kv in KV_DTYPES}


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    _check_cache_writes("store_kv", k_cache, v_cache, slot_mapping)
    if k.dtype != v.dtype:
        raise ValueError(f"store_kv: k and v must have one dtype, got {k.dtype} and {v.dtype}")
    op = _with_caches(_STORE_KV, k, k_cache, v_cache)
    op(_c(k), _c(v), kv_cache_bits(k_cache), kv_cache_bits(v_cache), _i32(slot_mapping))


def _q_shape(op: str, qkv: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int]:
    """q's shape [tokens, q heads, head_dim] in the fused projection's output qkv, for these caches."""
    kv_heads, head_dim = k_cache.shape[2], kv_head_dim(k_cache)
    if qkv.dim() != 2 or qkv.shape[1] % head_dim or qkv.shape[1] // head_dim <= 2 * kv_heads:
        raise ValueError(f"{op}: qkv must be [tokens, (q heads + 2 * {kv_heads}) * {head_dim}] for these caches, got "
                         f"{tuple(qkv.shape)}")
    return qkv.shape[0], qkv.shape[1] // head_dim - 2 * kv_heads, head_dim


_QK_NORM_ROPE_STORE = {kv: CompiledOp(
    graph.qk_norm_rope_store, [T(SAME, "T", "Hq", "D")],
    [T(SAME, "T", "QKV"), T(SAME, "D"), T(SAME, "D"), T(F32, 1), T(I32, "T"), T(F32, "half_D"), T(F32, 1), _cache(kv),
     _cache(kv), T(I32, "T")], variant=_kv_variant(kv),
) for kv in KV_DTYPES}


def qk_norm_rope_store(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float,
                       positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    _check_cache_writes("qk_norm_rope_store", k_cache, v_cache, slot_mapping)
    q = qkv.new_empty(_q_shape("qk_norm_rope_store", qkv, k_cache))
    op = _with_caches(_QK_NORM_ROPE_STORE, qkv, k_cache, v_cache)
    op(q, _c(qkv), _c(q_norm), _c(k_norm), _scalar(eps, qkv), _i32(positions), _c(inv_freq.float().to(qkv.device)),
       _scalar(scale, qkv), kv_cache_bits(k_cache), kv_cache_bits(v_cache), _i32(slot_mapping))
    return q


# ---- attention ----------------------------------------------------------------------------------------------

_ATTENTION_ARGS = [T(SAME, "T", "Hq", "D"), T(I32, "B", "max_pages"), T(I32, "B"), T(I32, "B_plus_1"), T(F32, 1)]
_PAGED_ATTENTION, _PAGED_ATTENTION_FLASH = (
    {
        kv: CompiledOp(
            fn,
            [T(SAME, "T", "Hq", "D")],
            [_ATTENTION_ARGS[0], _cache(kv), _cache(kv), *_ATTENTION_ARGS[1:]],
            variant=_kv_variant(kv),
        )
        for kv in KV_DTYPES
    }
    for fn in (graph.paged_attention, graph.paged_attention_flash)
)
"""The op with the plain GPU kernels, and its twin with the GPU flash kernels (GPU calls use the twin unless
GPU_OPTIONS.flash_attention is off, CPU calls never: its CPU kernel is the same)."""


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                    context_lens: torch.Tensor, query_start: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_attention reads the caches in place: they must be contiguous")
    twins = _PAGED_ATTENTION_FLASH if GPU_OPTIONS.flash_attention and not q.is_cpu else _PAGED_ATTENTION
    op = _with_caches(twins, q, k_cache, v_cache)
    op(out, _c(q), kv_cache_bits(k_cache), kv_cache_bits(v_cache), _i32(page_table), _i32(context_lens),
       _i32(query_start), _scalar(scale, q))
    return out


_QKV_ATTENTION = {kv: CompiledOp(
    graph.qkv_attention, [T(SAME, "T", "Hq", "D")],
    [T(SAME, "T", "QKV"), T(SAME, "D"), T(SAME, "D"), T(F32, 1), T(I32, "T"), T(F32, "half_D"), T(F32, 1), _cache(kv),
     _cache(kv), T(I32, "T"), *_ATTENTION_ARGS[1:]], variant=_kv_variant(kv),
) for kv in KV_DTYPES}


def qkv_attention(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float, positions: torch.Tensor,
                  inv_freq: torch.Tensor, rope_scale: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, page_table: torch.Tensor, context_lens: torch.Tensor,
                  query_start: torch.Tensor, scale: float) -> torch.Tensor:
    """qk_norm_rope_store then paged_attention (the flash kernels on a GPU) in one op, the model graph's."""
    _check_cache_writes("qkv_attention", k_cache, v_cache, slot_mapping)
    out = qkv.new_empty(_q_shape("qkv_attention", qkv, k_cache))
    op = _with_caches(_QKV_ATTENTION, qkv, k_cache, v_cache)
    op(out, _c(qkv), _c(q_norm), _c(k_norm), _scalar(eps, qkv), _i32(positions), _c(inv_freq.float().to(qkv.device)),
       _scalar(rope_scale, qkv), kv_cache_bits(k_cache), kv_cache_bits(v_cache), _i32(slot_mapping), _i32(page_table),
       _i32(context_lens), _i32(query_start), _scalar(scale, qkv))
    return out


# ---- linear layers ------------------------------------------------------------------------------------------

WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int8)
SCALED_DTYPES = (torch.float8_e4m3fn, torch.int8)
_BITS = {torch.float8_e4m3fn: torch.uint8}
"""The kernels take FP8 weights as their uint8 bits (MAX graphs refuse float8 tensors on CPU)."""
_LINEAR = {w: CompiledOp(graph.linear, [T(SAME, "M", "N")],
                         [T(SAME, "M", "K"), T(torch_dtype_to_max(w), "N", "K"), T(F32, "SN", "KB"), T(I32, 1)],
                         variant="_" + str(w).split(".")[-1])
           for w in (torch.float32, torch.bfloat16, torch.uint8, torch.int8)}


@lru_cache(maxsize=64)
def _block_k_on(block_k: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([block_k], dtype=torch.int32, device=device)


_LINEAR_TILED, _LINEAR_TILED_SWIGLU = ({
    w: CompiledOp(
        fn,
        [T(SAME, "M", "N")],
        [T(SAME, "M", "K"), T(torch_dtype_to_max(w), "NT", "KT", "R", "C"), T(F32, "SN", "KB"), T(I32, 1)],
        variant="_" + str(w).split(".")[-1],
    )
    for w in TILED_DTYPES
} for fn in (graph.linear_tiled, graph.linear_tiled_swiglu))


_LINEAR_INT4 = CompiledOp(
    graph.linear_int4,
    [T(SAME, "M", "N")],
    [T(SAME, "M", "K"), T(DType.uint8, "NT", "TB"), T(DType.uint8, "ST", "KB", "SB"), T(DType.uint8, "MT", "MB", "MR"),
     T(F16, "UT", "US", "UW", "UR"), T(I32, 1)],
)


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, block_k: int,
                n: int, supers: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] @ dequantize_int4(packed, scales, mins, block_k, n, K, supers)^T (reference.linear_int4; mins tiled
    as the scales, or one min per scale, reference.SHARED_MIN_SHAPE; int8 codes with supers), on a CPU."""
    if not x.is_cpu:
        raise ValueError(f"linear_int4: 4-bit weights are a CPU format, got x on {x.device}")
    if packed.dtype != torch.uint8:
        raise ValueError(f"linear_int4: packed weights are uint8 (reference.pack_int4), got {packed.dtype}")
    _check_scale_dtypes("linear_int4", scales, mins)
    if scales.dim() != 3 or mins.dim() != 3:
        raise ValueError(f"linear_int4: scales and mins are tiled [ceil(N / 32), blocks, 32] "
                         f"(reference.tile_int4_scales), got {tuple(scales.shape)} and {tuple(mins.shape)}")
    y = x.new_empty((x.shape[0], n))
    supers = _no_supers(4) if supers is None else supers
    _LINEAR_INT4(y, _c(x), _c(packed), _bytes(scales), _bytes(mins), _c(supers), _block_k_on(int(block_k), x.device))
    return y


def _check_scale_dtypes(op: str, *scales: torch.Tensor) -> None:
    if any(s.dtype not in (torch.float16, torch.int8) for s in scales):
        raise ValueError(f"{op}: 4-bit weights' scales and mins are float16, or int8 codes (quantization.Int4Weight), "
                         f"got {', '.join(sorted({str(s.dtype) for s in scales}))}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A 4-bit weight's scales or mins as the kernels take them: their bytes (2 a float16 value, 1 a code)."""
    return _c(t).view(torch.uint8)


@lru_cache(maxsize=2)
def _no_supers(rank: int) -> torch.Tensor:
    """The multipliers' placeholder of float16 scales: [1, ...] of rank `rank`."""
    return torch.ones((1,) * rank, dtype=torch.float16)


_MOE = {
    w: CompiledOp(
        graph.moe,
        [T(SAME, "T", "H")],
        [T(SAME, "T", "H"), T(SAME, "T", "E"), T(torch_dtype_to_max(w), "E", "GU"), T(F32, "GS", "GSE"),
         T(torch_dtype_to_max(w), "E", "DN"), T(F32, "DS", "DSE"), T(I32, 6)],
        variant="_" + str(w).split(".")[-1],
    )
    for w in (torch.float32, torch.bfloat16, torch.uint8, torch.int8)
}
_MOE_INT4 = CompiledOp(
    graph.moe_int4,
    [T(SAME, "T", "H")],
    [T(SAME, "T", "H"), T(SAME, "T", "E"), T(DType.uint8, "E", "GU"), T(DType.uint8, "E", "GS"),
     T(DType.uint8, "E", "GM"), T(F16, "GE", "GP"), T(DType.uint8, "E", "DN"), T(DType.uint8, "E", "DS"),
     T(DType.uint8, "E", "DM"), T(F16, "DE", "DP"), T(I32, 6)],
)


def moe(x: torch.Tensor, logits: torch.Tensor, top_k: int, normalize: bool, inter: int,
        gate_up: Sequence[torch.Tensor], down: Sequence[torch.Tensor], block_k: int = 0,
        down_block_k: Optional[int] = None) -> torch.Tensor:
    """reference.moe with the experts' linears on MILI's kernels, on a CPU: x [T, H], the router's logits [T, E],
    each expert's intermediate size `inter`; gate_up / down the experts' stacked weights (quantization.stack_experts)
    as their tensors: (weight,) dense [E, N, K] or tiled, (weight, scales) int8 / FP8, (packed, scales, mins) or
    (packed, scales, mins, supers) 4-bit (quantization.Int4Weight's; supers None: float16 scales), scaled in blocks
    of block_k columns (down's: down_block_k, by default the same)."""
    if not x.is_cpu:
        raise ValueError(f"moe: the mixture-of-experts kernels run on a CPU, got x on {x.device}")
    if not 1 <= len(gate_up) <= 4 or not 1 <= len(down) <= 4 or (len(gate_up) >= 3) != (len(down) >= 3) or (
            len(gate_up) < 3 and len(gate_up) != len(down)):
        raise ValueError("moe: gate_up and down are each (weight,), (weight, scales), or 4-bit (packed, scales, mins) "
                         "or (packed, scales, mins, supers)")
    if gate_up[0].dim() != down[0].dim():
        raise ValueError("moe: gate_up and down must be both tiled or both [E, N, K] (one layout for both)")
    flat = lambda t: _c(t).view(t.shape[0], -1)
    params = torch.tensor([block_k, top_k, int(normalize), int(gate_up[0].dim() > 3), inter,
                           block_k if down_block_k is None else down_block_k], dtype=torch.int32)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if len(gate_up) >= 3:
        _check_scale_dtypes("moe", *gate_up[1:3], *down[1:3])
        held = lambda w: (flat(w[0]), flat(_bytes(w[1])), flat(_bytes(w[2])),
                          _no_supers(2) if len(w) == 3 or w[3] is None else flat(w[3]))
        _MOE_INT4(y, _c(x), _c(logits), *held(gate_up), *held(down), params)
        return y
    if gate_up[0].dtype not in WEIGHT_DTYPES:
        raise ValueError(f"moe: expert weights must be one of {', '.join(map(str, WEIGHT_DTYPES))}, "
                         f"got {gate_up[0].dtype}")
    bits = _BITS.get(gate_up[0].dtype, gate_up[0].dtype)
    weight = lambda w: flat(_c(w[0]).view(bits))
    scales = lambda w: flat(w[1].float()) if len(w) == 2 else _scalar_on(1.0, x.device).view(1, 1)
    _MOE[bits](y, _c(x), _c(logits), weight(gate_up), scales(gate_up), weight(down), scales(down), params)
    return y


def linear(
    x: torch.Tensor, weight: torch.Tensor, scales: Optional[torch.Tensor] = None, block_k: int = 0,
    swiglu: bool = False,
) -> torch.Tensor:
    """x [M, K] @ dequantize(weight)[N, K]^T (reference.linear): float32 / bfloat16 weights as they are,
    float8_e4m3fn / int8 weights with scales [N, ceil(K / block_k)]; a 4-d float32 / bfloat16 / int8 weight is
    tiled (reference.tile_weight; an int8 one's scales [ceil(K / block_k), N], reference.tile_scales), on a CPU
    only. swiglu: silu_and_mul of the product [M, N / 2], in the same op where the weight is tiled."""
    tiled = weight.dim() == 4
    if tiled and (weight.dtype not in TILED_DTYPES or not x.is_cpu):
        raise ValueError(
            f"linear: tiled weights are float32 / bfloat16 / int8 on a CPU, got {weight.dtype} on {x.device}"
        )
    if weight.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"linear: weights must be one of {', '.join(map(str, WEIGHT_DTYPES))}, got {weight.dtype}")
    n, k = (weight.shape[0] * weight.shape[2], weight.shape[1] * weight.shape[3]) if tiled else weight.shape
    if weight.dtype in SCALED_DTYPES:
        if scales is None or block_k <= 0:
            raise ValueError(f"linear: {weight.dtype} weights need scales and a positive block_k")
        want = (-(-k // block_k), n) if tiled else (n, -(-k // block_k))
        if tuple(scales.shape) != want:
            raise ValueError(f"linear: scales must be {want} for a {'tiled ' if tiled else ''}{(n, k)} weight and "
                             f"block_k {block_k}, got {tuple(scales.shape)}"
                             + (" (reference.tile_scales makes them)" if tiled else ""))
    else:
        scales = _scalar_on(1.0, x.device).view(1, 1)
    if swiglu and n % 2:
        raise ValueError(f"linear: swiglu needs an even number of weight rows [gate | up], got {n}")
    fused = swiglu and tiled
    y = x.new_empty((x.shape[0], n // 2 if fused else n))
    bits = _BITS.get(weight.dtype, weight.dtype)
    op = (_LINEAR_TILED_SWIGLU if fused else _LINEAR_TILED) if tiled else _LINEAR
    op[bits](y, _c(x), _c(weight).view(bits), _c(scales.float()), _block_k_on(int(block_k), x.device))
    return silu_and_mul(y) if swiglu and not fused else y


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) [rows, k]: the k largest of each row of float32 logits [rows, n] on a CPU, largest first,
    equal values by index (reference.top_k). The sampler's candidates; torch.topk elsewhere."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or not logits.is_cpu:
        raise ValueError(f"top_k: logits must be 2-d float32 on a CPU, got {logits.dim()}-d {logits.dtype} on "
                         f"{logits.device}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"top_k: k must be in [1, {logits.shape[1]}] (the row's length), got {k}")
    logits = _c(logits)
    values, indices = logits.new_empty((logits.shape[0], k)), torch.empty((logits.shape[0], k), dtype=torch.long)
    library.eager_cpu_module().top_k_float32(_OPENMP, *_flatten((values, indices, logits),
                                                                  ((2, torch.float32), (2, torch.long),
                                                                   (2, torch.float32)), True))
    return values, indices


def sample_top_k(logits: torch.Tensor, k: torch.Tensor, settings: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """tokens [rows] (int64): row r of float32 logits [rows, n] on a CPU drawn among its k[r] (int32) best
    with settings[r] = (temperature, top_p, min_p) (float32) and the uniform u[r] in [0, 1) (float64)
    (reference.sample_top_k)."""
    args = (logits.new_empty(logits.shape[0], dtype=torch.long), _c(logits), _c(k), _c(settings), _c(u))
    flat = _flatten(args, ((1, torch.long), (2, torch.float32), (1, torch.int32), (2, torch.float32),
                           (1, torch.float64)), True)
    if flat is None or not logits.is_cpu:
        raise ValueError("sample_top_k: needs float32 logits [rows, n], int32 k [rows], float32 settings "
                         "[rows, 3] and float64 u [rows] on a CPU, got "
                         + ", ".join(f"{a.dim()}-d {a.dtype} on {a.device}" for a in args[1:]))
    library.eager_cpu_module().sample_top_k_float32(_OPENMP, *flat)
    return args[0]
