"""`mili serve | generate | bench`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional


def _generate(args: argparse.Namespace) -> int:
    from .inference import InferenceEngine, SamplingParams

    # bad sampling settings are told before the model loads
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed, ignore_eos=args.ignore_eos)
    t0 = time.perf_counter()
    engine = InferenceEngine.from_pretrained(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                                               weight_dtype=args.weight_dtype, kv_cache_dtype=args.kv_cache_dtype,
                                               device_graphs=args.device_graphs, overlap=args.overlap)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    outputs = engine.generate(args.prompt, params)
    gen_s = time.perf_counter() - t0
    for out in outputs:
        print(out.text)
        print(
            f"[{len(out.prompt_token_ids)} prompt tokens, {len(out.token_ids)} generated, "
            f"finish_reason={out.finish_reason}]",
            file=sys.stderr,
        )
    total = sum(len(o.token_ids) for o in outputs)
    print(f"[load {load_s:.1f} s, generate {gen_s:.2f} s, {total / gen_s:.1f} tokens/s]", file=sys.stderr)
    return 0


BENCHMARKS = {  # `mili bench WHAT`: each folder of benchmarks/ has one entry point
    "kernels": "benchmarks.kernels.run",
    "engine": "benchmarks.engine.run",
    "peers": "benchmarks.peers.run",
    "serving": "benchmarks.serving.run",
    "gpu": "benchmarks/gpu/suite.sh",
    "gpu-bundle": "benchmarks/gpu/bundle.sh",
}


def _bench(args: argparse.Namespace) -> int:
    import runpy
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    entry = BENCHMARKS[args.what]
    if not (root / "benchmarks").is_dir():
        print(f"mili bench: {root / 'benchmarks'} not found: the benchmarks ship with the source checkout",
              file=sys.stderr)
        return 2
    if entry.endswith(".sh"):
        return subprocess.run(["bash", str(root / entry), *args.args]).returncode
    sys.argv = [f"mili bench {args.what}", *args.args]  # the benchmark's usage line names the command
    sys.path.insert(0, str(root))
    try:
        runpy.run_module(entry, run_name="__main__")
    except SystemExit as done:
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
            return 1
        return done.code or 0
    return 0


class _DefaultsFormatter(argparse.HelpFormatter):
    """--help gives each option's default, where it has a value of its own."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, True, False, argparse.SUPPRESS):
            text += (" " if text else "") + "(default: %(default)s)"
        return text


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mili serve", formatter_class=_DefaultsFormatter)
    _add_serve_arguments(parser)
    return parser


def _explicit_flags(serve_argv: List[str]) -> set:
    """The options given on the command line (they win over a config file)."""
    parser = serve_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(serve_argv)))


def _serve(args: argparse.Namespace) -> int:
    import json

    from .server import config_file
    from .server.launcher import serve

    parser = serve_parser()
    if args.config:
        config_file.apply(args, parser, args.explicit, args.config)
    args.model = args.model or None  # --model "": the built-in model (a container's default /model overridden)
    config_file.check_options(args)
    # the file's model config: checked against the checkpoint's, or the shape of random weights to serve
    model_config = config_file.model_config_for(args, args.config) if args.config else None
    args.random_model = model_config if model_config is not None and not args.model else None
    if args.print_config:
        print(json.dumps(config_file.merged(args, parser), indent=2))
        return 0
    if args.replicas > 1:
        from .server.replicas import serve_replicas

        return serve_replicas(args, args.serve_argv)
    return serve(args)


def _add_format_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weight-dtype", default="auto", metavar="{auto,float32,bfloat16,fp8,int8,int4}",
                        help="the linear layers' weights on a CPU (auto: an FP8 checkpoint's FP8, an AWQ / GPTQ "
                        "checkpoint's int4, a W8A8 one's int8, else --dtype); "
                        "on a GPU they are dequantized to --dtype")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8", "fp8"],
                        help="the KV cache (auto: bfloat16 on a CPU, --dtype on a GPU); a CPU may keep float32 K/V "
                        "under float32 activations, int8 (a scale per token and head) or fp8 (e4m3) under either")


