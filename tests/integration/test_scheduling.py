"""Continuous batching on the Mojo backend: chunked prefill, preemption, prefix caching, aborts, and the
page-accounting invariant under a stress load. Greedy output must not depend on how a request was served."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from python_layer import InferenceEngine, SamplingParams
from python_layer.model.loader import load_model
from python_layer.model.qwen3_model import Qwen3CausalLM
from tests.engine_checks import no_request_holds_pages

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tiny_checkpoint: Path) -> Qwen3CausalLM:
    # float32 K/V: a prefill recomputed after a preemption rounds K/V to bfloat16 from sums in another order
    return load_model(tiny_checkpoint, backend="mojo", kv_cache_dtype="float32")


def _engine(model: Qwen3CausalLM, **kwargs) -> InferenceEngine:
    kwargs.setdefault("num_kv_pages", 64)
    return InferenceEngine(model, debug_checks=True, **kwargs)


def _prompts(n: int, lengths: tuple[int, int], seed: int, vocab: int = 1000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(n)]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return _prompts(6, (3, 70), seed=0)


@pytest.fixture(scope="module")
def alone(model: Qwen3CausalLM, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy tokens run alone, in one prefill, with no prefix cache."""
    engine = _engine(model, enable_prefix_caching=False)
    return [engine.generate([p], GREEDY)[0].token_ids for p in prompts]


def test_mojo_engine_matches_reference_backend(tiny_checkpoint: Path, prompts, alone) -> None:
    reference = InferenceEngine.from_pretrained(tiny_checkpoint, backend="reference", num_kv_pages=64,
                                                kv_cache_dtype="float32")
    assert [o.token_ids for o in reference.generate(prompts, GREEDY)] == alone


def test_batched_and_chunked_prefill_match_alone(model, prompts, alone) -> None:
    for budget in (2048, 7, 1):  # the whole batch at once; prompts split into chunks of <= 7 tokens; one token a step
        engine = _engine(model, max_num_batched_tokens=budget, enable_prefix_caching=False)
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == alone, budget
        assert no_request_holds_pages(engine)


def test_preempted_and_recomputed_requests_match_alone(model, prompts, alone) -> None:
    for prefix_caching in (False, True):
        # 9 pages of 16 tokens cannot hold all six requests at once: the newest ones are preempted and recomputed
        engine = _engine(model, num_kv_pages=9, enable_prefix_caching=prefix_caching)
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == alone
        assert engine.scheduler.num_preemptions > 0
        assert no_request_holds_pages(engine)


def test_prefix_cache_hits_match_fresh_prefill(model, prompts, alone) -> None:
    engine = _engine(model)
    system = _prompts(1, (40, 40), seed=5)[0]  # 2.5 pages shared by every request below
    shared = [system + p for p in prompts]
    fresh = [_engine(model, enable_prefix_caching=False).generate([p], GREEDY)[0].token_ids for p in shared]
    first = engine.generate([shared[0]], GREEDY)[0]
    assert first.num_cached_tokens == 0 and first.token_ids == fresh[0]
    outs = engine.generate(shared[1:], GREEDY)
    assert [o.token_ids for o in outs] == fresh[1:]
    assert all(o.num_cached_tokens == 32 for o in outs)  # the two whole pages of the system prompt
    again = engine.generate([shared[0]], GREEDY)[0]  # the whole request is cached now: all but its last token reused
    assert again.token_ids == fresh[0] and again.num_cached_tokens == (len(shared[0]) - 1) // 16 * 16
    stats = engine.prefix_cache
    assert stats.hit_tokens >= 32 * 5 and 0 < stats.hit_rate < 1
    assert no_request_holds_pages(engine)


def test_requests_submitted_together_share_a_prefix_being_computed(model, prompts) -> None:
    system = _prompts(1, (40, 40), seed=5)[0]  # 2.5 pages shared by every request below
    shared = [system + p for p in prompts]
    fresh = [_engine(model, enable_prefix_caching=False).generate([p], GREEDY)[0].token_ids for p in shared]
    engine = _engine(model)
    outs = engine.generate(shared, GREEDY)  # all at once: the first computes the system prompt, the others wait
    assert [o.token_ids for o in outs] == fresh
    assert outs[0].num_cached_tokens == 0 and all(o.num_cached_tokens == 32 for o in outs[1:])
    assert no_request_holds_pages(engine)


