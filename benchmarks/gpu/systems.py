"""The systems the end-to-end device benchmarks (benchmarks/gpu/e2e.py) time, behind one call:
`generate(prompts, max_tokens) -> (seconds, output tokens)`: every prompt (token ids) submitted at once, greedy,
ignore_eos, each producing exactly its max_tokens; wall-clock seconds until the last token is on the host.

- MILI: its engine in bfloat16, prefix caching off (the runs repeat their prompts), with or without device graphs
  and overlap, and (mili-cublas) with cuBLAS for the matmuls in place of MAX's own kernels;
- transformers: bfloat16, sdpa attention, its own `generate` on left-padded batches of prompts of similar length
  (each batch runs to its longest output; only the tokens asked for are counted);
- MAX's own Qwen3 pipeline: benchmarks/peers/max_pipeline.py in a Python that has `max[serve]`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Protocol, Sequence

import torch

from bindings.gpu_options import ENVIRONMENT
from python_layer import InferenceEngine, SamplingParams
from python_layer.model.device_memory import MAX_POOL_PERCENT
from python_layer.model.loader import load_model
from python_layer.model.qwen3_model import Qwen3CausalLM

MAX_WORKER = Path(__file__).resolve().parents[1] / "peers" / "max_pipeline.py"
# MAX's pool size as the operator set it, if they did: load_model sets one for MILI's own MAX otherwise
OPERATOR_POOL_PERCENT = os.environ.get(MAX_POOL_PERCENT)


class System(Protocol):
    name: str
    device_graphs: bool  # whether its decode steps replay captured device graphs

    def generate(self, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> tuple[float, int]: ...

    def close(self) -> None: ...


def _check_counts(name: str, got: Sequence[int], wanted: Sequence[int]) -> None:
    if list(got) != list(wanted):
        raise RuntimeError(f"{name} produced {sum(got)} tokens where {sum(wanted)} were asked for")


class Mili:
    VARIANTS = {
        "mili": {},
        "mili-sync": dict(overlap=False),
        "mili-eager": dict(device_graphs=False),
        "mili-cublas": {},
    }
    CUBLAS = "mili-cublas"

    def __init__(self, model: Qwen3CausalLM, name: str, max_num_seqs: int, max_num_batched_tokens: int,
                 kv_cache_gb: float, max_model_len: int) -> None:
        """name: one of VARIANTS (the engine's defaults, without overlap, without device graphs; mili-cublas: the
        defaults, the model's matmuls through cuBLAS, which it must have loaded with: MILI_GPU_VENDOR_BLAS=1 on a
        GPU). max_model_len: the workload's longest sequence, as MAX's pipeline is given it (it also sets how wide a
        replayed decode step's page table is)."""
        if name not in self.VARIANTS:
            raise ValueError(f"unknown MILI variant {name!r}: choose from {', '.join(self.VARIANTS)}")
        vendor_blas = getattr(model.forward_fn, "vendor_blas", False)
        if name == self.CUBLAS and not vendor_blas:
            raise ValueError(f"{name} times MILI with its matmuls through cuBLAS: load the model on a GPU with "
                             f"{ENVIRONMENT['vendor_blas']}=1 (run {name} in a process of its own)")
        if name != self.CUBLAS and vendor_blas:
            raise ValueError(f"{name} times MILI with MAX's own matmuls, but the model was loaded with "
                             f"{ENVIRONMENT['vendor_blas']}=1: time it as {self.CUBLAS}, or unset the setting")
        self.name = name
        self.engine = InferenceEngine(model, kv_cache_memory_gb=kv_cache_gb, max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False,
                                      max_model_len=max_model_len, **self.VARIANTS[name])
        graphs = self.engine.runner.decode_graphs
        self.device_graphs = graphs is not None and graphs.replays

    def generate(self, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> tuple[float, int]:
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
        started = time.perf_counter()
        outputs = self.engine.generate(list(prompts), params)
        seconds = time.perf_counter() - started
        _check_counts(self.name, [len(o.token_ids) for o in outputs], max_tokens)
        return seconds, sum(max_tokens)

    def close(self) -> None:
        del self.engine


def load_mili(path: str, device: str, kv_cache_gb: Optional[float] = None) -> Qwen3CausalLM:
    """The model in bfloat16; on a GPU, MAX's pool leaves room for a KV cache of kv_cache_gb (None: the engine's
    default; see device_memory.py)."""
    model = load_model(path, device=device, dtype="bfloat16", kv_cache_memory_gb=kv_cache_gb)
    # seconds, not minutes: its graph came from the compile cache (benchmarks/gpu/bundle.sh)
    print(f"MILI loaded its graph in {model.forward_fn.load_seconds:.1f} s", file=sys.stderr, flush=True)
    return model


class Transformers:
    def __init__(self, path: str, device: str, batch_size: int) -> None:
        from transformers import AutoModelForCausalLM

        self.name, self.device, self.batch_size = "transformers", torch.device(device), batch_size
        self.device_graphs = False
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa")
        self.model.to(self.device).eval()
        self.pad = self.model.config.eos_token_id if isinstance(self.model.config.eos_token_id, int) else 0

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> tuple[float, int]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        started = time.perf_counter()
        for at in range(0, len(order), self.batch_size):
            batch = order[at : at + self.batch_size]
            longest, new = max(len(prompts[i]) for i in batch), max(max_tokens[i] for i in batch)
            ids = torch.full((len(batch), longest), self.pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, i in enumerate(batch):  # left-padded
                ids[row, longest - len(prompts[i]) :] = torch.tensor(prompts[i])
                mask[row, longest - len(prompts[i]) :] = 1
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=self.pad,
            )
            _check_counts(self.name, [out.shape[1] - longest], [new])
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, sum(max_tokens)

    def close(self) -> None:
        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class MaxPipeline:
    """MAX's pipeline in a process of its own (its Python, its package versions), fed one job per line. It starts with
    device graph capture on; if it does not come up so, without (device_graphs says which ran)."""

    def __init__(self, path: str, python: str, devices: str, max_batch_size: int, max_length: int) -> None:
        self.name = "max pipeline"
        for capture in ("on", "off"):
            self.process = subprocess.Popen(
                max_worker_command(python, path, devices, max_batch_size, max_length, capture),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=max_worker_env(),
            )
            try:
                self.device_graphs = json.loads(self._reply())["device_graph_capture"]
                return
            except RuntimeError:
                if capture == "off":
                    raise
                print("MAX's pipeline did not come up with device graph capture: again without", file=sys.stderr)

    def _reply(self) -> str:
        for line in self.process.stdout:
            if line.startswith("REPLY "):
                return line[len("REPLY ") :].strip()
        raise RuntimeError(f"MAX's pipeline worker exited ({self.process.wait()}): see its stderr above")

    def generate(self, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> tuple[float, int]:
        self.process.stdin.write(json.dumps(dict(prompts=list(prompts), max_tokens=list(max_tokens))) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self._reply())
        _check_counts(self.name, [reply["output_tokens"]], [sum(max_tokens)])
        return reply["seconds"], reply["output_tokens"]

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def max_worker_command(python: str, path: str, devices: str, max_batch_size: int, max_length: int,
                       capture: str = "on") -> list[str]:
    """benchmarks/peers/max_pipeline.py's command line (benchmarks/gpu/precompile.py adds --compile-for)."""
    return [python, str(MAX_WORKER), "--model", path, "--devices", devices, "--max-batch-size", str(max_batch_size),
            "--max-length", str(max_length), "--device-graph-capture", capture]


def max_worker_env() -> dict[str, str]:
    """The environment MAX's worker starts in: this process's, as Python sees it. Mojo's Python interop sets
    PYTHONEXECUTABLE and MOJO_PYTHON_LIBRARY underneath (for this Python) once a graph has compiled or run; another
    Python started with them takes itself for this one and misses its own venv's packages. MAX's pool size that
    load_model set for MILI stays out too (the pipeline sizes its own); the operator's own goes to both."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONEXECUTABLE", "MOJO_PYTHON_LIBRARY", MAX_POOL_PERCENT)
    }
    if OPERATOR_POOL_PERCENT is not None:
        env[MAX_POOL_PERCENT] = OPERATOR_POOL_PERCENT
    return env


def python_with_max_serve(given: str) -> str:
    """The Python that runs MAX's pipeline: --max-python, else this one if it can import max.serve."""
    if given:
        return given
    probe = "import max.serve.pipelines.llm, max.serve.pipelines.model_worker"  # what max[serve]'s extras bring
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0
    if not found:
        raise RuntimeError(
            "no Python with max[serve]: make a venv with `pip install 'max[serve]'` and pass --max-python"
        )
    return sys.executable
