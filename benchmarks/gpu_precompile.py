"""Compiles, on a machine without a GPU, the graphs a GPU lease loads, into MAX's compile cache (MAX's
virtual-device mode, for $GPU_ARCH: sm_90a unless set): the lease then reads them from the cache where it would
compile them (minutes of its 15). The architecture must be the one MAX names the lease's GPU by, as its cache keys
hold it: the lease's setup step prints it. sm_90a is a lead, not yet seen: code built on MAX tells an H100 by
`architecture_name == "sm_90a"`, and on the H200 lease of 2026-11-27 no graph compiled here for sm_90 held. Run by
`benchmarks/gpu_lease.sh precompile`, in a copy of the checkout at the path the lease runs from: MAX's cache key
holds the kernel package's path.

The graphs: Qwen3-0.6B's shape in bfloat16 (the end-to-end runs, the decode profile), the tests' tiny model in
bfloat16 (tests/gpu/test_decode_graphs.py, the bfloat16 parity test) and the parity shapes in float32
(tests/integration/test_parity.py -k cuda), the 0.6B one in bfloat16 and the tiny one in float32 again with
qk_norm_rope_store and attention as two ops (MILI_GPU_QKV_ATTENTION=0: gpu_session.sh's profile-two-ops and
fallback, the one-op parity test), the 0.6B and the tiny one in bfloat16 with cuBLAS for their matmuls
(MILI_GPU_VENDOR_BLAS=1: profile-cublas, tests/gpu/test_vendor_blas.py), each built from a model loaded on the CPU with the reference backend,
whose weights have the layout they have on a GPU (no CPU tiling); and every op's graph in both dtypes, as
tests/gpu/test_gpu_ops.py's cases load them (bindings/ops.py CompiledOp.compiled); the kernel benchmark's
attention graphs (compile_attention_bench_graphs); and MAX's own Qwen3 pipeline as the e2e step starts it, by its
worker script in $MAX_PYTHON (default /tmp/mili-kit/max-python; its graphs' keys do not hold the checkpoint's
path)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from max import driver

ARCH = os.environ.get("GPU_ARCH", "sm_90a")
driver.set_virtual_device_api("cuda")  # before any device exists
driver.set_virtual_device_target_arch(ARCH)
driver.set_virtual_device_count(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import model_path  # noqa: E402

from bindings import graph as graph_settings, library, ops  # noqa: E402
from python_layer.model.loader import load_model  # noqa: E402
from python_layer.model.qwen3_graph import graph_weights, model_graph  # noqa: E402
from python_layer.model.random_checkpoint import TINY, build_random_checkpoint  # noqa: E402
from tests.conftest import PARITY_SHAPES  # noqa: E402


def compile_for_gpu(path: Path | str, dtype: str, qkv_attention: bool = True, vendor_blas: bool = False) -> float:
    """Compiles the graph that load_model(path, device="cuda", dtype=dtype) loads (with MILI_GPU_QKV_ATTENTION=0
    where qkv_attention is false, MILI_GPU_VENDOR_BLAS=1 where vendor_blas is true); returns the seconds it took."""
    model = load_model(path, device="cpu", dtype=dtype, backend="reference")
    with mock.patch.object(graph_settings, "QKV_ATTENTION", qkv_attention):
        graph = model_graph(model, graph_weights(model), "cuda:0")
    started = time.perf_counter()
    library.session("cuda:0", vendor_blas).compile(graph)
    return time.perf_counter() - started


def compile_op_graphs() -> int:
    """Every op's graph in both dtypes; returns how many."""
    session = library.session("cuda:0")
    for op in ops.ALL_OPS:
        for dtype in (torch.float32, torch.bfloat16):
            session.compile(op.graph(dtype, "cuda:0"))
    return 2 * len(ops.ALL_OPS)


