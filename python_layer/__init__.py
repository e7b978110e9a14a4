"""MILI: a Qwen3 inference server. `from python_layer import InferenceEngine, SamplingParams`."""

from .inference import InferenceEngine, InferenceRequest, RequestOutput, Sampler, SamplingParams
from .memory import KVCacheAllocator, PagedKVCache
from .model import QWEN3_PRESETS, Qwen3Config, Qwen3Model, WeightLoader
from .tokenizer import MessageFormatter, QwenTokenizer, get_tokenizer, parse_response

__version__ = "0.1.0"

__all__ = [
    "InferenceEngine", "InferenceRequest", "RequestOutput", "Sampler", "SamplingParams",
    "KVCacheAllocator", "PagedKVCache",
    "QWEN3_PRESETS", "Qwen3Config", "Qwen3Model", "WeightLoader",
    "MessageFormatter", "QwenTokenizer", "get_tokenizer", "parse_response",
]
