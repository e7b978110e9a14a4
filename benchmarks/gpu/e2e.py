"""End to end on a GPU: MILI against MAX's own Qwen3 pipeline and transformers on the same random-weight checkpoint
(Qwen3-0.6B's shape, bfloat16), in one run. The systems run one after another: each takes most of the GPU.

  mili bench engine latency --device cuda [--systems mili,mili-sync,mili-eager,transformers,max] [--contexts 512,4096]
      batch-1 decode, ms per token at each context: (T(prompt, n + 1) - T(prompt, 1)) / n, T being one generate
      call's wall time (so the prompt's processing drops out), n = --new-tokens; time to first token of a
      --ttft-len (2,048) token prompt: T(prompt, 1). Medians of --runs after a warm-up.
  mili bench engine throughput --device cuda [--systems ...]
      nano-vllm's workload: --num-requests (256) random prompts, prompt and output lengths uniform in [100, 1024],
      ignore_eos, all submitted at once; output tokens per second of one run after a warm-up.
  python -m benchmarks.gpu.e2e [--systems ...]
      both, each system started once for the two (MAX's pipeline takes a minute to come up).

"mili" replays its decode steps as device graphs and gives the device the next decode step before it reads the last
one's tokens (overlap), "mili-sync" replays them without overlap (--no-overlap), "mili-eager" runs them op by op
(--no-device-graphs), "mili-cublas" is "mili" with the model's matmuls through cuBLAS (run with MILI_GPU_VENDOR_BLAS=1,
in a process of its own: the setting is read as the model loads). All also print the bandwidth floor of a decode step:
the bytes it reads (every weight once) over the device's copy bandwidth measured in the run. Prints a table and writes
JSON under benchmarks/results/."""

from __future__ import annotations

import argparse
import random
import statistics
import traceback
from typing import Callable, Iterable

import torch

from benchmarks.common import gpu_options, model_path, print_table, write_json
from benchmarks.gpu.systems import MaxPipeline, Mili, System, Transformers, load_mili, python_with_max_serve
from benchmarks.kernels.run import copy_bandwidth

from python_layer.model.config import Qwen3Config

