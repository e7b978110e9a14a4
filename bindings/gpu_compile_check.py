"""Compile the GPU path of every MILI op for a virtual NVIDIA device: no GPU needed.

`python -m bindings.gpu_compile_check [sm_90 [--again]]` builds one graph per dtype holding every op on GPU(0) and
compiles it with MAX's virtual-device mode, so GPU-only compile errors show up on CPU-only machines.
Exits 0 when every graph compiled. A pass is recorded under MODULAR_CACHE_DIR, keyed by the architecture, MAX's
version and the sources that make the graphs (mojo_kernels/ and bindings/*.py): the same check of the same sources
then passes at once (build.sh runs it, then the tests; --again compiles anyway). (MAX aborts at interpreter exit
after a virtual compile: os._exit.)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
import time
from pathlib import Path


def passed_stamp(arch: str) -> Path:
    """The file recording that this check passed for arch at these sources."""
    from bindings import library

    sources = library._sources_digest(library.kernels_dir()) + library._sources_digest(Path(__file__).parent, "*.py")
    key = hashlib.sha256(f"{arch} max {importlib.metadata.version('max')} {sources}".encode()).hexdigest()[:16]
    return Path(os.environ["MODULAR_CACHE_DIR"]) / "mili_gpu_check" / f"{arch}-{key}"


def main(arch: str = "sm_90", *flags: str) -> int:
    stamp = passed_stamp(arch)
    if stamp.is_file() and "--again" not in flags:
        print(f"cuda:{arch}: every op compiled before at these sources ({stamp})", flush=True)
        return 0
    from max import driver

    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch(arch)
    driver.set_virtual_device_count(1)  # before any device exists

    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph

    from bindings import library, ops
    from bindings.gpu_options import GpuOptions

    session = InferenceSession(devices=[driver.Accelerator()])
    dev = DeviceRef.GPU(0)
    failures = 0
    # the ops with GpuOptions again with every kernel parameter off its default (PDL launches, prefill pairs), in
    # bfloat16 (the GPU model's dtype: those parameters' code is the same in every dtype)
    others = GpuOptions(pdl=True, prefill_pairs=True)
    optioned = [op for op in ops.ALL_OPS if op.takes_options]
    for dtype in (DType.float32, DType.bfloat16):
        variants = [(GpuOptions(), ops.ALL_OPS)] + ([(others, optioned)] if dtype == DType.bfloat16 else [])
        for options, chosen in variants:
            per_op = [op.input_types(dtype, dev) for op in chosen]
            with Graph(f"mili_gpu_check_{dtype}", input_types=[t for types in per_op for t in types],
                       kernel_library=library.kernel_library()) as graph:
                offset = 0
                for op, types in zip(chosen, per_op):
                    op.emit(graph.inputs[offset : offset + len(types)], options=options)
                    offset += len(types)
                graph.output()
            what = f"cuda:{arch} {dtype}: {len(chosen)} ops" + ("" if chosen is ops.ALL_OPS else f" with {others}")
            start = time.perf_counter()
            try:
                session.compile(graph)
                print(f"{what} compiled in {time.perf_counter() - start:.1f} s", flush=True)
            except Exception as e:  # the Mojo diagnostic is in the cause
                failures += 1
                print(f"{what}: FAILED\n{e.__cause__ or e}", flush=True)
    if failures:
        return 1
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(*sys.argv[1:]))
