"""Decode steps on DecodeGraphs' fixed-shape inputs (model/decode_graphs.py): batches padded up to a bucket, the
page table at its full width, the inputs copied into each bucket's buffers. A GPU replays those steps as device
graphs; a CPU executes the same buffers, and here they must give what the unpadded steps give."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from max.driver import CPU

from python_layer import SamplingParams
from python_layer.model.attention_metadata import SequenceChunk
from python_layer.model.decode_graphs import STAGING_BUFFERS, DecodeGraphs, _torch_view_of_stream
from python_layer.model.loader import load_model
from python_layer.model.qwen3_model import Qwen3CausalLM
from tests.engine_checks import no_request_holds_pages, padded_engine, random_prompts, serve_arrivals_and_aborts

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)

# one xdist worker for the module (`--dist loadgroup`): its model graphs compile once, not once per worker
pytestmark = pytest.mark.xdist_group("decode_graphs")


@pytest.fixture(scope="module")
def model(tiny_checkpoint: Path) -> Qwen3CausalLM:
    return load_model(tiny_checkpoint, backend="mojo")



@pytest.mark.parametrize("batch, bucket", [(1, 1), (3, 4), (6, 8), (8, 8)])
def test_padded_decode_steps_match_unpadded(model: Qwen3CausalLM, batch: int, bucket: int) -> None:
    prompts = random_prompts(batch, seed=batch, max_len=70)
    plain = padded_engine(model, False, max_num_seqs=8).generate(prompts, GREEDY)
    engine = padded_engine(model, True, max_num_seqs=8)
    graphs = engine.runner.decode_graphs
    graphs.warm_up()  # every bucket's step on padding rows alone: they touch no request's pages
    used = []  # the bucket of every decode step
    graphs.bucket = lambda batch, bucket_of=graphs.bucket: used.append(bucket_of(batch)) or used[-1]
    padded = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in padded] == [o.token_ids for o in plain]
    for a, b in zip(padded, plain):
        assert [lp.logprob for lp in a.logprobs] == pytest.approx([lp.logprob for lp in b.logprobs], abs=1e-4)
    # every decode step ran on the padded inputs; the smaller buckets served the batch as requests finished
    assert len(used) == 12 - 1 and max(used) == bucket
    assert no_request_holds_pages(engine) and engine.kv_cache.reserved_pages == [graphs.pad_page]


def test_arrivals_aborts_preemption_and_prefix_hits_match_unpadded(model: Qwen3CausalLM) -> None:
    """Requests come and go between steps, so each bucket's buffers are refreshed with ever different sequences;
    a 12-page pool preempts, and a shared prefix comes from the prefix cache."""
    system = random_prompts(1, seed=99, max_len=70)[0][:40] * 2
    outputs = []
    for decode_graphs in (False, True):
        engine = padded_engine(model, decode_graphs, num_kv_pages=12, max_num_seqs=6, overlap=False)
        done = serve_arrivals_and_aborts(engine, [system + p for p in random_prompts(24, seed=4, max_len=70)], seed=3)
        assert engine.scheduler.num_preemptions > 0 and engine.prefix_cache.hit_tokens > 0
        assert no_request_holds_pages(engine)
        outputs.append(done)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 24


def test_decode_graphs_refuse_what_they_cannot_run(model: Qwen3CausalLM) -> None:
    engine = padded_engine(model, False, max_num_seqs=2)
    kv = engine.kv_cache
    with pytest.raises(ValueError, match="KV page 1 is not reserved"):
        DecodeGraphs(model.forward_fn, kv, 2, 4, 1)
    graphs = DecodeGraphs(model.forward_fn, kv, 2, 4, kv.reserved_pages[0])
    with pytest.raises(ValueError, match="3 sequences exceeds the largest bucket, 2"):
        graphs([SequenceChunk([1], 0, [1])] * 3)
    with pytest.raises(ValueError, match="holds 5 KV pages, more than the page table's 4"):
        graphs([SequenceChunk([1], 70, [1, 2, 3, 4, 5])])


def test_staged_inputs_hold_the_step_arrays(model: Qwen3CausalLM) -> None:
    """A GPU copies a step's inputs from one page-locked buffer (DecodeGraphs._staged): its views must be the
    arrays, shapes included; each bucket writes its own STAGING_BUFFERS buffers in turn, made once (checked here on
    host memory)."""
    graphs = padded_engine(model, True, max_num_seqs=4).runner.decode_graphs
    step = lambda i: [torch.arange(5, dtype=torch.int32) + i, torch.arange(6, 18, dtype=torch.int32).reshape(3, 4) * i,
                      torch.tensor([7 + i], dtype=torch.int32)]
    written = []
    for i in range(2 * STAGING_BUFFERS):
        views = graphs._staged(4, step(i))
        assert [v.to_numpy().tolist() for v in views] == [a.tolist() for a in step(i)]
        written.append(views[0].to_numpy())
    graphs._staged(2, step(0))
    assert [len(graphs._staging[rows]) for rows in (2, 4)] == [1, STAGING_BUFFERS]
    # step i's buffer is step i + STAGING_BUFFERS's (the same memory, written again), and no other step's
    assert [written[i].tolist() for i in range(STAGING_BUFFERS)] == [step(i)[0].tolist() for i in
                                                                   range(STAGING_BUFFERS, 2 * STAGING_BUFFERS)]


def test_no_overlap_where_torch_cannot_run_on_the_replay_stream(model: Qwen3CausalLM) -> None:
    """A GPU overlaps steps only with torch on MAX's stream; where torch cannot use it, decode graphs still
    replay but every step is read at once (a warning says so). Here a CPU queue plays that stream."""
    with pytest.warns(RuntimeWarning, match="decode steps are not overlapped"):
        assert _torch_view_of_stream(CPU(), torch.device("cpu")) is None
    engine = padded_engine(model, True, max_num_seqs=2)
    assert engine.runner.decode_graphs.can_overlap  # a CPU runs each step at once
    engine.runner.decode_graphs.can_overlap = False
    following, run = [], engine.runner.run_following
    engine.runner.run_following = lambda requests, ids: following.append(ids) or run(requests, ids)
    out = engine.generate(
        random_prompts(2, seed=5, max_len=70), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    )
    assert [len(o.token_ids) for o in out] == [6, 6] and following == []
