"""The CPU graphs of bindings.ops (one per op and dtype), compiled on every core at once: each compile runs on
about one core (~40 s on these machines) and compiles in threads of one process do not overlap, so the op
tests' ~20 graphs compile in worker processes, into MAX's compile cache, where the tests' own loads find them.

(One graph holding every op, each behind ops.cond, would compile once, but in MAX 26.7 the buffers a branch
writes on a CPU can reach the caller's tensors after execute() returns.)"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import torch


def _compile(index: int, dtype: torch.dtype) -> None:
    from bindings import library, ops

    op = ops.ALL_OPS[index]
    library.session("cpu").compile(op.graph(dtype, "cpu"))


def compile_in_parallel(indices: list[int], dtype: torch.dtype) -> None:
    """Compile ops.ALL_OPS[i]'s CPU graph for each index, on os.cpu_count() worker processes."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited MAX or OpenMP state
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context) as pool:
        for done in [pool.submit(_compile, i, dtype) for i in indices]:
            done.result()