def _add_device_graphs_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-device-graphs",
        dest="device_graphs",
        action="store_false",
        help="on a GPU, run decode steps op by op instead of replaying them as device graphs (for debugging)",
    )
    parser.add_argument("--no-overlap", dest="overlap", action="store_false",
                        help="on a GPU, read each decode step's tokens before giving the device the next step "
                        "(by default the host's work on a step's tokens runs while the device computes the next, "
                        "except in steps with logprobs or penalties)")


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="options from a JSON or YAML file (python_layer/server/config_file.py); flags given here win",
    )
    parser.add_argument("--print-config", action="store_true", help="print the merged configuration and exit")
    parser.add_argument(
        "--model",
        default=None,
        help="checkpoint directory or Hugging Face id (default: the built-in random-weight model)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="auto: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--backend", default="mojo", choices=["mojo", "reference"],
                        help="mojo: one compiled MAX graph on the Mojo kernels; reference: PyTorch op by op")
    _add_format_options(parser)
    parser.add_argument("--max-num-seqs", type=int, default=64, help="requests in the running batch at most")
    _add_device_graphs_option(parser)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens computed per step at most")
    parser.add_argument("--max-queue-len", type=int, default=256,
                        help="requests waiting beyond the running batch; more are answered 503")
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: what the KV pool and model allow)"
    )
    parser.add_argument("--page-size", type=int, default=16, help="tokens per KV cache page (a power of two up to 256)")
    kv = parser.add_mutually_exclusive_group()
    kv.add_argument("--kv-pages", type=int, default=None, help="KV cache pages of --page-size tokens")
    kv.add_argument("--kv-cache-memory-gb", type=float, default=None,
                    help="KV cache size in GiB (default: 2 GiB, at most 4096 pages)")
    kv.add_argument("--kv-memory-fraction", type=float, default=None,
                    help="KV cache size as a fraction of the memory free after the weights loaded")
    parser.add_argument(
        "--served-model-name", default=None, help="the model name clients use (default: the checkpoint's folder name)"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (or set MILI_API_KEY)",
    )
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="seconds in-flight requests get to finish after SIGINT/SIGTERM before they are aborted")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="the server's log level")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="N workers (ports PORT+1..PORT+N) behind SGLang's router on --host/--port (pip install -e '.[replicas]')",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mili", description="MILI: a Qwen3 inference server")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one or more prompts", formatter_class=_DefaultsFormatter)
    gen.add_argument(
        "--model",
        default=None,
        help="checkpoint directory or Hugging Face id (default: the built-in random-weight model)",
    )
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for several (batched together)")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                     help="auto: bfloat16 on a GPU, float32 on the CPU")
    gen.add_argument("--backend", default="mojo", choices=["mojo", "reference"],
                     help="mojo: one compiled MAX graph on the Mojo kernels; reference: PyTorch op by op")
    _add_format_options(gen)
    _add_device_graphs_option(gen)
    gen.set_defaults(func=_generate)

    serve = sub.add_parser("serve", help="start the HTTP server (design-document routes and an OpenAI-compatible API)",
                           formatter_class=_DefaultsFormatter)
    _add_serve_arguments(serve)
    serve.set_defaults(func=_serve)

    bench = sub.add_parser(
        "bench", help="run a benchmark of benchmarks/ (benchmarks/README.md); extra arguments go to it"
    )
    bench.add_argument("what", choices=list(BENCHMARKS), help="kernels | engine NAME | peers | serving | gpu [STEP...] "
                                                             "| gpu-bundle")
    bench.add_argument("args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        args.serve_argv = argv[argv.index("serve") + 1:]
        args.explicit = _explicit_flags(args.serve_argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"mili: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
