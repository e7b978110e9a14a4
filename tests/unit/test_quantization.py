"""Weight formats: quantization error bounds, Qwen's FP8 checkpoint layout, and what loading one checks."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from python_layer.model.config import Qwen3Config
from python_layer.model.qwen3_model import resolve_kv_cache_dtype, resolve_weight_dtype
from python_layer.model.quantization import (QuantizedWeight, cat_rows, convert, parse_weight_dtype, quantize,
                                             quantize_fp8_blocks, write_fp8_checkpoint)
from python_layer.model.random_checkpoint import build_random_checkpoint
from python_layer.model.weight_loader import WeightLoader

# no size a multiple of 128: partial scale blocks in both directions
ODD = dict(hidden_size=200, intermediate_size=328, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           head_dim=40, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fp8")
    return write_fp8_checkpoint(
        build_random_checkpoint(root / "dense", seed=3, dtype=torch.bfloat16, **ODD), root / "fp8"
    )


def _block_dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Qwen's definition: every 128 x 128 block of q times its own scale."""
    s = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[: q.shape[0], : q.shape[1]]
    return q.float() * s


@pytest.mark.parametrize("weight_dtype, rel_step", [("int8", 1 / 127), ("fp8", 2.0**-4)])
def test_quantize_error_is_bounded_per_row_and_block(weight_dtype: str, rel_step: float) -> None:
    w = torch.randn(70, 300) * torch.rand(70, 1) * 3
    q = quantize(w, weight_dtype)
    assert q.weight.dtype == {"int8": torch.int8, "fp8": torch.float8_e4m3fn}[weight_dtype]
    assert q.scales.shape == (70, 3) and q.block_k == 128
    block_max = torch.nn.functional.pad(w.abs(), (0, 84)).view(70, 3, 128).amax(2).repeat_interleave(128, 1)[:, :300]
    err = (q.dequantize() - w).abs()
    if weight_dtype == "int8":  # half a step of block_max / 127
        assert (err <= block_max * rel_step / 2 + 1e-7).all()
    else:  # 3 mantissa bits: half an ulp of the value, or of the smallest normal (2^-6 of 448ths) below it
        assert (err <= w.abs() * rel_step + block_max / 448 * 2.0**-9 + 1e-7).all()


def test_fp8_blocks_round_trip_to_the_per_row_layout() -> None:
    w = torch.randn(130, 260)
    q, scale_inv = quantize_fp8_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and scale_inv.shape == (2, 3)
    from python_layer.model.quantization import from_block_scales

    per_row = from_block_scales(q, scale_inv, (128, 128))
    assert per_row.scales.shape == (130, 3)
    assert torch.equal(per_row.dequantize(), _block_dequantize(q, scale_inv))


