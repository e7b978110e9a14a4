"""One prompt in, its generated text out, on a throwaway engine whose KV pool holds just that prompt and output."""

from __future__ import annotations

import math

from ..model.qwen3_model import Qwen3CausalLM
from ..tokenizer.qwen_tokenizer import tokenizer_for_checkpoint
from .inference_engine import InferenceEngine
from .sampling_params import SamplingParams

PAGE_SIZE = 16


def generate_text(
    model: Qwen3CausalLM,
    prompt: str,
    max_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 0.95,
    top_k: int = 50,
) -> str:
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens)
    tokenizer = tokenizer_for_checkpoint(model.model_path)
    # the engine's context is min(max_position_embeddings, pages * PAGE_SIZE) and must exceed the prompt; one
    # request on a throwaway engine: capturing device graphs would cost more than it saves
    num_tokens = min(len(tokenizer.encode(prompt)) + max_tokens, model.config.max_position_embeddings)
    engine = InferenceEngine(model, tokenizer, num_kv_pages=math.ceil(num_tokens / PAGE_SIZE), page_size=PAGE_SIZE,
                             enable_prefix_caching=False, device_graphs=False)
    return engine.generate([prompt], params)[0].text
