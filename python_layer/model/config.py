"""Qwen3 model configuration: read from a checkpoint's config.json (+ generation_config.json)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .hub import resolve_model_dir
from .int4_checkpoints import METHODS, Int4Checkpoint, int4_checkpoint
from .w8a8_checkpoints import METHOD as W8A8_METHOD, check_w8a8_config

GGUF_METHOD = "gguf"
"""quantization_config.quant_method of the config.json gguf_checkpoints.py writes for a GGUF file."""
GGUF_WEIGHT_DTYPES = ("int4", "int8", "dense")
_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


MODEL_TYPES = ("qwen3", "qwen3_moe")


@dataclass
class Qwen3Config:
    """A Qwen3 model: dense (model_type qwen3), or mixture-of-experts (qwen3_moe: num_experts > 0). Defaults are
    Qwen3-0.6B's published numbers."""

    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128  # its own field in Qwen3: NOT hidden_size // num_attention_heads in general
    max_position_embeddings: int = 40960
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: Optional[dict] = (
        None  # e.g. {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    )
    tie_word_embeddings: bool = True
    hidden_act: str = "silu"
    attention_bias: bool = False
    torch_dtype: str = "bfloat16"
    bos_token_id: Optional[int] = 151643
    eos_token_ids: list[int] = field(default_factory=lambda: [151645, 151643])
    pad_token_id: Optional[int] = None
    generation_defaults: dict = field(default_factory=dict)  # temperature / top_k / top_p ... of generation_config.json
    quantization_config: Optional[dict] = (
        None  # Qwen's FP8 checkpoints: {"quant_method": "fp8", "weight_block_size": [128, 128]}
    )
    # qwen3_moe (transformers' Qwen3MoeConfig): the MLP of layer i is sparse when i is not in mlp_only_layers and
    # (i + 1) % decoder_sparse_step == 0; a sparse MLP routes each token to num_experts_per_tok of num_experts
    # SwiGLU experts of moe_intermediate_size, the others are dense of intermediate_size
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Qwen3Config.{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"Qwen3Config.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"Qwen3Config.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"Qwen3Config.rope_theta must be > 0, got {self.rope_theta!r}")
        if self.hidden_act != "silu":
            raise ValueError(f"Qwen3Config.hidden_act must be 'silu' (Qwen3's SwiGLU), got {self.hidden_act!r}")
        self._validate_rope_scaling()
        self._validate_quantization()
        self._validate_experts()
        self.eos_token_ids = [int(t) for t in self.eos_token_ids]

    def _validate_rope_scaling(self) -> None:
        scaling = self.rope_scaling
        if scaling is None:
            return
        if not isinstance(scaling, dict):
            raise ValueError(f"Qwen3Config.rope_scaling must be a dict or None, got {scaling!r}")
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "default":
            self.rope_scaling = None
            return
        if rope_type != "yarn":
            raise ValueError(f"Qwen3Config.rope_scaling.rope_type {rope_type!r} is not supported: use 'yarn' or none")
        if not float(scaling.get("factor", 0)) >= 1:
            raise ValueError(f"Qwen3Config.rope_scaling.factor must be >= 1 for yarn, got {scaling.get('factor')!r}")
        if not isinstance(scaling.get("original_max_position_embeddings"), int):
            raise ValueError("Qwen3Config.rope_scaling needs an integer original_max_position_embeddings for yarn")
        self.rope_scaling = {**scaling, "rope_type": "yarn"}

    def _validate_experts(self) -> None:
        if not self.num_experts:
            return
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Qwen3Config.{name} must be a positive integer for qwen3_moe, got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"Qwen3Config.num_experts_per_tok ({self.num_experts_per_tok}) must be at most "
                             f"num_experts ({self.num_experts})")
        bad = [i for i in self.mlp_only_layers if not isinstance(i, int) or not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"Qwen3Config.mlp_only_layers must be layer indices below num_hidden_layers "
                             f"({self.num_hidden_layers}), got {bad}")

    def is_sparse(self, layer: int) -> bool:
        """Whether layer's MLP is the mixture of experts (transformers' Qwen3MoeDecoderLayer's rule)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def model_type(self) -> str:
        return "qwen3_moe" if self.num_experts else "qwen3"

    def _validate_quantization(self) -> None:
        q = self.quantization_config
        if q is None:
            return
        if isinstance(q, dict) and q.get("quant_method") in METHODS:
            Int4Checkpoint.from_config(q)
            return
        if isinstance(q, dict) and q.get("quant_method") == GGUF_METHOD:
            if q.get("weight_dtype") not in GGUF_WEIGHT_DTYPES:
                raise ValueError(f"quantization_config of a GGUF file needs weight_dtype, one of {GGUF_WEIGHT_DTYPES}")
            return
        if isinstance(q, dict) and q.get("quant_method") == W8A8_METHOD:
            check_w8a8_config(q)
            if self.num_experts:
                raise ValueError("W8A8 (compressed-tensors) qwen3_moe checkpoints are not supported: load the "
                                 "bfloat16 or FP8 checkpoint (--weight-dtype int8 quantizes it at load)")
            return
        if not isinstance(q, dict) or q.get("quant_method") != "fp8":
            method = q.get("quant_method") if isinstance(q, dict) else q
            raise ValueError(
                f"quantization_config.quant_method {method!r} is not supported: MILI loads FP8, AWQ, GPTQ and W8A8 "
                "checkpoints (quant_method 'fp8', 'awq', 'gptq' as Qwen publishes them, 'compressed-tensors' int8 "
                "as RedHatAI's *-quantized.w8a8), llama.cpp's GGUF files, and quantizes others with --weight-dtype"
            )
        if q.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"quantization_config.fmt {q['fmt']!r} is not supported: FP8 weights must be e4m3")
        block = q.get("weight_block_size")
        if not (
            isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
        ):
            raise ValueError(f"quantization_config.weight_block_size must be two positive integers such as [128, 128], "
                             f"got {block!r} (per-tensor FP8 scales are not supported)")

    @property
    def fp8_block_size(self) -> Optional[tuple[int, int]]:
        """(rows, columns) of an FP8 checkpoint's scale blocks; None for other checkpoints."""
        q = self.quantization_config
        return tuple(q["weight_block_size"]) if q and q.get("quant_method") == "fp8" else None

    @property
    def w8a8(self) -> bool:
        """Whether this is a W8A8 int8 checkpoint (compressed-tensors, w8a8_checkpoints.py)."""
        q = self.quantization_config
        return bool(q) and q.get("quant_method") == W8A8_METHOD

    @property
    def gguf_weight_dtype(self) -> Optional[str]:
        """A GGUF file's linears' format in MILI's terms (gguf_checkpoints.py: int4, int8 or dense); None for other
        checkpoints."""
        q = self.quantization_config
        return q["weight_dtype"] if q and q.get("quant_method") == GGUF_METHOD else None

    @property
    def int4_checkpoint(self) -> Optional[Int4Checkpoint]:
        """An AWQ or GPTQ checkpoint's format; None for others."""
        return int4_checkpoint(self.quantization_config)

    def to_dict(self) -> dict:
        """Hugging Face config.json keys (plus MILI's eos_token_ids and generation_defaults)."""
        d = dataclasses.asdict(self)
        d["model_type"] = self.model_type
        d["eos_token_id"] = self.eos_token_ids[0] if self.eos_token_ids else None
        return d

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> "Qwen3Config":
        """From a config.json dict (transformers 4 `rope_theta`/`rope_scaling` or 5 `rope_parameters` style)."""
        d = dict(config_dict)
        model_type = d.get("model_type", "qwen3")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"config model_type is {model_type!r}: MILI serves Qwen3 checkpoints (model_type "
                             f"{' or '.join(map(repr, MODEL_TYPES))})")
        if model_type == "qwen3_moe":
            d.setdefault("num_experts", d.get("num_local_experts"))  # transformers 5 writes num_local_experts
            if not d.get("num_experts"):
                raise ValueError("a qwen3_moe config needs num_experts (a positive integer)")
        else:
            d["num_experts"] = 0
        if d.get("use_sliding_window"):
            raise ValueError("config use_sliding_window=true is not supported: Qwen3 checkpoints use full attention")
        rope_parameters = d.pop("rope_parameters", None)
        if rope_parameters:
            rope_parameters = dict(rope_parameters)
            d.setdefault("rope_theta", rope_parameters.pop("rope_theta", cls.rope_theta))
            if rope_parameters.get("rope_type", "default") != "default":
                d.setdefault("rope_scaling", rope_parameters)
        if "eos_token_ids" not in d and "eos_token_id" in d:
            eos = d["eos_token_id"]
            d["eos_token_ids"] = [] if eos is None else (eos if isinstance(eos, list) else [eos])
        if "torch_dtype" not in d and isinstance(d.get("dtype"), str):
            d["torch_dtype"] = d["dtype"]
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if d.get("num_key_value_heads") is None and "num_attention_heads" in d:
            d["num_key_value_heads"] = d["num_attention_heads"]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_pretrained(cls, model_name_or_path: str | os.PathLike) -> "Qwen3Config":
        """From a checkpoint directory or a Hugging Face Hub id; eos ids and sampling defaults from
        generation_config.json."""
        model_dir = resolve_model_dir(model_name_or_path, allow_patterns=["*.json"])
        config_path = model_dir / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"No config.json in {str(model_dir)!r}: not a Hugging Face checkpoint directory")
        config_dict = _read_json(config_path)
        generation_path = model_dir / "generation_config.json"
        if generation_path.is_file():
            generation = _read_json(generation_path)
            eos = generation.get("eos_token_id")
            if eos is not None:
                config_dict["eos_token_ids"] = eos if isinstance(eos, list) else [eos]
            config_dict["generation_defaults"] = {
                k: generation[k]
                for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
                if k in generation
            }
        return cls.from_dict(config_dict)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _preset(**kw: Any) -> Qwen3Config:
    return Qwen3Config(**{"vocab_size": 151936, "head_dim": 128, "num_key_value_heads": 8, **kw})


# Published numbers of the Qwen3 dense models (config.json of Qwen/Qwen3-*)
QWEN3_PRESETS: dict[str, Qwen3Config] = {
    name: _preset(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, tie_word_embeddings=tied)
    for name, hidden, intermediate, layers, heads, tied in [
        ("Qwen3-0.6B", 1024, 3072, 28, 16, True),
        ("Qwen3-1.7B", 2048, 6144, 28, 16, True),
        ("Qwen3-4B", 2560, 9728, 36, 32, True),
        ("Qwen3-8B", 4096, 12288, 36, 32, False),
        ("Qwen3-14B", 5120, 17408, 40, 40, False),
        ("Qwen3-32B", 5120, 25600, 64, 64, False),
    ]
}