DEFAULT_SYSTEMS = ("mili", "mili-sync", "mili-eager", "transformers", "max")
SYSTEMS = (*DEFAULT_SYSTEMS, "mili-cublas")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default=None, help="checkpoint (default: random weights of Qwen3-0.6B's shape)")
    parser.add_argument(
        "--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-python", default="", help="a Python with max[serve] for MAX's pipeline (default: this one)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=256, help="MILI's and MAX's batch at most")
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--kv-cache-gb", type=float, default=40.0, help="MILI's KV cache")
    parser.add_argument("--hf-batch-size", type=int, default=64, help="transformers' generate batch")


def decode_bytes(config: Qwen3Config, bytes_per_weight: int = 2) -> int:
    """What one decode step reads at least: every weight once (the embedding table only for the LM head)."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    layer += 2 * c.hidden_size + 2 * c.head_dim
    return bytes_per_weight * (c.num_hidden_layers * layer + c.vocab_size * c.hidden_size + c.hidden_size)


def open_system(name: str, path: str, args: argparse.Namespace, mili_model: dict) -> System:
    if name.startswith("mili"):
        if "model" not in mili_model:
            mili_model["model"] = load_mili(path, args.device, args.kv_cache_gb)
        return Mili(mili_model["model"], name, args.max_num_seqs, args.max_num_batched_tokens, args.kv_cache_gb,
                    max_length(args))
    if name == "transformers":
        return Transformers(path, args.device, args.hf_batch_size)
    if name == "max":
        return MaxPipeline(path, python_with_max_serve(args.max_python), max_devices(args.device), args.max_num_seqs,
                           max_length(args))
    raise ValueError(f"unknown system {name!r}: choose from {', '.join(SYSTEMS)}")


def max_devices(device: str) -> str:
    """MAX's device spec of a torch device: cpu, gpu:N."""
    return "cpu" if device == "cpu" else "gpu:" + (device.partition(":")[2] or "0")


def max_length(args: argparse.Namespace) -> int:
    """The longest sequence of the run's figures."""
    lengths = []
    if hasattr(args, "contexts"):
        lengths += [max(contexts(args)) + args.new_tokens + 1, args.ttft_len + 1]
    if hasattr(args, "num_requests"):
        lengths.append(args.prompt_len[1] + args.output_len[1])
    return max(lengths)


def contexts(args: argparse.Namespace) -> list[int]:
    return [int(c) for c in args.contexts.split(",") if c]


def median_seconds(system: System, prompts: list[list[int]], max_tokens: list[int], runs: int) -> float:
    system.generate(prompts, max_tokens)  # warm-up
    return statistics.median(system.generate(prompts, max_tokens)[0] for _ in range(runs))


def latency_row(system: System, args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    prompt = lambda n: [rng.randrange(1000, 100000) for _ in range(n)]
    row: dict = {}
    for ctx in contexts(args):
        p = prompt(ctx)
        first = median_seconds(system, [p], [1], args.runs)
        whole = median_seconds(system, [p], [args.new_tokens + 1], args.runs)
        row[f"decode_b1_ctx{ctx}_ms_per_token"] = (whole - first) / args.new_tokens * 1e3
    row[f"ttft_{args.ttft_len}_ms"] = median_seconds(system, [prompt(args.ttft_len)], [1], args.runs) * 1e3
    return row


def throughput_row(system: System, args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(1000, 100000) for _ in range(rng.randint(*args.prompt_len))] for _ in range(args.num_requests)
    ]
    max_tokens = [rng.randint(*args.output_len) for _ in range(args.num_requests)]
    system.generate(prompts[:8], [8] * min(8, len(prompts)))  # warm-up
    seconds, tokens = system.generate(prompts, max_tokens)
    return dict(seconds=seconds, output_tokens=tokens, output_tok_s=tokens / seconds,
                total_tok_s=(tokens + sum(map(len, prompts))) / seconds)


Figures = Callable[[System, argparse.Namespace], dict]


def run(args: argparse.Namespace, measures: dict[str, Figures]) -> dict[str, list[dict]]:
    """Each system opened once for every measure (kind -> its figures); one JSON per kind, written over after every
    system."""
    path = model_path(args.model)
    config = Qwen3Config.from_pretrained(path)
    bandwidth = copy_bandwidth(args.device)
    floor_ms = decode_bytes(config) / bandwidth * 1e3
    print(f"{', '.join(measures)} on {args.device}; copy bandwidth {bandwidth / 1e9:.0f} GB/s; decode floor "
          f"{floor_ms:.3f} ms/token", flush=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    meta = dict(vars(args), model=path, device_name=device, copy_bandwidth_bytes_per_s=bandwidth,
                gpu_options=gpu_options())
    rows: dict[str, list[dict]] = {kind: [] for kind in measures}
    outs: dict = dict.fromkeys(measures)
    mili_model: dict = {}
    for name in args.systems.split(","):
        system = None
        try:
            system = open_system(name, path, args, mili_model)
            for kind, figures in measures.items():
                try:
                    rows[kind].append(dict(system=name, device_graphs=system.device_graphs, **figures(system, args)))
                except Exception as e:  # one figure failing must not lose the others
                    traceback.print_exc()
                    rows[kind].append(dict(system=name, error=f"{type(e).__name__}: {e}"))
        except Exception as e:  # nor one system failing the others'
            traceback.print_exc()
            for kind in measures:
                rows[kind].append(dict(system=name, error=f"{type(e).__name__}: {e}"))
        finally:
            if system is not None:
                system.close()
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
        for kind in measures:
            rows[kind][-1]["bandwidth_floor_ms"] = floor_ms
            print(kind, rows[kind][-1], flush=True)
            # after every system: a run cut short at its time limit keeps the figures it has
            outs[kind] = write_json(f"{kind}-{args.device.replace(':', '')}", meta, rows[kind], outs[kind])
    for kind, found in rows.items():
        print(f"\n{kind}")
        print_table(
            found,
            ["system", *sorted({k for r in found for k in r} - {"system", "error", "bandwidth_floor_ms"}), "error"],
        )
    return rows


def add_latency_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contexts", default="512,4096", help="decode contexts (prompt lengths)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--ttft-len", type=int, default=2048)


def add_throughput_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))


def argument_parser(measures: Iterable[str] = ("latency", "throughput")) -> argparse.ArgumentParser:
    """The command line of these measures (by default `python -m benchmarks.gpu.e2e`'s, which
    benchmarks/gpu/precompile.py reads for the MAX pipeline the GPU suite starts)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    if "latency" in measures:
        add_latency_arguments(parser)
    if "throughput" in measures:
        add_throughput_arguments(parser)
    return parser


def _main(argv: list[str] | None, measures: dict[str, Figures]) -> int:
    run(argument_parser(measures).parse_args(argv), measures)
    return 0


def latency_main(argv: list[str] | None = None) -> int:
    return _main(argv, {"latency": latency_row})


def throughput_main(argv: list[str] | None = None) -> int:
    return _main(argv, {"throughput": throughput_row})


def main(argv: list[str] | None = None) -> int:
    return _main(argv, {"latency": latency_row, "throughput": throughput_row})


if __name__ == "__main__":
    raise SystemExit(main())
