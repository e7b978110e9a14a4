"""The model on low-precision weights, end to end on the compiled graph: an FP8 checkpoint in Qwen's layout
against a float32 run of its own dequantized weights, bfloat16 weights against transformers' bfloat16 drift,
int8 and int4 weights (and int8 activations) against the reference backend, AWQ and GPTQ checkpoints as int4 and
against transformers on their dequantized weights; a bfloat16 KV cache under float32 activations against both."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bindings import library
from bindings.reference import untile_weight
from python_layer import InferenceEngine, SamplingParams
from python_layer.model.config import Qwen3Config
from python_layer.model.embedding_table import QuantizedEmbedding
from python_layer.model.int4_checkpoints import write_int4_checkpoint
from python_layer.model.quantization import Int4Weight, QuantizedWeight, convert, write_fp8_checkpoint
from python_layer.model.weight_loader import WeightLoader, expected_weight_shapes
from python_layer.model.random_checkpoint import build_random_checkpoint
from python_layer.model.w8a8_checkpoints import write_w8a8_checkpoint
from tests.integration.test_parity import _Batch, _hf, _hf_logits, _prompts, _rel_err
from tests.unit.test_int4 import INT4_SHAPES
from tests.unit.test_quantization import ODD

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def odd_checkpoint(checkpoints_dir: Path) -> Path:
    return build_random_checkpoint(checkpoints_dir / "odd-dense", seed=3, dtype=torch.bfloat16, **ODD)


@pytest.fixture(scope="module")
def fp8_checkpoint(odd_checkpoint: Path, checkpoints_dir: Path) -> Path:
    return write_fp8_checkpoint(odd_checkpoint, checkpoints_dir / "odd-fp8")


def _greedy(engine: InferenceEngine, prompts: list[list[int]]) -> list[list[int]]:
    return [o.token_ids for o in engine.generate(prompts, GREEDY)]


GREEDY_TOP2 = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
NEAR_TIE = 0.1
"""Log-probabilities of the mojo and reference backends on the same 4-bit weights differ by up to ~0.06 (their
summation orders, over random weights): two tokens closer than this may come out of them either way."""


def _assert_greedy_agrees(ours: list, reference: list) -> None:
    """The same greedy tokens, up to a step where the reference's best two tokens are a near tie (the rest of that
    sequence then follows another token)."""
    for a, b in zip(ours, reference, strict=True):
        for step, (x, y, top) in enumerate(zip(a.token_ids, b.token_ids, b.logprobs, strict=True)):
            if x != y:
                gap = top.top[0][1] - top.top[1][1]
                assert gap < NEAR_TIE, f"step {step}: {x} against the reference's {y}, {gap:.3f} ahead of the next"
                break


def test_fp8_checkpoint_runs_fp8_and_matches_float32_on_its_dequantized_weights(fp8_checkpoint: Path) -> None:
    fp8 = InferenceEngine.from_pretrained(fp8_checkpoint, device="cpu", dtype="float32")  # no flag: the config says FP8
    dense = InferenceEngine.from_pretrained(fp8_checkpoint, device="cpu", dtype="float32", weight_dtype="float32",
                                            backend="reference")  # the float32 graph: test_parity
    layer = fp8.model.layers[0]
    assert fp8.model.weight_dtype == "fp8" and isinstance(layer.gate_up_proj, QuantizedWeight)
    assert layer.gate_up_proj.weight.dtype == torch.float8_e4m3fn
    assert fp8.model.lm_head.dtype == torch.bfloat16  # unquantized in the checkpoint: kept so
    assert fp8.model.embed_tokens.dtype == torch.bfloat16  # as stored: its rows widen to float32 exactly
    assert torch.equal(layer.gate_up_proj.dequantize(), dense.model.layers[0].gate_up_proj)
    prompts = _prompts(fp8.model.config.vocab_size)  # 57 prompt tokens (prefill kernel), then 3 rows (decode kernel)
    assert _greedy(fp8, prompts) == _greedy(dense, prompts)
    logits = [_Batch(e.model, len(prompts)).forward(prompts, all_logits=True) for e in (fp8, dense)]
    # the bfloat16 LM head reads the last hidden state rounded to bfloat16 (reference.effective_x): 2^-9 relative
    assert _rel_err(logits[0], logits[1]) < 2e-3


@pytest.mark.parametrize("shape", ["tiny", "odd"])
def test_w8a8_checkpoint_runs_as_int8_with_no_flag_and_matches_the_reference_backend(
    shape: str, tiny_checkpoint: Path, odd_checkpoint: Path, checkpoints_dir: Path
) -> None:
    """RedHatAI's W8A8 layout (compressed-tensors, int8 per channel, activations per token): the checkpoint's int8
    values in one block of all K columns, on the AMX / VNNI tiles (tiny: K a multiple of 64) and off them (odd)."""
    path = write_w8a8_checkpoint(tiny_checkpoint if shape == "tiny" else odd_checkpoint,
                                 checkpoints_dir / f"{shape}-w8a8")
    engines = {b: InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", backend=b,
                                                  kv_cache_dtype="float32")
               for b in ("mojo", "reference")}
    model = engines["mojo"].model
    assert model.weight_dtype == "int8" and model.lm_head.dtype == torch.bfloat16  # unquantized in the checkpoint
    down = model.layers[0].down_proj
    assert isinstance(down, QuantizedWeight) and down.scales.shape[0 if down.weight.dim() == 4 else 1] == 1  # one block
    prompts = _prompts(model.config.vocab_size, seed=1)  # a prefill of 57 tokens, then decode steps of 3 rows
    assert _greedy(engines["mojo"], prompts) == _greedy(engines["reference"], prompts)
    logits = [_Batch(e.model, len(prompts)).forward(prompts, all_logits=True) for e in engines.values()]
    # the kernels match the reference to 3e-7 a linear; an activation rounded to int8 the other way on float32 sums
    # in another order grows from layer to layer: 1e-3 here on tiny, 2.7e-2 on odd
    assert _rel_err(logits[0], logits[1]) < 5e-2


def test_bfloat16_weights_drift_no_more_than_transformers_bfloat16(tiny_checkpoint: Path) -> None:
    from transformers import Qwen3ForCausalLM

    hf_bf16 = Qwen3ForCausalLM.from_pretrained(
        tiny_checkpoint, dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()
    engine = InferenceEngine.from_pretrained(tiny_checkpoint, dtype="float32", weight_dtype="bfloat16")
    assert engine.model.layers[0].qkv_proj.dtype == torch.bfloat16 and engine.model.embed_tokens.dtype == torch.float32
    # in the decode kernel's tiled layout (reference.tile_weight), every projection and the LM head
    assert (
        all(
            w.dim() == 4
            for layer in engine.model.layers
            for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
        )
        and engine.model.lm_head.dim() == 4
    )
    prompt = _prompts(engine.model.config.vocab_size)[2]
    exact = _hf_logits(_hf(tiny_checkpoint), prompt)
    ours = _rel_err(_Batch(engine.model, 1).forward([prompt], all_logits=True), exact)
    theirs = _rel_err(_hf_logits(hf_bf16, prompt), exact)
    assert ours < min(theirs, 5e-2), (ours, theirs)


def test_int8_weights_match_the_reference_backend_and_stay_near_float32(tiny_checkpoint: Path) -> None:
    engines = {b: InferenceEngine.from_pretrained(tiny_checkpoint, dtype="float32", weight_dtype="int8", backend=b)
               for b in ("mojo", "reference")}
    # tiled (reference.tile_weight) where the CPU multiplies int8 quads (VNNI or AVX2)
    tiled = library.eager_cpu_module().int8_tiled()
    assert all(w.weight.dim() == (4 if tiled else 2) for layer in engines["mojo"].model.layers
               for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj))
    assert engines["reference"].model.layers[0].qkv_proj.weight.dim() == 2
    prompts = _prompts(engines["mojo"].model.config.vocab_size, seed=1)
    assert _greedy(engines["mojo"], prompts) == _greedy(engines["reference"], prompts)
    exact = _hf_logits(_hf(tiny_checkpoint), prompts[2])
    # int8 weights (a step is 1/254 of the block's largest |weight|) times int8 activations, as llama.cpp's q8_0:
    # 5.3% here, 3.4% with float32 activations, transformers' bfloat16 2.2%
    assert _rel_err(_Batch(engines["mojo"].model, 1).forward([prompts[2]], all_logits=True), exact) < 8e-2


def test_bfloat16_kv_cache_matches_the_reference_backend_and_drifts_less_than_transformers_bfloat16(
    tiny_checkpoint: Path,
) -> None:
    from transformers import Qwen3ForCausalLM

    engines = {
        b: InferenceEngine.from_pretrained(tiny_checkpoint, dtype="float32", kv_cache_dtype="bfloat16", backend=b)
        for b in ("mojo", "reference")
    }
    cache = engines["mojo"].kv_cache
    assert all(c.dtype == torch.bfloat16 for c in cache.k_caches + cache.v_caches)
    prompts = _prompts(engines["mojo"].model.config.vocab_size, seed=2)  # prefill, then decode over the cache
    assert _greedy(engines["mojo"], prompts) == _greedy(engines["reference"], prompts)
    logits = [_Batch(e.model, len(prompts)).forward(prompts, all_logits=True) for e in engines.values()]
    # K / V rounded alike; with AVX512_BF16 the prefill's attention rounds q and its softmax weights to bfloat16 too
    # (vdpbf16ps: 4e-3 here, 2e-5 without: float32 sums in another order)
    assert _rel_err(logits[0], logits[1]) < 1e-2
    exact = _hf_logits(_hf(tiny_checkpoint), prompts[2])
    ours = _rel_err(_Batch(engines["mojo"].model, 1).forward([prompts[2]], all_logits=True), exact)
    hf_bf16 = Qwen3ForCausalLM.from_pretrained(
        tiny_checkpoint, dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()
    assert ours < _rel_err(_hf_logits(hf_bf16, prompts[2]), exact), ours


@pytest.mark.parametrize("dtype, kv", [("float32", "int8"), ("bfloat16", "fp8")])
def test_8bit_kv_cache_matches_the_reference_backend_and_stays_near_float32(tiny_checkpoint: Path, dtype: str,
                                                                           kv: str) -> None:
    """int8 K/V (a scale per token and head) and FP8 e4m3 ones under either activation dtype: the model graph's
    attention over them against the reference backend's (bindings/reference.py), and the drift from float32."""
    engines = {b: InferenceEngine.from_pretrained(tiny_checkpoint, dtype=dtype, kv_cache_dtype=kv, backend=b)
               for b in ("mojo", "reference")}
    cache, c = engines["mojo"].kv_cache, engines["mojo"].model.config
    want = {"int8": (torch.int8, c.head_dim + 4), "fp8": (torch.float8_e4m3fn, c.head_dim)}[kv]
    assert all((t.dtype, t.shape[-1]) == want for t in cache.k_caches + cache.v_caches)
    prompts = _prompts(c.vocab_size, seed=5)  # prefill, then decode over the cache
    assert _greedy(engines["mojo"], prompts) == _greedy(engines["reference"], prompts)
    logits = [_Batch(e.model, 1).forward([prompts[2]], all_logits=True) for e in engines.values()]
    assert _rel_err(logits[0], logits[1]) < 2e-2  # an 8-bit value one step apart here and there
    exact = _hf_logits(_hf(tiny_checkpoint), prompts[2])
    assert _rel_err(logits[0], exact) < {"int8": 3e-2, "fp8": 1e-1}[kv]


