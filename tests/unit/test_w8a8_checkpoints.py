"""W8A8 int8 checkpoints (compressed-tensors, llm-compressor's int-quantized format): written as vLLM reads them,
read by MILI with no flag as its int8 format with one block of all K columns, other schemes refused by name."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from python_layer.model.config import Qwen3Config
from python_layer.model.quantization import QuantizedWeight
from python_layer.model.random_checkpoint import build_random_checkpoint
from python_layer.model.w8a8_checkpoints import QUANTIZATION_CONFIG, quantize_per_channel, write_w8a8_checkpoint
from python_layer.model.weight_loader import WeightLoader


@pytest.fixture(scope="module")
def w8a8_pair(tmp_path_factory) -> tuple:
    tmp = tmp_path_factory.mktemp("w8a8")
    src = build_random_checkpoint(tmp / "dense", seed=3, hidden_size=72, intermediate_size=100, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=18,
                                  tie_word_embeddings=False)
    return src, write_w8a8_checkpoint(src, tmp / "w8a8")


def test_projections_are_int8_per_channel_and_the_rest_as_it_was(w8a8_pair: tuple) -> None:
    src, dst = w8a8_pair
    before, after = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    assert after[name].dtype == torch.int8 and after[name + "_scale"].shape == (72, 1)
    w = before[name].float()
    assert ((after[name].float() * after[name + "_scale"] - w).abs() <= after[name + "_scale"] / 2 + 1e-6).all()
    assert torch.equal(after["model.norm.weight"], before["model.norm.weight"])
    assert torch.equal(after["lm_head.weight"], before["lm_head.weight"])  # ignored: unquantized
    assert json.loads((dst / "config.json").read_text())["quantization_config"] == QUANTIZATION_CONFIG
    q, scale = quantize_per_channel(torch.tensor([[0.5, -1.0, 0.25]]))
    assert q.tolist() == [[64, -127, 32]] and torch.allclose(scale, torch.tensor([[1 / 127]]))


def test_the_loader_reads_int8_values_and_scales_as_they_are(w8a8_pair: tuple) -> None:
    src, dst = w8a8_pair
    stored = load_file(dst / "model.safetensors")
    loader = WeightLoader(dst, Qwen3Config.from_pretrained(dst))
    loader.load_from_safetensors()
    assert loader.config.w8a8
    name = "model.layers.0.self_attn.o_proj.weight"
    w = loader.get_linear(name)
    assert isinstance(w, QuantizedWeight) and w.block_k == 72  # one block: all K columns
    assert torch.equal(w.weight, stored[name]) and torch.equal(w.scales, stored[name + "_scale"])
    assert torch.equal(loader.get_weight(name), stored[name].float() * stored[name + "_scale"])


@pytest.mark.parametrize("change, named", [
    (lambda q: q.update(format="float-quantized"), "float-quantized"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=128), "'group'"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=4), "'num_bits': 4"),
    (lambda q: q["config_groups"]["group_0"].update(input_activations=None), "input_activations"),
    (lambda q: q["config_groups"]["group_0"]["input_activations"].update(dynamic=False), "dynamic"),
])
def test_other_compressed_tensors_schemes_are_refused_by_name(change, named: str) -> None:
    q = copy.deepcopy(QUANTIZATION_CONFIG)
    change(q)
    with pytest.raises(ValueError, match="MILI reads W8A8 int8 checkpoints") as error:
        Qwen3Config(quantization_config=q)
    assert named in str(error.value)


def test_a_w8a8_moe_checkpoint_is_refused() -> None:
    with pytest.raises(ValueError, match="W8A8 .* qwen3_moe checkpoints are not supported"):
        Qwen3Config(quantization_config=QUANTIZATION_CONFIG, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32)
