"""`mili bench engine NAME [ARGS...]`: one of the engine benchmarks, by name (`--help` after it gives its options)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "throughput": "offline throughput: random prompt and output lengths, all requests at once",
    "latency": "prefill of 512 tokens and decode at batch 1 and 8, in each weight format",
    "shared_prefix": "time to first token of requests sharing a long system prompt, prefix cache on and off",
    "host_overhead": "the engine's host time per decode step, early and late in the output",
    "decode_profile": "where a decode step's time goes (kernels, device busy and idle time)",
    "matmul_order_drift": "bfloat16 logits against matmul summation order (the batch-1 graph's load check)",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        lines = "\n".join(f"  {name:<20}{what}" for name, what in BENCHMARKS.items())
        print(f"usage: mili bench engine NAME [ARGS...]\n{lines}", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    name, *args = argv
    module = importlib.import_module(f"benchmarks.engine.{name}")
    sys.argv = [f"mili bench engine {name}", *args]
    return module.main(args) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
