"""The model's GPU matmul options (bindings/gpu_options.py), each on a model loaded with it:
- vendor_blas: the model graph's matmuls through cuBLAS;
- batch1_graph: steps of one token of one sequence on a batch-1 graph, its matmuls W @ x^T.
Its bfloat16 logits, of a prefill and of the same prompt decoded a token at a time, drift from transformers' float32
ones no more than transformers' own bfloat16 does, as with the default graph; and its decode steps replayed as device
graphs (inside MAX's capture) give the tokens of the steps run op by op, down to batch 1 as requests finish."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

from transformers import Qwen3ForCausalLM

from bindings.gpu_options import GpuOptions
from python_layer import InferenceEngine, SamplingParams
from python_layer.model.loader import load_model
from tests.engine_checks import no_request_holds_pages, random_prompts
from tests.integration.test_parity import _Batch, _hf, _hf_logits, _prompts, _rel_err

SETTINGS = ("batch1_graph", "vendor_blas")
pytestmark = pytest.mark.xdist_group("matmul_settings")


@pytest.fixture(scope="module", params=SETTINGS)
def setting_model(request: pytest.FixtureRequest, tiny_checkpoint: Path):
    options = GpuOptions(**{request.param: True})
    return request.param, load_model(tiny_checkpoint, device="cuda", dtype="bfloat16", gpu_options=options)


def test_the_model_loaded_with_the_setting_takes_it(setting_model, cuda_model) -> None:
    name, model = setting_model
    taken = lambda m: m.forward_fn.vendor_blas if name == "vendor_blas" else m.forward_fn.batch_one_model is not None
    assert taken(model) is True and taken(cuda_model) is False


@pytest.mark.parametrize("one_by_one", [False, True], ids=["prefill", "token_by_token"])
def test_logits_drift_no_more_than_transformers_bfloat16(
    setting_model, tiny_checkpoint: Path, one_by_one: bool
) -> None:
    _, model = setting_model
    hf_bf16 = Qwen3ForCausalLM.from_pretrained(
        tiny_checkpoint, dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()
    prompt = _prompts(model.config.vocab_size)[2]
    exact = _hf_logits(_hf(tiny_checkpoint), prompt)
    batch = _Batch(model, 1)
    if one_by_one:  # a step of one token each: the batch-1 graph's steps
        logits = torch.cat([batch.forward([[token]], all_logits=True) for token in prompt])
    else:
        logits = batch.forward([prompt], all_logits=True)
    ours = _rel_err(logits, exact)
    theirs = _rel_err(_hf_logits(hf_bf16, prompt), exact)
    assert ours < min(1.25 * theirs, 5e-2), (ours, theirs)


def test_replayed_steps_give_the_tokens_of_steps_run_op_by_op(setting_model) -> None:
    _, model = setting_model
    prompts = random_prompts(13, seed=13, max_len=300)
    # outputs of different lengths: the batch shrinks to one as requests finish
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 2 * i, ignore_eos=True, logprobs=1) for i in range(13)]
    replayed = InferenceEngine(model, num_kv_pages=256, max_num_seqs=16, debug_checks=True)
    eager = InferenceEngine(model, num_kv_pages=256, max_num_seqs=16, device_graphs=False)
    assert replayed.runner.decode_graphs is not None and eager.runner.decode_graphs is None
    a, b = replayed.generate(prompts, params), eager.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        assert [lp.logprob for lp in x.logprobs] == pytest.approx([lp.logprob for lp in y.logprobs], abs=2e-2)
    assert no_request_holds_pages(replayed)
