"""The GPU attention kernels' registers as ptxas assembles them for an H100 (bindings/gpu_resources.py; no GPU
needed): the decode kernel's splits assume as many blocks of 128 threads an SM as its registers allow
(gpu_decode.mojo's decode_blocks_per_sm, by query heads a KV head), so each variant must fit its count, and one block
more must not (else the splits leave the GPU part idle); a spill would put the kernel's state in local memory."""

from functools import lru_cache

import pytest

from bindings import gpu_resources
from bindings.gpu_resources import KERNELS, kernel_resources

SM_REGISTERS, DECODE_THREADS = 65536, 128


@lru_cache(maxsize=1)
def _blocks_per_sm() -> dict[int, int]:
    return gpu_resources.decode_blocks_per_sm()


@pytest.mark.parametrize("name, group", [
    ("decode, bfloat16, 1 query head a KV head, from qkv", 1),
    ("decode, bfloat16, 2 query heads a KV head, from qkv (Qwen3-0.6B)", 2),
    ("decode, bfloat16, 2 query heads a KV head", 2),
    ("decode, bfloat16, 4 query heads a KV head, from qkv (Qwen3-8B)", 4),
    ("decode, bfloat16, 5 query heads a KV head, from qkv (Qwen3-14B)", 5),
    ("decode, bfloat16, 8 query heads a KV head, from qkv (Qwen3-32B)", 8),
    ("decode, float32, 2 query heads a KV head, from qkv", 2),
])
def test_decode_kernel_fits_the_blocks_an_sm_its_splits_assume(name: str, group: int) -> None:
    r = kernel_resources(*KERNELS[name])
    block = -(-r.registers // 8) * 8 * DECODE_THREADS  # an SM allots a thread's registers 8 at a time
    blocks = _blocks_per_sm()[group]
    assert block * blocks <= SM_REGISTERS < block * (blocks + 1), (r, blocks)
    assert r.spill_bytes == 0, r


def test_split_merge_does_not_spill() -> None:
    r = kernel_resources(*KERNELS["split merge, bfloat16"])
    assert r.spill_bytes == 0 and r.registers < 64, r
