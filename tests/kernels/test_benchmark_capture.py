"""The kernel benchmark's in-graph column rebuilds each op's graph from the tensors one ops.* call hands to
CompiledOp: every benchmarked call must get there (shortcuts such as the CPU extension module's included)."""

from __future__ import annotations

import torch

from benchmarks.kernels import CHAINS, captured_call, cases
from bindings import ops


def test_every_benchmarked_call_is_captured() -> None:
    for name, _, mojo, _, _ in cases(torch.float32, "cpu"):
        op, args = captured_call(mojo)
        assert isinstance(op, ops.CompiledOp) and all(isinstance(a, torch.Tensor) for a in args), name
        assert name.split()[0] in CHAINS
    assert ops.EAGER_CPU  # restored


def test_max_flash_attention_graph_builds_for_a_gpu_named_without_an_index() -> None:
    """The MAX flash attention row (a GPU's kernel benchmark): its graph is built for the q tensor's device key, never
    for --device as given ("cuda" names no index; the first H100 lease lost the row to that)."""
    from benchmarks.kernels import max_flash_graph
    from bindings import library

    key = library.device_key(torch.device("cuda"))
    graph = max_flash_graph((2, 5, 4, 128), (2, 5, 2, 128), torch.bfloat16, key, repeat=2)
    assert key == "cuda:0" and len(graph.inputs) == 3
    assert "mo.mha.no_cache" in str(graph)
