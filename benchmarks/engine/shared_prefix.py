"""Shared-prefix benchmark: many requests that share one long system prompt, all submitted at once, with the
prefix cache on and off, in the same run on the same loaded model.
`mili bench engine shared_prefix [--system-len 2000] [--num-requests 16]`.

With the cache, the first request's system prompt enters the prefix cache as it is computed and the others wait
for it instead of computing it again; without, each computes it. The table gives the time to first token
(TTFT) of all requests both ways and their ratio (off / on). JSON goes under benchmarks/results/."""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.common import model_path, print_table, write_json

from python_layer import InferenceEngine, SamplingParams
from python_layer.model.loader import load_model


def ttfts(engine: InferenceEngine, prompts: list[list[int]], params: SamplingParams) -> list[float]:
    """Submit every prompt now; seconds until each one's first token."""
    submitted = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    first: dict[str, float] = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            first.setdefault(delta.request_id, time.perf_counter() - submitted)
    return [first[i] for i in ids]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="checkpoint (default: random weights of Qwen3-0.6B's shape)")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--system-len", type=int, default=2000)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--backend", default="mojo")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    path = model_path(args.model)
    rng = random.Random(args.seed)
    tokens = lambda n: [rng.randrange(1000, 100000) for _ in range(n)]
    system = tokens(args.system_len)
    prompts = [system + tokens(args.question_len) for _ in range(args.num_requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    model = load_model(path, device=args.device, dtype=args.dtype, backend=args.backend)
    budget = args.system_len + args.question_len  # a whole prompt per step: chunking is not what is measured here
    rows = []
    for caching in (False, True):
        engine = InferenceEngine(model, enable_prefix_caching=caching, max_num_batched_tokens=budget)
        engine.generate([tokens(8)], SamplingParams(max_tokens=2))  # warm-up
        times = ttfts(engine, prompts, params)
        hit = engine.prefix_cache.hit_rate if caching else 0.0
        rows.append(
            dict(
                prefix_cache="on" if caching else "off",
                min_ttft_s=min(times),
                mean_ttft_s=statistics.mean(times),
                p50_ttft_s=statistics.median(times),
                max_ttft_s=max(times),
                hit_rate=hit,
            )
        )
        print(f"prefix cache {rows[-1]['prefix_cache']}: mean TTFT {rows[-1]['mean_ttft_s']:.3f} s", flush=True)
    off, on = rows
    on["ttft_off_over_on"] = off["mean_ttft_s"] / on["mean_ttft_s"]
    print_table(
        rows, ["prefix_cache", "min_ttft_s", "mean_ttft_s", "p50_ttft_s", "max_ttft_s", "hit_rate", "ttft_off_over_on"]
    )
    write_json("shared_prefix", dict(vars(args), model=path), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
