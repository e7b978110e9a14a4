"""The batch-1 graph (GpuOptions.batch1_graph, model/qwen3_graph.py): a step of one token of one sequence on a graph
static in its batch, whose linears are W @ x^T through MAX's matmul. A GPU setting; its graph is built and run here
on a CPU (float32, whose weights stay [N, K] there) to check what it computes. Compiling it takes ~100 s, so that
run is a slow test; tests/gpu/test_matmul_settings.py runs it on a GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from bindings.reference import tile_weight
from python_layer import SamplingParams
from python_layer.model.loader import load_model
from python_layer.model.qwen3_graph import (
    BATCH_ONE_TOLERANCE, CompiledQwen3, check_batch_one_logits, graph_weights, model_graph,
)
from tests.engine_checks import no_request_holds_pages, padded_engine, random_prompts

from benchmarks import common
from benchmarks.engine import matmul_order_drift


@pytest.mark.parametrize("device_key", ["cpu", "cuda:0"])  # built for a GPU without one: the graph a GPU loads
def test_its_batch_is_static_and_its_matmuls_take_w_times_x(tiny_checkpoint: Path, device_key: str) -> None:
    model = load_model(tiny_checkpoint, backend="reference", dtype="bfloat16" if device_key != "cpu" else "float32")
    graph = model_graph(model, graph_weights(model), device_key, batch_one=True)
    dims = [[str(d) for d in value.type.shape] for value in graph.inputs[:7]]
    assert dims == [["1"], ["1"], ["2"], ["1"], ["1", "max_pages"], ["1"], ["1"]]
    text = str(graph)
    # per layer qkv, o, gate_up, down, then the LM head: all MAX's matmul, none with a weight transposed
    assert text.count("rmo.matmul") == 4 * model.config.num_hidden_layers + 1, text
    assert "transpose" not in text and set(re.findall(r'symbol = "(mili_\w+)"', text)) == {
        "mili_rms_norm", "mili_fused_add_rms_norm", "mili_qkv_attention", "mili_silu_and_mul"}


@pytest.mark.parametrize("held", ["tiled", "quantized"])
def test_it_refuses_weights_not_held_dense(tiny_checkpoint: Path, held: str) -> None:
    """A CPU holds bfloat16 weights tiled for its decode kernel (as Qwen3CausalLM does for the mojo backend), and FP8
    ones quantized: the batch-1 graph takes neither (a GPU holds them dense)."""
    model = load_model(tiny_checkpoint, backend="reference", dtype="bfloat16",
                       weight_dtype="fp8" if held == "quantized" else "auto")
    weights = graph_weights(model)
    if held == "tiled":
        weights = {name: tile_weight(t) if name.endswith("_proj") else t for name, t in weights.items()}
    with pytest.raises(
        ValueError, match=rf"the batch-1 graph takes dense \[N, K\] weights .* not layers.0.qkv_proj's {held}"
    ):
        model_graph(model, weights, "cpu", batch_one=True)


def test_the_load_check_takes_rounding_apart_and_refuses_a_wrong_graph() -> None:
    torch.manual_seed(0)
    dynamic = torch.randn(151_936) * 4
    rounded_apart = dynamic + (torch.rand_like(dynamic) - 0.5) * 2 * 0.035 * dynamic.abs().max()
    check_batch_one_logits(rounded_apart.bfloat16(), dynamic.bfloat16())
    with pytest.raises(RuntimeError, match="differ from the dynamic graph's by up to .* unset MILI_GPU_BATCH1_GRAPH"):
        check_batch_one_logits(dynamic[torch.randperm(len(dynamic))], dynamic)


def test_the_drift_benchmark_tells_summation_order_from_a_wrong_matmul(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/engine/matmul_order_drift.py, whose figures on Qwen3-0.6B's shape set BATCH_ONE_TOLERANCE: on the tiny
    model too, other summation orders stay inside it and one wrong matmul falls outside."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert matmul_order_drift.main(["--model", str(tiny_checkpoint), "--tokens", "0,5"]) == 0
    rows = json.loads(next(tmp_path.glob("matmul-order-drift-*.json")).read_text())["rows"]
    forms = ("split_k", "reversed", "one_wrong")
    assert {(r["token"], r["form"]) for r in rows} == {(t, f) for t in (0, 5) for f in forms}
    for row in rows:
        assert (row["max_diff_share"] > BATCH_ONE_TOLERANCE) == (row["form"] == "one_wrong"), row


@pytest.mark.slow
def test_batch_one_steps_run_on_it_and_give_the_dynamic_graphs_tokens(tiny_checkpoint: Path) -> None:
    plain = load_model(tiny_checkpoint, backend="mojo")
    model = load_model(tiny_checkpoint, backend="mojo")
    model.forward_fn = compiled = CompiledQwen3(model, batch_one_graph=True)  # checks it against the dynamic graph
    taken = []
    graph_for = compiled.graph_for
    compiled.graph_for = lambda inputs: taken.append(graph_for(inputs) is compiled.batch_one_model) or graph_for(inputs)

    prompts = random_prompts(4, seed=5, max_len=40) + [[7]]  # the last a one-token prompt: its prefill is batch 1
    # outputs of different lengths: the batch shrinks to one as requests finish
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=True, logprobs=2) for i in range(5)]
    expected = padded_engine(plain, False, max_num_seqs=4).generate(prompts, params)
    for decode_graphs in (False, True):  # through Qwen3CausalLM.forward, and through DecodeGraphs' bucket 1
        taken.clear()
        engine = padded_engine(model, decode_graphs, max_num_seqs=4)
        got = engine.generate(prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in expected]
        for a, b in zip(got, expected):
            assert [lp.logprob for lp in a.logprobs] == pytest.approx([lp.logprob for lp in b.logprobs], abs=1e-4)
        assert any(taken) and not all(taken), taken  # batch-1 steps on it, the others on the dynamic graph
        assert no_request_holds_pages(engine)


@pytest.mark.slow
def test_a_step_that_asks_for_no_logits_stays_on_the_dynamic_graph(tiny_checkpoint: Path) -> None:
    model = load_model(tiny_checkpoint, backend="mojo")
    compiled = CompiledQwen3(model, batch_one_graph=True)
    one = lambda n: torch.zeros(n, dtype=torch.int32)
    step = lambda tokens, rows: [one(tokens), one(tokens), one(2), one(1), one((1, 1)), one(tokens), one(rows)]
    assert compiled.graph_for(step(1, 1)) is compiled.batch_one_model
    assert compiled.graph_for(step(1, 0)) is compiled.model  # a prompt chunk short of its last token
    assert compiled.graph_for(step(3, 1)) is compiled.model
