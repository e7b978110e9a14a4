import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from python_layer.model.config import Qwen3Config
from python_layer.model.random_checkpoint import TINY, build_random_checkpoint
from python_layer.model.quantization import FP8_E4M3_MAX
from python_layer.model.weight_loader import WeightLoader, expected_weight_shapes


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _loader(path: Path, **kw) -> WeightLoader:
    return WeightLoader(path, Qwen3Config.from_pretrained(path), **kw)


def test_loads_every_tensor_with_dtype_and_tied_lm_head(tiny_checkpoint: Path) -> None:
    loader = _loader(tiny_checkpoint, dtype=torch.bfloat16)
    weights = loader.load_from_safetensors()
    assert set(weights) == set(expected_weight_shapes(loader.config))
    assert all(w.dtype == torch.bfloat16 for w in weights.values())
    assert loader.get_weight("lm_head.weight") is loader.get_weight("model.embed_tokens.weight")
    raw = load_file(str(tiny_checkpoint / "model.safetensors"))
    name = "model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(loader.get_weight(name), raw[name].to(torch.bfloat16))
    assert loader.get_weight_as_numpy(name).shape == (
        TINY["num_key_value_heads"] * TINY["head_dim"],
        TINY["hidden_size"],
    )
    with pytest.raises(KeyError, match="model.layers.9"):
        loader.get_weight("model.layers.9.mlp.up_proj.weight")


def test_the_embedding_is_kept_as_stored_where_its_rows_widen_exactly(tiny_checkpoint: Path, tmp_path: Path) -> None:
    bf16 = build_random_checkpoint(tmp_path / "bf16", seed=2, dtype=torch.bfloat16, **TINY)
    for path, dtype, held in ((bf16, torch.float32, torch.bfloat16), (bf16, torch.float16, torch.float16),
                              (tiny_checkpoint, torch.float32, torch.float32),
                              (tiny_checkpoint, torch.bfloat16, torch.bfloat16)):
        loader = _loader(path, dtype=dtype)
        loader.load_from_safetensors()
        table = loader.get_embedding()
        assert table.dtype == held
        assert torch.equal(table.to(dtype), loader.get_weight("model.embed_tokens.weight"))


def test_sharded_checkpoint_with_index(checkpoints_dir: Path, tiny_checkpoint: Path) -> None:
    sharded = build_random_checkpoint(checkpoints_dir / "tiny_sharded", seed=0, max_shard_size="20MB", **TINY)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    a, b = _loader(sharded).load_from_safetensors(), _loader(tiny_checkpoint).load_from_safetensors()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_missing_unexpected_and_misshaped_tensors_are_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    raw = load_file(str(ckpt / "model.safetensors"))

    def write(tensors: dict) -> None:
        save_file(tensors, str(ckpt / "model.safetensors"))

    write({k: v for k, v in raw.items() if k != "model.layers.0.self_attn.q_norm.weight"})
    with pytest.raises(ValueError, match="lacks tensor.*model.layers.0.self_attn.q_norm.weight"):
        _loader(ckpt).load_from_safetensors()
    write({**raw, "model.layers.0.mlp.extra.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="Unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        _loader(ckpt).load_from_safetensors()
    write({**raw, "model.layers.1.mlp.down_proj.weight": torch.zeros(64, 100)})
    with pytest.raises(ValueError, match=r"'model.layers.1.mlp.down_proj.weight'.*shape \(64, 100\).*\(64, 128\)"):
        _loader(ckpt).load_from_safetensors()


def test_missing_weights_and_missing_shard(tiny_checkpoint: Path, tmp_path: Path) -> None:
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="No \\*.safetensors"):
        _loader(ckpt).load_from_safetensors()
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "shard-1.safetensors"}})
    )
    with pytest.raises(FileNotFoundError, match="shard-1.safetensors"):
        _loader(ckpt).load_from_safetensors()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        WeightLoader(tmp_path / "nothing", Qwen3Config()).load_from_safetensors()


def test_quantize_to_fp8_is_real_fp8_with_bounded_error(tiny_checkpoint: Path) -> None:
    loader = _loader(tiny_checkpoint)
    weights = loader.load_from_safetensors()
    quantized = loader.quantize_to_fp8()
    projections = [n for n in weights if n.endswith("_proj.weight")]
    assert sorted(quantized) == sorted(projections)
    assert weights.cached == set(projections)  # the embedding and the norms were not read
    for name, q in quantized.items():
        w = weights[name]
        assert q.weight.dtype == torch.float8_e4m3fn and q.weight.shape == w.shape
        assert q.scales.shape == (w.shape[0], -(-w.shape[1] // 128))  # a scale per row and block of 128 columns
        assert (q.weight.float().abs().amax(dim=1) == FP8_E4M3_MAX).all()
        # e4m3: 3 mantissa bits -> relative rounding error <= 2^-4; below the normal range the step is 2^-9 * scale
        bound = w.abs() * 2.0**-4 + q.scales.max(dim=1).values[:, None] * 2.0**-9
        assert ((q.dequantize() - w).abs() <= bound).all(), name
    assert "model.norm.weight" not in quantized and "model.embed_tokens.weight" not in quantized


def test_auto_dtype_is_bfloat16_on_gpus_and_float32_on_cpus() -> None:
    from python_layer.model.weight_loader import parse_dtype

    assert parse_dtype("auto", "cpu") == torch.float32 and parse_dtype("auto", "cuda:0") == torch.bfloat16
    assert parse_dtype("bf16") == torch.bfloat16 and parse_dtype(torch.float16, "cuda") == torch.float16
    with pytest.raises(ValueError, match="auto, float32"):
        parse_dtype("int4")


def test_tensors_are_read_when_asked_for_and_let_go_when_released(tiny_checkpoint: Path) -> None:
    loader = _loader(tiny_checkpoint)
    weights = loader.load_from_safetensors()
    assert weights.cached == set() and "model.layers.1.mlp.up_proj.weight" in weights  # checked, not read
    name = "model.layers.1.mlp.up_proj.weight"
    first = loader.get_weight(name)
    assert weights.cached == {name} and loader.get_weight(name) is first
    loader.release("model.layers.0.")
    assert weights.cached == {name}
    loader.release("model.layers.1.")
    assert weights.cached == set() and torch.equal(loader.get_weight(name), first)


def test_a_built_model_holds_none_of_the_checkpoints_tensors(tiny_checkpoint: Path) -> None:
    from python_layer.model.qwen3_model import Qwen3CausalLM

    loader = _loader(tiny_checkpoint)
    model = Qwen3CausalLM(loader.config, loader, backend="reference")
    assert loader.weights.cached == set()
    raw = load_file(str(tiny_checkpoint / "model.safetensors"))
    assert torch.equal(model.layers[1].down_proj, raw["model.layers.1.mlp.down_proj.weight"].float())
