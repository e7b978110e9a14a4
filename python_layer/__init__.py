"""MILI: a Qwen3 inference server. `from python_layer import InferenceEngine, SamplingParams`."""

from .inference import (
    ContinuousBatchScheduler, InferenceEngine, InferenceRequest, RequestMetadata, RequestOutput, RequestPhase, Sampler,
    SamplingParams,
)
from .memory import KVCacheAllocator, PagedKVCache, RadixAttentionCache
from .model import QWEN3_PRESETS, Qwen3Config, Qwen3Model, WeightLoader
from .tokenizer import MessageFormatter, QwenTokenizer, get_tokenizer, parse_response

__version__ = "0.1.0"

__all__ = [
    "ContinuousBatchScheduler", "InferenceEngine", "InferenceRequest", "RequestMetadata", "RequestOutput", "RequestPhase",
    "Sampler", "SamplingParams",
    "KVCacheAllocator", "PagedKVCache", "RadixAttentionCache",
    "QWEN3_PRESETS", "Qwen3Config", "Qwen3Model", "WeightLoader",
    "MessageFormatter", "QwenTokenizer", "get_tokenizer", "parse_response",
]
