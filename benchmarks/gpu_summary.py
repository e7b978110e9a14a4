"""benchmarks/results/gpu-summary.json from the latest GPU runs of the kernel benchmark (bfloat16) and of the
end-to-end latency and throughput benchmarks (benchmarks/gpu_session.sh runs them, then this). A figure whose
run is missing or whose system failed is null. `python benchmarks/gpu_summary.py [--results DIR]`"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Optional

RESULTS = Path(__file__).parent / "results"
ATTENTION = {"attention_prefill_2048_ratio_vs_sdpa": "attention prefill ctx=2048 B=1",
             "attention_decode_ctx4096_b1_ratio_vs_sdpa": "attention decode ctx=4096 B=1",
             "attention_decode_ctx4096_b8_ratio_vs_sdpa": "attention decode ctx=4096 B=8",
             "attention_decode_ctx4096_b64_ratio_vs_sdpa": "attention decode ctx=4096 B=64"}


def latest(results: Path, pattern: str) -> Optional[dict]:
    files = sorted(results.glob(pattern))  # the names end in the run's date and time
    return json.loads(files[-1].read_text()) if files else None


def _figure(run: Optional[dict], system: str, key: str) -> Optional[float]:
    rows = [r for r in (run or {}).get("rows", []) if r.get("system") == system]
    return rows[0].get(key) if rows else None


def summary(results: Path, commit: str) -> dict:
    kernels = latest(results, "kernels-cuda*-bfloat16-*.json")
    latency = latest(results, "latency-cuda*-*.json")
    throughput = latest(results, "throughput-cuda*-*.json")
    ops = {r["op"]: r for r in (kernels or {}).get("rows", [])}
    device = next((run["meta"].get("device_name") for run in (latency, throughput) if run), None)
    out = dict(device=device, commit=commit)
    out.update({key: ops.get(op, {}).get("in_graph_ratio") for key, op in ATTENTION.items()})
    out["attention_flash_kernels"] = (kernels or {}).get("meta", {}).get("flash_attention")
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
        e2e_flash_kernels=next((run["meta"].get("flash_attention") for run in (latency, throughput) if run), None),
        max_pipeline_device_graph_capture=_figure(throughput, "max", "device_graphs"),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--commit", default="", help="the commit the runs were at (default: git's HEAD; a device "
                                                     "machine's copy of the tree has no git)")
    args = parser.parse_args(argv)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent).stdout.strip()
    out = summary(args.results, commit or None)
    path = args.results / "gpu-summary.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
