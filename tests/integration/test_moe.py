"""Qwen3-MoE (model_type qwen3_moe) against transformers' Qwen3MoeForCausalLM on random-weight checkpoints of odd
shapes, on both backends (the compiled graph on mili_moe, and the PyTorch reference); and served by `mili serve`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from transformers import Qwen3MoeForCausalLM

from bindings import library
from python_layer import InferenceEngine, SamplingParams
from python_layer.model.embedding_table import QuantizedEmbedding
from python_layer.model.loader import load_model
from python_layer.model.quantization import Int4Weight, QuantizedWeight, write_fp8_checkpoint
from python_layer.model.random_checkpoint import build_random_checkpoint, build_random_gptq_checkpoint
from tests.engine_checks import no_request_holds_pages
from tests.integration.test_parity import _Batch, _prompts, _rel_err
from tests.server.live_server import start_mili_serve

# one xdist worker for the module (`--dist loadgroup`): its model graphs compile once, not once per worker
pytestmark = pytest.mark.xdist_group("moe")

MOE_SHAPES = {
    # norm_topk_prob, a dense layer among sparse ones, untied embeddings
    "normalized_dense_layer": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=40, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=7,
                                   num_experts_per_tok=3, norm_topk_prob=True, mlp_only_layers=[1],
                                   tie_word_embeddings=False),
    # every other layer sparse, top-8 of 10, tied embeddings, weights not renormalised
    "sparse_step_2_top8": dict(hidden_size=48, intermediate_size=72, moe_intermediate_size=20, num_hidden_layers=4,
                               num_attention_heads=6, num_key_value_heads=3, head_dim=8, num_experts=10,
                               num_experts_per_tok=8, norm_topk_prob=False, decoder_sparse_step=2,
                               tie_word_embeddings=True),
}


def _checkpoint(factory: pytest.TempPathFactory, shape: str) -> Path:
    return build_random_checkpoint(factory.mktemp("moe") / shape, seed=3, **MOE_SHAPES[shape])


@pytest.fixture(scope="module", params=sorted(MOE_SHAPES))
def moe_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def moe_dense_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, "normalized_dense_layer")


def _hf(path: Path) -> Qwen3MoeForCausalLM:
    return Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


@torch.inference_mode()
def _hf_greedy(hf: Qwen3MoeForCausalLM, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("backend", ["mojo", "reference"])
def test_moe_logits_match_transformers(moe_checkpoint: Path, backend: str) -> None:
    hf = _hf(moe_checkpoint)
    model = load_model(moe_checkpoint, device="cpu", dtype="float32", backend=backend, kv_cache_dtype="float32")
    assert model.config.model_type == "qwen3_moe"
    sparse = [i for i in range(model.config.num_hidden_layers) if model.config.is_sparse(i)]
    assert 0 < len(sparse) < model.config.num_hidden_layers
    assert all((model.layers[i].router is None) == (i not in sparse) for i in range(len(model.layers)))
    prompts = _prompts(model.config.vocab_size)
    batch = _Batch(model, len(prompts))
    logits = batch.forward(prompts, all_logits=True)  # a batch of mixed lengths
    offset = 0
    for prompt in prompts:
        with torch.inference_mode():
            expected = hf(torch.tensor([prompt])).logits[0].float()
        assert _rel_err(logits[offset : offset + len(prompt)], expected) < 1e-4
        offset += len(prompt)
    # a decode step of every sequence at once, on their cached keys
    step = [[t] for t in (11, 222, 3333)]
    decoded = batch.forward(step, all_logits=False)
    for prompt, token, row in zip(prompts, step, decoded):
        with torch.inference_mode():
            expected = hf(torch.tensor([prompt + token])).logits[0, -1].float()
        assert _rel_err(row, expected) < 1e-4


def test_moe_greedy_tokens_with_chunked_prefill_and_prefix_hits(moe_checkpoint: Path) -> None:
    hf = _hf(moe_checkpoint)
    engine = InferenceEngine.from_pretrained(moe_checkpoint, device="cpu", dtype="float32", max_num_batched_tokens=16,
                                             kv_cache_dtype="float32", enable_prefix_caching=True)
    vocab = engine.model.config.vocab_size
    shared = torch.randint(0, vocab, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    prompts = [shared + [5, 6, 7], shared + [900], _prompts(vocab, seed=2)[1]]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    first = engine.generate(prompts, params)  # 16 tokens a step: the prompts are prefilled in chunks
    again = engine.generate(prompts[:2], params)  # the shared prefix from the prefix cache
    assert engine.prefix_cache.hit_tokens >= 32
    for prompt, out in zip(prompts, first):
        assert out.token_ids == _hf_greedy(hf, prompt, 10)
    assert [o.token_ids for o in again] == [o.token_ids for o in first[:2]]
    assert no_request_holds_pages(engine)


SLOW = pytest.mark.slow


@pytest.mark.parametrize("weight_dtype", [*(pytest.param(w, marks=SLOW) for w in ("bfloat16", "int8", "fp8")), "int4",
                                          "fp8-checkpoint", "gptq-checkpoint"])
def test_moe_weight_formats_match_the_reference_backend(moe_dense_layer: Path, weight_dtype: str,
                                                        tmp_path: Path) -> None:
    """Every CPU format through mili_moe (the kernel tests cover each on its own); "fp8-checkpoint": one in the
    layout of Qwen's FP8 releases (Qwen3-30B-A3B-FP8: each expert's projections FP8 with weight_scale_inv),
    "gptq-checkpoint" of their GPTQ-Int4 ones (the random one the 48-layer benchmark builds), loaded with no flag."""
    path, options = moe_dense_layer, dict(weight_dtype=weight_dtype)
    if weight_dtype == "fp8-checkpoint":
        path, options = write_fp8_checkpoint(moe_dense_layer, tmp_path / "fp8"), {}
    elif weight_dtype == "gptq-checkpoint":
        path = build_random_gptq_checkpoint(tmp_path / "gptq", seed=3, **MOE_SHAPES["normalized_dense_layer"])
        options = {}
    engines = {b: InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", backend=b,
                                                  kv_cache_dtype="float32", enable_prefix_caching=False, **options)
               for b in ("mojo", "reference")}
    layer = next(layer for layer in engines["mojo"].model.layers if layer.router is not None)
    kind = {"int4": Int4Weight, "gptq-checkpoint": Int4Weight, "bfloat16": torch.Tensor}.get(weight_dtype,
                                                                                           QuantizedWeight)
    assert isinstance(layer.experts_gate_up, kind) and isinstance(layer.experts_down, kind)
    if weight_dtype.startswith("fp8"):
        assert layer.experts_gate_up.weight.dtype == torch.float8_e4m3fn
    if weight_dtype == "int8":  # tiled where this CPU reads int8 experts fastest so (linear.mojo's I8_TILED_EXPERTS)
        tiled = library.eager_cpu_module().int8_experts_tiled()
        assert layer.experts_gate_up.weight.dim() == layer.experts_down.weight.dim() == (5 if tiled else 3)
    prompts = _prompts(engines["mojo"].model.config.vocab_size, seed=4)
    logits = [_Batch(e.model, 1).forward([prompts[2]], all_logits=True) for e in engines.values()]
    # the experts' sums in another order than torch's; where x is rounded for the weights (bfloat16, int8 blocks: a
    # step of 1/127), a value on a rounding boundary may land a step apart
    assert _rel_err(logits[0], logits[1]) < (1e-3 if weight_dtype.startswith("fp8") else 2e-2)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert ([o.token_ids for o in engines["mojo"].generate(prompts, params)]
            == [o.token_ids for o in engines["reference"].generate(prompts, params)])


def test_mili_serve_serves_a_moe_checkpoint(moe_dense_layer: Path) -> None:
    proc, url = start_mili_serve(moe_dense_layer, "--served-model-name", "tiny-moe")
    try:
        chat = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny-moe", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6,
            "temperature": 0})
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] == 6
        with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
                "model": "tiny-moe", "prompt": "Once upon", "max_tokens": 5, "stream": True, "ignore_eos": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert "".join(e["choices"][0]["text"] for e in events)
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        proc.terminate()
        proc.wait(60)


def test_moe_gguf_file_loads_with_no_flag(tmp_path: Path) -> None:
    """A Q4_K_M-like qwen3moe GGUF: Q4_K gate / up experts with Q6_K down ones (each in its own bits and blocks in
    mili_moe_int4), and a layer of Q8_0 experts (mili_moe's int8); then `mili serve --model <the file>`."""
    from transformers import AutoModelForCausalLM

    from tests.gguf_files import dequantized_checkpoint, write_gguf
    from tests.integration.test_weight_formats import GREEDY, GREEDY_TOP2, _assert_greedy_agrees, _greedy

    src = build_random_checkpoint(tmp_path / "src", seed=5, dtype=torch.bfloat16, hidden_size=256,
                                  intermediate_size=288, moe_intermediate_size=256, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=6,
                                  num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False)
    experts = "model.layers.0.mlp.experts."
    types = {"model.embed_tokens": "Q4_K", "lm_head": "Q6_K", experts + "gate_proj": "Q4_K",
             experts + "up_proj": "Q4_K", experts + "down_proj": "Q6_K",
             **{f"model.layers.1.mlp.experts.{proj}": "Q8_0" for proj in ("gate_proj", "up_proj", "down_proj")}}
    path = write_gguf(src, tmp_path / "moe.gguf", types, default="Q4_0")
    kv = dict(kv_cache_dtype="float32")
    engine = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", **kv)
    reference = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", backend="reference", **kv)
    # the loader's float32 values against transformers, on the reference backend (as test_weight_formats' GGUF test)
    exact = InferenceEngine.from_pretrained(path, device="cpu", dtype="float32", weight_dtype="float32",
                                            backend="reference", **kv)
    first, second = engine.model.layers
    assert (first.experts_gate_up.bits, first.experts_gate_up.block_k) == (4, 32)
    assert (first.experts_down.bits, first.experts_down.block_k) == (6, 16)
    assert first.experts_gate_up.scales.dtype == first.experts_gate_up.mins.dtype == torch.int8  # Q4_K's codes
    assert first.experts_down.scales.dtype == torch.int8 and first.experts_down.mins.shape == (6, 1, 1, 1)  # Q6_K
    assert isinstance(second.experts_gate_up, QuantizedWeight) and second.experts_down.block_k == 32
    table = exact.model.embed_tokens  # in its Q4_K blocks, mins and all
    assert isinstance(table, QuantizedEmbedding) and table.block == 32 and table.mins is not None
    prompts = _prompts(engine.model.config.vocab_size, seed=5)
    _assert_greedy_agrees(engine.generate(prompts, GREEDY_TOP2), reference.generate(prompts, GREEDY_TOP2))
    hf = AutoModelForCausalLM.from_pretrained(dequantized_checkpoint(path, tmp_path / "dequantized"),
                                              dtype=torch.float32, attn_implementation="eager").eval()
    for prompt, tokens in zip(prompts, _greedy(exact, prompts)):
        assert _hf_greedy(hf, prompt, GREEDY.max_tokens) == tokens
    proc, url = start_mili_serve(path)  # the file itself, as a user passes it
    try:
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "moe.gguf"
        chat = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0})
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] == 6
    finally:
        proc.terminate()
        proc.wait(60)
