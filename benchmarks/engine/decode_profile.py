"""Where a decode step's time goes on a GPU: torch's profiler (CUPTI sees every kernel of the process, MAX's
replayed ones too) over --steps decode steps of MILI's engine at each --batches size, after the prompts'
prefill. Per batch: the step's wall time (without and with the profiler), the device's busy time in it (the
kernels' time) and its idle time between kernels (short gaps: launches; long ones: waiting for the host), the
kernels that take the most of it, and the host's side: the CUDA API calls and, from cProfile over the same steps,
the Python functions that take the most of its own time.

`mili bench engine decode_profile --device cuda [--batches 1,64] [--context 512] [--steps 32] [--no-overlap]`. Prints a
table per batch and writes JSON under benchmarks/results/. On a CPU the engine runs but no kernel is seen."""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import ContextManager, Iterable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import model_path, print_table, write_json
from benchmarks.gpu.systems import load_mili

from bindings.gpu_options import GpuOptions
from python_layer import InferenceEngine, SamplingParams
from python_layer.model.device_memory import MAX_POOL_PERCENT

TOP = 12
SHORT_GAP_US = 10.0
"""A gap between two kernels shorter than this is the device launching the next kernel of what it was given (~1-3
us a kernel inside a replayed graph); a longer one is the device waiting for the host."""


def decode_steps(engine: InferenceEngine, batch: int, args: argparse.Namespace, around: ContextManager) -> float:
    """Seconds of --steps decode steps of `batch` new requests (after their prefill and first token), run inside
    `around` (a profiler); the requests then run to their end."""
    rng = random.Random(args.seed + batch)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 2, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([rng.randrange(1000, 100000) for _ in range(args.context)], params)
    while any(r.num_output_tokens == 0 for r in engine.requests.values()):  # the prefill, and the first token
        engine.step()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    with around:
        started = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        sync()
        wall = time.perf_counter() - started
    while engine.has_unfinished_requests():
        engine.step()
    return wall


def profile_batch(engine: InferenceEngine, batch: int, args: argparse.Namespace) -> tuple[dict, list[dict], list[dict]]:
    """The batch's summary (its wall time with no profiler, and under torch's), its top kernels, and where the
    host's time goes: Python's own time per function (cProfile; the call that waits for the device shows as
    such) and the CUDA API calls torch's profiler saw (a synchronizing one shows there)."""
    wall = decode_steps(engine, batch, args, nullcontext())
    python = cProfile.Profile()
    decode_steps(engine, batch, args, python)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        profiled_wall = decode_steps(engine, batch, args, nullcontext())
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0]
    kernels.sort(key=lambda e: -e.device_time_total)
    busy_us = sum(e.device_time_total for e in kernels)
    per_step = lambda n: n / args.steps
    summary = dict(
        batch=batch,
        context=args.context,
        steps=args.steps,
        overlap=engine.overlap,
        attention=attention_graph(engine.model.gpu_options),
        matmuls=("cuBLAS" if engine.model.forward_fn.vendor_blas else "MAX's own")
        + (", batch-1 graph: W x^T" if batch == 1 and engine.model.forward_fn.batch_one_model is not None else ""),
        wall_ms_per_step=wall / args.steps * 1e3,
        profiled_wall_ms_per_step=profiled_wall / args.steps * 1e3,
        device_busy_ms_per_step=busy_us / args.steps / 1e3,
        busy_fraction=busy_us / 1e6 / profiled_wall,
        kernels_per_step=per_step(sum(e.count for e in kernels)),
        **device_gaps(prof.events(), args.steps),
    )
    top = [
        dict(
            batch=batch,
            kernel=e.key[:70],
            calls_per_step=per_step(e.count),
            us_per_step=per_step(e.device_time_total),
            share=e.device_time_total / busy_us,
        )
        for e in kernels[:TOP]
    ]
    api = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.key.startswith("cu")),
                 key=lambda e: -e.self_cpu_time_total)
    host = [dict(batch=batch, host="CUDA API " + e.key[:60], calls_per_step=per_step(e.count),
                 us_per_step=per_step(e.self_cpu_time_total)) for e in api[:TOP]]
    functions = sorted(pstats.Stats(python).stats.items(), key=lambda item: -item[1][2])  # by own time
    host += [dict(batch=batch, host=f"{Path(file).name}:{line}({name})"[:70], calls_per_step=per_step(calls),
                  us_per_step=per_step(own) * 1e6) for (file, line, name), (_, calls, own, _, _) in functions[:TOP]]
    return summary, top, host


