"""The decode step's kernels launched with Hopper's programmatic dependent launch (GpuOptions.pdl,
mojo_kernels/utils/dependent_launch.mojo): each may start while the kernel before it ends, and waits for it before
it reads what it wrote or writes anything. The same tokens as plain launches, replayed as device graphs and op by
op; a kernel that read too early would give others."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

from bindings.gpu_options import GpuOptions
from python_layer import InferenceEngine, SamplingParams
from python_layer.model.loader import load_model
from tests.engine_checks import no_request_holds_pages, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
pytestmark = pytest.mark.xdist_group("dependent_launch")


def test_pdl_launches_give_the_tokens_of_plain_ones(cuda_model, tiny_checkpoint) -> None:
    prompts = random_prompts(13, seed=11, max_len=300)
    plain_engine = InferenceEngine(cuda_model, num_kv_pages=256, max_num_seqs=16, device_graphs=False)
    plain = plain_engine.generate(prompts, GREEDY)
    pdl_model = load_model(tiny_checkpoint, device="cuda", dtype="bfloat16", gpu_options=GpuOptions(pdl=True))
    for device_graphs in (True, False):
        engine = InferenceEngine(pdl_model, num_kv_pages=256, max_num_seqs=16, debug_checks=True,
                                 device_graphs=device_graphs)
        assert (engine.runner.decode_graphs is not None) == device_graphs
        outputs = engine.generate(prompts, GREEDY)
        assert [o.token_ids for o in outputs] == [o.token_ids for o in plain], device_graphs
        for x, y in zip(outputs, plain):
            assert [lp.logprob for lp in x.logprobs] == pytest.approx([lp.logprob for lp in y.logprobs], abs=1e-3)
        assert no_request_holds_pages(engine)