def test_int4_weights_match_the_reference_backend_and_stay_near_float32(tiny_checkpoint: Path) -> None:
    engines = {b: InferenceEngine.from_pretrained(tiny_checkpoint, dtype="float32", weight_dtype="int4", backend=b,
                                                  kv_cache_dtype="float32")
               for b in ("mojo", "reference")}
    model = engines["mojo"].model
    assert all(isinstance(w, Int4Weight) for layer in model.layers
               for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj))
    assert isinstance(model.lm_head, Int4Weight) and model.lm_head.bits == 6
    prompts = _prompts(model.config.vocab_size, seed=4)
    assert _greedy(engines["mojo"], prompts) == _greedy(engines["reference"], prompts)
    logits = [_Batch(e.model, 1).forward([prompts[2]], all_logits=True) for e in engines.values()]
    assert _rel_err(logits[0], logits[1]) < 1e-4  # the same int8 x and 4-bit weights: float32 sums in another order
    # against float32: no further than transformers on the same int4 (and 6-bit LM head) weights, give or take the
    # activations' rounding to int8
    hf = _hf(tiny_checkpoint)
    exact = _hf_logits(hf, prompts[2])
    for name, param in hf.state_dict().items():
        if name.endswith("_proj.weight") or name == "lm_head.weight":
            fmt = "int6" if name == "lm_head.weight" else "int4"
            param.copy_(convert(param.detach().clone(), fmt, torch.float32).dequantize())
    weights_only = _rel_err(_hf_logits(hf, prompts[2]), exact)
    assert _rel_err(logits[0], exact) < 1.25 * weights_only, (_rel_err(logits[0], exact), weights_only)


