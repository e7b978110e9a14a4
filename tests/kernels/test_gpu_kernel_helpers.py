"""Index arithmetic of the GPU kernels, run on a CPU with the `mojo` compiler (the kernels themselves need a GPU:
tests/gpu)."""

import subprocess
from pathlib import Path

from bindings import library

ROOT = Path(__file__).resolve().parents[2]


def test_prefill_blocks_cover_every_row_tile_once() -> None:
    check = Path(__file__).with_name("prefill_block_tile_check.mojo")
    result = subprocess.run([library._mojo(), "run", "-I", str(ROOT), str(check)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok:"), result.stdout
