"""Kernel benchmark: each Mojo op against its PyTorch reference on the same inputs, at Qwen3-0.6B shapes.

`mili bench kernels [--dtype float32] [--device cpu]`. Prints a table with the median time of each side and their ratio
(Mojo / reference: below 1 means Mojo is faster) and, for the memory-bound ops, the achieved bytes/s against the
machine's copy bandwidth measured in the same run. Writes JSON under benchmarks/results/. On a GPU the peer is PyTorch's
own ops instead of bindings/reference.py (`torch_gpu_peer`): F.rms_norm, F.silu/gelu/relu in the input dtype, and
F.scaled_dot_product_attention over the K/V gathered into dense tensors beforehand (paging costs it nothing); rope,
store_kv and qk_norm_rope_store keep the reference. The attention rows on a GPU also time MAX's own flash attention
kernel (max.nn.kernels.flash_attention_gpu) in a graph on the same dense copies. MAX's paged kernel
(mo.mha.ragged.paged, what its pipeline runs) reads only MAX's own cache: K and V of every layer interleaved in each
page, pages of 128 tokens or more (max.pipelines.kv_cache refuses smaller; MILI's are 16), with dispatch metadata its KV
cache manager packs on the host. The prefill rows on a GPU also time MILI's kernel made to take one and two row tiles a
block (GpuOptions.prefill_pairs False and True), beside its own choice.

Two Mojo times: "call" is one standalone `bindings.ops` call from torch as users make it (on CPU the Mojo extension
module, about a microsecond of dispatch; on GPU a MAX graph execution); "in-graph" is the op's time inside one graph
that applies it REPEAT times in a chain (each result feeds the next call), divided by REPEAT: the dispatch is paid once,
as in the model graph, which runs all the ops of a step in one call. Bytes/s and the fraction of copy bandwidth use the
in-graph time.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import time
from dataclasses import asdict, replace
from functools import partial
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from bindings import ops
from bindings.gpu_options import GpuOptions
from bindings import reference as ref

HIDDEN, INTER, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 1024, 3072, 16, 8, 128, 16  # Qwen3-0.6B
from benchmarks.common import write_json
REPEAT = 20
ATTENTION_SHAPES = [(64, 1, 64), (2048, 1, 2048), (512, 1, 1), (4096, 1, 1), (4096, 8, 1)]
"""(context, batch, query tokens a sequence): prefill of a 64- and a 2048-token prompt (causal), then decode of one
token per sequence over long contexts."""
GPU_ATTENTION_SHAPES = ATTENTION_SHAPES + [(4096, 64, 1)]  # batch 64 on a GPU only: 1 GB of float32 K/V
# in-graph chains: which result of one call becomes which argument of the next (None: not chainable)
CHAINS = {"rms_norm": {0: 0}, "fused_add_rms_norm": {0: 0, 1: 1}, "head_rms_norm": {0: 0}, "rope": {0: 0, 1: 1},
          "silu_and_mul": None, "silu": {0: 0}, "gelu": {0: 0}, "relu": {0: 0}, "store_kv": {},
          "qk_norm_rope_store": {}, "attention": {0: 0}}


def median_seconds(fn: Callable[[], object], device: str, min_runs: int = 10, budget_s: float = 0.5) -> float:
    return paired_median_seconds([fn], device, min_runs, budget_s)[0]


def paired_median_seconds(fns: Sequence[Callable[[], object]], device: str, min_runs: int = 10,
                          budget_s: float = 1.0, block: int = 10) -> list[float]:
    """Median time of each function, timed in alternating blocks of `block` runs, so that this shared
    machine's slow spells and the allocator's state hit all of them alike. (Blocks with a pause, not single
    runs: torch's and Mojo's worker threads each spin a while after their work, slowing the other side.)"""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < min_runs or (time.perf_counter() - start < budget_s and len(times[0]) < 1000):
        for fn, ts in zip(fns, times):
            time.sleep(0.05)  # let the other side's spinning workers go to sleep (libgomp spins for ~10 ms)
            fn()  # warm-up of the block
            sync()
            for _ in range(block):
                t = time.perf_counter()
                fn()
                sync()
                ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def captured_call(fn: Callable[[], object]) -> tuple:
    """The CompiledOp and the exact tensors (outputs first) that one ops.* call hands to MAX (recorded, not run;
    EAGER_CPU off so that no op takes a shortcut around CompiledOp.__call__)."""
    calls = []
    original, eager = ops.CompiledOp.__call__, ops.EAGER_CPU
    ops.CompiledOp.__call__ = lambda self, *args: calls.append((self, args))
    ops.EAGER_CPU = False
    try:
        fn()
    finally:
        ops.CompiledOp.__call__, ops.EAGER_CPU = original, eager
    return calls[-1]


_repeated: dict = {}


def in_graph_seconds(name: str, fn: Callable[[], object], device: str,
                     options: GpuOptions = ops.GPU_OPTIONS) -> float | None:
    chain = CHAINS[name.split()[0]]
    if chain is None:
        return None
    from max.driver import Buffer
    from bindings import library

    op, args = captured_call(fn)
    key = (id(op), args[0].dtype, device, options)
    buffers = [Buffer.from_dlpack(a) for a in args]
    if key not in _repeated:
        device_key = library.device_key(args[0].device)
        _repeated[key] = library.session(device_key).load(op.graph(args[0].dtype, device_key, REPEAT, chain, options))
        # as the engine's warm-up does: the runtime thread a CPU session's first execute starts wakes seldom (without,
        # the AMX prefill attention at 1,024 tokens took 1.25x the time)
        with library.runtime_timer_slack() if device_key == "cpu" else contextlib.nullcontext():
            _repeated[key].execute(*buffers)
    model = _repeated[key]
    return median_seconds(lambda: model.execute(*buffers), device) / REPEAT


def prefill_tiles_a_block_us(name: str, fn: Callable[[], object], device: str) -> dict[str, float]:
    """In-graph µs of an attention prefill with one ("0") and with two ("1") row tiles a GPU block
    (GpuOptions.prefill_pairs)."""
    return {str(int(pairs)): in_graph_seconds(name, fn, device, replace(ops.GPU_OPTIONS, prefill_pairs=pairs)) * 1e6
            for pairs in (False, True)}


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a large tensor copy (read + write), the memory-bound ops' ceiling."""
    src = torch.empty(64 * 2**20, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, min_runs=5)
    return 2 * src.numel() * src.element_size() / seconds


