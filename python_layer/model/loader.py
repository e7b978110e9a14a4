"""The one way from a checkpoint path to a running model: resolve, read the config, load the weights, build
the forward (compiling the graph, or reading it from MAX's cache)."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Callable, ContextManager, Optional

import torch

from bindings.gpu_options import GpuOptions

from ..memory.heap import return_free_heap
from ..memory.kv_cache_manager import DEFAULT_PAGE_SIZE, kv_page_bytes, kv_pages_for
from .config import Qwen3Config
from .device_memory import leave_room_beside_max_pool
from .hub import resolve_model_dir
from .quantization import parse_weight_dtype
from .qwen3_model import DEFAULT_BACKEND, Qwen3CausalLM, check_backend, resolve_kv_cache_dtype
from .weight_loader import WeightLoader, expected_weight_shapes, parse_dtype

# on_phase(description) returns a context manager around that phase (the server shows progress with it)
PhaseReporter = Callable[[str], ContextManager[None]]


def load_model(
    path: Optional[str | os.PathLike] = None,
    device: str = "cpu",
    dtype: str | torch.dtype = "auto",
    backend: str = DEFAULT_BACKEND,
    on_phase: Optional[PhaseReporter] = None,
    weight_dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    num_kv_pages: Optional[int] = None,
    kv_cache_memory_gb: Optional[float] = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    gpu_options: Optional[GpuOptions] = None,
) -> Qwen3CausalLM:
    """A checkpoint directory or Hugging Face Hub id (None: MILI's built-in random-weight model) as a model
    ready to run. dtype (activations, KV cache) "auto" is float32 on a CPU, bfloat16 on a GPU. weight_dtype
    (the linear layers' weights on a CPU: float32, bfloat16, fp8, int8, int4) "auto" is an FP8 checkpoint's FP8,
    an AWQ / GPTQ checkpoint's int4, a W8A8 one's int8, else dtype. kv_cache_dtype "auto" is bfloat16 on a CPU
    (under float32 or bfloat16 activations), dtype on a GPU.
    On a GPU, MAX's memory pool leaves room for the weights and the KV cache the model will serve with:
    num_kv_pages pages of page_size tokens, else kv_cache_memory_gb GiB, else the engine's default (InferenceEngine's
    arguments of the same names; device_memory.py). gpu_options: how it runs on a GPU (bindings/gpu_options.py; None:
    GpuOptions.from_environment(), read here once)."""
    phase = on_phase or (lambda _: contextlib.nullcontext())
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r}: torch sees no CUDA GPU here (a CPU-only torch build, or no GPU "
                           "driver); use device 'cpu'")
    check_backend(backend)
    parse_weight_dtype(weight_dtype)
    gpu_options = gpu_options or GpuOptions.from_environment()
    with phase("resolving the checkpoint"):
        if path is None:
            from .random_checkpoint import builtin_model_path

            model_dir = builtin_model_path()
        else:
            model_dir = resolve_model_dir(path)
        config = Qwen3Config.from_pretrained(model_dir)
        torch_dtype = parse_dtype(dtype, device)
        # a bad value fails before the weights load
        cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, torch_dtype, torch.device(device))
    page_bytes = kv_page_bytes(config, page_size, cache_dtype)
    weight_bytes = sum(math.prod(shape) for shape in expected_weight_shapes(config).values()) * torch_dtype.itemsize
    kv_bytes = page_bytes * kv_pages_for(page_bytes, num_kv_pages, kv_cache_memory_gb)
    leave_room_beside_max_pool(device, weight_bytes + kv_bytes)
    with phase(f"checking the weights of {model_dir}"):
        weights = WeightLoader(model_dir, config, device=device, dtype=torch_dtype)
        weights.load_from_safetensors()  # each tensor is read when the model converts it, then let go
    with phase(
        f"loading the weights ({torch_dtype} on {device}) and building the model graph (compiled once, then "
        "read from the compile cache)"
        if backend == "mojo"
        else f"loading the weights ({torch_dtype} on {device})"
    ):
        model = Qwen3CausalLM(config, weights, device=device, backend=backend, weight_dtype=weight_dtype,
                              kv_cache_dtype=kv_cache_dtype, gpu_options=gpu_options)
    return_free_heap()
    return model