def compile_attention_bench_graphs() -> int:
    """The in-graph rows of the kernel benchmark's attention and qk_norm_rope_store cases in bfloat16 (gpu_session.sh's
    attention-bench): MILI's two ops applied REPEAT times, and MAX's flash attention on each attention shape (~50 s
    each here); then the two forms of gemv_forms.py's step (gemv-forms); returns how many."""
    import gemv_forms
    import kernels

    session = library.session("cuda:0")
    chains = {"paged_attention_flash": kernels.CHAINS["attention"], "qk_norm_rope_store": kernels.CHAINS["qk_norm_rope_store"]}
    graphs = [op.graph(torch.bfloat16, "cuda:0", kernels.REPEAT, chains[op.fn.__name__])
              for op in ops.ALL_OPS if op.fn.__name__ in chains]
    graphs += [kernels.max_flash_graph(*kernels.dense_shapes(*shape), torch.bfloat16, "cuda:0", kernels.REPEAT)
               for shape in kernels.GPU_ATTENTION_SHAPES]
    graphs += [gemv_forms.step_graph(form, gemv_forms.LAYERS, gemv_forms.SHAPES, "cuda:0") for form in gemv_forms.FORMS]
    for graph in graphs:
        session.compile(graph)
    return len(graphs)


def compile_max_pipeline(max_python: str) -> float:
    """MAX's own Qwen3 pipeline as the lease's e2e step starts it (device_e2e.py's default arguments), compiled by
    its worker script under max_python (a Python with max[serve]: the kit's max-python); returns the seconds."""
    import subprocess

    import device_e2e
    from e2e_systems import max_worker_command, max_worker_env

    args = device_e2e.argument_parser().parse_args([])
    command = max_worker_command(max_python, model_path(None), device_e2e.max_devices(args.device), args.max_num_seqs,
                                 device_e2e.max_length(args))
    started = time.perf_counter()
    subprocess.run([*command, "--compile-for", ARCH], check=True, env=max_worker_env())
    return time.perf_counter() - started


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_random_checkpoint(Path(tmp) / "tiny", **TINY)
        graphs = [(model_path(None), "bfloat16", "Qwen3-0.6B shape", True, False),
                  (tiny, "bfloat16", "tests' tiny model", True, False)]
        for name, shape in sorted(PARITY_SHAPES.items()):
            path = build_random_checkpoint(Path(tmp) / name, **shape)
            graphs.append((path, "float32", f"parity {name}", True, False))
        # qk_norm_rope_store and attention apart: the decode profile's A/B, e2e's fallback, the one-op parity test;
        # then cuBLAS for the matmuls: gpu_session.sh's profile-cublas
        graphs += [(model_path(None), "bfloat16", "Qwen3-0.6B shape, two ops", False, False),
                   (tiny, "float32", "tests' tiny model, two ops", False, False),
                   (model_path(None), "bfloat16", "Qwen3-0.6B shape, cuBLAS matmuls", True, True),
                   (tiny, "bfloat16", "tests' tiny model, cuBLAS matmuls", True, True)]
        for path, dtype, what, one_op, cublas in graphs:
            seconds = compile_for_gpu(path, dtype, one_op, cublas)
            print(f"{what}, {dtype}: compiled for {ARCH} in {seconds:.1f} s", flush=True)
    started = time.perf_counter()
    print(f"{compile_op_graphs()} op graphs compiled for {ARCH} in {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    print(f"{compile_attention_bench_graphs()} kernel benchmark graphs compiled for {ARCH} in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    max_python = os.environ.get("MAX_PYTHON", "/tmp/mili-kit/max-python")
    if Path(max_python).is_file():
        print(f"MAX's Qwen3 pipeline compiled for {ARCH} in {compile_max_pipeline(max_python):.1f} s", flush=True)
    else:
        print(f"no {max_python} (MAX_PYTHON: a Python with max[serve], e.g. the kit's peers unpacked by "
              "benchmarks/device_unpack.sh peers): MAX's pipeline is not compiled", flush=True)
    print(f"MAX's compile cache: {os.environ['MODULAR_CACHE_DIR']}/.max_cache", flush=True)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())  # MAX aborts at interpreter exit after a virtual compile
