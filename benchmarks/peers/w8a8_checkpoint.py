"""A checkpoint's weights in vLLM's own 8-bit format, for `mili bench peers --systems vllm --vllm-model`: every
decoder projection as compressed-tensors W8A8 int8 (llm-compressor's "int-quantized" format, as RedHatAI's
`*-quantized.w8a8` releases: int8 weights with a float32 scale per output channel, the largest |w| of the row
mapped to 127; activations quantized per token at run time), the rest as it was. MILI does not read this format:
its int8 runs on the source checkpoint, quantized at load (a scale per 128 weights).

  python -m benchmarks.peers.w8a8_checkpoint SRC DST"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from python_layer.model.quantization import rewrite_projections

_INT8 = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "block_structure": None,
         "actorder": None, "observer_kwargs": {}}
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {**_INT8, "strategy": "channel", "dynamic": False, "observer": "minmax"},
        "input_activations": {**_INT8, "strategy": "token", "dynamic": True, "observer": None},
        "output_activations": None,
    }},
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "sparsity_config": {},
}


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] as int8 values and float32 scales [N, 1]: w ~ q * scale."""
    scale = weight.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    return (weight.float() / scale).round().clamp(-127, 127).to(torch.int8), scale


def write_w8a8_checkpoint(src: str | Path, dst: str | Path) -> Path:
    def projection(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale = quantize_per_channel(weight)
        return {name: q, name + "_scale": scale}

    return rewrite_projections(src, dst, projection, QUANTIZATION_CONFIG)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(write_w8a8_checkpoint(sys.argv[1], sys.argv[2]))
