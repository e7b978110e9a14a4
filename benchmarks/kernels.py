"""Kernel benchmark: each Mojo op against its PyTorch reference on the same inputs, at Qwen3-0.6B shapes.

`mili bench kernels [--dtype float32] [--device cpu]` (or `python benchmarks/kernels.py`). Prints a table with
the median time of each side and their ratio (Mojo / reference: below 1 means Mojo is faster) and, for the
memory-bound ops, the achieved bytes/s against the machine's copy bandwidth measured in the same run.
Writes JSON under benchmarks/results/. A Mojo time includes MAX's per-call dispatch (~50 µs on CPU), as a
standalone call pays it; inside the model graph the ops share one dispatch per step.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bindings import ops  # noqa: E402
from bindings import reference as ref  # noqa: E402

HIDDEN, INTER, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 1024, 3072, 16, 8, 128, 16  # Qwen3-0.6B
RESULTS = Path(__file__).parent / "results"


def median_seconds(fn: Callable[[], object], device: str, min_runs: int = 10, budget_s: float = 0.5) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < budget_s and len(times) < 1000):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


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


def cases(dtype: torch.dtype, device: str):
    """(name, tokens, mojo fn, reference fn, bytes moved)"""
    rnd = lambda *s: torch.randn(*s, device=device).to(dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    for t in (1, 64, 2048):
        x, res, w = rnd(t, HIDDEN), rnd(t, HIDDEN), rnd(HIDDEN)
        yield "rms_norm", t, lambda: ops.rms_norm(x, w, 1e-6), lambda: ref.rms_norm(x, w, 1e-6), 2 * x.numel() * size
        yield ("fused_add_rms_norm", t, lambda: ops.fused_add_rms_norm(x, res, w, 1e-6),
               lambda: ref.fused_add_rms_norm(x, res, w, 1e-6), 4 * x.numel() * size)
        qh = rnd(t, Q_HEADS, HEAD_DIM)
        hw = rnd(HEAD_DIM)
        yield ("head_rms_norm", t, lambda: ops.head_rms_norm(qh, hw, 1e-6), lambda: ref.head_rms_norm(qh, hw, 1e-6),
               2 * qh.numel() * size)
        kh = rnd(t, KV_HEADS, HEAD_DIM)
        pos = torch.arange(t, dtype=torch.int32, device=device) + 100
        yield ("rope", t, lambda: ops.rope(qh, kh, pos, 1e6), lambda: ref.rope(qh, kh, pos, 1e6),
               2 * (qh.numel() + kh.numel()) * size)
        gu = rnd(t, 2 * INTER)
        yield "silu_and_mul", t, lambda: ops.silu_and_mul(gu), lambda: ref.silu_and_mul(gu), 1.5 * gu.numel() * size
        for name in ("silu", "gelu", "relu"):
            yield (name, t, lambda n=name: getattr(ops, n)(gu), lambda n=name: getattr(ref, n)(gu), 2 * gu.numel() * size)
        kc, vc, table = _paged(t + 64, 1, dtype, device)
        slots = torch.arange(t, dtype=torch.int32, device=device)
        vh = rnd(t, KV_HEADS, HEAD_DIM)
        yield ("store_kv", t, lambda: ops.store_kv(kh, vh, kc, vc, slots), lambda: ref.store_kv(kh, vh, kc, vc, slots),
               4 * kh.numel() * size)
    # prefill of a 2048-token prompt (causal), then decode of one token per sequence over long contexts
    for context, batch, q_len in ((64, 1, 64), (2048, 1, 2048), (512, 1, 1), (4096, 1, 1), (4096, 8, 1)):
        kc, vc, table = _paged(context, batch, dtype, device)
        q = rnd(batch * q_len, Q_HEADS, HEAD_DIM)
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        starts = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device=device)
        args = (q, kc, vc, table, lens, starts, HEAD_DIM**-0.5)
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * size
        name = f"attention {'decode' if q_len == 1 else 'prefill'} ctx={context} B={batch}"
        yield name, batch * q_len, lambda a=args: ops.paged_attention(*a), lambda a=args: ref.paged_attention(*a), kv_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", default="", help="run only the ops whose name contains this")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth(args.device)
    print(f"device {args.device}, {args.dtype}, {torch.get_num_threads()} threads; copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'op':<34}{'tokens':>7}{'mojo us':>11}{'torch us':>11}{'ratio':>8}{'mojo GB/s':>11}{'of copy':>9}")
    rows = []
    for name, tokens, mojo, torch_ref, nbytes in cases(dtype, args.device):
        if args.only not in name:
            continue
        mojo_s = median_seconds(mojo, args.device)
        ref_s = median_seconds(torch_ref, args.device)
        row = dict(op=name, tokens=tokens, mojo_us=mojo_s * 1e6, torch_us=ref_s * 1e6, ratio=mojo_s / ref_s,
                   mojo_bytes_per_s=nbytes / mojo_s, fraction_of_copy_bandwidth=nbytes / mojo_s / bandwidth)
        rows.append(row)
        print(f"{name:<34}{tokens:>7}{row['mojo_us']:>11.1f}{row['torch_us']:>11.1f}{row['ratio']:>8.2f}"
              f"{row['mojo_bytes_per_s'] / 1e9:>11.2f}{row['fraction_of_copy_bandwidth']:>9.2f}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"kernels-{args.device.replace(':', '')}-{args.dtype}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = dict(device=args.device, dtype=args.dtype, threads=torch.get_num_threads(), machine=platform.processor() or platform.machine(),
                copy_bandwidth_bytes_per_s=bandwidth)
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
