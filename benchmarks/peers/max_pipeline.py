"""MAX's own Qwen3 pipeline as a benchmark peer. Runs in a Python that has `max[serve]` (a venv of its own: it pins
other versions than MILI's), started by benchmarks/gpu/systems.py:

    python benchmarks/peers/max_pipeline.py --model CHECKPOINT [--devices gpu] [--max-batch-size 256]

It loads the checkpoint the way `max serve` does (its model worker, continuous batching, device graph capture on by
default: MAX 26.7 does not turn it on for Qwen3 by itself), prints `ready` and whether it captures on stdout, then
answers one line per request line on stdin:
{"prompts": [[token ids]...], "max_tokens": [n...]} -> {"seconds": s, "output_tokens": n}: every prompt
submitted at once, greedy, ignore_eos, seconds until the last one finished. No min_new_tokens: MAX, not configured
with enable_min_tokens, logs a warning for it per request and step on its model worker's path (148,569 lines in the
second H200 run's e2e step). A line of its own starts with REPLY; anything else MAX prints goes to stderr."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

REPLY = "REPLY "

# MILI_VIRTUAL_CPU_TARGET (bindings/library.py; benchmarks/gpu/bundle.sh sets it): the graphs' host code compiled for
# that CPU,
# so that MAX's compile cache holds on another host. At module level: the model worker MAX spawns imports this file
# again, and compiles the graphs there
if os.environ.get("MILI_VIRTUAL_CPU_TARGET"):
    from max import driver

    driver.set_virtual_cpu_target(os.environ["MILI_VIRTUAL_CPU_TARGET"])


def pipeline_config(args: argparse.Namespace):
    """The PipelineConfig `max serve` would make of these arguments."""
    from max.pipelines.lib import PipelineArgs, PipelineConfig

    kwargs = dict(model_path=args.model, device_specs=args.devices, max_batch_size=args.max_batch_size)
    if args.max_length:
        kwargs["max_length"] = args.max_length
    if args.encoding:
        kwargs["quantization_encoding"] = args.encoding
    kwargs["device_graph_capture"] = args.device_graph_capture == "on"
    return PipelineConfig.from_args(PipelineArgs.from_flat_kwargs(**kwargs))


def compile_only(args: argparse.Namespace) -> None:
    """Builds the pipeline for a virtual GPU of architecture args.compile_for (MAX's virtual-device mode): its graphs
    compile into MAX's cache, where a GPU machine's worker given the same arguments finds them
    (benchmarks/gpu/precompile.py)."""
    from max import driver

    driver.set_virtual_device_api("cuda")  # before any device exists
    driver.set_virtual_device_target_arch(args.compile_for)
    driver.set_virtual_device_count(1)
    from max.pipelines.lib import PIPELINE_REGISTRY

    PIPELINE_REGISTRY.retrieve_factory(pipeline_config(args)).factory()


async def serve(args: argparse.Namespace, replies) -> None:
    from max.pipelines.context import SamplingParams, SamplingParamsInput
    from max.pipelines.lib import PIPELINE_REGISTRY
    from max.pipelines.modeling.types import RequestID, TextGenerationRequest
    from max.serve.config import Settings
    from max.serve.pipelines.llm import TokenGeneratorPipeline
    from max.serve.pipelines.model_worker import start_model_worker
    from max.serve.pipelines.telemetry_worker import start_telemetry_consumer
    from max.serve.worker_interface._zmq_queue import generate_zmq_ipc_path
    from max.serve.worker_interface.zmq_interface import ZmqModelWorkerInterface

    config = pipeline_config(args)
    # no remote telemetry: the machines have no network, and its exporter's retries only load the host
    settings = Settings(offline_inference=True, disable_telemetry=True)
    retrieved = PIPELINE_REGISTRY.retrieve_factory(config)
    task = PIPELINE_REGISTRY.retrieve_pipeline_task(config.models.main_architecture_name)
    interface = ZmqModelWorkerInterface(task, context_type=PIPELINE_REGISTRY.retrieve_context_type(config))
    async with (
        start_telemetry_consumer(settings) as metric_client,
        start_model_worker(model_factory=retrieved.factory, pipeline_config=config, settings=settings,
                           metric_client=metric_client, model_worker_interface=interface,
                           zmq_endpoint_base=generate_zmq_ipc_path(), memory_plan=retrieved.memory_plan) as worker,
    ):
        pipeline = TokenGeneratorPipeline(model_name=config.model.model_path, tokenizer=retrieved.tokenizer,
                                          lora_queue=None, model_worker=worker)

        async def generate(prompt: list[int], max_tokens: int) -> int:
            params = SamplingParams.from_input_and_generation_config(
                SamplingParamsInput(max_new_tokens=max_tokens, ignore_eos=True, top_k=1),
                sampling_params_defaults=config.model.sampling_params_defaults)
            request = TextGenerationRequest(request_id=RequestID(), model_name=config.model.model_path, prompt=prompt,
                                            sampling_params=params)
            # random weights: any token may be <think>
            chunks = await pipeline.all_tokens(request, parse_reasoning=False)
            return sum(chunk.token_count for chunk in chunks)

        ready = dict(ready=True, device_graph_capture=bool(config.runtime.device_graph_capture))
        print(REPLY + json.dumps(ready), file=replies, flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            job = json.loads(line)
            started = time.perf_counter()
            counts = await asyncio.gather(*(generate(p, n) for p, n in zip(job["prompts"], job["max_tokens"])))
            reply = dict(seconds=time.perf_counter() - started, output_tokens=sum(counts))
            print(REPLY + json.dumps(reply), file=replies, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--devices", default="gpu", help="MAX's device spec: gpu, gpu:0, cpu")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=0, help="the context length (0: the model's)")
    parser.add_argument(
        "--encoding", default="", help="MAX's weight encoding (bfloat16, float32; default: the checkpoint's)"
    )
    parser.add_argument("--device-graph-capture", choices=("on", "off"), default="on")
    parser.add_argument(
        "--compile-for",
        default="",
        help="only compile the pipeline's graphs for this GPU architecture "
        "(sm_90) with no GPU, into MAX's cache, and exit",
    )
    args = parser.parse_args()
    if args.compile_for:
        compile_only(args)
        sys.stdout.flush()
        os._exit(0)  # MAX aborts at interpreter exit after a virtual compile
    replies = sys.stdout
    sys.stdout = sys.stderr  # MAX's own prints stay out of the replies
    asyncio.run(serve(args, replies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
