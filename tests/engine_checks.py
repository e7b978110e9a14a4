"""Checks shared by the engine tests."""

import random

from python_layer import InferenceEngine, SamplingParams
from python_layer.inference.model_runner import ModelRunner
from python_layer.model.decode_graphs import DecodeGraphs
from python_layer.model.qwen3_model import Qwen3CausalLM


def random_prompts(n: int, seed: int, max_len: int) -> list[list[int]]:
    """n prompts of 1 to max_len random token ids."""
    rng = random.Random(seed)
    return [[rng.randrange(1000) for _ in range(rng.randint(1, max_len))] for _ in range(n)]


def padded_engine(model: Qwen3CausalLM, decode_graphs: bool, **kwargs) -> InferenceEngine:
    """An engine (debug checks on) whose decode steps run on DecodeGraphs' padded fixed-shape inputs when
    decode_graphs, on a CPU too (which executes them where a GPU replays them). The padding page is reserved
    either way, so both leave the requests the same pages and preempt alike."""
    kwargs.setdefault("num_kv_pages", 64)
    max_len = (kwargs["num_kv_pages"] - 1) * 16  # what is left beside the padding page, with or without it
    engine = InferenceEngine(model, debug_checks=True, max_model_len=max_len, **kwargs)
    kv = engine.kv_cache
    pad_page = kv.reserve_page()
    if decode_graphs:
        graphs = DecodeGraphs(model.forward_fn, kv, engine.scheduler.max_num_seqs, kv.pages_for(max_len), pad_page)
        engine.runner = ModelRunner(model, kv, graphs)
    return engine


def no_request_holds_pages(engine: InferenceEngine) -> bool:
    """Page accounting is exact, and every page is free or held by the prefix cache alone."""
    engine.scheduler.check_page_accounting()
    cached = engine.prefix_cache.num_cached_pages if engine.prefix_cache else 0
    return not engine.requests and engine.kv_cache.num_free_pages + cached == engine.kv_cache.num_usable_pages


def serve_arrivals_and_aborts(engine: InferenceEngine, prompts: list, seed: int, max_tokens: int = 20) -> dict:
    """Greedy requests arrive a few at a time between steps and now and then the oldest is aborted; returns each
    request's (finish_reason, token ids). The same seed and prompts on engines that schedule alike give the same
    arrivals and aborts, so their outputs must be equal."""
    rng, pending, done = random.Random(seed), list(prompts), {}
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 3)):
            if pending:
                params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, max_tokens), ignore_eos=True)
                engine.add_request(pending.pop(), params, request_id=f"r{len(pending)}")
        if engine.requests and rng.random() < 0.1:
            victim = sorted(engine.requests)[0]
            done[victim] = (engine.abort(victim).finish_reason, engine.get_completed_result(victim).token_ids)
        for delta in engine.step():
            if delta.finished:
                done[delta.request_id] = (delta.finish_reason, engine.get_completed_result(delta.request_id).token_ids)
    return done
