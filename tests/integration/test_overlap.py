"""Overlapped decode steps (InferenceEngine.step with overlap on): the next greedy decode step is given to the
device before the tokens of the last are read, its input ids taken from where the last one left them. A CPU runs
each step at once, so here the overlap changes the order of the engine's work, not its timing: the tokens must
be those of steps read at once, whatever ends a request late (an EOS, a stop string, an abort) and whatever
the pool holds (preemption)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from python_layer import SamplingParams
from python_layer.model.loader import load_model
from python_layer.model.qwen3_model import Qwen3CausalLM
from tests.engine_checks import no_request_holds_pages, padded_engine, random_prompts


@pytest.fixture(scope="module")
def model(tiny_checkpoint: Path) -> Qwen3CausalLM:
    return load_model(tiny_checkpoint, backend="mojo")



def _count_following(engine) -> list:
    """Spies on the steps launched behind an unread one: the batch size of each."""
    sizes, run = [], engine.runner.run_following
    engine.runner.run_following = lambda requests, ids: sizes.append(len(requests)) or run(requests, ids)
    return sizes


def _generate(model: Qwen3CausalLM, overlap: bool, prompts: list, params: list, **kwargs):
    engine = padded_engine(model, True, overlap=overlap, max_num_seqs=8, **kwargs)
    following = _count_following(engine)
    outputs = engine.generate(prompts, params)
    assert no_request_holds_pages(engine) and not engine.has_unfinished_requests()
    return [(o.finish_reason, o.token_ids, o.text) for o in outputs], following


def test_overlapped_steps_give_the_tokens_of_steps_read_at_once(model: Qwen3CausalLM) -> None:
    prompts = random_prompts(7, seed=1, max_len=60)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 2, 5, 9, 14, 20, 20)]
    at_once, following = _generate(model, False, prompts, params)
    assert following == []
    overlapped, following = _generate(model, True, prompts, params)
    assert overlapped == at_once
    # every decode step after the first ran behind an unread one (the longest requests' tokens 3 to 20), but for
    # none of the requests that surely ended on the token being read: max_tokens 1 ended at the prompt, 2 on the
    # first decode step, then the others one by one
    assert following == [5] * 3 + [4] * 4 + [3] * 5 + [2] * 6


def test_sampled_requests_overlap_and_draw_what_they_draw_at_once(model: Qwen3CausalLM) -> None:
    """Rows that sample (temperature, top-k, top-p, min-p, a seed each) overlap too: a seed draws the same tokens
    either way. Rows that ask for logprobs or penalties need their tokens on the host: those steps are read at once."""
    prompts = random_prompts(6, seed=5, max_len=60)
    sampled = [SamplingParams(temperature=0.8, top_k=40 * (i % 2), top_p=0.9, min_p=0.05 * (i % 3), seed=i,
                              max_tokens=8 + i, ignore_eos=True) for i in range(len(prompts))]
    at_once, _ = _generate(model, False, prompts, sampled)
    overlapped, following = _generate(model, True, prompts, sampled)
    assert overlapped == at_once and following
    for extra in (dict(logprobs=1), dict(repetition_penalty=1.2)):
        params = [SamplingParams(**{**vars(p), **extra}) for p in sampled]
        _, following = _generate(model, True, prompts, params)
        assert following == [], extra


def test_requests_ended_by_a_token_read_late(model: Qwen3CausalLM) -> None:
    """A stop token or stop string is seen a step late: the step behind it computed one row for nothing."""
    prompts = random_prompts(6, seed=2, max_len=60)
    free = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True) for _ in prompts]
    reference, _ = _generate(model, False, prompts, free)
    params = []
    for i, (_, tokens, text) in enumerate(reference):
        if i % 3 == 0:  # a stop token id it reaches on its 5th token
            params.append(SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop_token_ids=[tokens[4]]))
        elif i % 3 == 1 and len(text) > 6:  # a stop string from the middle of its text
            params.append(SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[text[3:6]]))
        else:
            params.append(free[i])
    at_once, _ = _generate(model, False, prompts, params)
    overlapped, following = _generate(model, True, prompts, params)
    assert overlapped == at_once and following
    assert {reason for reason, _, _ in overlapped} == {"stop", "length"}


def test_aborts_and_preemption_with_overlap(model: Qwen3CausalLM) -> None:
    """Requests arrive between steps and some are aborted while a step is in flight; a 12-page pool makes the
    engine preempt (the overlap stops where the free pages are short). Every request that finished has the tokens
    it has alone; an aborted one, the first of them."""
    prompts = random_prompts(18, seed=3, max_len=60)
    rng = random.Random(4)
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 20), ignore_eos=True) for _ in prompts]
    alone = [padded_engine(model, True, overlap=False, num_kv_pages=12).generate([p], [q])[0].token_ids
             for p, q in zip(prompts, params)]
    engine = padded_engine(model, True, overlap=True, num_kv_pages=12, max_num_seqs=6)
    following = _count_following(engine)
    pending, done, aborted, aborted_in_flight = list(range(len(prompts))), {}, set(), 0
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 2)):
            if pending:
                i = pending.pop(0)
                engine.add_request(prompts[i], params[i], request_id=str(i))
        if engine.requests and rng.random() < 0.15:
            victim = sorted(engine.requests)[0]
            aborted_in_flight += engine._in_flight is not None and engine.requests[victim] in engine._in_flight.requests
            assert engine.abort(victim).finish_reason == "abort"
            done[victim] = engine.get_completed_result(victim).token_ids
            aborted.add(victim)
        for delta in engine.step():
            if delta.finished:
                done[delta.request_id] = engine.get_completed_result(delta.request_id).token_ids
    assert engine.scheduler.num_preemptions > 0 and following and aborted_in_flight
    assert no_request_holds_pages(engine)
    for i, tokens in enumerate(alone):
        got = done[str(i)]
        assert got == tokens[: len(got)] if str(i) in aborted else got == tokens, i
