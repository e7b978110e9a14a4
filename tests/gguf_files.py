"""GGUF files of random-weight Qwen3 checkpoints for the tests, written by gguf-py (llama.cpp's own Python package)
under the tensor names of its TensorNameMap, as llama.cpp's convert_hf_to_gguf.py writes them: each projection in
the type the test asks for. Types gguf-py quantizes (Q4_0 .. Q8_0) quantize the checkpoint's weights; the K-quants,
which it only dequantizes, get random blocks (random bytes, with their float16 scales small)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from safetensors.torch import load_file

from python_layer.model.config import Qwen3Config
from python_layer.tokenizer.qwen_tokenizer import ASSETS_DIR

K_QUANT_SCALES = {"Q2_K": [(80, 2), (82, 2)], "Q3_K": [(108, 2)], "Q4_K": [(0, 2), (2, 2)], "Q5_K": [(0, 2), (2, 2)],
                  "Q6_K": [(208, 2)]}
"""Where each K-quant block keeps its float16 super-block scales: (byte offset, 2)."""
SCALE = 2e-5
"""A K-quant block's float16 scales: their products with the 6-bit sub-block scales and values stay ~0.01-0.05."""


def random_blocks(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random bytes of a K-quant tensor [n, k] (uint8 [n, bytes a row]), its float16 scales set to SCALE-sized
    values."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for offset, width in K_QUANT_SCALES[qtype]:
        scales = (rng.uniform(0.5, 1.5, (n, k // block)) * SCALE).astype(np.float16)
        rows[..., offset:offset + width] = scales.view(np.uint8).reshape(n, k // block, width)
    return rows.reshape(n, -1)


def tensor_data(weight: torch.Tensor, qtype: str, seed: int) -> np.ndarray:
    """weight (a 2-d projection, or the experts' 3-d stack) in qtype as gguf-py writes it."""
    import gguf

    if qtype in K_QUANT_SCALES:
        shape = weight.shape
        return random_blocks(qtype, int(np.prod(shape[:-1])), shape[-1], seed).reshape(*shape[:-1], -1)
    values = weight.float().numpy()
    if qtype == "F32":
        return values
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType[qtype])


def write_gguf(src: Path, dst: Path, types: Mapping[str, str], default: str = "F32") -> Path:
    """The checkpoint src (a directory of safetensors, dense) as a GGUF file dst: tensor `name` (a Hugging Face name
    without `.weight`, e.g. model.layers.0.self_attn.v_proj, or the experts' stack model.layers.0.mlp.experts.down_proj)
    in types[name], other projections and the embedding in `default`, norms in F32."""
    import gguf

    config = Qwen3Config.from_pretrained(src)
    moe = config.num_experts > 0
    arch = gguf.MODEL_ARCH.QWEN3MOE if moe else gguf.MODEL_ARCH.QWEN3
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(file))
    experts: dict[str, list] = {}
    for name in sorted(tensors):
        if ".mlp.experts." in name:  # model.layers.{i}.mlp.experts.{e}.{proj}.weight -> one stack per layer
            layer, e, proj = name.split(".")[2], int(name.split(".")[5]), name.split(".")[6]
            experts.setdefault(f"model.layers.{layer}.mlp.experts.{proj}", []).append((e, tensors.pop(name)))
    for stack, rows in experts.items():
        tensors[stack + ".weight"] = torch.stack([t for _, t in sorted(rows, key=lambda r: r[0])])
    writer = gguf.GGUFWriter(str(dst), gguf.MODEL_ARCH_NAMES[arch])
    _write_metadata(writer, config)
    for seed, (name, weight) in enumerate(sorted(tensors.items())):
        base = name.removesuffix(".weight")
        qtype = "F32" if weight.dim() == 1 else types.get(base, default)
        data = tensor_data(weight, qtype, seed)
        writer.add_tensor(names.get_name(base) + ".weight", data,
                          raw_dtype=None if qtype == "F32" else gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _write_metadata(writer, config: Qwen3Config) -> None:
    import gguf

    c = config
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if c.num_experts:
        writer.add_expert_count(c.num_experts)
        writer.add_expert_used_count(c.num_experts_per_tok)
        writer.add_expert_feed_forward_length(c.moe_intermediate_size)
    vocab = json.loads((ASSETS_DIR / "tokenizer.json").read_text())
    tokens = {i: t for t, i in vocab["model"]["vocab"].items()}
    types = dict.fromkeys(tokens, gguf.TokenType.NORMAL)
    for added in vocab["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([tokens.get(i, f"[PAD{i}]") for i in range(c.vocab_size)])
    writer.add_token_types([types.get(i, gguf.TokenType.UNUSED) for i in range(c.vocab_size)])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in vocab["model"]["merges"]])
    writer.add_eos_token_id(151645)
    writer.add_bos_token_id(151643)
    writer.add_add_bos_token(False)
    writer.add_chat_template(json.loads((ASSETS_DIR / "tokenizer_config.json").read_text())["chat_template"])


def dequantized_checkpoint(path: Path, dst: Path) -> Path:
    """The Hugging Face checkpoint (float32) of a GGUF file's values as gguf-py dequantizes them, for transformers."""
    from safetensors.torch import save_file

    from python_layer.model.hub import resolve_model_dir
    from python_layer.model.weight_loader import WeightLoader, expected_weight_shapes

    directory = resolve_model_dir(path)
    config = Qwen3Config.from_pretrained(directory)
    loader = WeightLoader(directory, config)
    loader.load_from_safetensors()
    dst.mkdir(parents=True, exist_ok=True)
    save_file({name: loader.get_weight(name).contiguous() for name in expected_weight_shapes(config)},
              dst / "model.safetensors", metadata={"format": "pt"})
    hf = json.loads((directory / "config.json").read_text())
    del hf["quantization_config"]
    hf["torch_dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(hf))
    return dst