@pytest.fixture(scope="module")
def int4_dense(checkpoints_dir: Path) -> Path:
    return build_random_checkpoint(checkpoints_dir / "int4-dense", seed=6, dtype=torch.bfloat16,
                                   **{**INT4_SHAPES, "num_hidden_layers": 2})


def _hf_on_dequantized(path: Path) -> "torch.nn.Module":
    """transformers' float32 Qwen3 on a 4-bit checkpoint's weights, dequantized by MILI's loader."""
    from transformers import Qwen3ForCausalLM

    config = Qwen3Config.from_pretrained(path)
    loader = WeightLoader(path, config)
    loader.load_from_safetensors()
    state = {name: loader.get_weight(name) for name in expected_weight_shapes(config)}
    hf = Qwen3ForCausalLM(Qwen3ForCausalLM.config_class(**{k: v for k, v in config.to_dict().items()
                                                              if k != "quantization_config"},
                                                           attn_implementation="eager")).eval()
    hf.load_state_dict(state, strict=False)
    return hf


# one xdist worker for the three (`--dist loadgroup`): their model graphs compile once, not once per worker
@pytest.mark.xdist_group("awq_and_gptq")
@pytest.mark.parametrize("method, options", [("awq", {}), ("gptq", dict(sym=True)),
                                             ("gptq", dict(sym=False, desc_act=True))])
