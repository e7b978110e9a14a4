"""`mili bench serving`: a concurrency sweep of OpenAI-compatible servers with guidellm, cross-checked by a
light asyncio client, MILI beside llama.cpp's server and vLLM's CPU build's (`--systems mili,llama,vllm`) in the
same run.

Starts every system's server, then at each concurrency runs each server in turn with guidellm (closed-loop
streams, at least `--requests` streamed /v1/completions and two per stream, synthetic prompts of
`--prompt-tokens`, exactly `--output-tokens` out, the same sampling for every server) and then with the light
client (the same shape), then the same requests offline through MILI's engine (`--no-offline`: not), and stops
the servers. The CPU that guidellm, the light client and the server took during each point is recorded: on 2 cores
the load generator competes with the server. For MILI the light client's points and the offline ones also break
the engine's time down (benchmarks/serving/breakdown.py). Writes benchmarks/results/serving-<time>.json and three
PNGs beside it (throughput against latency, TTFT percentiles, MILI's breakdown)."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from transformers import AutoTokenizer

from benchmarks.serving import breakdown
from benchmarks.serving import guidellm_sweep
from benchmarks.serving import light_client
from benchmarks.serving import plots
from benchmarks.serving.offline import offline_point
from benchmarks.common import print_table, settle, write_json
from benchmarks.serving.cpu_meter import CpuMeter
from benchmarks.serving.servers import PEERS, Server, start_llama, start_mili, start_vllm

from python_layer.model.random_checkpoint import builtin_model_path

# Qwen3's recommended sampling, sent explicitly so both servers sample alike (llama-cpp-python's own defaults
# add min_p 0.05 and a repeat penalty of 1.1; each server ignores the other's field name)
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repeat_penalty": 1.0,
            "repetition_penalty": 1.0}
COLUMNS = ["system", "client", "concurrency", "requests", "errors", "output_tok_s", "ttft_ms_p50", "ttft_ms_p90",
           "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "e2e_s_p50", "e2e_s_p99", "client_cpu", "server_cpu"]


def _prompts(tokenizer_dir: str, count: int, tokens: int) -> List[str]:
    """Texts of `tokens` tokens each (random words of the tokenizer's vocabulary, decoded), all different."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(0)
    words = [w for w in tokenizer.get_vocab() if w.isascii() and w.isalpha() and len(w) > 2][:20000]
    prompts = []
    for _ in range(count):
        ids = tokenizer.encode(" ".join(rng.choice(words) for _ in range(tokens)), add_special_tokens=False)
        prompts.append(tokenizer.decode(ids[:tokens]))
    return prompts


def _requests(args: argparse.Namespace, concurrency: int) -> int:
    return max(args.requests, 2 * concurrency)


WARM_UP_PROMPTS = 2


def _point_prompts(prompts: List[str], args: argparse.Namespace) -> Tuple[List[str], Dict[int, List[str]]]:
    """The warm-up's prompts and each concurrency's own, in turn from `prompts`: no point sends a prompt an earlier
    one sent, so no server answers from its prefix cache what the point means to have computed."""
    at = WARM_UP_PROMPTS
    per_point = {}
    for c in args.concurrencies:
        n = _requests(args, c)
        per_point[c] = prompts[at: at + n]
        at += n
    return prompts[:WARM_UP_PROMPTS], per_point


def _prompt_count(args: argparse.Namespace) -> int:
    return WARM_UP_PROMPTS + sum(_requests(args, c) for c in args.concurrencies)


def _light_point(server: Server, args: argparse.Namespace, prompts: List[str], concurrency: int) -> dict:
    """The light client's point: `prompts` (this point's own), `concurrency` at a time."""
    pid = server.process.pid if server.process else None
    before = breakdown.engine_counters(server.url) if server.mili else None
    loop_cpu = breakdown.event_loop_cpu_seconds(pid) if server.mili and pid else 0.0
    with CpuMeter({"server": pid} if pid else {}) as meter:
        start = time.time()
        timings, wall, cpu = light_client.run_concurrency(server.url, server.model, prompts, args.output_tokens,
                                                          concurrency, SAMPLING)
        end = time.time()
    row = dict(light_client.summarize(timings, wall), concurrency=concurrency, client_cpu=cpu / wall,
               server_cpu=meter.share("server", start, end) if pid else None)
    if before is not None:
        loop_cpu = breakdown.event_loop_cpu_seconds(pid) - loop_cpu if pid else 0.0
        row.update(breakdown.summarize(before, breakdown.engine_counters(server.url), loop_cpu, wall))
    return row


def _guidellm_point(server: Server, args: argparse.Namespace, concurrency: int, work: Path) -> dict:
    """guidellm's point: its synthetic prompts seeded by the concurrency, so that each point's differ from the
    earlier points' and every server gets the same ones."""
    spec = guidellm_sweep.scenario(server.url, server.model, args.model, [concurrency], _requests(args, concurrency),
                                   args.prompt_tokens, args.output_tokens, SAMPLING, work / "guidellm.json",
                                   seed=concurrency)
    (row,) = guidellm_sweep.run(spec, work, server.process.pid if server.process else None)
    return dict(row, client_cpu=row.pop("generator_cpu"))


def _exit_report(server: Optional[Server]) -> str:
    """For a failed point: the server's exit code and the end of its log if it has exited (the log lives in the
    sweep's temporary directory), else nothing."""
    if server is None or server.process is None or server.process.poll() is None:
        return ""
    tail = server.log.read_text(errors="replace")[-1500:] if server.log and server.log.is_file() else ""
    return f"\n{server.name} exited with code {server.process.returncode}; the end of its log:\n{tail}"


def _sweep(servers: List[Server], args: argparse.Namespace, prompts: List[str],
           work: Path) -> Tuple[List[dict], List[dict]]:
    """Every point of every server in turn (concurrency, then server, then client), then offline, each once the
    machine is idle (settle: the last run's threads spin on for a while): this VM's speed drifts over minutes, and
    running them in turn keeps the drift out of the comparisons. `prompts`: _prompt_count(args) of them, shared out
    by _point_prompts. Returns the rows and the points that failed (the sweep goes on past them)."""
    warm_up, point_prompts = _point_prompts(prompts, args)
    for server in servers:
        light_client.run_concurrency(server.url, server.model, warm_up, 8, len(warm_up), SAMPLING)
    rows, failed = [], []

    def point(system: str, client: str, c: int, run: Callable[[], dict], server: Optional[Server] = None) -> None:
        settle()
        print(f"{system}: {client} at concurrency {c}", flush=True)
        try:
            rows.append(dict(run(), concurrency=c, system=system, client=client))
        except RuntimeError as e:
            error = f"{e}{_exit_report(server)}"
            print(f"{system}: {client} at concurrency {c} failed: {error}", file=sys.stderr, flush=True)
            failed.append(dict(system=system, client=client, concurrency=c, error=error))

    for c in args.concurrencies:
        for server in servers:
            for client in args.clients:
                run = (partial(_guidellm_point, server, args, c, work / server.model / str(c)) if client == "guidellm"
                       else partial(_light_point, server, args, point_prompts[c], c))
                point(server.name, client, c, run, server)
        for dtype in args.mili_weight_dtypes if args.offline else ():
            point(f"MILI {dtype}", "offline", c,
                  partial(offline_point, args.model, dtype, args.mili_kv_cache_dtype, point_prompts[c],
                          args.output_tokens, c, SAMPLING, work))
    return rows, failed


def _servers(args: argparse.Namespace, log_dir: Path):
    if args.url:
        yield Server(args.url, args.served_model, args.url.rstrip("/"))
        return
    for system in args.systems:
        if system == "mili":
            for dtype in args.mili_weight_dtypes:
                yield start_mili(args.model, dtype, args.mili_kv_cache_dtype, log_dir)
        elif system == "llama":
            for gguf in args.llama_ggufs:
                yield start_llama(PEERS / "gguf" / Path(args.model).name / f"{gguf}.gguf", args.threads, log_dir,
                                  slots=max(args.concurrencies))
        else:
            for dtype in args.vllm_dtypes:
                yield start_vllm(args.vllm_model or args.model, dtype, log_dir, max(args.concurrencies))


def _names(text: str) -> List[str]:
    """The items of a comma-separated option, blanks dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the built-in model)")
    parser.add_argument("--systems", default="mili,llama", help="comma-separated: mili, llama, vllm")
    parser.add_argument("--url", default=None, help="drive this running server instead of starting any")
    parser.add_argument("--served-model", default="mili", help="with --url: the model name it serves")
    parser.add_argument("--concurrencies", default="1,2,4,8,16")
    parser.add_argument("--requests", type=int, default=32, help="requests per concurrency (at least 2 a stream)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--mili-weight-dtypes", "--mili-weight-dtype", default="bfloat16",
                        help="comma-separated, a MILI server each: float32, bfloat16, int8, int4, fp8")
    parser.add_argument("--mili-kv-cache-dtype", default="bfloat16",
                        help="MILI's KV cache: bfloat16 (the 16 bits of llama-server's default f16 one), float32, "
                             "int8, fp8")
    parser.add_argument("--llama-ggufs", default="bf16",
                        help="comma-separated, a llama-server each: f32, bf16, q8_0, q4_0, q4_k_m "
                             "(benchmarks/peers/setup.sh writes them)")
    parser.add_argument("--vllm-dtypes", default="bfloat16",
                        help="comma-separated, a vLLM server each (benchmarks/peers/setup.sh vllm installs it): "
                             "bfloat16, float32")
    parser.add_argument("--vllm-model", default=None,
                        help="the checkpoint vLLM serves (default: --model), e.g. a W8A8 one of the same weights "
                             "(benchmarks/peers/w8a8_checkpoint.py)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--clients", default="guidellm,light", help="comma-separated: guidellm, light")
    parser.add_argument("--no-offline", action="store_true", help="no offline run of the workload")
    args = parser.parse_args(argv)
    args.llama_ggufs = _names(args.llama_ggufs)
    args.mili_weight_dtypes = _names(args.mili_weight_dtypes)
    args.vllm_dtypes = _names(args.vllm_dtypes)
    args.clients = _names(args.clients)
    if not args.clients or set(args.clients) - {"guidellm", "light"}:
        parser.error(f"--clients: {args.clients}; choose from guidellm, light")
    args.model = str(Path(args.model or builtin_model_path()).resolve())
    args.systems = _names(args.systems)
    unknown = set(args.systems) - {"mili", "llama", "vllm"}
    if unknown:
        parser.error(f"--systems: unknown {sorted(unknown)}; choose from mili, llama, vllm")
    if args.vllm_model:
        args.vllm_model = str(Path(args.vllm_model).resolve())
    args.concurrencies = [int(c) for c in args.concurrencies.split(",")]
    load = os.getloadavg()[0]
    if load > 1:
        print(f"warning: load average {load:.1f}: the figures need an otherwise idle machine", file=sys.stderr)
    prompts = _prompts(args.model, _prompt_count(args), args.prompt_tokens)
    servers: List[Server] = []
    args.offline = "mili" in args.systems and not args.no_offline and not args.url
    with tempfile.TemporaryDirectory(prefix="mili-serving-") as tmp:
        try:
            for server in _servers(args, Path(tmp)):
                servers.append(server)
            rows, failed = _sweep(servers, args, prompts, Path(tmp))
        finally:
            for server in servers:
                server.stop()
    rows.sort(key=lambda r: (r["system"], r["client"], r["concurrency"]))
    print_table([r for r in rows if r["client"] != "offline"], COLUMNS)
    mili_rows = [r for r in rows if "decode_ms" in r]
    if mili_rows:
        print("\nwhere MILI's engine thread spent the window (light client, offline):")
        print_table(mili_rows, ["system", "client", "concurrency", "output_tok_s", *breakdown.COLUMNS])
    generator = subprocess.run(
        [str(guidellm_sweep.GUIDELLM), "--version"], capture_output=True, text=True
    ).stdout.strip() if "guidellm" in args.clients else None
    meta = dict(benchmark="serving", generator=generator, generator_env=guidellm_sweep.GENERATOR_ENV,
                model=args.model, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                requests=args.requests, sampling=SAMPLING, load_average=load,
                mili_weight_dtypes=args.mili_weight_dtypes, mili_kv_cache_dtype=args.mili_kv_cache_dtype,
                llama_ggufs=args.llama_ggufs, vllm_dtypes=args.vllm_dtypes, vllm_model=args.vllm_model,
                threads=args.threads, failed=failed)
    out = write_json("serving", meta, rows)
    title = (f"{Path(args.model).name}: {args.prompt_tokens} tokens in, {args.output_tokens} out, "
             f"at least {args.requests} requests and 2 a stream per point ({args.clients[0]})")
    chosen = [r for r in rows if r["client"] == args.clients[0]]
    paths = [plots.throughput_latency(chosen, title, out.with_name(out.stem + "-throughput-latency.png")),
             plots.ttft_percentiles(chosen, title, out.with_name(out.stem + "-ttft.png"))]
    for system in sorted({r["system"] for r in mili_rows}):
        name = out.stem + "-breakdown" + ("" if len(args.mili_weight_dtypes) == 1 else "-" + system.split()[-1])
        paths.append(plots.breakdown([r for r in mili_rows if r["system"] == system], f"{system}, {title}",
                                     out.with_name(name + ".png")))
    for path in paths:
        print(f"wrote {path}")
    for f in failed:
        print(f"FAILED: {f['system']}, {f['client']} at concurrency {f['concurrency']} (its error is in {out.name})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
