"""Load Qwen3 weights from Hugging Face safetensors checkpoints (one file or sharded with an index)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, NamedTuple

import numpy as np
import torch
from safetensors import safe_open

from .config import Qwen3Config
from .hub import resolve_model_dir

FP8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def expected_weight_shapes(config: Qwen3Config) -> Dict[str, tuple[int, ...]]:
    """Every tensor a Qwen3 checkpoint holds, by its Hugging Face name."""
    c = config
    q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes: Dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
            p + "self_attn.q_proj.weight": (q_out, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv_out, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv_out, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q_out),
            p + "self_attn.q_norm.weight": (c.head_dim,),
            p + "self_attn.k_norm.weight": (c.head_dim,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        })
        if c.attention_bias:
            shapes.update({
                p + "self_attn.q_proj.bias": (q_out,),
                p + "self_attn.k_proj.bias": (kv_out,),
                p + "self_attn.v_proj.bias": (kv_out,),
            })
    return shapes


class Fp8Weight(NamedTuple):
    """A float8_e4m3fn weight [out, in] with one float32 scale per output channel: w ~= weight * scale[:, None]."""

    weight: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.scale[:, None]).to(dtype)


class WeightLoader:
    """Reads, checks and converts the tensors of a Qwen3 checkpoint."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        config: Qwen3Config,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model_path = Path(model_path)
        self.config = config
        self.device = device
        self.dtype = dtype
        self.weights: Dict[str, torch.Tensor] = {}

    def load_from_safetensors(self) -> Dict[str, torch.Tensor]:
        """Load every tensor of `model_path`, checked against the config and converted to `dtype` on `device`."""
        files = self._safetensors_files()
        expected = expected_weight_shapes(self.config)
        weights: Dict[str, torch.Tensor] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if name not in expected:
                        if name == "lm_head.weight" and self.config.tie_word_embeddings:
                            continue  # some tied checkpoints store the copy anyway; the embedding is used
                        raise ValueError(f"Unexpected tensor {name!r} in {file.name}: not part of a Qwen3 model with this config")
                    tensor = f.get_tensor(name)
                    if tuple(tensor.shape) != expected[name]:
                        raise ValueError(
                            f"Tensor {name!r} in {file.name} has shape {tuple(tensor.shape)}, "
                            f"but the config needs {expected[name]}"
                        )
                    weights[name] = tensor.to(device=self.device, dtype=self.dtype)
        missing = [n for n in expected if n not in weights]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(f"Checkpoint {self.model_path} lacks tensor(s) {', '.join(missing[:3])}{more}")
        self.weights = weights
        return weights

    def load_from_huggingface(self, model_name: str) -> Dict[str, torch.Tensor]:
        """Load from a Hugging Face Hub id (downloaded, or from the local HF cache when offline)."""
        self.model_path = resolve_model_dir(model_name)
        return self.load_from_safetensors()

    def _safetensors_files(self) -> list[Path]:
        if not self.model_path.is_dir():
            raise FileNotFoundError(f"Model directory {str(self.model_path)!r} does not exist")
        index = self.model_path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = [self.model_path / name for name in sorted(set(weight_map.values()))]
            absent = [f.name for f in files if not f.is_file()]
            if absent:
                raise FileNotFoundError(f"{index.name} names shard(s) that are missing from {self.model_path}: {absent}")
            return files
        files = sorted(self.model_path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"No *.safetensors weights in {self.model_path}: not a Hugging Face checkpoint directory")
        return files

    def quantize_to_fp8(self) -> Dict[str, Fp8Weight]:
        """Quantize every linear projection to float8_e4m3fn with per-output-channel scales (amax / 448).

        Norms and embeddings stay as they are; the returned dict holds only the quantized projections.
        """
        if not self.weights:
            raise RuntimeError("No weights loaded: call load_from_safetensors() first")
        quantized = {}
        for name, w in self.weights.items():
            if w.dim() == 2 and "_proj." in name:
                amax = w.float().abs().amax(dim=1).clamp(min=1e-12)
                scale = amax / FP8_E4M3_MAX
                q = (w.float() / scale[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
                quantized[name] = Fp8Weight(q, scale)
        return quantized

    def get_weight(self, name: str) -> torch.Tensor:
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            name = "model.embed_tokens.weight"
        if name not in self.weights:
            raise KeyError(f"Weight {name!r} not loaded (known: model.embed_tokens.weight, model.layers.N.*, model.norm.weight, lm_head.weight)")
        return self.weights[name]

    def get_weight_as_numpy(self, name: str) -> np.ndarray:
        tensor = self.get_weight(name)
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
            tensor = tensor.float()
        return tensor.detach().cpu().numpy()


def parse_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """'auto' (bfloat16 on GPUs, float32 on CPUs) / 'float32' / 'bfloat16' / 'float16' (or a torch dtype) -> torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r} is not supported: use one of auto, float32, bfloat16, float16")
    return table[dtype]