def test_prefill_chunks_enter_the_prefix_cache_at_once(model) -> None:
    engine = _engine(model, max_num_batched_tokens=16)
    prompt = _prompts(1, (50, 50), seed=9)[0]
    first = engine.add_request(prompt, GREEDY)
    for chunk in (1, 2):  # 16-token prefill chunks: each page is in the tree while the request still prefills
        engine.step()
        assert engine.prefix_cache.num_cached_pages == chunk and engine.requests[first].prefix_node.pages
    second = engine.add_request(prompt[:40] + [1, 2, 3], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.get_completed_result(second).num_cached_tokens == 32
    assert no_request_holds_pages(engine)


def test_a_prefix_computed_twice_is_kept_once(model) -> None:
    """Two requests that computed the same pages in one step (here: waiting for the other is switched off) end
    up sharing the cached copy; the duplicate goes back to the pool."""
    engine = _engine(model)
    engine.scheduler.pages.prefix_in_flight = lambda request, running: False
    prompt = _prompts(1, (40, 40), seed=11)[0]
    a, b = engine.add_request(prompt, GREEDY), engine.add_request(prompt, GREEDY)
    engine.step()  # both prefill the whole prompt
    pages_a, pages_b = engine.requests[a].page_ids, engine.requests[b].page_ids
    assert pages_a[:2] == pages_b[:2] and pages_a[2] != pages_b[2]
    assert engine.kv_cache.num_free_pages == engine.kv_cache.num_pages - 4
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.get_completed_result(a).token_ids == engine.get_completed_result(b).token_ids
    assert no_request_holds_pages(engine)


def test_prompt_of_whole_pages_is_never_matched_whole(model) -> None:
    engine = _engine(model)
    prompt = _prompts(1, (32, 32), seed=7)[0]
    first = engine.generate([prompt], GREEDY)[0]
    second = engine.generate([prompt], GREEDY)[0]
    assert second.num_cached_tokens == 16 and second.token_ids == first.token_ids


def test_abort_frees_pages_at_once(model) -> None:
    engine = _engine(model, enable_prefix_caching=False, max_num_seqs=1)
    running = engine.add_request([1, 2, 3] * 10, GREEDY)
    waiting = engine.add_request([4, 5, 6], GREEDY)
    engine.step()
    assert engine.kv_cache.num_free_pages < engine.kv_cache.num_pages
    assert engine.abort(running).finish_reason == "abort"
    engine.abort(waiting)
    assert engine.abort(waiting) is None  # already finished
    assert engine.kv_cache.num_free_pages == engine.kv_cache.num_pages and not engine.requests
    assert engine.get_request_status(running) == {"status": "completed", "finish_reason": "abort",
                                                  "tokens_generated": 1, "tokens_remaining": 0}
    assert engine.get_completed_result(waiting).finish_reason == "abort"
    assert engine.get_request_status("nope") == {"status": "not_found"}
    assert engine.step() == []


def test_prompt_that_can_never_fit_is_rejected(model) -> None:
    engine = _engine(model, num_kv_pages=4)  # 64 tokens in all
    with pytest.raises(ValueError, match="the prompt has 64 tokens.*max_model_len.*64"):
        engine.add_request(list(range(64)), GREEDY)
    # the largest request that fits runs even though it needs the whole pool
    out = engine.generate([list(range(60))], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_kv_cache_holds_what_was_asked_for(model) -> None:
    """kv_cache_memory_gb: as many pages as that holds, past the default's 4096 pages; by default 2 GiB's worth up to
    4096 pages; a size that is not positive is refused."""
    c = model.config
    page_bytes = 2 * c.num_hidden_layers * 16 * c.num_key_value_heads * c.head_dim * model.kv_cache_dtype.itemsize
    assert 2 * 2**30 // page_bytes > 4096  # the tiny model: the default's cap applies
    assert InferenceEngine(model).kv_cache.num_pages == 4096
    assert InferenceEngine(model, kv_cache_memory_gb=5000.5 * page_bytes / 2**30).kv_cache.num_pages == 5000
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="kv_cache_memory_gb must be > 0"):
            InferenceEngine(model, kv_cache_memory_gb=bad)


def test_penalties_and_logprobs_per_request_in_one_batch(model) -> None:
    engine = _engine(model)
    prompt = [7, 8, 9, 7, 8, 9]
    penalized = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=1.5,
                               frequency_penalty=1.0, presence_penalty=0.5)
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    alone = [engine.generate([prompt], p)[0] for p in (GREEDY, penalized, with_logprobs)]
    batched = engine.generate([prompt] * 3, [GREEDY, penalized, with_logprobs])
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    assert batched[0].token_ids != batched[1].token_ids  # the penalties changed something
    assert batched[2].token_ids == batched[0].token_ids and batched[0].logprobs is None
    for token, lp in zip(batched[2].token_ids, batched[2].logprobs):
        assert lp.token_id == token and len(lp.top) == 3 and lp.top[0][0] == token  # greedy: the top token
        assert lp.logprob == pytest.approx(lp.top[0][1]) and lp.logprob <= 0


def test_stress_random_requests_and_aborts_small_pool(model) -> None:
    rng = random.Random(1)
    engine = _engine(model, num_kv_pages=24, max_num_seqs=16, max_num_batched_tokens=64)
    expected_len, aborted, finished = {}, set(), {}
    pending = _prompts(300, (1, 100), seed=2)
    steps = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 6)):
            if pending:
                params = SamplingParams(temperature=rng.choice([0.0, 0.8]), max_tokens=rng.randint(1, 40),
                                        ignore_eos=True, seed=rng.randrange(100))
                rid = engine.add_request(pending.pop(), params)
                expected_len[rid] = params.max_tokens
        if engine.requests and rng.random() < 0.15:
            victim = rng.choice(sorted(engine.requests))
            engine.abort(victim)
            aborted.add(victim)
        for delta in engine.step():  # debug_checks: page accounting verified after every step
            if delta.finished:
                finished[delta.request_id] = engine.get_completed_result(delta.request_id)
        steps += 1
    assert len(finished) + len(aborted) == 300
    for rid, out in finished.items():
        assert out.finish_reason == "length"
        assert len(out.token_ids) == min(expected_len[rid], engine.max_model_len - len(out.prompt_token_ids))
    assert engine.scheduler.num_preemptions > 0 and engine.prefix_cache.hit_tokens >= 0
    assert no_request_holds_pages(engine)
    engine.prefix_cache.reset()
    assert engine.kv_cache.num_free_pages == engine.kv_cache.num_pages


@torch.inference_mode()
def test_stress_outputs_match_alone(model) -> None:
    """Greedy requests served under heavy preemption and chunking give the tokens they give alone."""
    prompts = _prompts(24, (1, 60), seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    alone = [_engine(model, enable_prefix_caching=False).generate([p], params)[0].token_ids for p in prompts]
    engine = _engine(model, num_kv_pages=12, max_num_seqs=8, max_num_batched_tokens=24)
    assert [o.token_ids for o in engine.generate(prompts, params)] == alone
    assert engine.scheduler.num_preemptions > 0
