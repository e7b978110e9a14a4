from .config import QWEN3_PRESETS, Qwen3Config
from .qwen3_model import AttentionMetadata, Qwen3Model
from .weight_loader import Fp8Weight, WeightLoader

__all__ = ["Qwen3Config", "QWEN3_PRESETS", "WeightLoader", "Fp8Weight", "Qwen3Model", "AttentionMetadata"]
