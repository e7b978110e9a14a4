"""The kernel benchmark's in-graph column rebuilds each op's graph from the tensors one ops.* call hands to
CompiledOp: every benchmarked call must get there (shortcuts such as the CPU extension module's included)."""

from __future__ import annotations

import torch

from benchmarks.kernels.run import CHAINS, captured_call, cases
from bindings import ops


def test_every_benchmarked_call_is_captured() -> None:
    for name, _, mojo, _, _ in cases(torch.float32, "cpu"):
        op, args = captured_call(mojo)
        assert isinstance(op, ops.CompiledOp) and all(isinstance(a, torch.Tensor) for a in args), name
        assert name.split()[0] in CHAINS
    assert ops.EAGER_CPU  # restored


def test_max_flash_attention_graph_builds_for_a_gpu_named_without_an_index() -> None:
    """The MAX flash attention row (a GPU's kernel benchmark): its graph is built for the q tensor's device key, never
    for --device as given ("cuda" names no index: the row was once lost to that)."""
    from benchmarks.kernels.run import max_flash_graph
    from bindings import library

    key = library.device_key(torch.device("cuda"))
    graph = max_flash_graph((2, 5, 4, 128), (2, 5, 2, 128), torch.bfloat16, key, repeat=2)
    assert key == "cuda:0" and len(graph.inputs) == 3
    assert "mo.mha.no_cache" in str(graph)


def test_dense_shapes_are_those_of_the_benchmarks_dense_copies() -> None:
    """benchmarks/gpu/precompile.py compiles MAX's flash attention graphs for the GPU suite from dense_shapes: the
    shapes
    of the dense copies the benchmark times them on (else the GPU host compiles them again)."""
    from benchmarks.kernels.run import ATTENTION_SHAPES, _dense_qkv, dense_shapes

    seen = []
    for name, _, mojo, _, _ in cases(torch.float32, "cpu"):
        if name.startswith("attention"):
            q, _, _, _, lens, *_ = mojo.args
            shape = (int(lens[0]), len(lens), q.shape[0] // len(lens))
            dense_q, dense_k, dense_v = _dense_qkv(*mojo.args[:5])
            assert (
                dense_shapes(*shape) == (tuple(dense_q.shape), tuple(dense_k.shape)) and dense_v.shape == dense_k.shape
            )
            seen.append(shape)
    assert seen == ATTENTION_SHAPES
