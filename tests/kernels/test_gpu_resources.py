"""The GPU attention kernels' registers as ptxas assembles them for an H100 (bindings/gpu_resources.py; no GPU
needed): the decode kernel's launch sizes assume 4 blocks of 128 threads an SM (gpu_decode.mojo's
DECODE_BUSY_BLOCKS), which 129 registers a thread would cut to 3, and a spill would put the kernel's state in local
memory."""

import pytest

from bindings.gpu_resources import KERNELS, kernel_resources

SM_REGISTERS, DECODE_THREADS, DECODE_BLOCKS_PER_SM = 65536, 128, 4


@pytest.mark.parametrize("name", [
    "decode, bfloat16, 2 query heads a KV head, from qkv (Qwen3-0.6B)",
    "decode, bfloat16, 2 query heads a KV head",
    "decode, float32, 2 query heads a KV head, from qkv",
])
def test_decode_kernel_fits_four_blocks_an_sm_without_spilling(name: str) -> None:
    r = kernel_resources(*KERNELS[name])
    assert r.registers * DECODE_THREADS * DECODE_BLOCKS_PER_SM <= SM_REGISTERS, r
    assert r.spill_bytes == 0, r


def test_split_merge_does_not_spill() -> None:
    r = kernel_resources(*KERNELS["split merge, bfloat16"])
    assert r.spill_bytes == 0 and r.registers < 64, r
