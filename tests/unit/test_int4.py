"""4-bit weights: MILI's int4 quantization, and Qwen's AWQ / GPTQ checkpoints read as they are, checked against
dequantizers written here from the layouts' definitions (AutoAWQ's nibble order, GPTQ's v1 zeros), bit by bit."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bindings import reference
from python_layer.model.config import Qwen3Config
from python_layer.model.int4_checkpoints import Int4Checkpoint, write_int4_checkpoint
from python_layer.model.qwen3_model import resolve_weight_dtype
from python_layer.model.quantization import (INT4_BLOCK_K, INT4_STEPS, Int4Weight, cat_rows, convert, expert,
                                             quantize_int4, stack_experts)
from python_layer.model.random_checkpoint import GPTQ_INT4, build_random_checkpoint, build_random_gptq_checkpoint
from python_layer.model.weight_loader import WeightLoader

# K a multiple of 128 (AWQ's groups must divide it), N not a multiple of 64: q 640, k / v 80, gate / up 640, down
# K 640
INT4_SHAPES = dict(hidden_size=384, intermediate_size=640, num_hidden_layers=1, num_attention_heads=16,
                   num_key_value_heads=2, head_dim=40, tie_word_embeddings=True)
LAYER = "model.layers.0.self_attn.k_proj"


def _words(t: torch.Tensor) -> list[list[int]]:
    return (t.to(torch.int64) & 0xFFFFFFFF).tolist()


def _awq_dequantize(tensors: dict, group: int) -> torch.Tensor:
    """AutoAWQ's GEMM layout by its definition: word c of row k packs columns 8c + [0, 2, 4, 6, 1, 3, 5, 7] in
    nibbles 0..7; w[n, k] = (q - z) * s."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    qweight, qzeros, scales = _words(tensors["qweight"]), _words(tensors["qzeros"]), tensors["scales"].float()
    k, n = len(qweight), scales.shape[1]
    w = torch.zeros(n, k)
    for row in range(k):
        for c in range(n // 8):
            for i in range(8):
                col = 8 * c + order[i]
                q = (qweight[row][c] >> (4 * i)) & 15
                z = (qzeros[row // group][c] >> (4 * i)) & 15
                w[col, row] = (q - z) * scales[row // group, col]
    return w


def _gptq_dequantize(tensors: dict, bits: int) -> torch.Tensor:
    """GPTQ's v1 layout by its definition: qweight word r of column n packs rows (32 / bits) r + i, qzeros word c of
    group g packs columns (32 / bits) c + i, each value i at bits i * bits; the zeros stored minus one."""
    per, mask = 32 // bits, (1 << bits) - 1
    qweight, qzeros = _words(tensors["qweight"]), _words(tensors["qzeros"])
    scales, g_idx = tensors["scales"].float(), tensors["g_idx"].tolist()
    k, n = len(g_idx), scales.shape[1]
    w = torch.zeros(n, k)
    for row in range(k):
        g = g_idx[row]
        for col in range(n):
            q = (qweight[row // per][col] >> (bits * (row % per))) & mask
            z = ((qzeros[g][col // per] >> (bits * (col % per))) & mask) + 1
            w[col, row] = (q - z) * scales[g, col]
    return w


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_checkpoint(tmp_path_factory.mktemp("int4") / "dense", seed=5, dtype=torch.bfloat16,
                                   **INT4_SHAPES)


def _layer(path: Path) -> dict:
    tensors = load_file(path / "model.safetensors")
    return {name.rpartition(".")[2]: t for name, t in tensors.items() if name.startswith(LAYER + ".")}


def _read(path: Path, packed: bool = True) -> object:
    config = Qwen3Config.from_pretrained(path)
    loader = WeightLoader(path, config)
    loader.load_from_safetensors()
    return loader.get_linear(LAYER + ".weight", packed)


def _assert_repacked(weight: Int4Weight, theirs: torch.Tensor) -> None:
    """weight is theirs up to its mins -z * s rounded to float16 (half a float16 step of each min at most)."""
    mins = weight.block_scales()[1].float().t().repeat_interleave(weight.block_k, dim=1)[:, : weight.in_features]
    assert weight.block_k == INT4_BLOCK_K and weight.scales.dtype == torch.float16
    assert ((weight.dequantize() - theirs).abs() <= mins.abs() * 2.0**-11).all()


@pytest.mark.parametrize("bits", [4, 6])
def test_quantize_int4_error_and_round_trip(bits: int) -> None:
    w = torch.randn(37, 300) * torch.rand(37, 1) * 3
    levels = 2**bits - 1
    q = quantize_int4(w, bits=bits)
    blocks = -(-300 // INT4_BLOCK_K)
    assert q.packed.shape == (2, 38 * 32 * bits) and q.scales.shape == q.mins.shape == (2, blocks, 32)
    assert q.scales.dtype == q.mins.dtype == torch.float16
    assert (q.in_features, q.out_features, q.bits) == (300, 37, bits)
    assert not q.scales[1, :, 5:].any() and not q.mins[1, :, 5:].any()  # the last tile's rows past N
    values = q.values()
    assert int(values.max()) <= levels and torch.equal(reference.pack_int4(values, bits), q.packed)
    err = (q.dequantize() - w).abs().view(37, -1)
    # min..max rounding is half a step of the block's range off at most; the least-squares fit trades the extremes'
    # error for the bulk's, up to about one such step
    padded = torch.nn.functional.pad(w, (0, blocks * INT4_BLOCK_K - 300), value=float("nan")).view(37, blocks, -1)
    spread = (padded.nan_to_num(-1e9).amax(2) - padded.nan_to_num(1e9).amin(2)).repeat_interleave(INT4_BLOCK_K, 1)
    spread = spread[:, :300]
    assert (err <= spread / levels * 1.5).all()
    # the least-squares fit does better than min..max rounding
    assert (q.dequantize() - w).norm() < 0.99 * (_minmax_int4(w, levels) - w).norm()
    stacked = cat_rows([q, quantize_int4(w[:5], bits=bits)])
    assert isinstance(stacked, Int4Weight) and stacked.packed.shape[0] == 2 and stacked.bits == bits  # 42 rows
    assert torch.equal(stacked.dequantize(), torch.cat([q.dequantize(), quantize_int4(w[:5], bits=bits).dequantize()]))
    assert torch.equal(convert(q, "float32", torch.float32), q.dequantize())
    assert convert(w, f"int{bits}", torch.float32).packed.shape == q.packed.shape
    other = 10 - bits
    assert convert(q, f"int{other}", torch.float32).bits == other
    # other bits and blocks: stacked in the layout that holds both (6 bits, the smaller block), the same values
    narrower = quantize_int4(w[:5], block_k=32, bits=other)
    mixed = cat_rows([q, narrower])
    assert (mixed.bits, mixed.block_k) == (6, 32)
    assert torch.equal(mixed.dequantize(), torch.cat([q.dequantize(), narrower.dequantize()]))
    assert torch.equal(cat_rows([q, w[:5]]), torch.cat([q.dequantize(), w[:5]]))  # with a dense one: dense
    with pytest.raises(ValueError, match="cannot stack 4-bit weights of different input sizes"):
        cat_rows([q, quantize_int4(w[:5, :64], bits=bits)])


@pytest.mark.parametrize("bits", [4, 6])
def test_quantize_int4_keeps_each_blocks_least_squares_best(bits: int) -> None:
    """quantize_int4 scores its ranges from each block's sums: its pick against every range's values fitted here
    directly in float64 (a block of constant values included, whose values all round alike)."""
    w = torch.randn(9, 300) * torch.rand(9, 1) * 3
    w[2, :INT4_BLOCK_K] = 0.25
    q = quantize_int4(w, bits=bits)
    levels, blocks = 2**bits - 1, -(-300 // INT4_BLOCK_K)
    def blocked(t: torch.Tensor) -> torch.Tensor:  # [9, blocks, 64], the last block padded with its last column
        padded = torch.nn.functional.pad(t.double(), (0, blocks * INT4_BLOCK_K - 300), mode="replicate")
        return padded.view(9, blocks, -1)

    padded, chosen = blocked(w), blocked(q.values())

    def best_fit_error(values: torch.Tensor) -> torch.Tensor:
        design = torch.stack([values, torch.ones_like(values)], -1)
        coefficients = torch.linalg.lstsq(design, padded[..., None]).solution
        return ((design @ coefficients)[..., 0] - padded).pow(2).sum(-1)

    single = padded.float()  # the ranges' values as quantize_int4 rounds them, in float32
    low, high = single.amin(-1, keepdim=True), single.amax(-1, keepdim=True)
    tried = [best_fit_error((((single - low) * ((levels + step) / (high - low).clamp(min=1e-12))).round()
                             .clamp(0, levels)).double()) for step in INT4_STEPS]
    # float32 sums may pick a near tie: within 1% of the best
    assert (best_fit_error(chosen) <= torch.stack(tried).amin(0) * 1.01 + 1e-12).all()


def test_a_zero_points_mins_are_held_once_and_mixes_hold_them_all() -> None:
    q = torch.randint(0, 64, (37, 96), dtype=torch.uint8)
    scales = (torch.rand(96 // 16, 37) * 0.01 + 1e-3).half().float()  # float16's, normal: -32 x them exact
    shared = Int4Weight.of(q, scales, None, 16, bits=6, zero=32)  # Q6_K's
    own = Int4Weight.of(q, scales, -32 * scales, 16, bits=6)
    assert shared.zero == 32 and own.zero is None and shared.mins.numel() == 1
    assert torch.equal(shared.dequantize(), own.dequantize())
    assert cat_rows([shared, shared]).zero == 32  # one zero point: still held once
    asym = quantize_int4(torch.randn(5, 96), block_k=32)
    for mixed in (cat_rows([shared, asym]), stack_experts([shared, own])):
        assert mixed.zero is None and mixed.mins.shape == mixed.scales.shape
    assert torch.equal(cat_rows([shared, asym]).dequantize()[:37], own.dequantize())
    experts = stack_experts([shared, own])
    assert all(torch.equal(expert(experts, e).dequantize(), own.dequantize()) for e in range(2))


def test_int4_refuses_weights_beyond_float16() -> None:
    with pytest.raises(ValueError, match="weights too large for int4's float16 scales .* use --weight-dtype int8"):
        quantize_int4(torch.randn(4, 64) * 1e6)


def test_6bit_values_are_4x_more_accurate_than_4bit() -> None:
    w = torch.randn(64, 512)
    errors = [(quantize_int4(w, bits=b).dequantize() - w).norm() / w.norm() for b in (4, 6)]
    assert errors[1] < errors[0] / 3.5, errors


def _minmax_int4(w: torch.Tensor, levels: int) -> torch.Tensor:
    blocks = -(-w.shape[1] // INT4_BLOCK_K)
    blocks = torch.nn.functional.pad(w, (0, blocks * INT4_BLOCK_K - w.shape[1]), mode="replicate").view(
        w.shape[0], blocks, -1)
    low, high = blocks.amin(2, keepdim=True), blocks.amax(2, keepdim=True)
    scale = (high - low) / levels
    return (((blocks - low) / scale).round() * scale + low).view(w.shape[0], -1)[:, :300]


def test_awq_checkpoint_reads_into_int4_exactly(dense: Path, tmp_path: Path) -> None:
    path = write_int4_checkpoint(dense, tmp_path / "awq", "awq")
    theirs = _awq_dequantize(_layer(path), 128)
    _assert_repacked(_read(path), theirs)
    assert torch.equal(_read(path, packed=False), theirs)
    # the bfloat16 source's dtype key(s) now say float16, as these checkpoints are, none left stale
    dtypes = lambda p: {json.loads((p / "config.json").read_text()).get(key) for key in ("dtype", "torch_dtype")}
    assert "bfloat16" in dtypes(dense) and dtypes(path) - {None} == {"float16"}
    config = Qwen3Config.from_pretrained(path)
    assert resolve_weight_dtype("auto", config, torch.float32, torch.device("cpu")) == "int4"
    assert resolve_weight_dtype("auto", config, torch.bfloat16, torch.device("cuda")) == "bfloat16"


@pytest.mark.parametrize("bits, group, sym, desc_act, repacked", [
    (4, 128, True, False, True),
    (4, 128, False, False, True),
    (4, 256, True, False, True),  # each group's scale over its blocks of 64
    (4, 64, False, False, True),
    (4, -1, False, False, True),
    (4, 32, True, False, False),  # groups smaller than the kernel's blocks: dequantized
    (4, 128, False, True, False),  # desc_act: groups in g_idx's order
    (8, 128, True, False, False),
])
def test_gptq_checkpoint_reads_exactly(dense: Path, tmp_path: Path, bits: int, group: int, sym: bool,
                                       desc_act: bool, repacked: bool) -> None:
    path = write_int4_checkpoint(dense, tmp_path / "gptq", "gptq", bits=bits, group_size=group, sym=sym,
                                 desc_act=desc_act)
    weight = _read(path)
    assert isinstance(weight, Int4Weight) == repacked
    theirs = _gptq_dequantize(_layer(path), bits)
    if repacked:
        _assert_repacked(weight, theirs)
        assert weight.zero == (8 if sym else None)  # sym's one zero point: one min per scale, no mins stored
    assert torch.equal(_read(path, packed=False), theirs)
    dense_weight = load_file(dense / "model.safetensors")[LAYER + ".weight"].float()
    assert (theirs - dense_weight).norm() < (0.15 if bits == 4 else 0.01) * dense_weight.norm()


def test_random_gptq_checkpoint_is_in_qwens_layout(tmp_path: Path) -> None:
    """build_random_gptq_checkpoint (the 48-layer Qwen3-30B-A3B benchmark's) writes GPTQ-Int4 as Qwen's releases
    have it: sharded with an index, symmetric 4-bit groups of 128 in order, read by MILI as int4 repacked exactly."""
    shape = {**INT4_SHAPES, "num_hidden_layers": 2}
    path = build_random_gptq_checkpoint(tmp_path / "gptq", seed=2, **shape)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization_config"] == GPTQ_INT4 and config["num_hidden_layers"] == 2
    assert sorted(p.name for p in path.glob("*.safetensors")) == [f"model-0000{i}-of-00003.safetensors"
                                                                   for i in (1, 2, 3)]
    tensors = {name.rpartition(".")[2]: t for name, t in load_file(path / "model-00002-of-00003.safetensors").items()
               if name.startswith(LAYER + ".")}
    assert (tensors["qzeros"] == 0x77777777).all() and torch.equal(tensors["g_idx"], torch.arange(384) // 128)
    theirs = _gptq_dequantize(tensors, 4)
    assert 0.015 < theirs.std() < 0.025
    weight = _read(path)
    assert isinstance(weight, Int4Weight)
    _assert_repacked(weight, theirs)


def test_bad_4bit_configs_are_refused(dense: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GEMM layout with 4 bits and zero points"):
        Int4Checkpoint.from_config({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})
    with pytest.raises(ValueError, match="bits 3 is not supported"):
        Int4Checkpoint.from_config({"quant_method": "gptq", "bits": 3, "group_size": 128})
    with pytest.raises(ValueError, match="group_size must be a positive integer or -1"):
        Int4Checkpoint.from_config({"quant_method": "gptq", "bits": 4, "group_size": 0})
    path = write_int4_checkpoint(dense, tmp_path / "awq", "awq")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "bitsandbytes"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="loads FP8, AWQ, GPTQ and W8A8 checkpoints"):
        Qwen3Config.from_pretrained(path)
