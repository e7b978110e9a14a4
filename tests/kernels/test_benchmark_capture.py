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
