"""The kernel cases of tests/kernels on a real GPU (skipped where there is none)."""

import pytest
import torch

from tests.kernel_cases import kernel_cases

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

ops = pytest.importorskip("bindings.ops", reason="MAX is not installed")


@pytest.mark.parametrize("runner, dtype, case", kernel_cases())
def test_op_matches_reference_on_gpu(runner, dtype: torch.dtype, case) -> None:
    torch.manual_seed(hash(str(case)) % 2**31)
    runner(ops, "cuda", dtype, case)
