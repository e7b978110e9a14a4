from .config import QWEN3_PRESETS, Qwen3Config
from .qwen3_model import AttentionMetadata, Qwen3CausalLM
from .quantization import QuantizedWeight
from .weight_loader import WeightLoader

__all__ = ["Qwen3Config", "QWEN3_PRESETS", "WeightLoader", "QuantizedWeight", "Qwen3CausalLM", "AttentionMetadata"]
