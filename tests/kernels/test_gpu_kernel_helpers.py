"""Index arithmetic of the GPU kernels, run on a CPU with the `mojo` compiler (the kernels themselves need a GPU:
tests/gpu)."""

import subprocess
from pathlib import Path

from bindings import library

ROOT = Path(__file__).resolve().parents[2]


def _run_check(name: str, *flags: str) -> None:
    check = Path(__file__).with_name(name)
    result = subprocess.run([library._mojo(), "run", *flags, "-I", str(ROOT), str(check)], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok:"), result.stdout


def test_prefill_blocks_cover_every_row_tile_once() -> None:
    _run_check("prefill_block_tile_check.mojo")


def test_each_attention_batch_goes_to_the_kernel_that_takes_it() -> None:
    # the host code as MAX compiles it for an H100, where WARP_SIZE is 32 (0 in a build for the CPU alone)
    _run_check("attention_dispatch_check.mojo", "--target-accelerator", "sm_90")


def test_attention_splits_cover_every_key_once_and_short_contexts_fill_the_first() -> None:
    _run_check("split_keys_check.mojo")


def test_decode_step_kernels_launch_with_pdl_only_when_asked() -> None:
    _run_check("dependent_launch_check.mojo", "--target-accelerator", "sm_90")
