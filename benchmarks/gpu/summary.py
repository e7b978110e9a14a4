"""benchmarks/results/gpu-summary.json from the latest GPU runs of the kernel benchmark (bfloat16) and of the
end-to-end latency and throughput benchmarks (benchmarks/gpu/suite.sh runs them, then this): each system's
figures from its newest run. A figure whose run is missing or whose system failed is null.
`python -m benchmarks.gpu.summary [--results DIR] [--since YYYYmmdd-HHMMSS]`"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Optional

from benchmarks.common import RESULTS
ATTENTION = {"attention_prefill_2048_ratio_vs_sdpa": "attention prefill ctx=2048 B=1",
             "attention_decode_ctx4096_b1_ratio_vs_sdpa": "attention decode ctx=4096 B=1",
             "attention_decode_ctx4096_b8_ratio_vs_sdpa": "attention decode ctx=4096 B=8",
             "attention_decode_ctx4096_b64_ratio_vs_sdpa": "attention decode ctx=4096 B=64"}


def runs(results: Path, pattern: str, since: str = "") -> list[dict]:
    """The runs whose file names match, oldest first (the names end in the run's date and time, as `since`:
    YYYYmmdd-HHMMSS)."""
    files = sorted(f for f in results.glob(pattern) if f.stem[-15:] >= since)
    return [json.loads(f.read_text()) for f in files]


def latest(results: Path, pattern: str, since: str = "") -> Optional[dict]:
    found = runs(results, pattern, since)
    return found[-1] if found else None


def merged(results: Path, pattern: str, since: str = "") -> Optional[dict]:
    """The newest run's meta with each system's newest row from all the runs (the suite times its systems in more than
    one run); a row with an error never replaces one with figures."""
    found = runs(results, pattern, since)
    rows: dict[str, dict] = {}
    metas: dict[str, dict] = {}  # the meta of the run each system's row came from
    for run in found:
        for row in run["rows"]:
            old = rows.get(row["system"])
            if old is None or "error" in old or "error" not in row:
                rows[row["system"]], metas[row["system"]] = row, run["meta"]
    return dict(meta=found[-1]["meta"], rows=list(rows.values()), meta_by_system=metas) if found else None


def _figure(run: Optional[dict], system: str, key: str) -> Optional[float]:
    rows = [r for r in (run or {}).get("rows", []) if r.get("system") == system]
    return rows[0].get(key) if rows else None


def summary(results: Path, commit: str, since: str = "") -> dict:
    kernels = latest(results, "kernels-cuda*-bfloat16-*.json", since)
    latency = merged(results, "latency-cuda*-*.json", since)
    throughput = merged(results, "throughput-cuda*-*.json", since)
    ops = {r["op"]: r for r in (kernels or {}).get("rows", [])}
    device = next((run["meta"].get("device_name") for run in (latency, throughput) if run), None)
    out = dict(device=device, commit=commit)
    out.update({key: ops.get(op, {}).get("in_graph_ratio") for key, op in ATTENTION.items()})
    prefill = ops.get(ATTENTION["attention_prefill_2048_ratio_vs_sdpa"], {})
    by_pairs = prefill.get("mojo_in_graph_us_by_prefill_pairs")  # by prefill_pairs: 0 one row tile, 1 two
    out["attention_prefill_2048_ratio_vs_sdpa_by_row_tiles_a_block"] = by_pairs and {
        str(int(setting) + 1): us / prefill["torch_us"] for setting, us in by_pairs.items()}
    out["attention_flash_kernels"] = _flash_attention((kernels or {}).get("meta", {}))
    out.update(
        decode_b1_ms_per_token=_figure(latency, "mili", "decode_b1_ctx512_ms_per_token"),
        decode_b1_ctx4096_ms_per_token=_figure(latency, "mili", "decode_b1_ctx4096_ms_per_token"),
        decode_b1_ms_per_token_without_overlap=_figure(latency, "mili-sync", "decode_b1_ctx512_ms_per_token"),
        decode_b1_ms_per_token_without_device_graphs=_figure(latency, "mili-eager", "decode_b1_ctx512_ms_per_token"),
        ttft_2048_ms=_figure(latency, "mili", "ttft_2048_ms"),
        bandwidth_floor_ms=_figure(latency, "mili", "bandwidth_floor_ms"),
        throughput_tok_s=_figure(throughput, "mili", "output_tok_s"),
        throughput_tok_s_without_overlap=_figure(throughput, "mili-sync", "output_tok_s"),
        max_pipeline_throughput_tok_s=_figure(throughput, "max", "output_tok_s"),
        max_pipeline_decode_b1_ms_per_token=_figure(latency, "max", "decode_b1_ctx512_ms_per_token"),
        transformers_throughput_tok_s=_figure(throughput, "transformers", "output_tok_s"),
        transformers_decode_b1_ms_per_token=_figure(latency, "transformers", "decode_b1_ctx512_ms_per_token"),
        e2e_flash_kernels=next((_flash_attention(run["meta"]) for run in (latency, throughput) if run), None),
        decode_b1_ms_per_token_cublas=_figure(latency, "mili-cublas", "decode_b1_ctx512_ms_per_token"),
        throughput_tok_s_cublas=_figure(throughput, "mili-cublas", "output_tok_s"),
        # MILI's (mili's) run's: a later run of mili-cublas has MILI_GPU_VENDOR_BLAS=1
        e2e_gpu_settings=next((_options(run["meta_by_system"]["mili"]) for run in (latency, throughput)
                               if run and "mili" in run["meta_by_system"]), None),
        mili_device_graphs=_figure(latency, "mili", "device_graphs"),  # false: a capture failed, steps ran op by op
        max_pipeline_device_graph_capture=_figure(throughput, "max", "device_graphs"),
    )
    return out


def _flash_attention(meta: dict) -> Optional[bool]:
    """Whether a run took the flash attention kernels: its GpuOptions (older runs: a flag of its own)."""
    return (_options(meta) or {}).get("flash_attention", meta.get("flash_attention"))


def _options(meta: dict) -> Optional[dict]:
    """A run's GpuOptions (older runs: their MILI_GPU_* variables, as gpu_settings)."""
    return meta.get("gpu_options", meta.get("gpu_settings"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--commit", default="", help="the commit the runs were at (default: git's HEAD; a device "
                                                     "machine's copy of the tree has no git)")
    parser.add_argument("--since", default="", help="only the runs from then on (YYYYmmdd-HHMMSS, as in their names)")
    args = parser.parse_args(argv)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent).stdout.strip()
    out = summary(args.results, commit or None, args.since)
    path = args.results / "gpu-summary.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
