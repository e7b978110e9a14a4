"""The kernel cases of tests/kernels on a real GPU (skipped where there is none)."""

import pytest
import torch

from tests.kernel_cases import (
    eight_bit_kv_case, kernel_cases, linear_weight, run_attention, run_linear_pair_panels, run_linear_tiled, seed_case,
)

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

ops = pytest.importorskip("bindings.ops", reason="MAX is not installed")
from bindings import reference as ref
from bindings.gpu_options import GpuOptions


GPU_CASES = [c for c in kernel_cases() if c.values[0] not in (run_linear_tiled, run_linear_pair_panels)  # CPU layouts
             and not eight_bit_kv_case(c)]  # 8-bit caches: CPU only


@pytest.mark.parametrize("runner, dtype, case", GPU_CASES)
def test_op_matches_reference_on_gpu(runner, dtype: torch.dtype, case) -> None:
    seed_case(case)
    runner(ops, "cuda", dtype, case)


@pytest.mark.parametrize("runner, dtype, case", [c for c in GPU_CASES if c.values[0] is run_attention])
def test_plain_attention_kernels_match_reference_on_gpu(monkeypatch, runner, dtype: torch.dtype, case) -> None:
    """The plain GPU attention kernels, which GpuOptions(flash_attention=False) takes instead of the flash ones (the
    default, which the test above runs), on every attention case."""
    monkeypatch.setattr(ops, "GPU_OPTIONS", GpuOptions(flash_attention=False))
    seed_case(case)
    runner(ops, "cuda", dtype, case)


@pytest.mark.parametrize("runner, dtype, case", [c for c in GPU_CASES if c.values[0] is run_attention
                                                  and c.values[1] == torch.bfloat16])
def test_flash_prefill_with_two_row_tiles_a_block_matches_reference_on_gpu(monkeypatch, runner, dtype: torch.dtype,
                                                                          case) -> None:
    """GpuOptions(prefill_pairs=True): every block of the prefill kernel takes a heavy row tile and its mirror, which
    it does by itself only where the row tiles outnumber the SMs (2,048 tokens and more, not the cases' sizes)."""
    monkeypatch.setattr(ops, "GPU_OPTIONS", GpuOptions(prefill_pairs=True))
    seed_case(case)
    runner(ops, "cuda", dtype, case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_weights_on_a_gpu_get_a_clear_error(dtype: torch.dtype) -> None:
    """The tiled layout is the CPU decode kernel's (a GPU model never tiles its weights): on a GPU, a clear error."""
    weight, scales, block_k = linear_weight(64, 128, dtype, "cuda")
    with pytest.raises(ValueError, match="tiled weights are .* on a CPU"):
        ops.linear(torch.randn(3, 128, device="cuda").to(dtype), ref.tile_weight(weight), scales, block_k)


def test_ops_and_torch_see_each_others_pending_work() -> None:
    """MAX runs the ops on its own stream: an op must see what torch queued just before it (milliseconds of work
    still running), and torch what the op wrote, without the caller synchronizing."""
    x = torch.zeros(16 * 2**20, device="cuda")
    for _ in range(64):  # 64 passes over 64 MB: a few ms of work queued on torch's stream
        x.add_(1.0)
    y = ops.relu(x)
    y.add_(1.0)
    assert torch.equal(y, torch.full_like(x, 65.0))
