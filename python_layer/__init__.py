"""MILI: a Qwen3 inference server. `from python_layer import InferenceEngine, SamplingParams`."""

from .design_api import (
    KVCacheAllocator, MessageFormatter, Qwen3Model, QwenTokenizer, RequestMetadata, RequestPhase, Sampler,
    get_tokenizer,
)
from .inference import ContinuousBatchScheduler, InferenceEngine, InferenceRequest, RequestOutput, SamplingParams
from .memory import PagedKVCache, RadixAttentionCache
from .model import QWEN3_PRESETS, Qwen3Config, WeightLoader
from .model.loader import load_model
from .tokenizer import parse_response

__version__ = "0.1.0"

__all__ = [
    "ContinuousBatchScheduler",
    "InferenceEngine",
    "InferenceRequest",
    "RequestMetadata",
    "RequestOutput",
    "RequestPhase",
    "Sampler",
    "SamplingParams",
    "KVCacheAllocator",
    "PagedKVCache",
    "RadixAttentionCache",
    "QWEN3_PRESETS",
    "Qwen3Config",
    "Qwen3Model",
    "WeightLoader",
    "load_model",
    "MessageFormatter",
    "QwenTokenizer",
    "get_tokenizer",
    "parse_response",
]
