"""Load Qwen3 weights from Hugging Face safetensors checkpoints (one file or sharded with an index)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict

import numpy as np
import torch
from safetensors import safe_open

from .config import Qwen3Config
from .hub import resolve_model_dir
from .quantization import LinearWeight, QuantizedWeight, from_block_scales, quantize
SCALE_SUFFIX = "_scale_inv"
"""An FP8 checkpoint's `X.weight_scale_inv` beside each quantized `X.weight`."""


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
        """Load every tensor of `model_path`, checked against the config and converted to `dtype` on `device`
        (an FP8 checkpoint's float8_e4m3fn weights and their `weight_scale_inv` stay as they are)."""
        files = self._safetensors_files()
        expected = expected_weight_shapes(self.config)
        block = self.config.fp8_block_size
        weights: Dict[str, torch.Tensor] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if block and name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in expected:
                        n, k = expected[name[: -len(SCALE_SUFFIX)]]
                        shape = (-(-n // block[0]), -(-k // block[1]))
                        weights[name] = self._checked(f, name, file, shape).to(self.device, torch.float32)
                        continue
                    if name not in expected:
                        if name == "lm_head.weight" and self.config.tie_word_embeddings:
                            continue  # some tied checkpoints store the copy anyway; the embedding is used
                        raise ValueError(f"Unexpected tensor {name!r} in {file.name}: not part of a Qwen3 model with this config")
                    tensor = self._checked(f, name, file, expected[name])
                    if tensor.dtype == torch.float8_e4m3fn:
                        if not block:
                            raise ValueError(f"Tensor {name!r} in {file.name} is float8_e4m3fn, but config.json has no FP8 "
                                             "quantization_config (quant_method 'fp8', weight_block_size) to scale it")
                        weights[name] = tensor.to(self.device)
                    else:
                        weights[name] = tensor.to(device=self.device, dtype=self.dtype)
        unscaled = [n for n, t in weights.items() if t.dtype == torch.float8_e4m3fn and n + SCALE_SUFFIX not in weights]
        if unscaled:
            raise ValueError(f"Checkpoint {self.model_path} has FP8 weight(s) without {SCALE_SUFFIX}: {', '.join(unscaled[:3])}")
        missing = [n for n in expected if n not in weights]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(f"Checkpoint {self.model_path} lacks tensor(s) {', '.join(missing[:3])}{more}")
        self.weights = weights
        return weights

    @staticmethod
    def _checked(f, name: str, file: Path, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = f.get_tensor(name)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"Tensor {name!r} in {file.name} has shape {tuple(tensor.shape)}, but the config needs {shape}")
        return tensor

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

    def quantize_to_fp8(self) -> Dict[str, QuantizedWeight]:
        """Every linear projection as float8_e4m3fn with a scale per row and block of 128 columns (the block's
        largest |value| / 448). Norms and embeddings stay as they are: the dict holds only the projections."""
        if not self.weights:
            raise RuntimeError("No weights loaded: call load_from_safetensors() first")
        return {name: quantize(self.get_weight(name), "fp8") for name, w in self.weights.items()
                if w.dim() == 2 and "_proj." in name}

    def get_linear(self, name: str) -> LinearWeight:
        """A linear layer's weight as the checkpoint has it: dense, or FP8 with its scales (QuantizedWeight)."""
        if name + SCALE_SUFFIX in self.weights:
            return from_block_scales(self.weights[name], self.weights[name + SCALE_SUFFIX], self.config.fp8_block_size)
        return self.get_weight(name)

    def get_weight(self, name: str) -> torch.Tensor:
        """A tensor of the checkpoint in `dtype` (FP8 weights dequantized)."""
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            name = "model.embed_tokens.weight"
        if name not in self.weights:
            raise KeyError(f"Weight {name!r} not loaded (known: model.embed_tokens.weight, model.layers.N.*, model.norm.weight, lm_head.weight)")
        if name + SCALE_SUFFIX in self.weights:
            return self.get_linear(name).dequantize(self.dtype)
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
