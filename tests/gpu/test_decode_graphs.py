"""Decode steps replayed as device graphs on a GPU (model/decode_graphs.py): the same tokens as the steps run
op by op, whatever the batch, and the captured buckets reused as requests come and go; overlapped (the next step
given to the GPU before the last one's tokens are read, its input ids taken there), the same tokens again."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

from python_layer import InferenceEngine, SamplingParams
from tests.engine_checks import no_request_holds_pages, random_prompts, serve_arrivals_and_aborts

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
# one xdist worker for the module (`pytest -n N --dist loadgroup`): the model's graph compiles once, not per test
pytestmark = pytest.mark.xdist_group("decode_graphs")


def test_replayed_decode_steps_give_the_tokens_of_steps_run_op_by_op(cuda_model) -> None:
    replayed = InferenceEngine(cuda_model, num_kv_pages=256, max_num_seqs=16, debug_checks=True)
    eager = InferenceEngine(cuda_model, num_kv_pages=256, max_num_seqs=16, device_graphs=False)
    graphs = replayed.runner.decode_graphs
    assert graphs is not None and graphs.buckets == [1, 2, 4, 8, 16] and eager.runner.decode_graphs is None
    assert sorted(graphs._steps) == graphs.buckets and all(logits is not None for _, logits in graphs._steps.values())
    for batch in (1, 3, 8, 13):
        prompts = random_prompts(batch, seed=batch, max_len=300)
        a, b = replayed.generate(prompts, GREEDY), eager.generate(prompts, GREEDY)
        assert [o.token_ids for o in a] == [o.token_ids for o in b], batch
        for x, y in zip(a, b):
            assert [lp.logprob for lp in x.logprobs] == pytest.approx([lp.logprob for lp in y.logprobs], abs=2e-2)
    assert no_request_holds_pages(replayed)


def test_replay_with_arrivals_and_aborts(cuda_model) -> None:
    outputs = []
    for device_graphs in (True, False):
        # the same 39 pages for the requests both ways (device graphs reserve one for padding): the same preemptions
        engine = InferenceEngine(cuda_model, num_kv_pages=40 if device_graphs else 39, max_num_seqs=8,
                                 debug_checks=True, device_graphs=device_graphs, overlap=False)
        assert engine.kv_cache.num_usable_pages == 39
        done = serve_arrivals_and_aborts(engine, random_prompts(30, seed=6, max_len=300), seed=5, max_tokens=24)
        assert no_request_holds_pages(engine)
        outputs.append(done)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 30


def test_overlapped_decode_steps_give_the_tokens_of_steps_read_at_once(cuda_model) -> None:
    """torch's token copies and argmax run on MAX's stream between the replays: a step that read its input ids
    before the step before had written them would give other tokens."""
    prompts = random_prompts(13, seed=8, max_len=300)
    # greedy rows, and rows that sample on the device with a seed each (they draw the same either way)
    params = [
        SamplingParams(temperature=0.0 if i % 2 else 0.7, top_p=0.9, seed=i, max_tokens=4 + 3 * i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    outputs = []
    for overlap in (True, False):
        engine = InferenceEngine(cuda_model, num_kv_pages=256, max_num_seqs=16, debug_checks=True, overlap=overlap)
        following, run = [], engine.runner.run_following
        engine.runner.run_following = lambda requests, ids, run=run, following=following: (
            following.append(len(requests)) or run(requests, ids))
        outputs.append([o.token_ids for o in engine.generate(prompts, params)])
        assert no_request_holds_pages(engine) and bool(following) == overlap
    assert outputs[0] == outputs[1]


def test_steps_behind_an_unread_one_are_launched_without_waiting_for_the_device(cuda_model) -> None:
    """Giving the device the next step must not wait for the step in flight (else the host's work no longer
    overlaps the device's): torch's sync debug mode raises on any synchronizing call torch makes meanwhile,
    for greedy rows, sampled rows (seeded or not) and a batch that shrinks as requests end."""
    engine = InferenceEngine(cuda_model, num_kv_pages=256, max_num_seqs=16, debug_checks=True)
    launch, following = engine._launch_following, []

    def without_syncs(launched):
        torch.cuda.set_sync_debug_mode("error")
        try:
            following.append(launch(launched))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return following[-1]

    engine._launch_following = without_syncs
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, top_k=20 * (i % 2), min_p=0.05,
                             seed=i if i % 3 == 1 else None, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(9)]
    outputs = engine.generate(random_prompts(9, seed=9, max_len=300), params)
    assert [len(o.token_ids) for o in outputs] == [p.max_tokens for p in params]
    assert sum(step is not None for step in following) >= 10 and no_request_holds_pages(engine)
