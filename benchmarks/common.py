"""What the engine benchmarks share: the Qwen3-0.6B-shaped checkpoint, the table, the JSON record."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from bindings.gpu_options import GpuOptions
from python_layer.model.random_checkpoint import (
    QWEN3_0_6B_SHAPE, QWEN3_30B_A3B_SHAPE, build_random_checkpoint, build_random_gptq_checkpoint, cache_dir,
)

RESULTS = Path(__file__).resolve().parent / "results"

IDLE_BUSY = 0.05
"""Share of all the cores busy below which the machine counts as idle (settle)."""
SETTLE_TIMEOUT_S = 30.0


RANDOM_MODELS: dict[str, Callable[[Path], Path]] = {
    "qwen3-0.6b-random": lambda path: build_random_checkpoint(path, dtype=torch.bfloat16, **QWEN3_0_6B_SHAPE),
    "qwen3-30b-a3b-4-layers-random": lambda path: build_random_checkpoint(
        path, dtype=torch.bfloat16, **{**QWEN3_30B_A3B_SHAPE, "num_hidden_layers": 4}),
    "qwen3-30b-a3b-gptq-int4-random": lambda path: build_random_gptq_checkpoint(path, **QWEN3_30B_A3B_SHAPE),
}
"""Random-weight checkpoints --model may name, built once into the cache: Qwen3-0.6B's exact shapes (bfloat16, 1.2
GB); 4 of Qwen3-30B-A3B's 48 layers (bfloat16, 6.1 GB); all of Qwen3-30B-A3B in the layout of Qwen's GPTQ-Int4
release (16 GB)."""


def model_path(model: Optional[str]) -> str:
    """The --model given: a checkpoint directory, or one of RANDOM_MODELS (default qwen3-0.6b-random)."""
    name = model or "qwen3-0.6b-random"
    if name not in RANDOM_MODELS:
        return name
    path = cache_dir() / "models" / name
    if not (path / "config.json").is_file():
        print(f"building the random-weight checkpoint {name} into {path} (first run only)", file=sys.stderr, flush=True)
        RANDOM_MODELS[name](path)
    return str(path)


def gpu_options() -> dict[str, bool | None]:
    """The GpuOptions a run's models load with (bindings/gpu_options.py: flash attention, PDL, cuBLAS, ...)."""
    return asdict(GpuOptions.from_environment())


def device_argument(argv: Optional[Sequence[str]]) -> str:
    """The --device of a benchmark's command line (default cpu): a GPU runs the end-to-end comparison instead."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--device", default="cpu")
    return parser.parse_known_args(argv)[0].device


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
    cells = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))


def _fmt(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def write_json(name: str, meta: dict, rows: Sequence[dict], out: Optional[Path] = None) -> Path:
    """Writes results/NAME-TIME.json, or over `out` (a file an earlier call wrote) when given."""
    meta = dict(meta, machine=platform.machine(), cpus=torch.get_num_threads(), time=time.strftime("%Y-%m-%d %H:%M:%S"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = out or RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(dict(meta=meta, rows=list(rows)), indent=1))
    print(f"wrote {out}")
    return out


def settle(window_s: float = 0.25) -> float:
    """Waits until the machine is idle (under IDLE_BUSY of all the cores busy over window_s), at most SETTLE_TIMEOUT_S;
    returns the seconds waited. Before each timed run: MAX's runtime threads spin on after a graph (an idle MILI server
    ~2 s after its last request, on 2 cores, and for tens of seconds while another process competes for the cores),
    and a fixed pause let them take up to a third of the next system's cores."""
    import psutil

    start = time.perf_counter()
    while psutil.cpu_percent(interval=window_s) >= 100 * IDLE_BUSY:
        if time.perf_counter() - start > SETTLE_TIMEOUT_S:
            print(f"warning: the machine did not go idle within {SETTLE_TIMEOUT_S:g} s", file=sys.stderr, flush=True)
            break
    return time.perf_counter() - start
