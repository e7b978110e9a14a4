"""Seeded random-weight Qwen3 checkpoints in Hugging Face layout, built with `transformers`.

Tests compare MILI against transformers on them, benchmarks time them, and the smallest is MILI's built-in
default model (its weights are random: it produces gibberish, but real Qwen3 arithmetic on real shapes)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from ..tokenizer.qwen_tokenizer import ASSETS_DIR

QWEN3_VOCAB = 151936
EOS_TOKEN_IDS = [151645, 151643]

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
BUILTIN = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
               num_key_value_heads=4, head_dim=64, tie_word_embeddings=True)
QWEN3_0_6B_SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
QWEN3_30B_A3B_SHAPE = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                           num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                           moe_intermediate_size=768, norm_topk_prob=True, tie_word_embeddings=False)
BUILTIN_NAME = "mili-random-qwen3-256h4l-v1"


def build_random_checkpoint(
    path: str | os.PathLike,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    max_shard_size: Optional[str] = None,
    **config_overrides: Any,
) -> Path:
    """Write config.json, generation_config.json, safetensors and the Qwen3 tokenizer files into `path`.

    Weights are N(0, initializer_range) with norm weights around 1 (not exactly 1, so that a norm applied with
    the wrong weight shows up in parity tests). Built in a temporary directory and renamed into place.
    """
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM
    from transformers.utils import logging as hf_logging

    config = _hf_config(**config_overrides)
    torch.manual_seed(seed)
    # a MoE is made in its dtype at once: Qwen3-30B-A3B's layers are 1.2 GB each in float32
    moe = "num_experts" in config_overrides
    model = Qwen3MoeForCausalLM._from_config(config, dtype=dtype) if moe else Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
    model = model.to(dtype)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar's carriage returns run into the server's log lines
    try:
        with _staged(path) as staging:
            model.save_pretrained(staging, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return Path(path)


def _hf_config(**overrides: Any) -> Any:
    """transformers' Qwen3Config (Qwen3MoeConfig when `num_experts` is given) with Qwen3's vocabulary and defaults."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    return (Qwen3MoeConfig if "num_experts" in overrides else Qwen3Config)(**{
        "vocab_size": QWEN3_VOCAB, "max_position_embeddings": 40960, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
        "initializer_range": 0.1, "bos_token_id": 151643, "eos_token_id": 151645, **overrides,
    })


@contextlib.contextmanager
def _staged(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory beside `path` to write a checkpoint's weights into; then Qwen3's generation config and
    tokenizer files go beside them, and it is renamed into place (replacing `path`). Removed if the writing fails."""
    from transformers import GenerationConfig

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    try:
        yield staging
        GenerationConfig(
            bos_token_id=151643, eos_token_id=EOS_TOKEN_IDS, pad_token_id=151643,
            do_sample=True, temperature=0.6, top_k=20, top_p=0.95,
        ).save_pretrained(staging)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(ASSETS_DIR / name, staging / name)
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


GPTQ_INT4 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
             "checkpoint_format": "gptq"}
"""The quantization_config of Qwen's Qwen3-*-GPTQ-Int4 checkpoints."""


def build_random_gptq_checkpoint(path: str | os.PathLike, seed: int = 0, **config_overrides: Any) -> Path:
    """A random-weight checkpoint in the layout of Qwen's GPTQ-Int4 files (GPTQ_INT4): every decoder projection as
    random 4-bit values with zero 8 and a float16 scale per group of 128 inputs, every other tensor float16 as
    build_random_checkpoint makes them. Written one layer per shard, with no dense model: for shapes whose dense
    weights do not fit in memory or on disk (all 48 layers of Qwen3-30B-A3B: 16 GB here, 61 GB in bfloat16)."""
    from safetensors.torch import save_file

    from .config import Qwen3Config
    from .weight_loader import expected_weight_shapes

    config = _hf_config(**config_overrides).to_dict()
    config.update(dtype="float16", quantization_config=GPTQ_INT4)
    qwen3 = Qwen3Config.from_dict(config)
    int4 = qwen3.int4_checkpoint
    generator = torch.Generator().manual_seed(seed)
    shards: dict[str, dict[str, tuple[int, ...]]] = {}  # one per layer, one for the rest
    for name, shape in expected_weight_shapes(qwen3).items():
        shards.setdefault(name.split(".")[2] if name.startswith("model.layers.") else "rest", {})[name] = shape
    with _staged(path) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        weight_map = {}
        for i, names in enumerate(shards.values()):
            tensors = {}
            for name, shape in names.items():
                if name.endswith("_proj.weight"):
                    tensors.update(_random_gptq(name[: -len(".weight")], int4.shapes(*shape), generator))
                elif name.endswith("norm.weight"):
                    tensors[name] = (1 + 0.2 * torch.randn(shape, generator=generator)).half()
                else:
                    tensors[name] = (config["initializer_range"] * torch.randn(shape, generator=generator)).half()
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(tensors, staging / file, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, file))
        (staging / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}, indent=1))
    return Path(path)


def _random_gptq(base: str, shapes: dict[str, tuple[int, ...]], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One projection's GPTQ tensors (GPTQ_INT4's v1 storage): random words of 4-bit values, zeros 8 (stored as 7),
    scales giving values of standard deviation ~0.02 (4.6 steps), and groups in order."""
    k = shapes["g_idx"][0]
    group = GPTQ_INT4["group_size"]
    return {
        f"{base}.qweight": torch.randint(-2**31, 2**31, shapes["qweight"], dtype=torch.int32, generator=generator),
        f"{base}.qzeros": torch.full(shapes["qzeros"], 0x77777777, dtype=torch.int32),
        f"{base}.scales": (0.0043 * (1 + 0.1 * torch.randn(shapes["scales"], generator=generator))).half(),
        f"{base}.g_idx": (torch.arange(k) // group).to(torch.int32),
    }


def cache_dir() -> Path:
    """Where MILI keeps generated models: $MILI_CACHE_DIR, else ~/.cache/mili."""
    return Path(os.environ.get("MILI_CACHE_DIR", Path.home() / ".cache" / "mili"))


def builtin_model_path() -> Path:
    """The built-in default model (random weights, Qwen3 architecture and tokenizer), generated on first use."""
    path = cache_dir() / "models" / BUILTIN_NAME
    if not (path / "config.json").is_file():
        # on stderr: scripts take the path from stdout (benchmarks/serving/setup.sh)
        print(f"MILI: generating the built-in random-weight Qwen3 model into {path} (first use only)", file=sys.stderr,
              flush=True)
        build_random_checkpoint(path, seed=1234, **BUILTIN)
    return path