def device_gaps(events: Iterable, steps: int) -> dict:
    """The device's idle time between the end of its work so far and the start of the next kernel or copy, in ms a
    step: in gaps under SHORT_GAP_US (launch latency, which fewer kernels a step would cut) and longer ones (the
    device waiting for the host, which a faster or better overlapped host would cut)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    gaps = {"short": 0.0, "long": 0.0}
    busy_until = None
    for start, end in spans:
        if busy_until is not None and start > busy_until:
            gaps["short" if start - busy_until < SHORT_GAP_US else "long"] += start - busy_until
        busy_until = end if busy_until is None else max(busy_until, end)
    return {f"{kind}_gaps_ms_per_step": us / steps / 1e3 for kind, us in gaps.items()}


def device_memory(device: str, stage: str) -> dict:
    """The GPU's free memory against what torch holds, at a stage of the run: what MAX's pool and the weights take
    beside MILI's KV cache, and the pool's percent as load_model set it (device_memory.py), to check that rule
    against a real GPU (on the H200: captures failed beside a 40 GB KV cache under MAX's default pool)."""
    if not device.startswith("cuda"):
        return dict(stage=stage)
    gb = lambda n: round(n / 2**30, 2)
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return dict(
        stage=stage,
        free_gb=gb(free),
        used_gb=gb(total - free),
        total_gb=gb(total),
        torch_allocated_gb=gb(torch.cuda.memory_allocated()),
        torch_reserved_gb=gb(torch.cuda.memory_reserved()),
        max_pool_percent=os.environ.get(MAX_POOL_PERCENT, "MAX's default"),
    )


def attention_graph(options: GpuOptions) -> str:
    """How the model graph runs attention, and how the decode step's kernels launch (GpuOptions.pdl,
    mojo_kernels/utils/dependent_launch.mojo)."""
    launch = ", PDL launches" if options.pdl else ""
    if not options.flash_attention:
        return "plain kernels, two ops" + launch
    return "flash kernels, " + ("one op (qkv_attention)" if options.runs_qkv_attention else "two ops") + launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default=None, help="checkpoint (default: random weights of Qwen3-0.6B's shape)")
    parser.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens of each request")
    parser.add_argument("--steps", type=int, default=32, help="decode steps profiled per batch")
    parser.add_argument("--no-overlap", dest="overlap", action="store_false", help="read each step at once")
    parser.add_argument("--kv-cache-gb", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    memory = [device_memory(args.device, "before the model")]
    model = load_mili(model_path(args.model), args.device, args.kv_cache_gb)
    memory.append(device_memory(args.device, "model loaded (MAX's device, the weights)"))
    engine = InferenceEngine(model, kv_cache_memory_gb=args.kv_cache_gb, max_num_seqs=max(batches),
                             max_num_batched_tokens=max(batches) * args.context, enable_prefix_caching=False,
                             max_model_len=args.context + args.steps + 2, overlap=args.overlap)
    memory.append(device_memory(args.device, "engine made (KV cache, decode steps captured)"))
    summaries, tops, hosts = [], [], []
    for batch in batches:
        decode_steps(engine, batch, argparse.Namespace(**{**vars(args), "steps": 4}), nullcontext())  # warm-up
        summary, top, host = profile_batch(engine, batch, args)
        summaries.append(summary)
        tops += top
        hosts += host
    memory.append(device_memory(args.device, "profiled"))
    for rows in (summaries, tops, hosts, memory):
        if rows:
            print_table(rows, list(rows[-1]))
    write_json(f"decode-profile-{args.device.replace(':', '')}", {**vars(args), "memory": memory},
               summaries + tops + hosts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
