"""vLLM's CPU build as a system of `mili bench peers`, run by benchmarks/peers/run.py in vLLM's own venv
(benchmarks/peers/setup.sh vllm): `python vllm_worker.py CHECKPOINT DTYPE MAX_MODEL_LEN MAX_NUM_SEQS`.

Loads the checkpoint offline (vllm.LLM; an AWQ or GPTQ checkpoint through vLLM's CPU 4-bit kernels), prints
{"ready": ..., "quantization": ...} on a line, then answers each line of stdin,
{"prompts": [[token ids], ...], "max_tokens": n}, with {"seconds": ...}: the wall time of one greedy llm.generate of
those prompts, every sequence running to n tokens (ignore_eos). run.py times a prefill as generate(prompt, 1) and a
decode as generate(prompts, n) - generate(prompts, 1): the tokens after the first, as MILI's figures count them.
This file imports nothing of MILI's (vLLM's venv has none of it)."""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    from vllm import LLM, SamplingParams

    path, dtype, max_model_len, max_num_seqs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    started = time.perf_counter()
    llm = LLM(model=path, dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0,
              enable_prefix_caching=False)
    quantization = llm.llm_engine.model_config.quantization  # an AWQ / GPTQ checkpoint's, else None
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - started, "version": _version(),
                      "quantization": quantization}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True, detokenize=False)
        prompts = [{"prompt_token_ids": p} for p in request["prompts"]]
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        if any(len(o.outputs[0].token_ids) != request["max_tokens"] for o in outputs):
            raise RuntimeError("vLLM stopped a sequence early")
        print(json.dumps({"seconds": seconds}), flush=True)
    return 0


def _version() -> str:
    import vllm

    return vllm.__version__


if __name__ == "__main__":
    raise SystemExit(main())
