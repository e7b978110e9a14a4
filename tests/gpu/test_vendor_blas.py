"""The model graph's matmuls through cuBLAS (MILI_GPU_VENDOR_BLAS=1, bindings/library.py) on a GPU: its bfloat16
logits drift from transformers' float32 ones no more than transformers' own bfloat16 does, as with MAX's matmul
kernels, and its decode steps replayed as device graphs (cuBLAS inside MAX's capture) give the tokens of the steps
run op by op."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

from transformers import Qwen3ForCausalLM  # noqa: E402

from python_layer import InferenceEngine, SamplingParams  # noqa: E402
from python_layer.model.loader import load_model  # noqa: E402
from tests.engine_checks import no_request_holds_pages, random_prompts  # noqa: E402
from tests.integration.test_parity import _Batch, _hf, _hf_logits, _prompts, _rel_err  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
pytestmark = pytest.mark.xdist_group("vendor_blas")


@pytest.fixture(scope="module")
def cublas_model(tiny_checkpoint: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MILI_GPU_VENDOR_BLAS", "1")  # read as the model loads
        return load_model(tiny_checkpoint, device="cuda", dtype="bfloat16")


def test_the_model_loaded_with_the_setting_calls_cublas(cublas_model, cuda_model) -> None:
    assert cublas_model.forward_fn.vendor_blas is True and cuda_model.forward_fn.vendor_blas is False


def test_cublas_logits_drift_no_more_than_transformers_bfloat16(cublas_model, tiny_checkpoint: Path) -> None:
    hf_bf16 = Qwen3ForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.bfloat16, attn_implementation="eager").eval()
    prompt = _prompts(cublas_model.config.vocab_size)[2]
    exact = _hf_logits(_hf(tiny_checkpoint), prompt)
    ours = _rel_err(_Batch(cublas_model, 1).forward([prompt], all_logits=True), exact)
    theirs = _rel_err(_hf_logits(hf_bf16, prompt), exact)
    assert ours < min(1.25 * theirs, 5e-2), (ours, theirs)


def test_replayed_cublas_steps_give_the_tokens_of_steps_run_op_by_op(cublas_model) -> None:
    prompts = random_prompts(13, seed=13, max_len=300)
    replayed = InferenceEngine(cublas_model, num_kv_pages=256, max_num_seqs=16, debug_checks=True)
    eager = InferenceEngine(cublas_model, num_kv_pages=256, max_num_seqs=16, device_graphs=False)
    assert replayed.runner.decode_graphs is not None and eager.runner.decode_graphs is None
    a, b = replayed.generate(prompts, GREEDY), eager.generate(prompts, GREEDY)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        assert [lp.logprob for lp in x.logprobs] == pytest.approx([lp.logprob for lp in y.logprobs], abs=2e-2)
    assert no_request_holds_pages(replayed)