def test_stacked_and_converted_weights() -> None:
    a, b = quantize(torch.randn(8, 200), "int8"), quantize(torch.randn(4, 200), "int8")
    both = cat_rows([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    assert convert(a, "int8", torch.float32) is a
    assert convert(a, "float32", torch.float32).dtype == torch.float32
    assert convert(torch.randn(4, 4), "bfloat16", torch.float32).dtype == torch.bfloat16
    assert convert(torch.randn(4, 4), "fp8", torch.float32).weight.dtype == torch.float8_e4m3fn
    with pytest.raises(ValueError, match="different formats"):
        cat_rows([a, quantize(torch.randn(4, 200), "fp8")])


def test_weight_dtype_names_and_resolution() -> None:
    assert parse_weight_dtype("bf16") == "bfloat16" and parse_weight_dtype("q8") == "int8"
    assert parse_weight_dtype("q4") == "int4"
    with pytest.raises(ValueError, match="use one of auto, float32, bfloat16, fp8, int8, int4"):
        parse_weight_dtype("int3")
    fp8 = Qwen3Config(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_weight_dtype("auto", fp8, torch.float32, cpu) == "fp8"
    assert resolve_weight_dtype("auto", Qwen3Config(), torch.float32, cpu) == "float32"
    assert resolve_weight_dtype("int8", Qwen3Config(), torch.float32, cpu) == "int8"
    assert resolve_weight_dtype("fp8", fp8, torch.bfloat16, gpu) == "bfloat16"  # dequantized on a GPU


def test_kv_cache_dtype_resolution() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_kv_cache_dtype("auto", torch.float32, cpu) == torch.bfloat16
    assert resolve_kv_cache_dtype("auto", torch.float32, gpu) == torch.float32
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, gpu) == torch.bfloat16
    assert resolve_kv_cache_dtype("bfloat16", torch.float32, cpu) == torch.bfloat16
    assert resolve_kv_cache_dtype("int8", torch.bfloat16, cpu) == torch.int8
    assert resolve_kv_cache_dtype("fp8", torch.float32, cpu) == torch.float8_e4m3fn
    with pytest.raises(ValueError, match="'int4' is not one of auto, float32, bfloat16, int8, fp8"):
        resolve_kv_cache_dtype("int4", torch.float32, cpu)
    with pytest.raises(ValueError, match="an? int8 KV cache under bfloat16 activations on cuda is not supported"):
        resolve_kv_cache_dtype("int8", torch.bfloat16, gpu)
    with pytest.raises(ValueError, match="a float32 KV cache under bfloat16 activations on cpu is not supported"):
        resolve_kv_cache_dtype("float32", torch.bfloat16, cpu)
    with pytest.raises(ValueError, match="bfloat16 KV cache under float32 activations on cuda"):
        resolve_kv_cache_dtype("bfloat16", torch.float32, gpu)


def test_fp8_checkpoint_loads_with_its_block_scales(fp8_checkpoint: Path) -> None:
    config = Qwen3Config.from_pretrained(fp8_checkpoint)
    assert config.fp8_block_size == (128, 128)
    loader = WeightLoader(fp8_checkpoint, config)
    weights = loader.load_from_safetensors()
    name = "model.layers.1.mlp.down_proj.weight"  # [200, 328]
    assert weights[name].dtype == torch.float8_e4m3fn and weights[name + "_scale_inv"].shape == (2, 3)
    linear = loader.get_linear(name)
    assert isinstance(linear, QuantizedWeight) and linear.scales.shape == (200, 3)
    expected = _block_dequantize(weights[name], weights[name + "_scale_inv"])
    assert torch.equal(linear.dequantize(), expected)
    assert torch.equal(loader.get_weight(name), expected)  # dense views are dequantized
    assert loader.get_weight("model.norm.weight").dtype == torch.float32  # unquantized tensors as before
    quantized = loader.quantize_to_fp8()
    assert name in quantized and "model.norm.weight" not in quantized


def _rewrite(src: Path, dst: Path, edit_tensors=None, edit_config=None) -> Path:
    shutil.copytree(src, dst)
    if edit_tensors:
        tensors = load_file(dst / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, dst / "model.safetensors")
    if edit_config:
        config = json.loads((dst / "config.json").read_text())
        edit_config(config)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def _load(path: Path) -> None:
    WeightLoader(path, Qwen3Config.from_pretrained(path)).load_from_safetensors()


def test_broken_fp8_checkpoints_are_refused_with_the_reason(fp8_checkpoint: Path, tmp_path: Path) -> None:
    scale = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    missing = _rewrite(fp8_checkpoint, tmp_path / "a", edit_tensors=lambda t: t.pop(scale))
    with pytest.raises(
        ValueError, match="FP8 weight\\(s\\) without _scale_inv: model.layers.0.self_attn.q_proj.weight"
    ):
        _load(missing)
    wrong = _rewrite(fp8_checkpoint, tmp_path / "b", edit_tensors=lambda t: t.update({scale: torch.ones(1, 1)}))
    with pytest.raises(ValueError, match="q_proj.weight_scale_inv.*shape \\(1, 1\\), but the config needs \\(2, 2\\)"):
        _load(wrong)
    unscaled = _rewrite(fp8_checkpoint, tmp_path / "c", edit_config=lambda c: c.pop("quantization_config"))
    with pytest.raises(ValueError, match="is float8_e4m3fn, but config.json has no FP8 quantization_config"):
        _load(unscaled)
    with pytest.raises(ValueError, match="quant_method 'bitsandbytes' is not supported"):
        Qwen3Config(quantization_config={"quant_method": "bitsandbytes"})
    with pytest.raises(ValueError, match="weight_block_size must be two positive integers"):
        Qwen3Config(quantization_config={"quant_method": "fp8"})
