"""CPU latency of one request and of small batches, in each weight format:
`mili bench engine latency [--weight-dtypes float32,bfloat16,int8,fp8,int4] [--batches 1,8] [--runs 3]`.

The definition, shared with benchmarks/peers/run.py (which times llama.cpp and transformers the same way):
- prefill: one 512-token prompt; seconds from submitting it until its first new token is produced;
- decode: greedy, 128 new tokens per sequence, 32-token prompts, batch 1 and 8 (8 different prompts);
  tok/s = batch * (128 - 1) / (seconds from the moment every sequence has its first token until the last token),
  so the prompts' processing is left out;
- prompts: random token ids in [1000, 100000) from a fixed seed; the median of 3 runs after one warm-up run;
- the systems (here each weight format) are loaded together and their runs interleaved: each timed run of a
  figure goes round all of them in turn, so a drift of the machine's speed (a shared VM's memory bandwidth moves
  by 10-15% over minutes) lands on all of them alike instead of on whichever ran during it.
The engine runs float32 activations (each of --mili-dtypes) with the weights in --weight-dtypes and the KV cache
in each of --kv-cache-dtypes, prefix caching off (every run computes its prompt). Long contexts: --prompt-len 2000.
Prints a table and writes JSON under benchmarks/results/."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from benchmarks.common import device_argument, model_path, print_table, settle, write_json

from python_layer import InferenceEngine, SamplingParams
from python_layer.memory.kv_cache_manager import DEFAULT_PAGE_SIZE
from python_layer.model.quantization import Int4Weight, LinearWeight, QuantizedWeight


def bits_per_weight(weights: Iterable[LinearWeight]) -> float:
    """The bits a weight of `weights` (a model's decode_weights) takes, scales and mins included, as llama.cpp's
    model size over its weights counts its files: int4's 6-bit LM head and a W8A8 checkpoint's scale per row are in
    it."""
    stored = count = 0
    for w in weights:
        if isinstance(w, Int4Weight):
            stored += sum(t.nbytes for t in (w.packed, w.scales, w.mins, w.supers) if t is not None)
            count += w.packed.numel() * 8 // w.bits
        elif isinstance(w, QuantizedWeight):
            stored += w.weight.nbytes + w.scales.nbytes
            count += w.weight.numel()
        else:
            stored += w.nbytes
            count += w.numel()
    return round(8 * stored / count, 2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the benchmark definition (shared with benchmarks/peers/run.py)."""
    parser.add_argument("--model", default=None, help="checkpoint (default: random weights of Qwen3-0.6B's shape)")
    parser.add_argument("--batches", default="1,8", help="decode batch sizes")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (the median is reported)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt length of the decode runs")
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-dtypes", default="auto",
                        help="MILI's KV caches, each timed with every weight format: auto (float32, the activations' "
                        "dtype), float32, bfloat16, int8, fp8")
    parser.add_argument("--mili-dtypes", default="float32",
                        help="MILI's activations (--dtype), each timed with every weight format: float32 (its CPU "
                        "default), bfloat16 (as vLLM's bfloat16 runs)")


def check_idle() -> float:
    """The 1-minute load average, with a warning when other work keeps the CPUs busy: the figures are then far off
    (llama.cpp's most of all: its threads spin at every barrier, and one descheduled thread stalls the others)."""
    load = os.getloadavg()[0]
    if load > 1.0:
        print(f"warning: load average {load:.1f} before the start: other processes are using the CPUs", flush=True)
    return load


def batch_sizes(args: argparse.Namespace) -> list[int]:
    return [int(b) for b in str(args.batches).split(",") if b]


def prefill_prompt(args: argparse.Namespace) -> list[int]:
    rng = random.Random(args.seed)
    return [rng.randrange(1000, 100000) for _ in range(args.prefill_len)]


def decode_prompts(args: argparse.Namespace) -> list[list[int]]:
    """max(batches) different prompts; a batch of b takes the first b."""
    rng = random.Random(args.seed + 1)
    return [[rng.randrange(1000, 100000) for _ in range(args.prompt_len)] for _ in range(max(batch_sizes(args)))]


def decode_tok_s(batch: int, new_tokens: int, seconds: float) -> float:
    """Tokens per second after every sequence has its first token."""
    return batch * (new_tokens - 1) / seconds


@dataclass
class Subject:
    """A system under test, loaded: its row of the table so far and its two timed runs. prefill(prompt) -> seconds
    to the first token; decode(prompts) -> seconds from every sequence's first token to the last token."""

    row: dict
    prefill: Callable[[list[int]], float]
    decode: Callable[[list[list[int]]], float]
    close: Callable[[], None] = lambda: None

    @property
    def name(self) -> str:
        return f"{self.row['system']} {self.row['format']}"


def measure(args: argparse.Namespace, subjects: list[Subject]) -> list[str]:
    """Fills in every subject's prefill_s and decode_b{b}_tok_s (medians of args.runs after a warm-up run), the
    runs of each figure interleaved across the subjects. A subject that raises is reported, dropped from the
    remaining runs and its name returned; the others go on."""
    prompts = decode_prompts(args)
    figures: list[tuple[str, Callable[[Subject], float]]] = [("prefill", lambda s: s.prefill(prefill_prompt(args)))]
    figures += [(f"decode_b{b}", lambda s, b=b: s.decode(prompts[:b])) for b in batch_sizes(args)]
    failed: list[str] = []
    live = list(subjects)
    for figure, once in figures:
        samples: dict[int, list[float]] = {id(s): [] for s in live}
        for run in range(args.runs + 1):  # run 0: the warm-up
            for s in list(live):
                settle()
                try:
                    seconds = once(s)
                except Exception:  # one system failing must not lose the others' figures
                    traceback.print_exc()
                    failed.append(s.name)
                    live.remove(s)
                    continue
                if run > 0:
                    samples[id(s)].append(seconds)
        for s in live:
            runs = samples[id(s)]
            if figure == "prefill":
                s.row["prefill_s"], s.row["prefill_runs"] = statistics.median(runs), runs
            else:
                b = int(figure[len("decode_b"):])
                s.row[f"{figure}_tok_s"] = decode_tok_s(b, args.new_tokens, statistics.median(runs))
                s.row[f"{figure}_runs_s"] = runs
        print(
            f"{figure}: " + ", ".join(f"{s.name} {statistics.median(samples[id(s)]):.4g} s" for s in live), flush=True
        )
    return failed


