"""A checkpoint's weights in vLLM's own 8-bit format, for `mili bench peers --systems vllm --vllm-model` (MILI reads
it too, with no flag): every decoder projection as compressed-tensors W8A8 int8 (python_layer/model/
w8a8_checkpoints.py), the rest as it was.

  python -m benchmarks.peers.w8a8_checkpoint SRC DST"""

from __future__ import annotations

import sys

from python_layer.model.w8a8_checkpoints import write_w8a8_checkpoint

if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(write_w8a8_checkpoint(sys.argv[1], sys.argv[2]))
