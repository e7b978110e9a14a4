"""InferenceEngine behaviour on the tiny checkpoint: stops, limits, aborts, errors, per-request sampling."""

from pathlib import Path

import pytest

from python_layer import InferenceEngine, SamplingParams
from python_layer.model.qwen3_model import check_backend
from tests.engine_checks import no_request_holds_pages

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def test_text_prompt_output(tiny_engine: InferenceEngine) -> None:
    out = tiny_engine.generate("Hello, world!", GREEDY)[0]
    assert out.prompt_token_ids == [9707, 11, 1879, 0] and out.prompt == "Hello, world!"
    assert len(out.token_ids) == 10 and out.finish_reason == "length"
    assert out.text == tiny_engine.tokenizer.decode(out.token_ids)
    assert no_request_holds_pages(tiny_engine)


def test_steps_hand_out_only_what_is_new(tiny_engine: InferenceEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    request_id = tiny_engine.add_request("Once upon a time", params)
    deltas = []
    while tiny_engine.has_unfinished_requests():
        deltas += tiny_engine.step()
    final = tiny_engine.get_completed_result(request_id)
    assert [len(d.token_ids) for d in deltas] == [1] * 12
    assert [t for d in deltas for t in d.token_ids] == final.token_ids
    assert "".join(d.text for d in deltas) == final.text == tiny_engine.tokenizer.decode(final.token_ids)
    assert [lp for d in deltas for lp in d.logprobs] == final.logprobs
    assert [d.finish_reason for d in deltas] == [None] * 11 + ["length"]


def test_stop_string_text_is_held_back_until_settled(tiny_engine: InferenceEngine) -> None:
    full = tiny_engine.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    stop = full.text.strip()[3:6]
    request_id = tiny_engine.add_request("Once upon a time", SamplingParams(temperature=0.0, max_tokens=12,
                                                                            ignore_eos=True, stop=[stop, "@@@@@@"]))
    sent = ""
    while tiny_engine.has_unfinished_requests():
        for delta in tiny_engine.step():
            sent += delta.text
            assert stop not in sent
    assert sent == tiny_engine.get_completed_result(request_id).text == full.text[: full.text.index(stop)]


def test_stop_token_ids_and_eos(tiny_engine: InferenceEngine) -> None:
    tokens = tiny_engine.generate([[1, 2, 3]], GREEDY)[0].token_ids
    stop_token = tokens[3]
    first = tokens.index(stop_token)
    out = tiny_engine.generate(
        [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_token])
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == tokens[: first + 1]

    saved = tiny_engine.eos_token_ids
    tiny_engine.eos_token_ids = {stop_token}
    try:
        out = tiny_engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=10))[0]
        assert out.finish_reason == "stop" and out.token_ids == tokens[: first + 1]
        ignored = tiny_engine.generate([[1, 2, 3]], GREEDY)[0]
        assert ignored.token_ids == tokens and ignored.finish_reason == "length"
    finally:
        tiny_engine.eos_token_ids = saved


def test_stop_string_truncates_text(tiny_engine: InferenceEngine) -> None:
    full = tiny_engine.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    stop = full.text.strip()[3:6]
    assert stop, full.text
    out = tiny_engine.generate(
        "Once upon a time", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    )[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert full.token_ids[: len(out.token_ids)] == out.token_ids


def test_per_request_parameters_in_one_batch(tiny_engine: InferenceEngine) -> None:
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [5, 6, 7]]
    alone = tiny_engine.generate([prompts[0]], GREEDY)[0].token_ids
    seeded = SamplingParams(temperature=1.0, top_k=50, seed=123, max_tokens=10, ignore_eos=True)
    sampled_alone = tiny_engine.generate([prompts[1]], seeded)[0].token_ids
    outs = tiny_engine.generate(
        prompts, [GREEDY, seeded, SamplingParams(temperature=1.5, max_tokens=3, ignore_eos=True)]
    )
    assert outs[0].token_ids == alone
    assert outs[1].token_ids == sampled_alone  # a seed reproduces whatever the batch
    assert len(outs[2].token_ids) == 3
    assert no_request_holds_pages(tiny_engine)


def test_small_pool_queues_requests_until_pages_free(tiny_checkpoint: Path) -> None:
    engine = InferenceEngine.from_pretrained(tiny_checkpoint, num_kv_pages=6)
    prompts = [[i + 1] * (10 + 7 * i) for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = engine.generate(prompts, params)
    expected = [engine.generate([p], params)[0].token_ids for p in prompts]
    assert [o.token_ids for o in outs] == expected
    assert no_request_holds_pages(engine)


def test_context_limit_and_bad_prompts(tiny_checkpoint: Path) -> None:
    engine = InferenceEngine.from_pretrained(tiny_checkpoint, max_model_len=40)
    out = engine.generate([[3] * 35], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    request_id = engine.add_request([3] * 35, SamplingParams(max_tokens=10**21))
    engine.step()
    assert engine.get_request_status(request_id) == {"status": "processing", "phase": "running", "tokens_generated": 1,
                                                     "tokens_remaining": 4}  # the limit the context allows
    engine.abort(request_id)
    with pytest.raises(ValueError, match="the prompt has 40 tokens.*max_model_len.* 40"):
        engine.generate([[3] * 40])
    with pytest.raises(ValueError, match="empty"):
        engine.generate("")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 151936\)"):
        engine.generate([[1, 151936]])
    with pytest.raises(ValueError, match="string or a list of token ids"):
        engine.add_request(3.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        engine.generate(["a"], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="max_model_len"):  # a failing prompt in a list leaves nothing behind
        engine.generate([[1, 2], [3] * 50])
    assert no_request_holds_pages(engine)


def test_abort_frees_pages(tiny_engine: InferenceEngine) -> None:
    a = tiny_engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=50, ignore_eos=True))
    tiny_engine.add_request([5, 6], SamplingParams(max_tokens=3, ignore_eos=True))
    tiny_engine.step()
    assert tiny_engine.kv_cache.num_free_pages < tiny_engine.kv_cache.num_pages
    tiny_engine.abort(a)
    tiny_engine.abort("unknown")
    while tiny_engine.has_unfinished_requests():
        tiny_engine.step()
    assert no_request_holds_pages(tiny_engine)
    tiny_engine.add_request([1], request_id="dup")
    with pytest.raises(ValueError, match="already in use"):
        tiny_engine.add_request([1], request_id="dup")
    tiny_engine.abort("dup")
    assert no_request_holds_pages(tiny_engine)


def test_max_model_len_beyond_the_kv_pool_is_rejected(tiny_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="max_model_len 1000 exceeds.*KV pool 10 pages"):
        InferenceEngine.from_pretrained(tiny_checkpoint, num_kv_pages=10, max_model_len=1000)


def test_missing_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        InferenceEngine.from_pretrained(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="No config.json"):
        InferenceEngine.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="backend 'cuda-magic' is not available"):
        check_backend("cuda-magic")


def test_stop_string_split_over_pieces_is_found() -> None:
    from python_layer.inference.inference_engine import _find_stop

    assert _find_stop("STx", ["STOP"]) is None
    assert _find_stop("abcSTOPx", ["zz", "OPx", "STOP"]) == 3  # the earliest start wins
    assert _find_stop("abc", []) is None
