"""Offline throughput: N requests with random prompt and output lengths (ignore_eos), all submitted at once,
on each backend and weight format in the same run. `mili bench engine throughput [--num-requests 32]
[--backends mojo,reference] [--weight-dtypes float32,int8]`. With `--device cuda`: nano-vllm's workload against
MAX's own pipeline and transformers (benchmarks/gpu/e2e.py). Prints a table (output and total tokens/s, and
each row's throughput relative to the first row of the reference backend, else the first row) and writes JSON
under benchmarks/results/."""

from __future__ import annotations

import argparse
import random
import time

from benchmarks.common import device_argument, model_path, print_table, write_json

from python_layer import InferenceEngine, SamplingParams
from python_layer.model.loader import load_model


def run(engine: InferenceEngine, prompts: list[list[int]], max_tokens: list[int]) -> dict:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    started = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    generated = sum(len(o.token_ids) for o in outs)
    prompt_tokens = sum(len(p) for p in prompts)
    return dict(seconds=seconds, prompt_tokens=prompt_tokens, output_tokens=generated,
                output_tok_s=generated / seconds, total_tok_s=(generated + prompt_tokens) / seconds,
                preemptions=engine.scheduler.num_preemptions)


def main(argv: list[str] | None = None) -> int:
    if device_argument(argv) != "cpu":  # on a GPU: nano-vllm's workload, against MAX's pipeline and transformers
        from benchmarks.gpu.e2e import throughput_main

        return throughput_main(argv)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="checkpoint (default: random weights of Qwen3-0.6B's shape)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(16, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--backends", default="mojo,reference")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weight-dtypes", default="auto", help="comma-separated: auto, float32, bfloat16, fp8, int8")
    parser.add_argument(
        "--device", default="cpu", help="cpu; a GPU runs nano-vllm's workload against peers (benchmarks/gpu/e2e.py)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    path = model_path(args.model)
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(1000, 100000) for _ in range(rng.randint(*args.prompt_len))] for _ in range(args.num_requests)
    ]
    max_tokens = [rng.randint(*args.output_len) for _ in range(args.num_requests)]
    rows = []
    for backend in args.backends.split(","):
        for weight_dtype in args.weight_dtypes.split(","):
            started = time.perf_counter()
            model = load_model(path, device=args.device, dtype=args.dtype, backend=backend, weight_dtype=weight_dtype)
            engine = InferenceEngine(
                model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
            )
            load_s = time.perf_counter() - started
            engine.generate([prompts[0][:8]], SamplingParams(max_tokens=2))  # warm-up
            rows.append(
                dict(backend=backend, weights=model.weight_dtype, load_s=load_s, **run(engine, prompts, max_tokens))
            )
            print(f"{backend} {model.weight_dtype}: {rows[-1]['output_tok_s']:.1f} output tokens/s", flush=True)
            del engine, model
    base = next((r for r in rows if r["backend"] == "reference"), rows[0])
    name = f"speedup_vs_{base['backend']}_{base['weights']}"
    for r in rows:
        r[name] = r["total_tok_s"] / base["total_tok_s"]
    print_table(rows, ["backend", "weights", "load_s", "prompt_tokens", "output_tokens", "seconds", "output_tok_s",
                       "total_tok_s", "preemptions", name])
    write_json("throughput", dict(vars(args), model=path), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
