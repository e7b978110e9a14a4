import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

import python_layer
from python_layer import design_api
from python_layer.design_api import (
    KVCacheAllocator, MessageFormatter, Qwen3Model, QwenTokenizer, RequestMetadata, RequestPhase, Sampler,
    get_tokenizer,
)
from python_layer.inference import generate
from python_layer.inference.inference_engine import InferenceEngine
from python_layer.inference.request import InferenceRequest, RequestStatus
from python_layer.inference.sampler import BatchSampler
from python_layer.inference.sampling_params import SamplingParams
from python_layer.model.config import Qwen3Config
from python_layer.model.loader import load_model
from python_layer.model.weight_loader import WeightLoader
from python_layer.tokenizer.chat_template import parse_response
from python_layer.tokenizer.detokenizer import IncrementalDetokenizer
from python_layer.tokenizer.qwen_tokenizer import ASSETS_DIR

CONFIG = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def test_python_layer_exports_the_design_document_names() -> None:
    for name in ("RequestMetadata", "RequestPhase", "Sampler", "KVCacheAllocator", "QwenTokenizer", "get_tokenizer",
                 "MessageFormatter", "Qwen3Model"):
        assert getattr(python_layer, name) is getattr(design_api, name)
    assert python_layer.load_model is load_model and python_layer.parse_response is parse_response


def test_request_metadata_snapshots_an_engine_request() -> None:
    request = InferenceRequest("r1", "hi", [5, 6, 7], SamplingParams(max_tokens=4),
                               IncrementalDetokenizer(get_tokenizer()), max_total_tokens=7)
    meta = RequestMetadata.from_request(request)
    assert (meta.request_id, meta.prompt_tokens, meta.generated_tokens) == ("r1", [5, 6, 7], [])
    assert (meta.max_tokens, meta.seq_length, meta.phase) == (4, 3, RequestPhase.PREFILL)
    assert not meta.is_complete() and meta.tokens_remaining() == 4

    request.num_cached_tokens = 3
    request.token_ids.append(9)
    meta = RequestMetadata.from_request(request)
    assert meta.phase == RequestPhase.DECODE and meta.generated_tokens == [9] and meta.seq_length == 4
    assert meta.tokens_remaining() == 3 and meta.prompt_tokens == [5, 6, 7]

    request.status, request.finish_reason = RequestStatus.FINISHED, "stop"  # a stop token before max_tokens
    meta = RequestMetadata.from_request(request)
    assert meta.is_complete() and meta.tokens_remaining() == 0
    assert RequestMetadata("r2", [1], max_tokens=2, generated_tokens=[3, 4]).is_complete()


def test_sampler_is_the_batch_sampler_with_the_static_methods() -> None:
    logits = torch.randn(3, 20)
    assert isinstance(Sampler(), BatchSampler)
    assert Sampler()(logits, [SamplingParams(temperature=0.0)] * 3, [None] * 3).token_ids == logits.argmax(-1).tolist()
    assert Sampler.greedy_sampling(logits).tolist() == logits.argmax(-1).tolist()
    assert Sampler.top_k_top_p_sampling(logits, temperature=0.0).tolist() == logits.argmax(-1).tolist()
    tokens = Sampler.top_k_top_p_sampling(logits, temperature=0.7, top_k=2, top_p=1.0)
    top2 = logits.topk(2).indices
    assert all(t in row for t, row in zip(tokens.tolist(), top2.tolist()))
    assert Sampler.temperature_sampling(logits, 1.0).shape == (3,)


def test_kv_cache_allocator_pages_one_at_a_time() -> None:
    alloc = KVCacheAllocator(CONFIG, max_seq_length=48, dtype=torch.float32)
    assert alloc.num_pages == 3 and alloc.get_page(0).shape == (16, 2, 32)
    pages = [alloc.allocate_page() for _ in range(3)]
    with pytest.raises(RuntimeError, match="Insufficient pages"):
        alloc.allocate_page()
    alloc.add_page_reference(pages[0])
    alloc.free_page(pages[0])
    assert alloc.num_free_pages == 0
    alloc.free_page(pages[0])
    assert alloc.allocate_page() == pages[0]


def test_kv_cache_allocator_writes_then_gathers_across_non_contiguous_pages() -> None:
    alloc = KVCacheAllocator(CONFIG, dtype=torch.float32, num_pages=6, page_size=4)
    pages = [5, 1, 3]
    data = torch.randn(10, 2, 32)
    alloc.write_pages(pages, data, cache_type="v", layer=1)
    torch.testing.assert_close(alloc.gather_pages(pages, 10, cache_type="v", layer=1), data)
    torch.testing.assert_close(alloc.get_page(1, "v", layer=1), data[4:8])
    assert alloc.gather_pages(pages, 10, cache_type="k", layer=1).abs().sum() == 0
    with pytest.raises(ValueError, match="cache_type"):
        alloc.get_page(0, "q")
    with pytest.raises(ValueError, match="exceeds"):
        alloc.gather_pages(pages, 13)
    with pytest.raises(ValueError, match="do not fit"):
        alloc.write_pages(pages, torch.randn(13, 2, 32))


def test_batch_encode_matches_transformers() -> None:
    hf_tokenizer = AutoTokenizer.from_pretrained(ASSETS_DIR)
    tok = get_tokenizer()
    assert isinstance(tok, QwenTokenizer) and get_tokenizer() is tok
    texts = ["Hello, world!", "The quick brown fox jumps over the lazy dog.", "你好，世界！今天天气怎么样？",
             "def fib(n: int) -> int:\n    return n", "emoji 🎉🚀", ""]
    ours = tok.batch_encode(texts, max_length=12)
    theirs = hf_tokenizer(texts, padding=True, truncation=True, max_length=12)
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["attention_mask"] == theirs["attention_mask"]
    tensors = tok.batch_encode(texts, max_length=None, return_tensors=True, padding_side="left")
    longest = max(len(tok.encode(t)) for t in texts)
    assert tensors["input_ids"].shape == (6, longest) and tensors["input_ids"].dtype == torch.long
    assert tensors["input_ids"][0, 0] == tok.pad_token_id and tensors["attention_mask"][0, 0] == 0
    with pytest.raises(ValueError, match="padding=True"):
        tok.batch_encode(texts, padding=False, return_tensors=True)


@pytest.mark.parametrize("text", ["<think>\nhmm\n</think>\n\nAnswer", "<think>unfinished", "plain"])
def test_message_formatter_parse_response_is_the_function(text: str) -> None:
    assert MessageFormatter(get_tokenizer()).parse_response(text) == parse_response(text)


PROMPT = "What is machine learning?"


def test_qwen3_model_generate_is_the_engine_on_a_few_pages(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = []

    class RecordingEngine(InferenceEngine):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(generate, "InferenceEngine", RecordingEngine)
    config = Qwen3Config.from_pretrained(tiny_checkpoint)
    model = Qwen3Model(config, WeightLoader(tiny_checkpoint, config), backend="reference")
    text = model.generate(PROMPT, max_tokens=6, temperature=0.0)

    engine = InferenceEngine(load_model(tiny_checkpoint, backend="reference"))
    assert text == engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=6))[0].text
    (used,) = built
    assert used.kv_cache.num_pages == math.ceil((len(get_tokenizer().encode(PROMPT)) + 6) / 16)
    assert used.prefix_cache is None

    # a context shorter than prompt + max_tokens bounds the pages too
    config.max_position_embeddings = 20
    model.generate(PROMPT, max_tokens=100, temperature=0.0)
    assert built[-1].kv_cache.num_pages == 2 and built[-1].max_model_len == 20
