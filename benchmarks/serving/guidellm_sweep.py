"""One guidellm run against one OpenAI-compatible server (one or more concurrencies; `mili bench serving` runs
one per point, so that the servers take turns), read back from guidellm's JSON.

guidellm lives in its own venv (benchmarks/serving/setup.sh): it pins versions of its own. It runs with one
worker process (GUIDELLM__MAX_WORKER_PROCESSES=1): its default of up to 10 processes, each polling its queues,
takes CPU the server needs on a 2-core machine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Dict, List, Sequence

from benchmarks.serving.cpu_meter import CpuMeter

GUIDELLM = Path(__file__).resolve().parent / ".loadgen" / "bin" / "guidellm"
GENERATOR_ENV = {"GUIDELLM__MAX_WORKER_PROCESSES": "1"}
PERCENTILES = ("p50", "p90", "p99")
METRICS = {"ttft_ms": "time_to_first_token_ms", "itl_ms": "inter_token_latency_ms", "e2e_s": "request_latency"}


def scenario(url: str, model: str, tokenizer: str, concurrencies: Sequence[int], requests: int, prompt_tokens: int,
             output_tokens: int, sampling: Dict[str, float], out: Path, seed: int = 42) -> dict:
    """guidellm's scenario file: closed-loop streams at each concurrency, `requests` requests each, synthetic
    prompts of exactly prompt_tokens tokens (drawn from `seed`: the same seed gives the same prompts),
    exactly output_tokens out (guidellm sends ignore_eos)."""
    return {
        "spec": {
            "backend": {"kind": "openai_http", "target": url, "model": model, "request_format": "/v1/completions",
                        "http2": False, "api_routes": {"/health": "v1/models"}, "extras": {"body": dict(sampling)}},
            "profile": {"kind": "concurrent", "streams": concurrencies[0]},
            "data": [{"kind": "synthetic_text", "prompt_tokens": prompt_tokens, "output_tokens": output_tokens}],
            "tokenizer": {"kind": "hf_auto", "model": tokenizer},
            "seed": {"kind": "static", "value": seed},
            "constraints": [{"kind": "max_requests", "count": requests}],
            "outputs": [{"kind": "json", "path": str(out)}],
        },
        "benchmarks": [{"profile.streams": c} for c in concurrencies],
    }


def run(spec: dict, work: Path, server_pid: int | None) -> List[dict]:
    """Runs guidellm on the scenario; one row per concurrency, with the CPU shares of guidellm and the server
    during that benchmark's window."""
    if not GUIDELLM.is_file():
        raise SystemExit(f"{GUIDELLM} not found: run `bash benchmarks/serving/setup.sh` first")
    work.mkdir(parents=True, exist_ok=True)
    (work / "scenario.json").write_text(json.dumps(spec, indent=1))
    out = Path(spec["spec"]["outputs"][0]["path"])
    with open(work / "guidellm.log", "w") as log:
        process = subprocess.Popen(
            [str(GUIDELLM), "run", "-c", str(work / "scenario.json"), "--disable-console"],
            cwd=work,
            env=dict(os.environ, **GENERATOR_ENV),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        pids = {"generator": process.pid, **({"server": server_pid} if server_pid else {})}
        with CpuMeter(pids) as meter:
            code = process.wait()
    if code != 0:
        tail = (work / "guidellm.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"guidellm failed (exit {code}); the end of its log:\n{tail}")
    rows = rows_from_report(json.loads(out.read_text()))
    for row in rows:
        start, end = row.pop("_start"), row.pop("_end")
        row.update({f"{name}_cpu": meter.share(name, start, end) for name in pids})
    return rows


def rows_from_report(report: dict) -> List[dict]:
    """guidellm's JSON report -> one row per benchmark: requests, output tok/s, TTFT / ITL / e2e percentiles."""
    rows = []
    for bench in report["benchmarks"]:
        metrics = bench["metrics"]
        done = metrics["request_totals"]
        row = {"concurrency": bench["config"]["strategy"]["streams"], "requests": done["successful"],
               "errors": done["errored"] + done["incomplete"], "duration_s": bench["duration"],
               "output_tok_s": metrics["output_token_count"]["successful"]["total_sum"] / bench["duration"],
               "_start": bench["start_time"], "_end": bench["end_time"]}
        for short, name in METRICS.items():
            percentiles = metrics[name]["successful"]["percentiles"]
            row.update({f"{short}_{p}": percentiles[p] for p in PERCENTILES})
        rows.append(row)
    return rows
