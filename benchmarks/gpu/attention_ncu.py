"""The attention kernels' launches for Nsight Compute to read: MILI's kernels and SDPA's (FlashAttention-2) on the
kernel benchmark's inputs (benchmarks/kernels/run.py), each case twice (a warm-up, then the launch to read), under NVTX
ranges that name them. The attention benchmark says how far MILI is from SDPA (prefill of 2,048 tokens 1.83x, decode
at batch 64 1.21x on the H200); the counters say why: the warps' stall reasons, issue slots, occupancy, the memory
system's throughput.

benchmarks/gpu/suite.sh's `ncu-attention` step runs it under
`ncu --nvtx --clock-control none --kernel-name regex:attention|flash|mha --section ...` (the card's clocks left as
they are), a case a run, with MAX's memory pool small, since ncu saves and restores the device's memory between its
passes.
Alone it runs the same launches, prints what it ran and checks each result against bindings/reference.py's: the
dry run a machine without ncu can do, and a CPU test (tests/kernels/test_attention_ncu.py)."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from benchmarks.kernels import run as kernels

from bindings import reference as ref

DEFAULT_CASES = "attention prefill ctx=2048 B=1,attention decode ctx=4096 B=64,attention decode ctx=4096 B=1"


@contextmanager
def nvtx_range(name: str, device: str) -> Iterator[None]:
    """An NVTX range around the launches (ncu --nvtx names the range of each kernel it reads); none on a CPU."""
    gpu = device.startswith("cuda")
    if gpu:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()


def launches(cases: list[str], device: str, dtype: torch.dtype) -> Iterator[tuple[str, str, Callable[[], object]]]:
    """(case, system, call) for each wanted case of the kernel benchmark: MILI's op, then its GPU peer (SDPA over
    the K/V held dense) where there is one."""
    found = set()
    for name, _, mojo, reference, _ in kernels.cases(dtype, device):
        if name in cases:
            found.add(name)
            yield name, "mili", mojo
            if device.startswith("cuda"):
                yield name, "sdpa", reference
    missing = [c for c in cases if c not in found]
    if missing:
        raise SystemExit(f"no such attention case: {', '.join(missing)} (the kernel benchmark's attention rows are: "
                         f"{', '.join(n for n, *_ in kernels.cases(dtype, device) if n.startswith('attention'))})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated names of the kernel benchmark's rows")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    for case, system, call in launches(args.cases.split(","), args.device, dtype):
        for run in ("warm-up", "read"):
            with nvtx_range(f"{case} {system} {run}", args.device):
                out = call()
        if system == "mili":  # a kernel worth reading computes the right thing
            expected = ref.paged_attention(*call.args)
            error = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
            assert error < 2e-2, f"{case}: MILI's attention is off by {error:.2e} (relative) against the reference"
        print(f"{case:<34} {system:<5} launched twice", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
