"""Compiles, on a machine without a GPU, the graphs the GPU suite loads, into MAX's compile cache (MAX's virtual-device
mode, for $GPU_ARCH: sm_90a unless set): the GPU host then reads them from the cache instead of compiling them. The
architecture must be the one MAX names the host's GPU by, as its cache keys hold it (the suite's setup step prints
it; MAX names an H100 or H200 sm_90a). Run by benchmarks/gpu/bundle.sh, in a copy of the checkout at the path the
suite runs from: MAX's cache key holds the kernel package's path.

The graphs: Qwen3-0.6B's shape in bfloat16 (the end-to-end runs, the decode profile), the tests' tiny model in bfloat16
(tests/gpu/test_decode_graphs.py, the bfloat16 parity test) and the parity shapes in float32
(tests/integration/test_parity.py -k cuda), the 0.6B one in bfloat16 and the tiny one in float32 again with
qk_norm_rope_store and attention as two ops (GpuOptions.qkv_attention off: benchmarks/gpu/suite.sh's profile-two-ops and
fallback, the one-op parity test), the 0.6B and the tiny one in bfloat16 with cuBLAS for their matmuls
(GpuOptions.vendor_blas: profile-cublas, tests/gpu/test_matmul_settings.py) and their batch-1 graphs
(GpuOptions.batch1_graph: profile-batch1, the same tests), each built from a model loaded on the CPU with the reference
backend, whose weights have the layout they have on a GPU (no CPU tiling); and every op's graph in both dtypes, as
tests/gpu/test_gpu_ops.py's cases load them (bindings/ops.py CompiledOp.compiled); the kernel benchmark's attention
graphs (attention_bench_keys); and MAX's own Qwen3 pipeline as the e2e step starts it, by its worker script in
$MAX_PYTHON (default /tmp/mili-kit/max-python; its graphs' keys do not hold the checkpoint's path). The compiles run in
one worker process per core (a compile keeps about one busy)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

from max import driver

ARCH = os.environ.get("GPU_ARCH", "sm_90a")
driver.set_virtual_device_api("cuda")  # before any device exists
driver.set_virtual_device_target_arch(ARCH)
driver.set_virtual_device_count(1)

from benchmarks.common import model_path

from bindings import library, ops
from bindings.gpu_options import GpuOptions
from python_layer.model.loader import load_model
from python_layer.model.qwen3_graph import graph_weights, model_graph
from python_layer.model.random_checkpoint import TINY, build_random_checkpoint
from tests.conftest import PARITY_SHAPES


def compile_for_gpu(path: Path | str, dtype: str, qkv_attention: bool = True, vendor_blas: bool = False,
                    batch_one: bool = False) -> float:
    """Compiles the graph that load_model(path, device="cuda", dtype=dtype) loads with these GpuOptions (with
    batch_one, the batch-1 graph it loads beside it with GpuOptions.batch1_graph); returns the seconds it took."""
    options = GpuOptions(qkv_attention=qkv_attention, vendor_blas=vendor_blas, batch1_graph=batch_one)
    model = load_model(path, device="cpu", dtype=dtype, backend="reference", gpu_options=options)
    graph = model_graph(model, graph_weights(model), "cuda:0", batch_one)
    return _compile_seconds(library.session("cuda:0", vendor_blas), graph)


def _compile_seconds(session, graph) -> float:
    started = time.perf_counter()
    session.compile(graph)
    return time.perf_counter() - started


def compile_op_graph(index: int, dtype: torch.dtype) -> float:
    """ops.ALL_OPS[index]'s graph in `dtype`, as tests/gpu/test_gpu_ops.py's cases load it; returns the seconds."""
    return _compile_seconds(library.session("cuda:0"), ops.ALL_OPS[index].graph(dtype, "cuda:0"))


def attention_bench_keys() -> list[tuple]:
    """(kind, key) of each in-graph row of the kernel benchmark's attention and qk_norm_rope_store cases in bfloat16
    (benchmarks/gpu/suite.sh's attention-bench): "op", MILI's op ops.ALL_OPS[key] applied REPEAT times; "max_flash",
    MAX's
    flash attention on attention shape `key` (~50 s each here); then "gemv", gemv_forms.py's step in form `key`
    (gemv-forms)."""
    from benchmarks.gpu import gemv_forms
    from benchmarks.kernels import run as kernels

    keys = [
        ("op", i)
        for i, op in enumerate(ops.ALL_OPS)
        if op.fn.__name__ in ("paged_attention_flash", "qk_norm_rope_store")
    ]
    keys += [("max_flash", shape) for shape in kernels.GPU_ATTENTION_SHAPES]
    return keys + [("gemv", form) for form in gemv_forms.FORMS]


def attention_bench_graph(kind: str, key):
    from benchmarks.gpu import gemv_forms
    from benchmarks.kernels import run as kernels

    if kind == "op":
        op = ops.ALL_OPS[key]
        chain = kernels.CHAINS["attention" if op.fn.__name__ == "paged_attention_flash" else "qk_norm_rope_store"]
        return op.graph(torch.bfloat16, "cuda:0", kernels.REPEAT, chain)
    if kind == "max_flash":
        return kernels.max_flash_graph(*kernels.dense_shapes(*key), torch.bfloat16, "cuda:0", kernels.REPEAT)
    return gemv_forms.step_graph(key, gemv_forms.LAYERS, gemv_forms.SHAPES, "cuda:0")


def compile_attention_bench_graph(kind: str, key) -> float:
    """attention_bench_graph(kind, key); returns the seconds."""
    return _compile_seconds(library.session("cuda:0"), attention_bench_graph(kind, key))


def compile_max_pipeline(max_python: str) -> float:
    """MAX's own Qwen3 pipeline as the GPU suite's e2e step starts it (benchmarks/gpu/e2e.py's default arguments),
    compiled by
    its worker script under max_python (a Python with max[serve]: the kit's max-python); returns the seconds."""
    import subprocess

    from benchmarks.gpu import e2e as device_e2e
    from benchmarks.gpu.systems import max_worker_command, max_worker_env

    args = device_e2e.argument_parser().parse_args([])
    command = max_worker_command(max_python, model_path(None), device_e2e.max_devices(args.device), args.max_num_seqs,
                                 device_e2e.max_length(args))
    started = time.perf_counter()
    subprocess.run([*command, "--compile-for", ARCH], check=True, env=max_worker_env())
    return time.perf_counter() - started


def jobs(tmp: Path) -> list[tuple]:
    """(what, function, args) of every compile, the longest first."""
    model, tiny = model_path(None), build_random_checkpoint(tmp / "tiny", **TINY)
    found = [
        ("Qwen3-0.6B shape, bfloat16", compile_for_gpu, (model, "bfloat16")),
        # qk_norm_rope_store and attention apart: the decode profile's A/B, e2e's fallback, the one-op parity test;
        # then cuBLAS for the matmuls: benchmarks/gpu/suite.sh's profile-cublas; then the batch-1 graph: profile-batch1
        ("Qwen3-0.6B shape, bfloat16, two ops", compile_for_gpu, (model, "bfloat16", False)),
        ("Qwen3-0.6B shape, bfloat16, cuBLAS matmuls", compile_for_gpu, (model, "bfloat16", True, True)),
        ("Qwen3-0.6B shape, bfloat16, batch-1 graph", compile_for_gpu, (model, "bfloat16", True, False, True)),
        ("tests' tiny model, bfloat16", compile_for_gpu, (tiny, "bfloat16")),
        ("tests' tiny model, float32, two ops", compile_for_gpu, (tiny, "float32", False)),
        ("tests' tiny model, bfloat16, cuBLAS matmuls", compile_for_gpu, (tiny, "bfloat16", True, True)),
        ("tests' tiny model, bfloat16, batch-1 graph", compile_for_gpu, (tiny, "bfloat16", True, False, True)),
    ]
    found += [(f"parity {name}, float32", compile_for_gpu, (build_random_checkpoint(tmp / name, **shape), "float32"))
              for name, shape in sorted(PARITY_SHAPES.items())]
    max_python = os.environ.get("MAX_PYTHON", "/tmp/mili-kit/max-python")
    if Path(max_python).is_file():
        found.insert(0, ("MAX's Qwen3 pipeline", compile_max_pipeline, (max_python,)))
    else:
        print(f"no {max_python} (MAX_PYTHON: a Python with max[serve], e.g. the kit's peers unpacked by "
              "benchmarks/gpu/unpack.sh peers): MAX's pipeline is not compiled", flush=True)
    found += [(f"kernel benchmark graph {kind} {key}", compile_attention_bench_graph, (kind, key))
              for kind, key in attention_bench_keys()]
    return found + [
        (f"{op.fn.__name__}{op.variant} op graph, {str(dtype).split('.')[-1]}", compile_op_graph, (i, dtype))
        for i, op in enumerate(ops.ALL_OPS)
        for dtype in (torch.float32, torch.bfloat16)
    ]


def main() -> int:
    """Spawned workers import this file again, which sets MAX's virtual device up in each."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        found = jobs(Path(tmp))
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context) as pool:
            running = {pool.submit(function, *args): what for what, function, args in found}
            for done in as_completed(running):
                print(f"{running[done]}: compiled for {ARCH} in {done.result():.1f} s", flush=True)
    print(f"{len(found)} graphs compiled for {ARCH} in {time.perf_counter() - started:.1f} s; MAX's compile cache: "
          f"{os.environ['MODULAR_CACHE_DIR']}/.max_cache", flush=True)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())  # MAX aborts at interpreter exit after a virtual compile
