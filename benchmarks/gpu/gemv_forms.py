"""A batch-1 decode step's matmuls in MAX's two forms and through cuBLAS (torch), Qwen3-0.6B's layer shapes.

At batch 1, MAX 26.7's matmul dispatch sends x[1, K] @ W^T (the model graph's form: m = 1, transpose_b) to its
split-K GEMV, and W @ x^T (n = 1) to its vector GEMV. Compiled for sm_90a here, each form's graph holds only those
kernels. The vector GEMV is the one that read the LM head at ~4.2 TB/s on the H200, where the layers' split-K GEMVs
read at ~1.9. This times a step's 4 x LAYERS matmuls with distinct weights (881 MB, past any L2) in each form, each
step replayed as one device graph, against torch's F.linear (cuBLAS) in a CUDA graph. Each form's results are
checked against F.linear's before it is timed. Prints a table and writes JSON under benchmarks/results/.
`python -m benchmarks.gpu.gemv_forms [--device cuda] [--layers 28]`
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch
import torch.nn.functional as F

from bindings import library
from benchmarks.common import write_json
from benchmarks.kernels.run import copy_bandwidth, median_seconds

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
"""(N, K) of a Qwen3-0.6B layer's matmuls: its 16 + 2 x 8 heads of 128, hidden 1024, intermediate 3072."""
LAYERS = 28  # Qwen3-0.6B's
FORMS = ("x_wt", "w_xt")
"""x_wt: x @ W^T, as the model graph has it; w_xt: W @ x^T, reshaped to [1, N] (the same bytes at batch 1)."""


def _widths(shapes: dict) -> list[int]:
    """The distinct K of `shapes`, sorted: the step's inputs x come first, one of each width."""
    return sorted({k for _, k in shapes.values()})


def step_graph(form: str, layers: int, shapes: dict, device_key: str):
    """A graph of `layers` x len(shapes) batch-1 matmuls in `form`: inputs x for each K (sorted), then each layer's
    weights in `shapes`' order; outputs [1, N] each, in the same order."""
    from max.dtype import DType
    from max.graph import Graph, TensorType, ops

    dev = library.device_ref(device_key)
    ks = _widths(shapes)
    types = [TensorType(DType.bfloat16, [1, k], dev) for k in ks]
    types += [TensorType(DType.bfloat16, [n, k], dev) for _ in range(layers) for n, k in shapes.values()]
    with Graph(f"mili_gemv_{form}_{layers}x{len(shapes)}", input_types=types) as g:
        xs = {k: g.inputs[i].tensor for i, k in enumerate(ks)}
        weights = iter(v.tensor for v in g.inputs[len(ks):])
        outputs = []
        for _ in range(layers):
            for n, k in shapes.values():
                w = next(weights)
                if form == "x_wt":
                    outputs.append(ops.matmul(xs[k], ops.transpose(w, 0, 1)))
                else:
                    outputs.append(ops.reshape(ops.matmul(w, ops.transpose(xs[k], 0, 1)), [1, n]))
        g.output(*outputs)
    return g


def step_inputs(layers: int, shapes: dict, device: str) -> list[torch.Tensor]:
    """step_graph's inputs, random bfloat16: x of unit scale, weights scaled so that each output is too."""
    ks = _widths(shapes)
    rnd = lambda *s: torch.randn(*s, device=device).to(torch.bfloat16)
    return [rnd(1, k) for k in ks] + [rnd(n, k) / k**0.5 for _ in range(layers) for n, k in shapes.values()]


def torch_step(inputs: list[torch.Tensor], layers: int, shapes: dict) -> list[torch.Tensor]:
    """The same matmuls through F.linear (cuBLAS on a GPU)."""
    ks = _widths(shapes)
    xs = dict(zip(ks, inputs))
    weights = iter(inputs[len(ks):])
    return [F.linear(xs[k], next(weights)) for _ in range(layers) for _, k in shapes.values()]


def max_step(form: str, inputs: list[torch.Tensor], layers: int, shapes: dict) -> tuple[Callable[[], object], list]:
    """A callable running the step in `form` (replaying its device graph on a GPU) and the outputs it writes, which
    hold its results once it has run."""
    from max.driver import Buffer

    device_key = library.device_key(inputs[0].device)
    model = library.session(device_key).load(step_graph(form, layers, shapes, device_key))
    buffers = [Buffer.from_dlpack(t) for t in inputs]
    if device_key == "cpu":
        outputs = []
        def run() -> None:
            outputs[:] = model.execute(*buffers)
        return run, outputs
    key = FORMS.index(form)
    model.execute(*buffers)  # once outside the capture, as the engine does before its captures
    outputs = model.capture(key, *buffers)
    return (lambda: model.replay(key, *buffers)), outputs


def torch_graph_step(inputs: list[torch.Tensor], layers: int, shapes: dict) -> Callable[[], object]:
    """F.linear's step captured in a CUDA graph (on a CPU, run as is)."""
    if inputs[0].device.type != "cuda":
        return lambda: torch_step(inputs, layers, shapes)
    torch_step(inputs, layers, shapes)  # cuBLAS's handle and workspace, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch_step(inputs, layers, shapes)
    return graph.replay


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=LAYERS)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    inputs = step_inputs(args.layers, SHAPES, args.device)
    expected = torch_step(inputs, args.layers, SHAPES)
    nbytes = sum(t.numel() * t.element_size() for t in inputs)
    bandwidth = copy_bandwidth(args.device)
    print(f"device {args.device}, {args.layers} layers x {len(SHAPES)} matmuls at batch 1, {nbytes / 1e6:.0f} MB of "
          f"weights; copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    rows = [dict(system="torch F.linear", us_per_step=median_seconds(torch_graph_step(inputs, args.layers, SHAPES),
                                                                     args.device) * 1e6)]
    for form in FORMS:
        run, outputs = max_step(form, inputs, args.layers, SHAPES)
        run()
        if inputs[0].device.type == "cuda":
            torch.cuda.synchronize()
        error = max((torch.from_dlpack(o).float() - e.float()).abs().max().item() for o, e in zip(outputs, expected))
        if error > 0.05:  # bfloat16 outputs of unit scale (a few ulps apart): a wrong form is not timed
            raise SystemExit(f"MAX's {form} step differs from F.linear by {error}")
        rows.append(dict(system=f"MAX {form}", us_per_step=median_seconds(run, args.device) * 1e6, max_abs_error=error))
    print(f"{'system':<16}{'us/step':>10}{'TB/s':>7}{'of copy':>9}")
    for row in rows:
        row["bytes_per_s"] = nbytes / (row["us_per_step"] / 1e6)
        row["fraction_of_copy_bandwidth"] = row["bytes_per_s"] / bandwidth
        print(f"{row['system']:<16}{row['us_per_step']:>10.1f}{row['bytes_per_s'] / 1e12:>7.2f}"
              f"{row['fraction_of_copy_bandwidth']:>9.2f}", flush=True)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    meta = dict(device=args.device, device_name=device_name, layers=args.layers, shapes=SHAPES, weight_bytes=nbytes,
                copy_bandwidth_bytes_per_s=bandwidth)
    write_json(f"gemv-forms-{args.device.replace(':', '')}", meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
