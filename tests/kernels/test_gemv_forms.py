"""benchmarks/gpu/gemv_forms.py, the GPU suite's comparison of MAX's two forms of a batch-1 matmul: each form's graph is
the
step it says, and gives F.linear's results."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu.gemv_forms import FORMS, LAYERS, SHAPES, max_step, step_graph, step_inputs, torch_step


def test_a_step_graph_holds_every_layers_matmuls_for_a_gpu() -> None:
    """Built (not compiled) for a GPU, as benchmarks/gpu/precompile.py builds it: the three inputs x, a weight a layer
    and
    shape, a [1, N] output each."""
    for form in FORMS:
        graph = step_graph(form, LAYERS, SHAPES, "cuda:0")
        assert len(graph.inputs) == 3 + LAYERS * 4
        assert [str(t.shape) for t in graph.output_types[:4]] == [f"[Dim(1), Dim({n})]" for n, _ in SHAPES.values()]
        assert len(graph.output_types) == LAYERS * 4


@pytest.mark.slow
def test_both_forms_give_the_matmuls_of_f_linear() -> None:
    """Through MAX graphs on the CPU, at small odd shapes, two layers."""
    shapes = {"a": (24, 16), "b": (16, 40), "c": (7, 40)}
    inputs = step_inputs(2, shapes, "cpu")
    expected = torch_step(inputs, 2, shapes)
    for form in FORMS:
        run, outputs = max_step(form, inputs, 2, shapes)
        run()
        got = [torch.from_dlpack(o) for o in outputs]
        assert [g.shape for g in got] == [e.shape for e in expected]
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.float(), e.float(), rtol=2e-2, atol=2e-2)