def _paged(context: int, batch: int, dtype: torch.dtype, device: str):
    pages_per_seq = -(-context // PAGE)
    num_pages = batch * pages_per_seq
    kc = torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, device=device).to(dtype)
    vc = torch.randn_like(kc)
    table = torch.randperm(num_pages, device=device).to(torch.int32).view(batch, pages_per_seq)
    return kc, vc, table


def _dense_qkv(q, kc, vc, table, lens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, S, Hq, D], K and V [B, L, Hkv, D]: dense copies of equal-length sequences' paged K/V (untimed)."""
    batch, context, page_size = len(lens), int(lens[0]), kc.shape[1]
    dense = lambda cache: cache[table[:, : -(-context // page_size)].long()].flatten(1, 2)[:, :context].contiguous()
    return q.view(batch, -1, *q.shape[1:]), dense(kc), dense(vc)


def _sdpa_peer(q, kc, vc, table, lens, starts, scale) -> Callable[[], torch.Tensor]:
    """F.scaled_dot_product_attention over dense copies of the K/V."""
    q4, k, v = (t.transpose(1, 2).contiguous() for t in _dense_qkv(q, kc, vc, table, lens))
    return partial(F.scaled_dot_product_attention, q4, k, v, is_causal=q4.shape[2] > 1, scale=scale, enable_gqa=True)


def dense_shapes(context: int, batch: int, q_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """q [B, S, Hq, D] and K/V [B, L, Hkv, D] of an attention case held dense (_dense_qkv)."""
    return (batch, q_len, Q_HEADS, HEAD_DIM), (batch, context, KV_HEADS, HEAD_DIM)


def max_flash_graph(q_shape: Sequence[int], kv_shape: Sequence[int], dtype: torch.dtype, device_key: str, repeat: int):
    """MAX's own GPU flash attention (max.nn.kernels.flash_attention_gpu) on dense q [B, S, Hq, D] and K/V
    [B, L, Hkv, D], applied `repeat` times in a chain (each output is the next q), causal when S == L."""
    from max.experimental.torch import torch_dtype_to_max
    from max.graph import Graph, TensorType
    from max.nn.attention import MHAMaskVariant
    from max.nn.kernels import flash_attention_gpu

    from bindings import library

    dev, dt = library.device_ref(device_key), torch_dtype_to_max(dtype)
    mask = MHAMaskVariant.CAUSAL_MASK if q_shape[1] == kv_shape[1] else MHAMaskVariant.NULL_MASK
    types = [
        TensorType(dt, list(q_shape), dev),
        TensorType(dt, list(kv_shape), dev),
        TensorType(dt, list(kv_shape), dev),
    ]
    with Graph(f"max_flash_{'x'.join(map(str, q_shape))}_{'x'.join(map(str, kv_shape))}", input_types=types) as g:
        x, k, v = (value.tensor for value in g.inputs)
        for _ in range(repeat):
            x = flash_attention_gpu(x, k, v, mask, HEAD_DIM**-0.5)
        g.output(x)
    return g


def max_flash_seconds(args: tuple, device: str) -> float:
    """In-graph time of MAX's flash attention (max_flash_graph) on dense copies of ops.paged_attention's inputs."""
    from max.driver import Buffer
    from bindings import library

    q, k, v = _dense_qkv(*args[:5])
    key = library.device_key(q.device)  # "cuda:N": the graph's device needs the index that `device` may leave out
    model = library.session(key).load(max_flash_graph(q.shape, k.shape, q.dtype, key, REPEAT))
    buffers = [Buffer.from_dlpack(t) for t in (q, k, v)]
    return median_seconds(lambda: model.execute(*buffers), device) / REPEAT


def torch_gpu_peer(name: str, args: tuple) -> Callable[[], object] | None:
    """PyTorch's own op for `name` on `args` (the ops.* arguments), or None where torch has none."""
    if name == "attention":
        return _sdpa_peer(*args)
    x = args[0]
    if name in ("rms_norm", "head_rms_norm"):
        return partial(F.rms_norm, x, x.shape[-1:], args[1], args[2])
    if name == "fused_add_rms_norm":
        def add_rms_norm(x, residual, weight, eps):
            residual = x + residual
            return F.rms_norm(residual, residual.shape[-1:], weight, eps), residual
        return partial(add_rms_norm, *args)
    if name == "silu_and_mul":
        return lambda: F.silu(x[..., : x.shape[-1] // 2]) * x[..., x.shape[-1] // 2 :]
    if name in ("silu", "gelu", "relu"):
        return partial(getattr(F, name), x)
    return None


def cases(dtype: torch.dtype, device: str):
    """(name, tokens, mojo call, peer call, bytes moved); calls are partials bound to their own inputs.
    The peer is bindings/reference.py, or on a GPU PyTorch's own op where it has one."""
    gpu = device.startswith("cuda")
    for name, tokens, mojo, reference, nbytes in _reference_cases(dtype, device):
        peer = torch_gpu_peer(name.split()[0], mojo.args) if gpu else None
        yield name, tokens, mojo, peer or reference, nbytes


def _reference_cases(dtype: torch.dtype, device: str):
    rnd = lambda *s: torch.randn(*s, device=device).to(dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    for t in (1, 64, 2048):
        x, res, w = rnd(t, HIDDEN), rnd(t, HIDDEN), rnd(HIDDEN)
        yield "rms_norm", t, partial(ops.rms_norm, x, w, 1e-6), partial(ref.rms_norm, x, w, 1e-6), 2 * x.numel() * size
        yield ("fused_add_rms_norm", t, partial(ops.fused_add_rms_norm, x, res, w, 1e-6),
               partial(ref.fused_add_rms_norm, x, res, w, 1e-6), 4 * x.numel() * size)
        qh, kh, vh, hw = (
            rnd(t, Q_HEADS, HEAD_DIM),
            rnd(t, KV_HEADS, HEAD_DIM),
            rnd(t, KV_HEADS, HEAD_DIM),
            rnd(HEAD_DIM),
        )
        yield ("head_rms_norm", t, partial(ops.head_rms_norm, qh, hw, 1e-6), partial(ref.head_rms_norm, qh, hw, 1e-6),
               2 * qh.numel() * size)
        pos = torch.arange(t, dtype=torch.int32, device=device) + 100
        yield ("rope", t, partial(ops.rope, qh, kh, pos, 1e6), partial(ref.rope, qh, kh, pos, 1e6),
               2 * (qh.numel() + kh.numel()) * size)
        gu = rnd(t, 2 * INTER)
        yield "silu_and_mul", t, partial(ops.silu_and_mul, gu), partial(ref.silu_and_mul, gu), 1.5 * gu.numel() * size
        for name in ("silu", "gelu", "relu"):
            yield name, t, partial(getattr(ops, name), gu), partial(getattr(ref, name), gu), 2 * gu.numel() * size
        kc, vc, _ = _paged(t + 64, 1, dtype, device)
        slots = torch.arange(t, dtype=torch.int32, device=device)
        yield (
            "store_kv",
            t,
            partial(ops.store_kv, kh, vh, kc, vc, slots),
            partial(ref.store_kv, kh, vh, kc, vc, slots),
            4 * kh.numel() * size,
        )
        # the model's one op for the q/k/v slices, both head norms, RoPE and the KV store (the rows above, fused)
        qkv = rnd(t, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM)
        inv_freq, scale = ref.rope_inv_freq(HEAD_DIM, 1e6)
        args = (qkv, hw, hw, 1e-6, pos, inv_freq.to(device), scale, kc, vc, slots)
        yield ("qk_norm_rope_store", t, partial(ops.qk_norm_rope_store, *args), partial(ref.qk_norm_rope_store, *args),
               (qkv.numel() + qh.numel() + 2 * kh.numel()) * size)
    for context, batch, q_len in GPU_ATTENTION_SHAPES if device.startswith("cuda") else ATTENTION_SHAPES:
        kc, vc, table = _paged(context, batch, dtype, device)
        q = rnd(batch * q_len, Q_HEADS, HEAD_DIM)
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        starts = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device=device)
        args = (q, kc, vc, table, lens, starts, HEAD_DIM**-0.5)
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * size
        name = f"attention {'decode' if q_len == 1 else 'prefill'} ctx={context} B={batch}"
        yield name, batch * q_len, partial(ops.paged_attention, *args), partial(ref.paged_attention, *args), kv_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--only", default="", help="run only the ops whose name contains one of these (comma-separated)"
    )
    args = parser.parse_args(argv)
    ops.GPU_OPTIONS = GpuOptions.from_environment()  # as the models of the same run load
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth(args.device)
    print(
        f"device {args.device}, {args.dtype}, {torch.get_num_threads()} threads; "
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s"
    )
    print(
        f"{'op':<34}{'tokens':>7}{'torch us':>11}{'call us':>10}{'ratio':>7}"
        f"{'graph us':>10}{'ratio':>7}{'GB/s':>7}{'of copy':>8}"
    )
    rows = []
    for name, tokens, mojo, torch_ref, nbytes in cases(dtype, args.device):
        if not any(part in name for part in args.only.split(",")):
            continue
        ref_s, mojo_s = paired_median_seconds([torch_ref, mojo], args.device)
        graph_s = in_graph_seconds(name, mojo, args.device)
        time.sleep(0.2)  # MAX's worker threads spin a while after a graph: let them rest before the next op
        kernel_s = graph_s or mojo_s
        row = dict(op=name, tokens=tokens, torch_us=ref_s * 1e6, mojo_call_us=mojo_s * 1e6, call_ratio=mojo_s / ref_s,
                   mojo_in_graph_us=graph_s and graph_s * 1e6, in_graph_ratio=graph_s and graph_s / ref_s,
                   bytes_per_s=nbytes / kernel_s, fraction_of_copy_bandwidth=nbytes / kernel_s / bandwidth)
        peer = ""
        if name.startswith("attention") and args.device.startswith("cuda"):  # MAX's own flash attention beside SDPA
            try:
                row["max_flash_us"] = max_flash_seconds(mojo.args, args.device) * 1e6
                row["in_graph_ratio_vs_max_flash"] = kernel_s * 1e6 / row["max_flash_us"]
                peer = f"   MAX flash {row['max_flash_us']:.1f} us, ratio {row['in_graph_ratio_vs_max_flash']:.2f}"
            except Exception as e:  # a peer that cannot run must not lose MILI's and SDPA's figures
                row["max_flash_error"] = f"{type(e).__name__}: {e}"
                peer = f"   MAX flash: {row['max_flash_error'][:80]}"
        if name.startswith("attention prefill") and args.device.startswith("cuda"):
            row["mojo_in_graph_us_by_prefill_pairs"] = pairs = prefill_tiles_a_block_us(name, mojo, args.device)
            peer += f"   1 / 2 row tiles a block {pairs['0']:.1f} / {pairs['1']:.1f} us"
        rows.append(row)
        in_graph = f"{graph_s * 1e6:>10.1f}{graph_s / ref_s:>7.2f}" if graph_s else f"{'-':>10}{'-':>7}"
        print(f"{name:<34}{tokens:>7}{ref_s * 1e6:>11.1f}{mojo_s * 1e6:>10.1f}{mojo_s / ref_s:>7.2f}{in_graph}"
              f"{row['bytes_per_s'] / 1e9:>7.1f}{row['fraction_of_copy_bandwidth']:>8.2f}{peer}", flush=True)
    meta = dict(device=args.device, dtype=args.dtype, processor=platform.processor(),
                copy_bandwidth_bytes_per_s=bandwidth, gpu_options=asdict(ops.GPU_OPTIONS))
    write_json(f"kernels-{args.device.replace(':', '')}-{args.dtype}", meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
