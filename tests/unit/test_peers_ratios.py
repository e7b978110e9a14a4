"""The peers runner's speed ratios: the ratio of the medians, and the median of the per-round ratios."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from benchmarks.peers.run import ratio_rows


def _row(system: str, fmt: str, prefill: list[float], decode_b1: list[float]) -> dict:
    med = lambda v: sorted(v)[len(v) // 2]
    return dict(system=system, format=fmt, prefill_s=med(prefill), prefill_runs=prefill,
                decode_b1_tok_s=127 / med(decode_b1), decode_b1_runs_s=decode_b1)


def test_ratios_of_medians_and_of_rounds() -> None:
    # the VM slows down in round 3 for both systems: the medians come from different rounds, the pairs do not
    mili_f32 = _row("mili", "float32", [2.0, 1.0, 3.0], [10.0, 10.5, 20.0])
    mili_bf16 = _row("mili", "bfloat16", [1.5, 1.6, 1.4], [9.0, 6.0, 11.0])
    llama_f32 = _row("llama.cpp", "f32", [2.2, 1.1, 3.6], [11.0, 10.0, 21.0])
    llama_bf16 = _row("llama.cpp", "bf16", [3.0, 3.0, 3.0], [30.0, 30.0, 30.0])
    f32, bf16, best = ratio_rows([mili_f32, mili_bf16, llama_f32, llama_bf16], argparse.Namespace(batches="1"))

    assert f32["comparison"] == "mili float32 / llama.cpp f32"
    assert abs(f32["prefill"] - 2.2 / 2.0) < 1e-9 and abs(f32["decode_b1"] - 11.0 / 10.5) < 1e-9
    assert abs(f32["prefill_paired"] - 1.1) < 1e-9  # rounds 1.1, 1.1, 1.2
    assert abs(f32["decode_b1_paired"] - 1.05) < 1e-9  # rounds 1.1, 0.952, 1.05
    assert bf16["comparison"] == "mili bfloat16 / llama.cpp bf16" and abs(bf16["decode_b1_paired"] - 30 / 9) < 1e-9
    # best: each round's fastest format of each system
    assert best["comparison"] == "mili best / llama.cpp best"
    assert abs(best["prefill_paired"] - 2.2 / 1.5) < 1e-9  # rounds 2.2 / 1.5, 1.1 / 1.0, 3.0 / 1.4
    assert abs(best["decode_b1_paired"] - 10.0 / 6.0) < 1e-9  # rounds 11 / 9, 10 / 6, 21 / 11


def test_kv_caches_and_vllm_pair_by_bits() -> None:
    """MILI's KV caches meet llama.cpp's of the same bits (bfloat16 its default f16, int8 / fp8 its q8_0), and MILI's
    weights vLLM's in the same dtype (whatever MILI's activations), int4 an AWQ / GPTQ checkpoint's own format, int8
    a W8A8 one's."""
    runs = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]
    rows = [_row("mili", "int4 kv bfloat16", *runs), _row("mili", "int4 kv int8", *runs),
            _row("mili", "int4 kv fp8", *runs), _row("mili", "bfloat16", *runs),
            _row("mili", "bfloat16 act bfloat16", *runs), _row("mili", "int8", *runs),
            _row("llama.cpp", "q4_0", *runs), _row("llama.cpp", "q4_0 kv q8_0", *runs),
            _row("vllm", "awq", *runs), _row("vllm", "bfloat16", *runs), _row("vllm", "compressed-tensors", *runs)]
    names = [r["comparison"] for r in ratio_rows(rows, argparse.Namespace(batches="1"))]
    assert names == ["mili int4 kv bfloat16 / llama.cpp q4_0", "mili int4 kv int8 / llama.cpp q4_0 kv q8_0",
                     "mili int4 kv fp8 / llama.cpp q4_0 kv q8_0", "mili int4 kv bfloat16 / vllm awq",
                     "mili int4 kv int8 / vllm awq", "mili int4 kv fp8 / vllm awq", "mili bfloat16 / vllm bfloat16",
                     "mili bfloat16 act bfloat16 / vllm bfloat16",
                     "mili int8 / vllm compressed-tensors", "mili best / llama.cpp best"]


def test_w8a8_checkpoint_is_compressed_tensors_int8_per_channel(tmp_path) -> None:
    """vLLM's 8-bit peer checkpoint: int8 projections with a float32 scale per row, the rest as it was."""
    from safetensors.torch import load_file

    from benchmarks.peers.w8a8_checkpoint import quantize_per_channel, write_w8a8_checkpoint
    from python_layer.model.config import Qwen3Config
    from python_layer.model.random_checkpoint import build_random_checkpoint

    src = build_random_checkpoint(tmp_path / "dense", seed=3, hidden_size=64, intermediate_size=96,
                                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    dst = write_w8a8_checkpoint(src, tmp_path / "w8a8")
    before, after = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    assert after[name].dtype == torch.int8 and after[name + "_scale"].shape == (64, 1)
    w = before[name].float()
    assert ((after[name].float() * after[name + "_scale"] - w).abs() <= after[name + "_scale"] / 2 + 1e-6).all()
    assert torch.equal(after["model.norm.weight"], before["model.norm.weight"])
    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors"
    assert config["config_groups"]["group_0"]["weights"]["num_bits"] == 8
    with pytest.raises(ValueError, match="quant_method 'compressed-tensors' is not supported"):  # MILI's own loader
        Qwen3Config.from_pretrained(dst)
    q, scale = quantize_per_channel(torch.tensor([[0.5, -1.0, 0.25]]))
    assert q.tolist() == [[64, -127, 32]] and torch.allclose(scale, torch.tensor([[1 / 127]]))