def test_awq_and_gptq_checkpoints_load_with_no_flag(int4_dense: Path, tmp_path: Path, method: str,
                                                    options: dict) -> None:
    path = write_int4_checkpoint(int4_dense, tmp_path / method, method, **options)
    kv = dict(kv_cache_dtype="float32")
    engine = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", **kv)  # no flag: the config says
    reference = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", backend="reference", **kv)
    exact = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", weight_dtype="float32", **kv)
    repacked = not options.get("desc_act")  # desc_act's groups follow g_idx: dequantized, dense
    assert engine.model.weight_dtype == "int4"
    assert isinstance(engine.model.layers[0].qkv_proj, Int4Weight) == repacked
    assert engine.model.embed_tokens.dtype == exact.model.embed_tokens.dtype == torch.float16  # as these store it
    # the int4 weights are the exact ones but for their mins -z * s rounded to float16
    ours, theirs = _dequantized(engine.model.layers[1].down_proj), _dequantized(exact.model.layers[1].down_proj)
    assert (ours - theirs).abs().max() <= theirs.abs().max() * 2.0**-10
    prompts = _prompts(engine.model.config.vocab_size, seed=5)
    _assert_greedy_agrees(engine.generate(prompts, GREEDY_TOP2), reference.generate(prompts, GREEDY_TOP2))
    # the same dequantized weights in float32 (MILI's --weight-dtype float32 and transformers): the same tokens
    hf = _hf_on_dequantized(path)
    for prompt, tokens in zip(prompts, _greedy(exact, prompts)):
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=GREEDY.max_tokens, do_sample=False,
                          min_new_tokens=GREEDY.max_tokens)
        assert out[0, len(prompt):].tolist() == tokens


