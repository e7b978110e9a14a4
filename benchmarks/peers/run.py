"""MILI beside its peers on the CPU, one run, one benchmark definition (benchmarks/engine/latency.py's: prefill of one
512-token prompt; greedy decode of 128 tokens from 32-token prompts at batch 1 and 8; medians of 3 runs after a
warm-up; 2 threads everywhere):
- MILI in each weight format (float32 activations; latency.open_mili);
- llama.cpp (llama-cpp-python built from source for this CPU by setup.sh) on GGUFs written by llama.cpp's own
  convert_hf_to_gguf.py from the same checkpoint: f32, bf16, q8_0; timed through its low-level API
  (llama_decode on one llama_batch per step: the batch's prompts together, then one token per sequence);
- transformers in bfloat16 (one forward for the prompts, then a greedy loop on its KV cache).
Every system is loaded first, then each timed run goes round all of them in turn (latency.measure), so the
ratios compare runs taken minutes, not half an hour, apart.

  bash benchmarks/peers/setup.sh          # once: build llama-cpp-python, convert the checkpoint
  mili bench peers [--systems mili,llama,transformers] [--mili-weight-dtypes float32,bfloat16,int8,fp8]
                   [--llama-types f32,bf16,q8_0] [--runs 3]

Prints one table (and the speed ratios: MILI in each format over llama.cpp with the same bits, and the best of
each; above 1 means MILI is faster: the ratio of the medians and, as `_paired`, the median of the per-round ratios)
and writes JSON under benchmarks/results/. Not part of the test suite."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"  # setup.sh's work folder (git-ignored)
sys.path.insert(0, str(PEERS / "site"))  # llama_cpp, built by setup.sh

import numpy as np
import torch
from benchmarks.common import model_path, print_table, write_json

from benchmarks.engine import latency

THREADS = 2
# MILI weight format -> the llama.cpp format with the same bits per weight
SAME_BITS = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0", "fp8": "q8_0"}


# ---- llama.cpp ----------------------------------------------------------------------------------------------

def import_llama_cpp():
    try:
        import llama_cpp
        from llama_cpp._logger import set_verbose
    except ImportError as e:
        raise SystemExit(f"llama_cpp cannot be imported ({e}): build it first with\n"
                         f"  . .venv/bin/activate && bash {HERE / 'setup.sh'}") from None
    set_verbose(False)
    return llama_cpp


class LlamaCpp:
    """One GGUF in one llama.cpp context with room for 8 sequences; greedy decoding by argmax of the logits."""

    def __init__(self, gguf: Path, n_seq: int, per_seq_ctx: int, n_batch: int) -> None:
        self.lib = lib = import_llama_cpp()
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        # read into memory as MILI's weights are: with every system loaded at once, mmapped weights are page cache
        # the kernel may evict (llama.cpp bf16 measured 10% slower mmapped in a full run than alone)
        model_params.use_mmap = False
        self.model = lib.llama_model_load_from_file(str(gguf).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        params = lib.llama_context_default_params()
        params.n_seq_max = n_seq
        params.n_ctx = n_seq * per_seq_ctx  # split between the sequences
        params.n_batch = params.n_ubatch = n_batch  # a whole prompt batch in one ubatch
        params.n_threads = params.n_threads_batch = THREADS
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.bits = 8 * lib.llama_model_size(self.model) / lib.llama_model_n_params(self.model)
        self.batch = lib.llama_batch_init(params.n_batch, 0, 1)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)

    def _decode(self, tokens: list[tuple[int, int, int, bool]]) -> list[int]:
        """One llama_decode of (token, position, sequence, wants logits) entries: the argmax of each logits row."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, pos, 1, seq, int(logits)
        b.n_tokens = len(tokens)
        if self.lib.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        n_out = sum(1 for t in tokens if t[3])
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), shape=(n_out * self.n_vocab,))
        return logits.reshape(n_out, self.n_vocab).argmax(axis=1).tolist()

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, float]:
        """Greedy decoding of the prompts together: (started, every sequence has its first token, last token)."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        started = time.perf_counter()
        entries = [(t, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, t in enumerate(p)]
        next_tokens = self._decode(entries)
        first = time.perf_counter()
        for step in range(new_tokens - 1):
            next_tokens = self._decode(
                [(t, len(p) + step, seq, True) for seq, (p, t) in enumerate(zip(prompts, next_tokens))]
            )
        return started, first, time.perf_counter()


def open_llama(gguf: Path, args: argparse.Namespace) -> latency.Subject:
    started = time.perf_counter()
    per_seq = max(args.prefill_len + 1, args.prompt_len + args.new_tokens)
    n_seq = max(latency.batch_sizes(args))
    llama = LlamaCpp(gguf, n_seq, -(-per_seq // 256) * 256, max(512, args.prefill_len, n_seq * args.prompt_len))
    load_s = time.perf_counter() - started

    def prefill(prompt: list[int]) -> float:
        s, first, _ = llama.run([prompt], 1)
        return first - s

    def decode(prompts: list[list[int]]) -> float:
        _, first, last = llama.run(prompts, args.new_tokens)
        return last - first

    row = dict(system="llama.cpp", format=gguf.stem, bits=round(llama.bits, 2), load_s=load_s)
    return latency.Subject(row, prefill, decode, llama.close)


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


def ratio_rows(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    mili = [r for r in rows if r["system"] == "mili"]
    llama = {r["format"]: r for r in rows if r["system"] == "llama.cpp"}
    hf = [r for r in rows if r["system"] == "transformers"]
    out = [
        speed_ratios(f"mili {r['format']} / llama.cpp {SAME_BITS[r['format']]}", r, llama[SAME_BITS[r["format"]]], args)
        for r in mili
        if SAME_BITS.get(r["format"]) in llama
    ]
    if mili and llama:
        out.append(speed_ratios("mili best / llama.cpp best", best(mili, args), best(list(llama.values()), args), args))
    if mili and hf:
        out.append(speed_ratios("mili best / transformers bf16", best(mili, args), hf[0], args))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    latency.add_arguments(parser)
    parser.add_argument("--systems", default="mili,llama,transformers")
    parser.add_argument("--mili-weight-dtypes", default="float32,bfloat16,int8,fp8")
    parser.add_argument("--llama-types", default="f32,bf16,q8_0")
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
        openers += [
            (f"mili {w}", lambda w=w: latency.open_mili(path, w, args)) for w in args.mili_weight_dtypes.split(",")
        ]
    if "llama" in systems:
        import_llama_cpp()
        for t in args.llama_types.split(","):
            if not (gguf_dir / f"{t}.gguf").is_file():
                raise SystemExit(f"{gguf_dir / f'{t}.gguf'} is missing: convert the checkpoint with\n"
                                 f"  bash {HERE / 'setup.sh'} {path}")
        openers += [
            (f"llama.cpp {t}", lambda t=t: open_llama(gguf_dir / f"{t}.gguf", args))
            for t in args.llama_types.split(",")
        ]
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