# ---- MILI ---------------------------------------------------------------------------------------------------

def _run_requests(engine: InferenceEngine, prompts: Sequence[list[int]], max_tokens: int) -> tuple[float, float, float]:
    """Submit the prompts together, step until all finish: (submitted, every one has its first token, last token)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    ids = {engine.add_request(list(p), params) for p in prompts}
    first: dict[str, float] = {}
    counts = dict.fromkeys(ids, 0)
    now = started
    while engine.has_unfinished_requests():
        deltas = engine.step()
        now = time.perf_counter()
        for d in deltas:
            if d.token_ids and d.request_id in ids:
                first.setdefault(d.request_id, now)
                counts[d.request_id] += len(d.token_ids)
    if set(counts.values()) != {max_tokens}:
        raise RuntimeError(f"expected {max_tokens} tokens per request, got {sorted(counts.values())}")
    return started, max(first.values()), now


def kv_label(kv: str, default: str) -> str:
    """What a system's format says of its KV cache: nothing for its default one."""
    return "" if kv == default else f" kv {kv}"


def mili_openers(path: str, weight_dtypes: str, args: argparse.Namespace) -> list[tuple[str, Callable[[], Subject]]]:
    """MILI in each weight format (comma-separated) with each of args.kv_cache_dtypes and args.mili_dtypes."""
    return [(f"mili {mili_format(w, kv, act)}", lambda w=w, kv=kv, act=act: open_mili(path, w, kv, act, args))
            for w in weight_dtypes.split(",") for kv in args.kv_cache_dtypes.split(",")
            for act in args.mili_dtypes.split(",")]


def mili_format(weight_dtype: str, kv_cache_dtype: str, dtype: str) -> str:
    """A MILI row's format: its weights, then its activations and its KV cache where they are not the defaults."""
    return weight_dtype + ("" if dtype == "float32" else f" act {dtype}") + kv_label(kv_cache_dtype, "auto")


def open_mili(path: str, weight_dtype: str, kv_cache_dtype: str, dtype: str, args: argparse.Namespace,
              weights: Optional[str] = None) -> Subject:
    """MILI on the CPU: activations in dtype, weights in weight_dtype, the KV cache in kv_cache_dtype, a KV pool big
    enough for the runs; `weights` names the weights in the row's format (default: weight_dtype)."""
    started = time.perf_counter()
    per_sequence = -(-(args.prompt_len + args.new_tokens) // DEFAULT_PAGE_SIZE)
    pages = max(batch_sizes(args)) * per_sequence + -(-args.prefill_len // DEFAULT_PAGE_SIZE) + 8
    engine = InferenceEngine.from_pretrained(path, device="cpu", dtype=dtype, weight_dtype=weight_dtype,
                                             kv_cache_dtype=kv_cache_dtype,
                                             enable_prefix_caching=False, max_num_seqs=max(8, *batch_sizes(args)),
                                             max_num_batched_tokens=max(2048, args.prefill_len), num_kv_pages=pages)
    load_s = time.perf_counter() - started

    def prefill(prompt: list[int]) -> float:
        submitted, first, _ = _run_requests(engine, [prompt], 1)
        return first - submitted

    def decode(prompts: list[list[int]]) -> float:
        _, first, last = _run_requests(engine, prompts, args.new_tokens)
        return last - first

    row = dict(system="mili", format=mili_format(weights or weight_dtype, kv_cache_dtype, dtype),
               bits=bits_per_weight(engine.model.decode_weights()), load_s=load_s)
    return Subject(row, prefill, decode)


def open_all(openers: list[tuple[str, Callable[[], Subject]]]) -> tuple[list[Subject], list[str]]:
    """Loads each system in turn: (the loaded ones, the names of those that failed to load)."""
    subjects, failed = [], []
    for name, opener in openers:
        print(f"loading {name} ...", flush=True)
        try:
            subjects.append(opener())
        except Exception:
            traceback.print_exc()
            failed.append(name)
    return subjects, failed


COLUMNS = ["system", "format", "bits", "load_s", "prefill_s"]


def columns(args: argparse.Namespace) -> list[str]:
    return COLUMNS + [f"decode_b{b}_tok_s" for b in batch_sizes(args)]


def main(argv: list[str] | None = None) -> int:
    if device_argument(argv) != "cpu":  # on a GPU: MILI against MAX's pipeline and transformers
        from benchmarks.gpu.e2e import latency_main

        return latency_main(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--weight-dtypes", default="float32,bfloat16,int8,fp8,int4")
    args = parser.parse_args(argv)

    path = model_path(args.model)
    load = check_idle()
    subjects, failed = open_all(mili_openers(path, args.weight_dtypes, args))
    failed += measure(args, subjects)
    rows = [s.row for s in subjects if s.name not in failed]
    print_table(rows, columns(args))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    write_json("latency", dict(vars(args), model=path, load_average=load, failed=failed), rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