def _dequantized(weight) -> torch.Tensor:
    """A weight as [N, K] values: float32 ones may be tiled as panels (reference.tile_weight)."""
    if isinstance(weight, torch.Tensor):
        return untile_weight(weight) if weight.dim() == 4 else weight
    return weight.dequantize()


PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
GGUF_LAYER_TYPES = [("Q4_K", "Q4_K", "Q6_K", "Q5_1", "Q4_K", "Q4_1", "Q5_0"),
                    ("Q4_0", "F16", "Q4_0", "Q8_0", "Q5_K", "Q5_K", "Q8_0")]
GGUF_TYPES = {"model.embed_tokens": "Q6_K", **{f"model.layers.{i}.{proj}": qtype
                                               for i, types in enumerate(GGUF_LAYER_TYPES)
                                               for proj, qtype in zip(PROJECTIONS, types, strict=True)}}
"""A Q4_K_M-like mix (Q4_K q / k with a Q6_K v: the fused qkv in the 6-bit blocks of 16 that hold both) and every
other type, an F16 k among 4-bit q / v (that qkv dense)."""


def test_gguf_file_loads_with_no_flag_in_its_own_formats(checkpoints_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from tests.gguf_files import dequantized_checkpoint, write_gguf
    from tests.unit.test_gguf import GGUF_SHAPES

    src = build_random_checkpoint(checkpoints_dir / "gguf-src", seed=7, dtype=torch.bfloat16, **GGUF_SHAPES)
    path = write_gguf(src, tmp_path / "mix.gguf", GGUF_TYPES)
    kv = dict(kv_cache_dtype="float32")
    engine = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", **kv)  # no flag: the file says
    reference = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", backend="reference", **kv)
    # the loader's float32 values, checked against transformers on the reference backend: the kernels on the file's
    # formats are checked against that backend above, and the float32 graph by test_parity
    exact = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", weight_dtype="float32",
                                            backend="reference", **kv)
    first, second = engine.model.layers
    assert engine.model.weight_dtype == "int4"
    assert (first.qkv_proj.bits, first.qkv_proj.block_k, first.gate_up_proj.bits, first.down_proj.bits) == (6, 16, 4, 6)
    assert isinstance(second.qkv_proj, torch.Tensor) and isinstance(second.down_proj, QuantizedWeight)
    assert (engine.model.lm_head.bits, engine.model.lm_head.block_k) == (6, 16)  # the tied Q6_K embedding
    # K-quants keep their codes (Q5_K gate / up, Q6_K LM head); a mix of them with others, float16 scales and mins
    assert second.gate_up_proj.supers is not None and engine.model.lm_head.supers is not None
    assert first.qkv_proj.supers is None and first.gate_up_proj.supers is None
    for table in (engine.model.embed_tokens, exact.model.embed_tokens):  # in its Q6_K blocks: 1.5 bytes a value
        assert isinstance(table, QuantizedEmbedding) and table.block == 16 and table.mins is None
    # a format asked for converts every weight (as a GPU, which dequantizes them to its dtype)
    assert all(isinstance(w, torch.Tensor) and w.dtype == torch.float32 for w in exact.model.decode_weights())
    prompts = _prompts(engine.model.config.vocab_size, seed=5)
    _assert_greedy_agrees(engine.generate(prompts, GREEDY_TOP2), reference.generate(prompts, GREEDY_TOP2))
    # gguf-py's values in float32 (MILI's loader at --weight-dtype float32 and transformers): the same tokens
    hf = AutoModelForCausalLM.from_pretrained(dequantized_checkpoint(path, tmp_path / "dequantized"),
                                              dtype=torch.float32, attn_implementation="eager").eval()
    for prompt, tokens in zip(prompts, _greedy(exact, prompts)):
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=GREEDY.max_tokens, do_sample=False,
                          min_new_tokens=GREEDY.max_tokens)
        assert out[0, len(prompt):].tolist() == tokens
