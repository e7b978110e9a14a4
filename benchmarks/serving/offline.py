"""The served workload run offline: the same prompts, output lengths and sampling through MILI's InferenceEngine
with at most `concurrency` requests running at once (the closed loop's number of streams), all submitted together.
What the server's HTTP, streaming and threads cost is the difference.

Each point runs in a process of its own (`offline_point`), which exits when it is done: MAX's worker threads spin
a while after their last work, and in the benchmark's process they took most of a core from the next served
point."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from benchmarks.serving import breakdown

from prometheus_client import generate_latest

from python_layer.inference.metrics import EngineMetrics

if TYPE_CHECKING:
    from python_layer import InferenceEngine

ROOT = Path(__file__).resolve().parents[2]


def counters(engine: InferenceEngine) -> breakdown.Counters:
    """An engine's counters as its server's /metrics would export them: read through the server's own
    EngineMetrics."""
    metrics = EngineMetrics("offline")
    metrics.observe_engine(engine)
    return breakdown.parse_counters(generate_latest(metrics.registry).decode())


def offline_point(checkpoint: str, weight_dtype: str, kv_cache_dtype: str, prompts: Sequence[str], output_tokens: int,
                  concurrency: int, sampling: dict, work: Path) -> dict:
    """Output tok/s of the prompts at `concurrency` requests at a time, and the breakdown of the engine's time."""
    spec = work / "offline.json"
    spec.write_text(json.dumps(dict(checkpoint=checkpoint, weight_dtype=weight_dtype, kv_cache_dtype=kv_cache_dtype,
                                    prompts=list(prompts), output_tokens=output_tokens, concurrency=concurrency,
                                    sampling=sampling)))
    done = subprocess.run([sys.executable, "-m", "benchmarks.serving.offline", str(spec)], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the offline point at concurrency {concurrency} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(spec: dict) -> dict:
    from python_layer import InferenceEngine, SamplingParams

    engine = InferenceEngine.from_pretrained(spec["checkpoint"], weight_dtype=spec["weight_dtype"],
                                             kv_cache_dtype=spec["kv_cache_dtype"], max_num_seqs=spec["concurrency"])
    engine.generate("warm up", SamplingParams(max_tokens=4))
    sampling = {k: spec["sampling"][k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}
    params = SamplingParams(max_tokens=spec["output_tokens"], ignore_eos=True, **sampling)
    before = counters(engine)
    start = time.perf_counter()
    outputs = engine.generate(spec["prompts"], params)
    wall = time.perf_counter() - start
    generated = sum(len(o.token_ids) for o in outputs)
    row = {"requests": len(outputs), "errors": 0, "duration_s": wall, "output_tok_s": generated / wall}
    return dict(row, **breakdown.summarize(before, counters(engine), 0.0, wall))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one offline point of `mili bench serving` (its JSON spec)")
    parser.add_argument("spec")
    print(json.dumps(_run(json.loads(Path(parser.parse_args().spec).read_text()))))
