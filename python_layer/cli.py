"""`mili serve | generate | bench`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional


def _generate(args: argparse.Namespace) -> int:
    from .inference import InferenceEngine, SamplingParams

    t0 = time.perf_counter()
    engine = InferenceEngine.from_pretrained(args.model, device=args.device, dtype=args.dtype, backend=args.backend)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed, ignore_eos=args.ignore_eos)
    t0 = time.perf_counter()
    outputs = engine.generate(args.prompt, params)
    gen_s = time.perf_counter() - t0
    for out in outputs:
        print(out.text)
        print(f"[{len(out.prompt_token_ids)} prompt tokens, {len(out.token_ids)} generated, finish_reason={out.finish_reason}]",
              file=sys.stderr)
    total = sum(len(o.token_ids) for o in outputs)
    print(f"[load {load_s:.1f} s, generate {gen_s:.2f} s, {total / gen_s:.1f} tokens/s]", file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{args.what}.py"
    if not script.is_file():
        print(f"mili bench: {script} not found: the benchmarks ship with the source checkout", file=sys.stderr)
        return 2
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(script.parent))  # the benchmarks import their shared helpers (benchmarks/common.py)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def _not_yet(what: str, issue: str):
    def run(args: argparse.Namespace) -> int:
        print(f"mili {what}: not yet available (it lands with the {issue} issue). "
              "Use `mili generate --prompt ...` meanwhile.", file=sys.stderr)
        return 2
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mili", description="MILI: a Qwen3 inference server")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    gen.add_argument("--model", default=None, help="checkpoint directory or Hugging Face id (default: the built-in random-weight model)")
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for several (batched together)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--backend", default="mojo", choices=["mojo", "reference"],
                     help="mojo: one compiled MAX graph on the Mojo kernels; reference: PyTorch op by op")
    gen.set_defaults(func=_generate)

    serve = sub.add_parser("serve", help="start the HTTP server")
    serve.add_argument("--model", default=None)
    serve.set_defaults(func=_not_yet("serve", "server"))

    bench = sub.add_parser("bench", help="run a benchmark of benchmarks/; extra arguments go to it")
    bench.add_argument("what", nargs="?", default="kernels", choices=["kernels", "throughput", "shared_prefix"])
    bench.add_argument("args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"mili: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
